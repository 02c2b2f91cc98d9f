//! `generate`: tokens after the prompts, with throughput; streamed, or from and to a state.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use serde_json::json;
use stablegraph::models::mamba2::Sampling;
use stablegraph::models::GenerateOptions;
use stablegraph::HostArray;

use crate::family;
use crate::load::{ModelArgs, PromptArgs, SamplingArgs};
use crate::open::{load, Loaded};
use crate::text::Codec;
use crate::{cache_hits, ids_text, peak_rss_mb, progress, seconds, write_run_json};

/// The flags of `generate`.
#[derive(Args)]
pub(crate) struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Write {"tokens": [[new tokens of each row]], "prompt_len", "prefill_tokens_per_s",
    /// "decode_tokens_per_s", "compile_s", "compiles" (XLA compiles this process ran),
    /// "cache_hits", "peak_rss_mb", ...} to FILE (rows cut after --eos).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the prompt logits to FILE.npy as float32 [batch, L, vocab], L the longest prompt:
    /// row r's prompt fills its last prompt_len[r] positions, the positions before it (left
    /// padding of a shorter prompt) are 0.
    #[arg(long, value_name = "FILE")]
    dump_logits: Option<PathBuf>,
    /// Print the text as it is produced (segments of 16 tokens; one row, with a tokenizer or
    /// a byte vocabulary). Default: on when stdout is a terminal and the tokens are text (a
    /// tokenizer or a byte vocabulary). Streaming runs generate
    /// once (compile included) and prints no throughput; use `bench` for figures.
    #[arg(long, conflicts_with = "no_stream")]
    stream: bool,
    /// Never stream (print the rows at the end, with timings).
    #[arg(long)]
    no_stream: bool,
    /// Continue from the state in FILE (written by --state-out; one row per prompt): the
    /// prompt is fed after whatever made it, e.g. the next turn of a conversation.
    #[arg(long, value_name = "FILE")]
    state_in: Option<PathBuf>,
    /// Write the state after the prompt and the generated tokens to FILE (safetensors), for
    /// a later --state-in. With --state-in or --state-out, generate runs once (compile
    /// included) and prints no throughput.
    #[arg(long, value_name = "FILE")]
    state_out: Option<PathBuf>,
}

/// Each row's tokens up to and including its first `eos`.
pub(crate) fn cut_at_eos(rows: Vec<Vec<u32>>, eos: Option<u32>) -> Vec<Vec<u32>> {
    rows.into_iter()
        .map(|mut row| {
            if let Some(end) = eos.and_then(|e| row.iter().position(|&t| t == e)) {
                row.truncate(end + 1);
            }
            row
        })
        .collect()
}

/// One timed prefill and one timed generate, both already compiled; with `streamed`, the
/// seconds and the steps of a stream's segments after its first (decode steps alone).
pub(crate) struct Timed {
    pub(crate) prefill_s: f64,
    pub(crate) generate_s: f64,
    pub(crate) streamed: Option<(f64, usize)>,
    pub(crate) tokens: Vec<Vec<u32>>,
}

impl Timed {
    /// Times one prefill and one generate; with `stream_too`, also a stream of the same
    /// tokens timed from its first segment's end to its last's: the decode steps alone (a
    /// generate less a separate prefill mixes two programs, and past a few thousand tokens of
    /// prompt their difference is noise).
    pub(crate) fn run(l: &Loaded, options: &GenerateOptions, stream_too: bool) -> Result<Timed> {
        let t = Instant::now();
        drop(l.model.prefill_last(&l.prompts).context("prefill")?);
        let prefill_s = seconds(t);
        let t = Instant::now();
        let tokens = l.model.generate(&l.prompts, options).context("generate")?;
        let generate_s = seconds(t);
        let streamed = match stream_too {
            true => streamed_steps(l, options)?,
            false => None,
        };
        Ok(Timed {
            prefill_s,
            generate_s,
            streamed,
            tokens: cut_at_eos(tokens, options.eos),
        })
    }

    pub(crate) fn generated(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }

    /// The seconds of the decode steps: the stream's after its first segment, else the
    /// generate's less the prefill's.
    pub(crate) fn decode_s(&self) -> Option<f64> {
        match self.streamed {
            Some((s, _)) => Some(s),
            None => Some(self.generate_s - self.prefill_s),
        }
        .filter(|&d| d > 0.0)
    }

    /// The tokens of the steps [`Timed::decode_s`] times (all rows).
    fn decoded(&self) -> usize {
        match self.streamed {
            Some((_, steps)) => steps * self.tokens.len(),
            None => self.generated(),
        }
    }

    pub(crate) fn prefill_tps(&self, prompt_tokens: usize) -> f64 {
        prompt_tokens as f64 / self.prefill_s
    }

    pub(crate) fn decode_tps(&self) -> Option<f64> {
        let n = self.decoded();
        self.decode_s().filter(|_| n > 0).map(|d| n as f64 / d)
    }

    /// Milliseconds per decode step (the longest row's steps).
    pub(crate) fn ms_per_token(&self) -> Option<f64> {
        let longest = self.tokens.iter().map(Vec::len).max().unwrap_or(0);
        let steps = match self.streamed {
            Some((_, steps)) => steps,
            None => longest,
        };
        self.decode_s()
            .filter(|_| steps > 0)
            .map(|d| 1e3 * d / steps as f64)
    }
}

/// The segment of the timed streams: the first holds the prefill, the rest decode steps only.
const TIMED_SEGMENT: usize = 16;

/// A stream of `options` in segments of [`TIMED_SEGMENT`] steps, timed from the end of its
/// first segment to its last: the seconds and the steps between (`None` when the generation
/// is one segment long, or a row stopped early).
fn streamed_steps(l: &Loaded, options: &GenerateOptions) -> Result<Option<(f64, usize)>> {
    let mut first: Option<(Instant, usize)> = None;
    let mut on_tokens = |rows: &[Vec<u32>]| {
        if first.is_none() {
            first = Some((Instant::now(), rows.iter().map(Vec::len).max().unwrap_or(0)));
        }
        true
    };
    let tokens = l
        .model
        .generate_stream(&l.prompts, options, TIMED_SEGMENT, &mut on_tokens)
        .context("generate (streamed)")?;
    let end = Instant::now();
    let longest = tokens.iter().map(Vec::len).max().unwrap_or(0);
    let full = tokens.iter().all(|r| r.len() == longest);
    Ok(first
        .filter(|&(_, n)| full && longest > n)
        .map(|(t, n)| ((end - t).as_secs_f64(), longest - n)))
}

/// Runs generate and prefill once each (compiling them; with `stream_too`, a timed stream's
/// programs too); returns the first generate's time and whether its program came from the
/// disk cache.
pub(crate) fn warm_up(
    l: &Loaded,
    options: &GenerateOptions,
    stream_too: bool,
) -> Result<(f64, bool)> {
    let (batch, bucket) = l.shape();
    progress(&format!(
        "compiling and running generate ({batch} x {bucket} prompt positions, {} new tokens)",
        options.max_new_tokens
    ));
    let before = l.client.cache_stats();
    let t = Instant::now();
    l.model.generate(&l.prompts, options).context("generate")?;
    let first_s = seconds(t);
    let cached = l.client.cache_stats().disk_hits > before.disk_hits;
    progress("compiling and running prefill");
    drop(l.model.prefill_last(&l.prompts).context("prefill")?);
    if stream_too {
        streamed_steps(l, options)?;
    }
    Ok((first_s, cached))
}

/// `generate`.
pub(crate) fn generate(a: GenerateArgs) -> Result<()> {
    let l = load(&a.model, &a.prompt, &a.sampling, false)?;
    let options = l.options.clone();
    if a.state_in.is_some() || a.state_out.is_some() {
        let outputs = family::Outputs {
            state_in: a.state_in.as_deref(),
            state_out: a.state_out.as_deref(),
            json: a.json.as_deref(),
        };
        return family::with_state_files(&l.face(), &outputs);
    }
    let terminal = std::io::stdout().is_terminal() && l.codec.is_text();
    if a.stream || (terminal && !a.no_stream && l.prompts.len() == 1) {
        return generate_streamed(&l, &options);
    }
    let (first_s, cached) = warm_up(&l, &options, false)?;
    if let Some(path) = &a.dump_logits {
        progress("prefill with the logits at every position");
        let all = l.model.prefill_logits(&l.prompts).context("prefill")?;
        let lens: Vec<usize> = l.prompts.iter().map(Vec::len).collect();
        dump_logits(path, &all, &lens)?;
    }
    let run = Timed::run(&l, &options, false)?;
    let compile_s = first_s - run.generate_s;
    let prompt_tokens = l.prompt_tokens();
    let peak = peak_rss_mb();

    print_rows(&l.codec, &run.tokens)?;
    let (batch, bucket) = l.shape();
    println!("model     {}", l.description);
    println!(
        "settings  {}",
        describe_settings(&l.options, l.settings_from.as_deref())
    );
    l.print_devices();
    println!("prompt    {batch} row(s), {prompt_tokens} tokens in all (padded to {bucket})");
    println!(
        "compile   {compile_s:.2} s (first generate {first_s:.2} s - second {:.2} s; {})",
        run.generate_s,
        if cached {
            "loaded from the compile cache"
        } else {
            "compiled"
        }
    );
    println!(
        "prefill   {prompt_tokens} tokens in {:.3} s: {:.1} tokens/s",
        run.prefill_s,
        run.prefill_tps(prompt_tokens)
    );
    match (run.decode_s(), run.decode_tps(), run.ms_per_token()) {
        (Some(d), Some(tps), Some(ms)) => println!(
            "decode    {} tokens in {d:.3} s: {tps:.1} tokens/s, {ms:.2} ms per step",
            run.generated()
        ),
        _ => println!("decode    too fast to separate from the prefill"),
    }
    if let Some(mb) = peak {
        println!("memory    peak RSS {mb:.0} MB");
    }

    if let Some(path) = &a.json {
        let value = json!({
            "tokens": run.tokens,
            "prompt_len": l.prompts.iter().map(Vec::len).collect::<Vec<_>>(),
            "prefill_tokens_per_s": run.prefill_tps(prompt_tokens),
            "decode_tokens_per_s": run.decode_tps(),
            "compile_s": compile_s,
            "compile_from_cache": cached,
            "compiles": l.client.cache_stats().compiles,
            "cache_hits": cache_hits(&l.client),
            "prefill_s": run.prefill_s,
            "generate_s": run.generate_s,
            "generated_tokens": run.generated(),
            "max_new_tokens": options.max_new_tokens,
            "model": l.description,
            "devices": l.devices,
            "parallel": l.parallel_name(),
            "weight_bytes_per_device": l.model.weight_bytes(),
            "settings": settings_json(&l.options, l.settings_from.as_deref()),
        });
        write_run_json(path, value, l.model.as_ref())?;
    }
    Ok(())
}

/// Prints each row's new tokens, as quoted text when there is a tokenizer or a byte vocabulary.
pub(crate) fn print_rows(codec: &Codec, rows: &[Vec<u32>]) -> Result<()> {
    for (r, row) in rows.iter().enumerate() {
        let text = codec
            .decode(row)
            .with_context(|| format!("decoding row {r}"))?;
        let shown = match text {
            Some(text) => format!("{text:?}"),
            None => ids_text(row),
        };
        println!("row {r:<5} {shown}");
    }
    Ok(())
}

/// Segment length of `generate --stream`.
pub(crate) const STREAM_SEGMENT: usize = 16;

/// `generate --stream`: prints the prompt's text, then the row's text (or ids) as its tokens
/// arrive.
fn generate_streamed(l: &Loaded, options: &GenerateOptions) -> Result<()> {
    let shown = Shown {
        codec: &l.codec,
        prompts: &l.prompts,
        description: &l.description,
        settings: describe_settings(&l.options, l.settings_from.as_deref()),
    };
    print_stream(&shown, options.eos, |on_tokens| {
        l.model
            .generate_stream(&l.prompts, options, STREAM_SEGMENT, on_tokens)
            .map_err(Into::into)
    })
}

/// What a streamed generation prints besides its tokens.
pub(crate) struct Shown<'a> {
    pub(crate) codec: &'a Codec,
    pub(crate) prompts: &'a [Vec<u32>],
    pub(crate) description: &'a str,
    pub(crate) settings: String,
}

/// Prints the prompt's text, then runs `stream` (a generation in segments of
/// [`STREAM_SEGMENT`] handing each segment's tokens to the callback it is given) and prints
/// the row's text (or ids) as its tokens arrive, then the model, settings and time.
pub(crate) fn print_stream(
    shown: &Shown,
    eos: Option<u32>,
    stream: impl FnOnce(&mut dyn FnMut(&[Vec<u32>]) -> bool) -> Result<Vec<Vec<u32>>>,
) -> Result<()> {
    ensure!(
        shown.prompts.len() == 1,
        "--stream prints one row; give one prompt (or --no-stream)"
    );
    progress("compiling and running prefill and the generate segment");
    let t = Instant::now();
    let mut all: Vec<u32> = Vec::new();
    let mut printed = String::new();
    let mut failure = None;
    let mut out = std::io::stdout();
    echo_prompt(shown.codec, &shown.prompts[0])?;
    let tokens = stream(&mut |fresh: &[Vec<u32>]| {
        all.extend(&fresh[0]);
        let text = match shown.codec.decode_settled(&all) {
            Ok(Some(text)) => text,
            Ok(None) => ids_text(&all) + ",",
            Err(e) => {
                failure = Some(e.context("decoding"));
                return false;
            }
        };
        // Print what is new; a decode that rewrote earlier text waits for the next one.
        if let Some(new) = text.strip_prefix(printed.as_str()) {
            print!("{new}");
            let _ = out.flush();
            printed = text;
        }
        true
    })
    .context("generate")?;
    if let Some(e) = failure {
        println!();
        return Err(e);
    }
    // What the last tokens settled (an incomplete UTF-8 tail is shown as U+FFFD now).
    if let Some(text) = shown.codec.decode(&all).context("decoding")? {
        if let Some(new) = text.strip_prefix(printed.as_str()) {
            print!("{new}");
        }
    }
    println!();
    let generated = cut_at_eos(tokens, eos)[0].len();
    println!("model     {}", shown.description);
    println!("settings  {}", shown.settings);
    println!(
        "generate  {} prompt tokens and {generated} new in {:.2} s, streamed in segments of \
         {STREAM_SEGMENT} (compile included)",
        shown.prompts[0].len(),
        seconds(t)
    );
    Ok(())
}

/// Prints the prompt's text before the streamed continuation (dimmed on a terminal), so that the
/// new text reads in its context; prints nothing for prompts that are not text.
fn echo_prompt(codec: &Codec, prompt: &[u32]) -> Result<()> {
    let Some(prompt) = codec.decode(prompt).context("decoding the prompt")? else {
        return Ok(());
    };
    if std::io::stdout().is_terminal() {
        print!("\x1b[2m{prompt}\x1b[0m");
    } else {
        print!("{prompt}");
    }
    Ok(())
}

/// The sampling and penalty settings in words, and where their defaults came from.
pub(crate) fn describe_settings(o: &GenerateOptions, from: Option<&Path>) -> String {
    let mut text = match o.sampling {
        Sampling::Greedy => "greedy".to_string(),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
            seed,
        } => {
            format!("sampled: temperature {temperature}, top-k {top_k}, top-p {top_p}, seed {seed}")
        }
    };
    let p = &o.penalties;
    let mut on = Vec::new();
    if p.repetition_penalty != 1.0 {
        on.push(format!("repeat penalty {}", p.repetition_penalty));
    }
    if p.presence_penalty != 0.0 {
        on.push(format!("presence penalty {}", p.presence_penalty));
    }
    if p.frequency_penalty != 0.0 {
        on.push(format!("frequency penalty {}", p.frequency_penalty));
    }
    if let (false, Some(n)) = (on.is_empty(), p.repeat_last_n) {
        on.push(format!("over the last {n} tokens"));
    }
    if p.no_repeat_ngram_size > 0 {
        on.push(format!("no repeated {}-grams", p.no_repeat_ngram_size));
    }
    if on.is_empty() {
        on.push("no penalties".into());
    }
    text = format!("{text}; {}", on.join(", "));
    if let Some(path) = from {
        let shown = path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(path);
        text.push_str(&format!(" (defaults from {})", shown.display()));
    }
    text
}

/// The settings used, as JSON (`sampling`, `penalties`, `generation_config`: the file whose
/// defaults they took, or null).
pub(crate) fn settings_json(o: &GenerateOptions, from: Option<&Path>) -> serde_json::Value {
    let sampling = match o.sampling {
        Sampling::Greedy => json!({ "mode": "greedy" }),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
            seed,
        } => json!({
            "mode": "sample",
            "temperature": short(temperature),
            "top_k": top_k,
            "top_p": short(top_p),
            "seed": seed,
        }),
    };
    let p = &o.penalties;
    json!({
        "sampling": sampling,
        "penalties": {
            "repetition_penalty": short(p.repetition_penalty),
            "presence_penalty": short(p.presence_penalty),
            "frequency_penalty": short(p.frequency_penalty),
            "repeat_last_n": p.repeat_last_n,
            "no_repeat_ngram_size": p.no_repeat_ngram_size,
        },
        "generation_config": from.map(|p| p.display().to_string()),
    })
}

/// An f32 as the f64 of its shortest decimal form (0.6, not 0.6000000238418579).
fn short(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// Writes the prompt logits `[batch, bucket, vocab]` (each row's `prompt_len` real positions at
/// its end) as `[batch, longest prompt, vocab]` f32, zero before a shorter prompt (see
/// `--dump-logits`).
pub(crate) fn dump_logits(path: &Path, logits: &HostArray, prompt_len: &[usize]) -> Result<()> {
    let logits = logits.as_array::<f32>()?;
    let logits = logits.as_standard_layout();
    let data = logits.as_slice().context("logits are not contiguous")?;
    let &[batch, bucket, vocab] = logits.shape() else {
        bail!("prefill logits have shape {:?}", logits.shape());
    };
    let longest = prompt_len.iter().copied().max().unwrap_or(0);
    let mut out = vec![0f32; batch * longest * vocab];
    for (r, &len) in prompt_len.iter().enumerate() {
        for p in longest - len..longest {
            let src = (r * bucket + bucket - longest + p) * vocab;
            let dst = (r * longest + p) * vocab;
            out[dst..dst + vocab].copy_from_slice(&data[src..src + vocab]);
        }
    }
    write_npy(path, &[batch, longest, vocab], &out)
        .with_context(|| format!("writing {}", path.display()))
}

/// NumPy `.npy` version 1.0: magic, header length, a dict padded to a multiple of 64, data.
fn write_npy(path: &Path, dims: &[usize], data: &[f32]) -> Result<()> {
    let shape = match dims {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            dims.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&u16::try_from(header.len())?.to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for x in data {
        f.write_all(&x.to_le_bytes())?;
    }
    f.flush()?;
    Ok(())
}
