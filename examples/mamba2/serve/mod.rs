//! `serve`: an OpenAI-compatible HTTP server over the continuous-batching scheduler
//! (`stablegraph::serving`). The engine thread ([`engine`]) owns the model and the scheduler;
//! the HTTP handlers (tokio + axum) parse requests (`stablegraph::serving::openai`), turn tokens into text
//! ([`output`]) and stream them; [`metrics`] counts.

mod answer;
mod engine;
mod http;
mod metrics;
mod output;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use stablegraph::serving::chat::ChatTemplate;
use stablegraph::serving::{Scheduler, SchedulerOptions, SlotModel};

use crate::load::{ModelArgs, Source};
use crate::progress;
use crate::text::Codec;
use metrics::Metrics;
use stablegraph::sampling::GenerationConfig;

/// The flags of `serve`.
#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stdout).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests decoded at once: the rows of the compiled segment program.
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Decode steps per segment; requests join and leave between segments (a new request
    /// waits for the segment under way; more steps per call cost less per token).
    #[arg(long, default_value_t = 4)]
    segment: usize,
    /// Requests waiting for a slot; more are answered 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// The longest prompt taken, in tokens.
    #[arg(long, default_value_t = 2048)]
    max_prompt: usize,
    /// The most new tokens a request may ask for.
    #[arg(long, default_value_t = 2048)]
    max_tokens: usize,
    /// Prompts prefilled together at most (those of one length bucket).
    #[arg(long, default_value_t = 4)]
    prefill_batch: usize,
    /// Longer prompts are prefilled in pieces of this many tokens, one piece per segment, so
    /// that the requests decoding meanwhile wait for a piece, not a whole prompt.
    #[arg(long, default_value_t = 128)]
    prompt_piece: usize,
    /// A request ends at this token (not returned).
    #[arg(long, value_name = "ID")]
    eos: Option<u32>,
    /// The most tokens of prompt and generation one request may hold (default: --max-prompt
    /// plus --max-tokens); a model with attention keeps a key/value cache of that many
    /// tokens (and room for padding) per slot. Longer requests are answered 400.
    #[arg(long, value_name = "N")]
    max_context: Option<usize>,
    /// The tokens of prompt and generation all slots' key/value caches hold together (a
    /// transformer or hybrid keeps them in pages of 16 columns shared by the slots): a request
    /// waits until its prompt and max_tokens fit beside the running ones, so --slots times
    /// --max-context need not all be backed by memory. Default: every slot its whole context.
    #[arg(long, value_name = "N")]
    kv_tokens: Option<usize>,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health (also read from
    /// STABLEGRAPH_API_KEY).
    #[arg(
        long,
        value_name = "KEY",
        env = "STABLEGRAPH_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// Device memory for the prefix state cache, in MiB (0: off): the state after each whole
    /// --prompt-piece of a prompt is kept, and a request whose prompt starts with a kept prefix
    /// prefills only the rest (the same tokens as without the cache).
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    prefix_cache_mb: usize,
    /// Prefill rides with decode (Mamba-2): a step feeds a group of prompt pieces and takes
    /// one decode step for the other slots in one program call. By default (and for other
    /// families) pieces run between decode segments, which measured faster on CPU.
    #[arg(long)]
    mixed: bool,
    /// The largest request body, in bytes; larger ones are refused before they are read.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
}

/// What the handlers share.
pub(crate) struct Shared {
    commands: std::sync::mpsc::Sender<engine::Command>,
    metrics: Arc<Metrics>,
    codec: Codec,
    /// The checkpoint's chat template, if it has one.
    template: Option<ChatTemplate>,
    /// Tokens that end a reply (the checkpoint's `eos_token_id`s), cut on the host.
    stop_ids: Vec<u32>,
    /// The most new tokens a request may ask for.
    max_tokens: usize,
    /// The tokens of prompt and generation one request may hold.
    context: usize,
    model_id: String,
    api_key: Option<String>,
    max_body: usize,
    /// Set on SIGTERM: new requests are refused.
    draining: AtomicBool,
    /// Numbers replies and seeds sampled requests that name no seed.
    counter: AtomicU64,
    /// The server's start (Unix seconds), as `created` of the model.
    started: u64,
}

impl Shared {
    fn next(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn serve(a: ServeArgs) -> Result<()> {
    let options = SchedulerOptions {
        slots: a.slots,
        segment: a.segment,
        max_queue: a.max_queue,
        prefill_batch: a.prefill_batch,
        prompt_piece: a.prompt_piece,
        max_prompt: a.max_prompt,
        max_tokens: a.max_tokens,
        eos: a.eos,
        max_context: a.max_context,
        prefix_cache_bytes: a.prefix_cache_mb.saturating_mul(1 << 20),
        mixed: a.mixed,
        kv_tokens: a.kv_tokens,
    };
    let opened = a.model.open_any(false)?;
    let (template, stop_ids) = chat_setup(&opened.source)?;
    let context = options.context();
    let (model, codec) = (opened.model, opened.codec);
    let (model_id, description) = (opened.id, opened.description);
    eprintln!("{}: {description}", crate::speaker());
    let mut scheduler = Scheduler::new(model, options).context("starting the scheduler")?;
    progress("compiling the prefill, insert and segment programs");
    let t = std::time::Instant::now();
    let settings = scheduler.warm_up()?;
    eprintln!(
        "{}: serve: {} programs for {settings} prompt buckets x prefill groups in {:.1} s",
        crate::speaker(),
        scheduler.model().programs_compiled(),
        crate::seconds(t)
    );
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let engine_metrics = metrics.clone();
    let engine = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || engine::run(scheduler, rx, engine_metrics))
        .context("starting the engine thread")?;
    let shared = Arc::new(Shared {
        commands: tx,
        metrics,
        codec,
        template,
        stop_ids,
        max_tokens: a.max_tokens,
        context,
        model_id,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        max_body: a.max_body,
        draining: AtomicBool::new(false),
        counter: AtomicU64::new(unix_now()),
        started: unix_now(),
    });
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .with_context(|| format!("--host {} --port {}", a.host, a.port))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(http::listen(shared, addr))?;
    // The handlers are gone and with them the command channel: the engine finishes and ends.
    engine
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    eprintln!("{}: serve: stopped", crate::speaker());
    Ok(())
}

/// The chat template and the end-of-reply tokens of the checkpoint `source` names (none for
/// random weights): its template ([`ChatTemplate::for_checkpoint`]) and its
/// generation_config.json's `eos_token_id`s.
fn chat_setup(source: &Source) -> Result<(Option<ChatTemplate>, Vec<u32>)> {
    let Source::Checkpoint { dir, .. } = source else {
        return Ok((None, Vec::new()));
    };
    let template = ChatTemplate::for_checkpoint(dir)?;
    let config = dir.join("generation_config.json");
    let stop_ids = match config.is_file() {
        true => GenerationConfig::from_file(&config)?
            .eos_token_id
            .unwrap_or_default(),
        false => Vec::new(),
    };
    Ok((template, stop_ids))
}
