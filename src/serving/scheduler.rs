//! The continuous-batching loop: a queue, a table of slots, and [`Scheduler::step`], which
//! admits queued requests into free slots and runs one segment.

use std::collections::VecDeque;

use super::{Segment, SlotModel};
use crate::error::{Error, Result};
use crate::sampling::Sampling;

/// A request's number, unique within a [`Scheduler`].
pub type RequestId = u64;

/// What a client asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The prompt's tokens (at least one).
    pub prompt: Vec<u32>,
    /// The most new tokens (at least one).
    pub max_tokens: usize,
    /// Token choice; a sampled request's seed makes its tokens the same whatever else runs.
    pub sampling: Sampling,
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
}

impl SchedulerOptions {
    /// The tokens of prompt and generation a slot holds: `max_context`, at most `max_prompt +
    /// max_tokens`.
    pub fn context(&self) -> usize {
        let most = self.max_prompt.saturating_add(self.max_tokens);
        self.max_context.map_or(most, |c| c.min(most))
    }
}

impl Default for SchedulerOptions {
    /// 8 slots, segments of 4 steps, 64 queued, prefill 4 at a time in pieces of up to 128
    /// tokens, prompts up to 2,048 tokens and up to 2,048 new tokens, no `eos`, a context of
    /// both.
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
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue holds [`SchedulerOptions::max_queue`] requests already.
    QueueFull,
    /// The request is malformed; the message names the field.
    Invalid(String),
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::QueueFull => write!(f, "the queue is full; retry later"),
            SubmitError::Invalid(why) => write!(f, "{why}"),
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

/// What happened to a request during a [`Scheduler::step`].
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Its prompt was prefilled into a slot.
    Started {
        /// The request.
        id: RequestId,
    },
    /// New tokens (never empty).
    Tokens {
        /// The request.
        id: RequestId,
        /// The tokens, in order.
        tokens: Vec<u32>,
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
    /// Prefill calls run.
    pub prefills: u64,
    /// Prompt tokens prefilled.
    pub prompt_tokens: u64,
    /// Tokens generated and returned.
    pub generated_tokens: u64,
}

/// A request in a slot.
#[derive(Debug)]
struct Running {
    id: RequestId,
    /// Tokens still to make.
    remaining: usize,
    /// It has made no token yet.
    fresh: bool,
    /// The rest of its prompt, still to prefill.
    pending: Vec<u32>,
    sampling: Sampling,
    key: [u32; 2],
}

/// Continuous batching over a [`SlotModel`]: [`Scheduler::submit`] queues a request,
/// [`Scheduler::step`] admits queued requests into free slots (prompts of one bucket prefilled
/// together) and runs one segment for every slot in use, returning what happened. A segment
/// right after an admission runs one step, so that new requests see their first token without
/// waiting for a whole segment.
pub struct Scheduler<M: SlotModel> {
    model: M,
    options: SchedulerOptions,
    /// `None` only after a model error that could not be recovered from.
    slots: Option<M::Slots>,
    table: Vec<Option<Running>>,
    queue: VecDeque<(RequestId, Request)>,
    next_id: RequestId,
    stats: SchedulerStats,
}

impl<M: SlotModel> Scheduler<M> {
    /// A scheduler over `model` with empty slots. Zero slots, segment steps, prefill batch,
    /// prompt or token limits, or an `eos` outside the vocabulary, are an error.
    pub fn new(model: M, options: SchedulerOptions) -> Result<Self> {
        let o = &options;
        let zero = [
            ("slots", o.slots),
            ("segment", o.segment),
            ("prefill_batch", o.prefill_batch),
            ("prompt_piece", o.prompt_piece),
            ("max_prompt", o.max_prompt),
            ("max_tokens", o.max_tokens),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, v)| *v == 0) {
            return Err(Error::InvalidArgument(format!(
                "SchedulerOptions.{name} is 0; it must be at least 1"
            )));
        }
        if o.segment > crate::models::MAX_NEW_TOKENS {
            return Err(Error::InvalidArgument(format!(
                "SchedulerOptions.segment ({}) is more than {}",
                o.segment,
                crate::models::MAX_NEW_TOKENS
            )));
        }
        let vocab = model.vocab_size();
        if let Some(e) = o.eos.filter(|&e| e as usize >= vocab) {
            return Err(Error::InvalidArgument(format!(
                "SchedulerOptions.eos ({e}) is outside the vocabulary of {vocab}"
            )));
        }
        model.prompt_bucket(o.max_prompt)?;
        if o.max_context == Some(0) {
            return Err(Error::InvalidArgument(
                "SchedulerOptions.max_context is 0; it must be at least 2".into(),
            ));
        }
        let slots = model.open_slots(o.slots, o.context())?;
        let table = (0..o.slots).map(|_| None).collect();
        Ok(Scheduler {
            model,
            options,
            slots: Some(slots),
            table,
            queue: VecDeque::new(),
            next_id: 0,
            stats: SchedulerStats::default(),
        })
    }

    /// Compiles every program serving can run: the segment programs (greedy and sampled, each
    /// row subset) and, for every prompt bucket up to `max_prompt` and `prompt_piece` and every
    /// prefill group size (the powers of two up to `prefill_batch` and `slots`), the prefill and
    /// insert programs (and, for prompts fed in pieces, the continuing ones), without running
    /// them. After it, requests compile nothing. Returns how many settings it prepared.
    pub fn warm_up(&mut self) -> Result<usize> {
        let o = &self.options;
        let mut buckets = Vec::new();
        for len in 1..=o.max_prompt.min(o.prompt_piece) {
            let b = self.model.prompt_bucket(len)?;
            if buckets.last() != Some(&b) {
                buckets.push(b);
            }
        }
        let most = o.prefill_batch.min(o.slots);
        let sizes: Vec<usize> = (0..usize::BITS)
            .map(|i| 1usize << i)
            .take_while(|&g| g <= most)
            .collect();
        let pieces = o.max_prompt > o.prompt_piece;
        for &b in &buckets {
            for &g in &sizes {
                self.model
                    .prepare_fill(o.slots, o.context(), g, b, pieces)?;
            }
        }
        self.model
            .prepare_segments(o.slots, o.context(), o.segment)?;
        Ok(buckets.len() * sizes.len())
    }

    /// Queues `request`; returns its id. A full queue, an empty prompt, a token outside the
    /// vocabulary, a prompt or `max_tokens` beyond the limits, or sampling settings out of
    /// range are refused, naming what was wrong.
    pub fn submit(&mut self, request: Request) -> std::result::Result<RequestId, SubmitError> {
        self.check(&request).map_err(SubmitError::Invalid)?;
        if self.queue.len() >= self.options.max_queue {
            return Err(SubmitError::QueueFull);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back((id, request));
        Ok(id)
    }

    fn check(&self, r: &Request) -> std::result::Result<(), String> {
        let vocab = self.model.vocab_size();
        let o = &self.options;
        if r.prompt.is_empty() {
            return Err("the prompt is empty; it needs at least one token".into());
        }
        if r.prompt.len() > o.max_prompt {
            return Err(format!(
                "the prompt has {} tokens; the most this server takes is {}",
                r.prompt.len(),
                o.max_prompt
            ));
        }
        if let Some(t) = r.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!(
                "prompt token {t} is outside the vocabulary of {vocab}"
            ));
        }
        if r.max_tokens == 0 || r.max_tokens > o.max_tokens {
            return Err(format!(
                "max_tokens ({}) is not in 1..={}",
                r.max_tokens, o.max_tokens
            ));
        }
        if r.prompt.len() + r.max_tokens > o.context() {
            return Err(format!(
                "the prompt ({} tokens) and max_tokens ({}) need {} tokens of context; this \
                 server's context is {} tokens",
                r.prompt.len(),
                r.max_tokens,
                r.prompt.len() + r.max_tokens,
                o.context()
            ));
        }
        r.sampling.check(vocab).map_err(|e| e.to_string())
    }

    /// Drops request `id`, queued or decoding (its slot is free for the next step). Returns
    /// whether it was there.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(at) = self.queue.iter().position(|(q, _)| *q == id) {
            self.queue.remove(at);
            return true;
        }
        for slot in &mut self.table {
            if slot.as_ref().is_some_and(|r| r.id == id) {
                *slot = None;
                return true;
            }
        }
        false
    }

    /// Whether a request is queued or decoding.
    pub fn has_work(&self) -> bool {
        !self.queue.is_empty() || self.table.iter().any(Option::is_some)
    }

    /// Counts and where the scheduler stands.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            queued: self.queue.len(),
            active: self.table.iter().filter(|s| s.is_some()).count(),
            ..self.stats.clone()
        }
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The options.
    pub fn options(&self) -> &SchedulerOptions {
        &self.options
    }

    /// Feeds the next piece of the prompts still being prefilled (one group), admits queued
    /// requests into free slots (their first piece), then runs one segment for the slots whose
    /// prompts are in. A model error fails the requests it touched ([`Event::Failed`]) and
    /// reopens the slots; only an error reopening them is returned.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        if let Some(rows) = self.next_pieces() {
            if let Err(e) = self.fill(&rows, true) {
                events.extend(self.reopen(&e)?);
            }
        }
        while let Some(group) = self.next_group() {
            let rows: Vec<(usize, Vec<u32>)> = group
                .iter()
                .map(|(slot, _, r)| (*slot, r.prompt.clone()))
                .collect();
            for (slot, id, r) in &group {
                self.table[*slot] = Some(Running {
                    id: *id,
                    remaining: r.max_tokens,
                    fresh: true,
                    pending: r.prompt.clone(),
                    sampling: r.sampling,
                    key: r.sampling.key(),
                });
            }
            match self.fill(&rows, false) {
                Ok(()) => events.extend(group.iter().map(|(_, id, _)| Event::Started { id: *id })),
                Err(e) => events.extend(self.reopen(&e)?),
            }
        }
        if self.table.iter().flatten().any(|r| r.pending.is_empty()) {
            match self.run() {
                Ok(mut decoded) => events.append(&mut decoded),
                Err(e) => events.extend(self.reopen(&e)?),
            }
        }
        Ok(events)
    }

    /// The rows whose prompts are still being fed, for their next piece: the first such row
    /// and the next ones whose piece has its bucket, up to `prefill_batch` (rounded down to a
    /// power of two).
    fn next_pieces(&self) -> Option<Vec<(usize, Vec<u32>)>> {
        let chunk = self.options.prompt_piece;
        let piece = |r: &Running| r.pending[..r.pending.len().min(chunk)].to_vec();
        let waiting: Vec<(usize, Vec<u32>)> = self
            .table
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let r = s.as_ref().filter(|r| !r.pending.is_empty())?;
                Some((i, piece(r)))
            })
            .collect();
        let bucket = |p: &[u32]| self.model.prompt_bucket(p.len()).ok();
        let first = bucket(&waiting.first()?.1);
        let mut group: Vec<(usize, Vec<u32>)> = waiting
            .into_iter()
            .filter(|(_, p)| bucket(p) == first)
            .take(self.options.prefill_batch)
            .collect();
        group.truncate(1 << group.len().ilog2());
        Some(group)
    }

    /// Prefills the next piece of each row's prompt into its slot (`continued`: after the
    /// pieces before it) and takes the piece off the row's pending prompt.
    fn fill(&mut self, rows: &[(usize, Vec<u32>)], continued: bool) -> Result<()> {
        let chunk = self.options.prompt_piece;
        let pieces: Vec<(usize, &[u32])> = rows
            .iter()
            .map(|(slot, p)| (*slot, &p[..p.len().min(chunk)]))
            .collect();
        let slots = self.take_slots()?;
        self.slots = Some(self.model.fill_slots(slots, &pieces, continued)?);
        self.stats.prefills += 1;
        for (slot, piece) in &pieces {
            self.stats.prompt_tokens += piece.len() as u64;
            if let Some(r) = self.table[*slot].as_mut() {
                r.pending.drain(..piece.len());
            }
        }
        Ok(())
    }

    /// The next queued requests to prefill together with the free slots they go to: the
    /// queue's head and the next ones whose first piece has its prompt bucket, as many as
    /// there are free slots and `prefill_batch` allow, rounded down to a power of two.
    fn next_group(&mut self) -> Option<Vec<(usize, RequestId, Request)>> {
        let free: Vec<usize> = (0..self.table.len())
            .filter(|&i| self.table[i].is_none())
            .collect();
        let (_, head) = self.queue.front()?;
        if free.is_empty() {
            return None;
        }
        let chunk = self.options.prompt_piece;
        let bucket = |r: &Request| self.model.prompt_bucket(r.prompt.len().min(chunk)).ok();
        let first = bucket(head);
        let room = free.len().min(self.options.prefill_batch);
        let mut picked = Vec::new();
        for (at, (_, r)) in self.queue.iter().enumerate() {
            if picked.len() == room {
                break;
            }
            if at == 0 || bucket(r) == first {
                picked.push(at);
            }
        }
        let size = 1 << picked.len().ilog2();
        picked.truncate(size);
        let mut group = Vec::with_capacity(size);
        for (k, at) in picked.into_iter().enumerate().rev() {
            let (id, r) = self.queue.remove(at)?;
            group.push((free[k], id, r));
        }
        group.reverse();
        Some(group)
    }

    /// One segment over the slots in use; the events it makes.
    fn run(&mut self) -> Result<Vec<Event>> {
        let n = self.table.len();
        // The rows whose prompts are in; a row still being prefilled waits.
        fn decoding(s: &Option<Running>) -> Option<&Running> {
            s.as_ref().filter(|r| r.pending.is_empty())
        }
        let active: Vec<bool> = self.table.iter().map(|s| decoding(s).is_some()).collect();
        let sampling: Vec<Sampling> = self
            .table
            .iter()
            .map(|s| decoding(s).map_or(Sampling::Greedy, |r| r.sampling))
            .collect();
        let keys: Vec<[u32; 2]> = self
            .table
            .iter()
            .map(|s| decoding(s).map_or([0, 0], |r| r.key))
            .collect();
        // A request just prefilled gets its first token after one step, not a whole segment.
        let longest = self
            .table
            .iter()
            .filter_map(decoding)
            .map(|r| r.remaining)
            .max();
        let first = self.table.iter().filter_map(decoding).any(|r| r.fresh);
        let steps = match first {
            true => 1,
            false => longest.unwrap_or(1).min(self.options.segment),
        };
        let segment = Segment {
            capacity: self.options.segment,
            steps,
            active: &active,
            sampling: &sampling,
            keys: &keys,
            eos: self.options.eos,
        };
        let slots = self.take_slots()?;
        let (slots, out) = self.model.run_segment(slots, &segment)?;
        self.slots = Some(slots);
        self.stats.segments += 1;
        if out.tokens.len() != n || out.keys.len() != n {
            return Err(Error::InvalidArgument(
                "a segment returned the wrong number of rows".into(),
            ));
        }
        let mut events = Vec::new();
        for (slot, (row, key)) in self.table.iter_mut().zip(out.tokens.iter().zip(&out.keys)) {
            let Some(r) = slot.as_mut().filter(|r| r.pending.is_empty()) else {
                continue;
            };
            r.key = *key;
            r.fresh = false;
            let mut fresh = Vec::new();
            let mut reason = None;
            for &t in row {
                if Some(t) == self.options.eos {
                    reason = Some(FinishReason::Eos);
                    break;
                }
                fresh.push(t);
                r.remaining -= 1;
                if r.remaining == 0 {
                    reason = Some(FinishReason::Length);
                    break;
                }
            }
            self.stats.generated_tokens += fresh.len() as u64;
            if !fresh.is_empty() {
                events.push(Event::Tokens {
                    id: r.id,
                    tokens: fresh,
                });
            }
            if let Some(reason) = reason {
                events.push(Event::Finished { id: r.id, reason });
                *slot = None;
            }
        }
        Ok(events)
    }

    fn take_slots(&mut self) -> Result<M::Slots> {
        self.slots.take().ok_or_else(|| {
            Error::InvalidArgument("the scheduler's slots were lost to an earlier error".into())
        })
    }

    /// After a model error: fails every request in a slot and opens fresh slots.
    fn reopen(&mut self, error: &Error) -> Result<Vec<Event>> {
        let events = self
            .table
            .iter_mut()
            .filter_map(Option::take)
            .map(|r| Event::Failed {
                id: r.id,
                error: error.to_string(),
            })
            .collect();
        self.slots = None;
        self.slots = Some(
            self.model
                .open_slots(self.options.slots, self.options.context())?,
        );
        Ok(events)
    }
}
