//! `generate --model DIR` for a checkpoint of a family other than Mamba-2 (Mamba-1,
//! Falcon-Mamba, Bamba, Granite 4.0-H, Nemotron-H; `stablegraph::models::family`): generation
//! in one program (the prefill and the device-side decode loop), greedy or sampled, with
//! penalties and `--eos`, defaults from the checkpoint's generation_config.json as for Mamba-2.
//! Streams in segments as Mamba-2 does (`--stream`, or by default on a terminal for one text
//! prompt), and continues from and writes state files (`--state-in/--state-out`: the Mamba-2
//! states and, for the hybrids, the attention caches), over several devices (`--devices`,
//! `--parallel`). What only the Mamba-2 engine has (its prefill chunking and bf16-dot switch)
//! is refused by name. [`load_model`] is also how `eval` and `serve` open such a checkpoint.

use std::io::IsTerminal as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use stablegraph::models::family::{self, CausalLm};
use stablegraph::models::GenerateOptions;
use stablegraph::runtime::Client;
use stablegraph::DType;

use crate::bench::{median, print_row};
use crate::generate::{
    cut_at_eos, describe_settings, dump_logits, print_stream, settings_json, Shown, STREAM_SEGMENT,
};
use crate::load::{Bf16Dots, ModelArgs, PromptArgs, SamplingArgs, Source};
use crate::text::Codec;
use crate::{ids_text, peak_rss_mb, progress, seconds, write_run_json};

/// The `generate` flags besides the model, prompt and sampling ones.
pub(crate) struct Outputs<'a> {
    /// `--stream`.
    pub(crate) stream: bool,
    /// `--no-stream`.
    pub(crate) no_stream: bool,
    /// `--state-in FILE`.
    pub(crate) state_in: Option<&'a Path>,
    /// `--state-out FILE`.
    pub(crate) state_out: Option<&'a Path>,
    /// `--json FILE`.
    pub(crate) json: Option<&'a Path>,
    /// `--dump-logits FILE`.
    pub(crate) dump_logits: Option<&'a Path>,
}

/// The flags' check: the Mamba-2-only ones are an error naming them.
fn refuse(family: &str, m: &ModelArgs) -> Result<()> {
    let mut given: Vec<&str> = Vec::new();
    let set = [
        (m.prefill_chunk.is_some(), "--prefill-chunk"),
        (!matches!(m.bf16_dots, Bf16Dots::Auto), "--bf16-dots"),
    ];
    given.extend(set.iter().filter(|(on, _)| *on).map(|(_, name)| *name));
    if !given.is_empty() {
        bail!(
            "{family} checkpoints do not take {} yet (only Mamba-2's engine has them)",
            given.join(", ")
        );
    }
    Ok(())
}

/// The family of the checkpoint in `dir` by its `model_type` (for the refusal message).
fn family_name(dir: &Path) -> &'static str {
    match crate::load::model_type(dir).ok().flatten().as_deref() {
        Some("falcon_mamba") => "Falcon-Mamba",
        Some("bamba") => "Bamba",
        Some("granitemoehybrid") => "Granite 4.0-H",
        Some("nemotron_h") => "Nemotron-H",
        _ => "Mamba-1",
    }
}

/// A checkpoint of another family than Mamba-2, opened with the flags' prompts and options.
struct Opened {
    client: Client,
    model: Box<dyn CausalLm>,
    codec: Codec,
    prompts: Vec<Vec<u32>>,
    options: GenerateOptions,
    settings_from: Option<std::path::PathBuf>,
    description: String,
}

/// Loads the checkpoint in `dir` as the flags say (the Mamba-2-only ones refused by name): the
/// client, the model, and a line describing it.
pub(crate) fn load_model(dir: &Path, m: &ModelArgs) -> Result<(Client, Box<dyn CausalLm>, String)> {
    refuse(family_name(dir), m)?;
    crate::speak_as(family_name(dir));
    progress("loading the PJRT plugin");
    anyhow::ensure!(m.devices > 0, "--devices must be at least 1");
    let client = match (&m.plugin, m.devices) {
        (Some(path), _) => Client::from_plugin_path(path)?,
        (None, 1) => Client::cpu()?,
        (None, n) => Client::cpu_with_devices(n)?,
    };
    let dtype = m.dtype.dtype();
    progress(&format!("loading weights from {}", dir.display()));
    let parallel = m.parallel.kind();
    let model = family::load_parallel(&client, dir, dtype, parallel, m.devices)
        .with_context(|| format!("--model {}", dir.display()))?;
    let mut description = describe(dir, model.as_ref(), dtype);
    if m.devices > 1 {
        description.push_str(&format!(
            ", over {} devices by {}",
            m.devices,
            parallel.name()
        ));
    }
    Ok((client, model, description))
}

/// Opens the checkpoint in `dir` as the flags say (the Mamba-2-only ones refused by name).
fn open(dir: &Path, m: &ModelArgs, p: &PromptArgs, s: &SamplingArgs) -> Result<Opened> {
    let (client, model, description) = load_model(dir, m)?;
    let vocab = model.vocab_size();
    let codec = Codec::for_model(Some(dir), vocab)?;
    let prompts = p.prompts(&codec, vocab)?;
    let source = Source::Checkpoint {
        dir: dir.to_path_buf(),
        shipped: false,
    };
    let (options, settings_from) = s.options_for(&source, vocab)?;
    Ok(Opened {
        client,
        model,
        codec,
        prompts,
        options,
        settings_from,
        description,
    })
}

/// `emit --model DIR` for another family: the prefill, step and generate programs' text.
pub(crate) fn emit(
    dir: &Path,
    m: &ModelArgs,
    p: &PromptArgs,
    s: &SamplingArgs,
    out_dir: &Path,
) -> Result<()> {
    let o = open(dir, m, p, s)?;
    let face = Face {
        model: o.model.as_ref(),
        codec: &o.codec,
        prompts: &o.prompts,
        options: &o.options,
        settings_from: o.settings_from.as_deref(),
        description: &o.description,
    };
    emit_face(&face, out_dir)
}

/// Writes the prefill, step and generate programs' text of a model of any family to `out_dir`.
pub(crate) fn emit_face(l: &Face, out_dir: &Path) -> Result<()> {
    progress("lowering the programs");
    let texts = l.model.stablehlo(l.prompts, l.options)?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    for (name, text) in ["prefill", "step", "generate"].iter().zip(&texts) {
        let path = out_dir.join(format!("{name}.mlir"));
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("{} ({} lines)", path.display(), text.lines().count());
    }
    println!(
        "{}: batch {}, longest prompt {}, {} new tokens",
        l.description,
        l.prompts.len(),
        l.prompts.iter().map(Vec::len).max().unwrap_or(0),
        l.options.max_new_tokens
    );
    Ok(())
}

/// One timed run: prefill tokens/s, and decode tokens/s and ms per token when measurable.
type Run = (f64, Option<f64>, Option<f64>);

/// `bench --model DIR` for another family: after a compiling run, `repeat` timed runs of the
/// prefill (a one-token generation: the logits of the last position only) and the whole
/// generation, one program each; prefill tokens/s, decode tokens/s and ms per token (the
/// generation less the prefill, over its steps), and their medians.
pub(crate) fn bench(
    dir: &Path,
    m: &ModelArgs,
    p: &PromptArgs,
    s: &SamplingArgs,
    repeat: usize,
    json_path: Option<&Path>,
) -> Result<()> {
    let o = open(dir, m, p, s)?;
    let one = GenerateOptions {
        max_new_tokens: 1,
        ..o.options.clone()
    };
    progress("compiling and running the generate programs");
    let t = Instant::now();
    o.model.generate(&o.prompts, &one)?;
    o.model.generate(&o.prompts, &o.options)?;
    let first_s = seconds(t);
    let prompt_tokens: usize = o.prompts.iter().map(Vec::len).sum();
    let steps = o.options.max_new_tokens.saturating_sub(1);
    let mut runs: Vec<Run> = Vec::new();
    for i in 0..repeat {
        progress(&format!("timed run {}/{repeat}", i + 1));
        let t = Instant::now();
        o.model.generate(&o.prompts, &one)?;
        let prefill_s = seconds(t);
        let t = Instant::now();
        o.model.generate(&o.prompts, &o.options)?;
        let decode_s = (seconds(t) - prefill_s).max(0.0);
        let decode = (steps > 0 && decode_s > 0.0).then_some(decode_s);
        runs.push((
            prompt_tokens as f64 / prefill_s,
            decode.map(|d| (steps * o.prompts.len()) as f64 / d),
            decode.map(|d| d / steps as f64 * 1e3),
        ));
    }
    println!("model     {}", o.description);
    println!(
        "shape     {} row(s), {prompt_tokens} prompt tokens, {} new tokens per row",
        o.prompts.len(),
        o.options.max_new_tokens
    );
    println!(
        "{:<8} {:>14} {:>14} {:>14}",
        "run", "prefill tok/s", "decode tok/s", "ms per token"
    );
    for (i, r) in runs.iter().enumerate() {
        print_row(&(i + 1).to_string(), Some(r.0), r.1, r.2);
    }
    let med = |f: &dyn Fn(&Run) -> Option<f64>| median(runs.iter().filter_map(f).collect());
    let (p, d, ms) = (med(&|r| Some(r.0)), med(&|r| r.1), med(&|r| r.2));
    print_row("median", p, d, ms);
    println!("first     {first_s:.2} s (compiling both programs and running them)");
    if let Some(path) = json_path {
        let value = json!({
            "median": {"prefill_tokens_per_s": p, "decode_tokens_per_s": d, "ms_per_token": ms},
            "runs": runs.iter().map(|r| json!({
                "prefill_tokens_per_s": r.0, "decode_tokens_per_s": r.1, "ms_per_token": r.2,
            })).collect::<Vec<_>>(),
            "prompt_len": o.prompts.iter().map(Vec::len).collect::<Vec<_>>(),
            "max_new_tokens": o.options.max_new_tokens,
            "first_s": first_s,
            "compiles": o.client.cache_stats().compiles,
            "model": o.description,
            "settings": settings_json(&o.options, o.settings_from.as_deref()),
        });
        write_run_json(path, value, o.model.as_ref())?;
    }
    Ok(())
}

/// Runs `generate` for the checkpoint in `dir`.
pub(crate) fn generate(
    dir: &Path,
    m: &ModelArgs,
    p: &PromptArgs,
    s: &SamplingArgs,
    o: &Outputs,
) -> Result<()> {
    let Opened {
        client,
        model,
        codec,
        prompts,
        options,
        settings_from,
        description,
    } = open(dir, m, p, s)?;
    let loaded = Face {
        model: model.as_ref(),
        codec: &codec,
        prompts: &prompts,
        options: &options,
        settings_from: settings_from.as_deref(),
        description: &description,
    };
    if o.state_in.is_some() || o.state_out.is_some() {
        return with_state_files(&loaded, o);
    }
    let terminal = std::io::stdout().is_terminal() && codec.is_text();
    if o.stream || (terminal && !o.no_stream && prompts.len() == 1) {
        let shown = Shown {
            codec: &codec,
            prompts: &prompts,
            description: &description,
            settings: describe_settings(&options, settings_from.as_deref()),
        };
        return print_stream(&shown, options.eos, |on_tokens| {
            model
                .generate_stream(&prompts, &options, STREAM_SEGMENT, on_tokens)
                .map_err(Into::into)
        });
    }
    progress("compiling and running the prefill and generate programs");
    let t = Instant::now();
    let logits = model.prefill_logits(&prompts)?;
    model.generate(&prompts, &options)?;
    let first_s = seconds(t);
    let t = Instant::now();
    model.prefill_logits(&prompts)?;
    let prefill_s = seconds(t);
    let t = Instant::now();
    let tokens = model.generate(&prompts, &options)?;
    let generate_s = seconds(t);
    let tokens = cut_at_eos(tokens, options.eos);
    if let Some(path) = o.dump_logits {
        let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
        dump_logits(path, &logits, &lens)?;
    }
    print_rows(&codec, &tokens)?;
    let timings = Timings {
        first_s,
        prefill_s,
        generate_s,
        steps: s.max_new_tokens.saturating_sub(1),
    };
    let settings = Settings {
        text: describe_settings(&options, settings_from.as_deref()),
        json: settings_json(&options, settings_from.as_deref()),
        max_new_tokens: options.max_new_tokens,
    };
    report(&loaded, &client, &tokens, &timings, &settings, o)
}

/// What `generate` and `emit` work with once a model of any family is loaded: the model on
/// the engine's face, its text, the prompts and the options.
pub(crate) struct Face<'a> {
    pub(crate) model: &'a dyn CausalLm,
    pub(crate) codec: &'a Codec,
    pub(crate) prompts: &'a [Vec<u32>],
    pub(crate) options: &'a GenerateOptions,
    pub(crate) settings_from: Option<&'a Path>,
    pub(crate) description: &'a str,
}

/// `generate --state-in/--state-out`: one generation from the given state file (or none),
/// writing the state after it.
pub(crate) fn with_state_files(l: &Face, o: &Outputs) -> Result<()> {
    progress("compiling and running generate from the state");
    let t = Instant::now();
    let tokens = l
        .model
        .generate_with_state_files(l.prompts, l.options, o.state_in, o.state_out)
        .context("generate")?;
    let taken = seconds(t);
    let tokens = cut_at_eos(tokens, l.options.eos);
    print_rows(l.codec, &tokens)?;
    println!("model     {}", l.description);
    println!(
        "settings  {}",
        describe_settings(l.options, l.settings_from)
    );
    println!(
        "generate  {} prompt tokens and {} new in {taken:.2} s (compile included)",
        l.prompts.iter().map(Vec::len).sum::<usize>(),
        tokens.iter().map(Vec::len).sum::<usize>()
    );
    if let Some(path) = o.state_in {
        println!("state     continued from {}", path.display());
    }
    if let Some(path) = o.state_out {
        println!("state     written to {}", path.display());
    }
    if let Some(path) = o.json {
        let value = json!({
            "tokens": tokens,
            "model": l.description,
            "settings": settings_json(l.options, l.settings_from),
        });
        write_run_json(path, value, l.model)?;
    }
    Ok(())
}

/// One line on the model.
fn describe(dir: &Path, model: &dyn CausalLm, dtype: DType) -> String {
    format!(
        "{} ({}): {}, {} matrices",
        dir.display(),
        model.family(),
        model.describe(),
        crate::load::dtype_name(dtype)
    )
}

/// How tokens were picked, for people and for `--json`.
struct Settings {
    text: String,
    json: serde_json::Value,
    max_new_tokens: usize,
}

/// The timed runs: the first (compiling), the prefill alone, and the whole generation.
struct Timings {
    first_s: f64,
    prefill_s: f64,
    generate_s: f64,
    /// Steps in the whole run (the first new token comes from the prefill).
    steps: usize,
}

/// Prints the figures and writes `--json`.
fn report(
    l: &Face,
    client: &Client,
    tokens: &[Vec<u32>],
    t: &Timings,
    settings: &Settings,
    o: &Outputs,
) -> Result<()> {
    let prompt_tokens: usize = l.prompts.iter().map(Vec::len).sum();
    let (steps, prefill_s) = (t.steps, t.prefill_s);
    let decode_s = t.generate_s - prefill_s;
    let decode_tps =
        (steps > 0 && decode_s > 0.0).then(|| (steps * l.prompts.len()) as f64 / decode_s);
    // The first run compiled both programs, prefilled, and generated.
    let step_s = if steps > 0 {
        decode_s / steps as f64
    } else {
        0.0
    };
    let compile_s = (t.first_s - prefill_s - t.generate_s).max(0.0);
    println!("model     {}", l.description);
    println!(
        "settings  {}; one program (prefill and a device-side decode loop)",
        settings.text
    );
    println!(
        "prompt    {} row(s), {prompt_tokens} tokens in all",
        l.prompts.len()
    );
    println!(
        "compile   {compile_s:.2} s (first prefill and generation {:.2} s)",
        t.first_s
    );
    println!(
        "prefill   {prompt_tokens} tokens in {prefill_s:.3} s: {:.1} tokens/s",
        prompt_tokens as f64 / prefill_s
    );
    match decode_tps {
        Some(tps) => println!(
            "decode    {steps} steps in {decode_s:.3} s: {tps:.1} tokens/s, {:.2} ms per step",
            step_s * 1e3
        ),
        None => println!("decode    too fast to separate from the prefill"),
    }
    let peak = peak_rss_mb();
    if let Some(mb) = peak {
        println!("memory    peak RSS {mb:.0} MB");
    }
    if let Some(path) = o.json {
        let value = json!({
            "tokens": tokens,
            "prompt_len": l.prompts.iter().map(Vec::len).collect::<Vec<_>>(),
            "prefill_tokens_per_s": prompt_tokens as f64 / prefill_s,
            "decode_tokens_per_s": decode_tps,
            "compile_s": compile_s,
            "compiles": client.cache_stats().compiles,
            "prefill_s": prefill_s,
            "generate_s": t.generate_s,
            "max_new_tokens": settings.max_new_tokens,
            "model": l.description,
            "settings": settings.json,
        });
        write_run_json(path, value, l.model)?;
    }
    Ok(())
}

/// Prints each row's tokens as text (or ids).
fn print_rows(codec: &Codec, tokens: &[Vec<u32>]) -> Result<()> {
    for (r, row) in tokens.iter().enumerate() {
        let shown = match codec.decode(row)? {
            Some(text) => format!("{text:?}"),
            None => ids_text(row),
        };
        println!("row {r:<5} {shown}");
    }
    Ok(())
}
