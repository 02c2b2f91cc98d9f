//! What a [`super::Scheduler`] takes and tells: requests, its options, why a request was
//! refused or ended, the events of a step, and its counts.

use super::StepLogprobs;
use crate::sampling::{Penalties, Sampling};

/// A request's number, unique within a [`Scheduler`](super::Scheduler).
pub type RequestId = u64;

/// What a client asks for. [`Request::default`] is an empty prompt, 16 tokens, greedy, and
/// no penalties, bias or log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The prompt's tokens (at least one).
    pub prompt: Vec<u32>,
    /// The most new tokens (at least one).
    pub max_tokens: usize,
    /// Token choice; a sampled request's seed makes its tokens the same whatever else runs.
    pub sampling: Sampling,
    /// Penalties on the tokens of its context (prompt and generated), as `generate` applies
    /// them ([`Penalties`]).
    pub penalties: Penalties,
    /// (token, bias) added to the logits before each token is picked.
    pub logit_bias: Vec<(u32, f32)>,
    /// Report each generated token's log-probability and the most likely tokens'
    /// ([`Event::Tokens`]).
    pub logprobs: bool,
}

impl Default for Request {
    fn default() -> Request {
        Request {
            prompt: Vec::new(),
            max_tokens: 16,
            sampling: Sampling::Greedy,
            penalties: Penalties::NONE,
            logit_bias: Vec::new(),
            logprobs: false,
        }
    }
}

impl Request {
    /// Whether it needs the segment program with penalties, biases and log-probabilities.
    pub(crate) fn needs_extras(&self) -> bool {
        self.logprobs || !self.logit_bias.is_empty() || !self.penalties.is_off()
    }
}

/// The scheduler's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerOptions {
    /// The rows of the segment program: how many requests decode at once.
    pub slots: usize,
    /// The most decode steps per segment call; requests join and leave between calls.
    pub segment: usize,
    /// The most requests waiting for a slot; more are refused ([`SubmitError::QueueFull`]).
    pub max_queue: usize,
    /// The most prompts prefilled in one call (rounded down to a power of two).
    pub prefill_batch: usize,
    /// Longer prompts are fed in pieces of this many tokens, one piece per step, so that the
    /// rows decoding meanwhile wait for one piece at a time, not a whole prompt.
    pub prompt_piece: usize,
    /// The longest prompt taken, in tokens.
    pub max_prompt: usize,
    /// The most new tokens a request may ask for.
    pub max_tokens: usize,
    /// A request ends when it emits this token (which is not returned).
    pub eos: Option<u32>,
    /// The most tokens of prompt and generation one request may hold (a model with attention
    /// keeps that many keys and values per slot); `None`: `max_prompt + max_tokens`. A request
    /// whose prompt and `max_tokens` need more is refused.
    pub max_context: Option<usize>,
    /// The device memory the prefix state cache may hold, in bytes (0: no cache). After each
    /// whole piece of a prompt (`prompt_piece` tokens) the slot's state is kept, keyed by the
    /// tokens before it; a request whose prompt starts with a kept prefix starts from its state
    /// and prefills only the rest. The tokens are those without the cache.
    pub prefix_cache_bytes: usize,
    /// Prefill rides with decode where the model can ([`super::SlotModel::mixes`]: Mamba-2): a
    /// step feeds one group of prompt pieces and takes one decode step for the other slots in
    /// one call, sharing its products. Else (the default: it measured slower on the CPU
    /// plugin, see docs/serving.md; and when a decoding slot asks for penalties, a bias or
    /// log-probabilities) a step prefills, then runs a segment.
    pub mixed: bool,
    /// The tokens of prompt and generation all slots' caches hold together, for a model that
    /// keeps its attention caches in pages ([`super::SlotSize::pool`]): a request is admitted
    /// when its prompt and `max_tokens` fit in what the running ones leave, so many slots of a
    /// long context need not all be backed. `None`: every slot its whole context.
    pub kv_tokens: Option<usize>,
}

impl SchedulerOptions {
    /// The tokens of prompt and generation a slot holds: `max_context`, at most `max_prompt +
    /// max_tokens`.
    pub fn context(&self) -> usize {
        let most = self.max_prompt.saturating_add(self.max_tokens);
        self.max_context.map_or(most, |c| c.min(most))
    }

    /// What each slot holds: [`SchedulerOptions::context`] tokens, fed in pieces of up to
    /// `prompt_piece` (at most `max_prompt`).
    pub fn slot_size(&self) -> super::SlotSize {
        super::SlotSize {
            context: self.context(),
            piece: self.prompt_piece.min(self.max_prompt),
            pool: self.kv_tokens,
        }
    }
}

impl Default for SchedulerOptions {
    /// 8 slots, segments of 4 steps, 64 queued, prefill 4 at a time in pieces of up to 128
    /// tokens, prompts up to 2,048 tokens and up to 2,048 new tokens, no `eos`, a context of
    /// both, a prefix cache of 1 GiB, prefill alternating with decode, caches for every slot's
    /// whole context.
    fn default() -> Self {
        SchedulerOptions {
            slots: 8,
            segment: 4,
            max_queue: 64,
            prefill_batch: 4,
            prompt_piece: 128,
            max_prompt: 2048,
            max_tokens: 2048,
            eos: None,
            max_context: None,
            prefix_cache_bytes: 1 << 30,
            mixed: false,
            kv_tokens: None,
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue holds [`SchedulerOptions::max_queue`] requests already.
    QueueFull,
    /// The request is malformed.
    Invalid {
        /// The field at fault (`prompt`, `max_tokens`, `n`, `logit_bias`, `penalties`,
        /// `sampling`).
        field: &'static str,
        /// What was wrong, naming the field.
        message: String,
    },
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::QueueFull => write!(f, "the queue is full; retry later"),
            SubmitError::Invalid { message, .. } => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for SubmitError {}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// It made `max_tokens` tokens.
    Length,
    /// It emitted `eos`.
    Eos,
}

/// What happened to a request during a [`Scheduler::step`](super::Scheduler::step).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Its prompt is in a slot (prefilled, or in part taken from the prefix cache).
    Started {
        /// The request.
        id: RequestId,
        /// The prompt's tokens whose state came from the prefix cache, or, for the choices of
        /// a request for several after the first, from the first's slot.
        cached: usize,
    },
    /// New tokens (never empty).
    Tokens {
        /// The request.
        id: RequestId,
        /// The tokens, in order.
        tokens: Vec<u32>,
        /// Each token's log-probabilities, when the request asked for them (else empty).
        logprobs: Vec<StepLogprobs>,
    },
    /// It ended; its slot is free.
    Finished {
        /// The request.
        id: RequestId,
        /// Why.
        reason: FinishReason,
    },
    /// The model failed while it was queued or decoding; it is gone.
    Failed {
        /// The request.
        id: RequestId,
        /// The model's error.
        error: String,
    },
}

/// Counts since the scheduler started, and where it stands.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerStats {
    /// Requests waiting for a slot.
    pub queued: usize,
    /// Slots decoding a request.
    pub active: usize,
    /// Segment calls run.
    pub segments: u64,
    /// Prefill calls run (mixed calls included).
    pub prefills: u64,
    /// Calls in which prefill rode with decode (each also counted as a segment and a
    /// prefill).
    pub mixed: u64,
    /// Prompt tokens prefilled.
    pub prompt_tokens: u64,
    /// Tokens generated and returned.
    pub generated_tokens: u64,
    /// Requests whose prompt started with a cached prefix.
    pub prefix_hits: u64,
    /// Requests with a whole block of prompt whose prompt started with no cached prefix.
    pub prefix_misses: u64,
    /// Cached states dropped to make room.
    pub prefix_evictions: u64,
    /// The device memory the cached states hold, in bytes.
    pub prefix_bytes: usize,
    /// The cached states.
    pub prefix_entries: usize,
    /// Prompt tokens taken from the cache instead of prefilled.
    pub cached_tokens: u64,
}
