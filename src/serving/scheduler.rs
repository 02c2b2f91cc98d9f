//! The continuous-batching loop: a queue, a table of slots, and [`Scheduler::step`], which
//! admits queued requests into free slots and runs one segment.

use std::collections::VecDeque;

use super::prefix_cache::PrefixCache;
use super::request::{
    Event, FinishReason, Request, RequestId, SchedulerOptions, SchedulerStats, SubmitError,
};
use super::table::{extras_of, running, Queued, Running};
use super::{Extras, Piece, Segment, SegmentOutput, SlotModel};
use crate::error::{Error, Result};
use crate::sampling::Sampling;

/// Continuous batching over a [`SlotModel`]: [`Scheduler::submit`] queues a request,
/// [`Scheduler::step`] admits queued requests into free slots (prompts of one bucket prefilled
/// together; a prompt that starts with a cached prefix from its state) and runs one segment
/// for every slot in use, returning what happened. A segment right after an admission runs one
/// step, so that new requests see their first token without waiting for a whole segment.
pub struct Scheduler<M: SlotModel> {
    model: M,
    options: SchedulerOptions,
    /// `None` only after a model error that could not be recovered from.
    slots: Option<M::Slots>,
    table: Vec<Option<Running>>,
    queue: VecDeque<Queued>,
    cache: PrefixCache<M::Snapshot>,
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
        let slots = model.open_slots(o.slots, o.slot_size())?;
        let table = (0..o.slots).map(|_| None).collect();
        let cache = PrefixCache::new(o.prompt_piece, o.prefix_cache_bytes);
        Ok(Scheduler {
            model,
            options,
            slots: Some(slots),
            table,
            queue: VecDeque::new(),
            cache,
            next_id: 0,
            stats: SchedulerStats::default(),
        })
    }

    /// Compiles every program serving can run: the segment programs (greedy and sampled, each
    /// row subset), the snapshot and restore programs (the prefix cache, `n` choices) and, for
    /// every prompt bucket up to `max_prompt` and `prompt_piece` and every prefill group size
    /// (the powers of two up to `prefill_batch` and `slots`), the prefill and insert programs
    /// (and, for prompts fed in pieces, the continuing ones; riding with decode, the mixed
    /// ones), without running them. After it, requests compile nothing. Returns how many
    /// settings it prepared.
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
        let mixing = self.mixing();
        for &b in &buckets {
            for &g in &sizes {
                self.model
                    .prepare_fill(o.slots, o.slot_size(), g, b, pieces)?;
                if mixing {
                    self.model.prepare_mixed(o.slots, g, b)?;
                }
            }
        }
        self.model
            .prepare_segments(o.slots, o.slot_size(), o.segment)?;
        self.model.prepare_snapshots(o.slots, o.slot_size())?;
        Ok(buckets.len() * sizes.len())
    }

    /// Queues `request`; returns its id. A full queue, an empty prompt, a token outside the
    /// vocabulary, a prompt or `max_tokens` beyond the limits, or sampling settings out of
    /// range are refused, naming what was wrong.
    pub fn submit(&mut self, request: Request) -> std::result::Result<RequestId, SubmitError> {
        Ok(self.submit_n(request, 1)?[0])
    }

    /// Queues `n` choices of `request` (OpenAI's `n`): its prompt is prefilled once and its
    /// state copied into `n` slots, choice `i` sampling as [`Sampling::for_choice`] says.
    /// Returns the choices' ids, in order. Refused as [`Scheduler::submit`] refuses, and
    /// when `n` is 0 or more than the slots.
    pub fn submit_n(
        &mut self,
        request: Request,
        n: usize,
    ) -> std::result::Result<Vec<RequestId>, SubmitError> {
        self.check(&request)?;
        if n == 0 || n > self.options.slots {
            return Err(SubmitError::Invalid {
                field: "n",
                message: format!(
                    "n ({n}) is not in 1..={} (the slots of this server)",
                    self.options.slots
                ),
            });
        }
        if self.queue.len() >= self.options.max_queue {
            return Err(SubmitError::QueueFull);
        }
        let ids: Vec<RequestId> = (self.next_id..self.next_id + n as u64).collect();
        self.next_id += n as u64;
        let samplings = (0..n).map(|i| request.sampling.for_choice(i)).collect();
        self.queue.push_back(Queued {
            ids: ids.clone(),
            samplings,
            request,
        });
        Ok(ids)
    }

    fn check(&self, r: &Request) -> std::result::Result<(), SubmitError> {
        let bad = |field, message| Err(SubmitError::Invalid { field, message });
        let vocab = self.model.vocab_size();
        let o = &self.options;
        if r.prompt.is_empty() {
            return bad(
                "prompt",
                "the prompt is empty; it needs at least one token".into(),
            );
        }
        if r.prompt.len() > o.max_prompt {
            return bad(
                "prompt",
                format!(
                    "the prompt has {} tokens; the most this server takes is {}",
                    r.prompt.len(),
                    o.max_prompt
                ),
            );
        }
        if let Some(t) = r.prompt.iter().find(|&&t| t as usize >= vocab) {
            return bad(
                "prompt",
                format!("prompt token {t} is outside the vocabulary of {vocab}"),
            );
        }
        if r.max_tokens == 0 || r.max_tokens > o.max_tokens {
            return bad(
                "max_tokens",
                format!(
                    "max_tokens ({}) is not in 1..={}",
                    r.max_tokens, o.max_tokens
                ),
            );
        }
        if r.prompt.len() + r.max_tokens > o.context() {
            return bad(
                "prompt",
                format!(
                    "the prompt ({} tokens) and max_tokens ({}) need {} tokens of context; this \
                 server's context is {} tokens",
                    r.prompt.len(),
                    r.max_tokens,
                    r.prompt.len() + r.max_tokens,
                    o.context()
                ),
            );
        }
        if let Some((t, _)) = r.logit_bias.iter().find(|(t, _)| *t as usize >= vocab) {
            return bad(
                "logit_bias",
                format!("logit_bias token {t} is outside the vocabulary of {vocab}"),
            );
        }
        if let Some((_, b)) = r.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return bad(
                "logit_bias",
                format!("logit_bias {b} is not a finite number"),
            );
        }
        if let Err(e) = r.penalties.check() {
            return bad("penalties", e.to_string());
        }
        match r.sampling.check(vocab) {
            Err(e) => bad("sampling", e.to_string()),
            Ok(()) => Ok(()),
        }
    }

    /// Drops request `id`, queued or decoding (its slot is free for the next step). Returns
    /// whether it was there. The other choices of its request go on.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(at) = self.queue.iter().position(|q| q.ids.contains(&id)) {
            let q = &mut self.queue[at];
            if let Some(k) = q.ids.iter().position(|&i| i == id) {
                q.ids.remove(k);
                q.samplings.remove(k);
            }
            if q.ids.is_empty() {
                self.queue.remove(at);
            }
            return true;
        }
        let Some(slot) =
            (0..self.table.len()).find(|&i| self.table[i].as_ref().is_some_and(|r| r.id == id))
        else {
            return false;
        };
        self.table[slot] = None;
        self.requeue_copies_of(slot);
        true
    }

    /// The choices waiting for the prompt of slot `slot`, which is gone: back to the queue's
    /// front as a request of their own.
    fn requeue_copies_of(&mut self, slot: usize) {
        let (mut ids, mut samplings) = (Vec::new(), Vec::new());
        let mut request = None;
        for s in &mut self.table {
            if s.as_ref().is_some_and(|r| r.copy_of == Some(slot)) {
                let Some(r) = s.take() else { continue };
                ids.push(r.id);
                samplings.push(r.request.sampling);
                request.get_or_insert(r.request);
            }
        }
        if let Some(request) = request {
            self.queue.push_front(Queued {
                ids,
                samplings,
                request,
            });
        }
    }

    /// Whether a request is queued or decoding.
    pub fn has_work(&self) -> bool {
        !self.queue.is_empty() || self.table.iter().any(Option::is_some)
    }

    /// Counts and where the scheduler stands.
    pub fn stats(&self) -> SchedulerStats {
        let c = self.cache.counts();
        SchedulerStats {
            queued: self.queue.iter().map(|q| q.ids.len()).sum(),
            active: self.table.iter().filter(|s| s.is_some()).count(),
            prefix_hits: c.hits,
            prefix_misses: c.misses,
            prefix_evictions: c.evictions,
            prefix_bytes: c.bytes,
            prefix_entries: c.entries,
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
    /// requests into free slots (their first piece, or their cached prefix), then runs one
    /// segment for the slots whose prompts are in. A model error fails the requests it touched
    /// ([`Event::Failed`]) and reopens the slots; only an error reopening them is returned.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        let mixing = self.mixing();
        if !mixing {
            if let Some(rows) = self.next_pieces() {
                if let Err(e) = self.fill(&rows) {
                    events.extend(self.reopen(&e)?);
                }
            }
        }
        loop {
            match self.admit() {
                Ok(Some(started)) => events.extend(started),
                Ok(None) => break,
                Err(e) => events.extend(self.reopen(&e)?),
            }
        }
        if let Err(e) = self.settle_copies(&mut events) {
            events.extend(self.reopen(&e)?);
        }
        let pieces = match mixing {
            true => self.next_pieces(),
            false => None,
        };
        let ready = self.table.iter().flatten().any(Running::ready);
        let result = match pieces {
            // Decoding rides with the pieces, one step, when no row needs an extras segment.
            Some(rows) if ready && !self.needs_extras() => self.run(Some(&rows)),
            Some(rows) => self.fill(&rows).and_then(|()| match ready {
                true => self.run(None),
                false => Ok(Vec::new()),
            }),
            None if ready => self.run(None),
            None => Ok(Vec::new()),
        };
        match result {
            Ok(mut decoded) => events.append(&mut decoded),
            Err(e) => events.extend(self.reopen(&e)?),
        }
        Ok(events)
    }

    /// Whether prefill rides with decode: asked for, and the model can.
    fn mixing(&self) -> bool {
        self.options.mixed && self.model.mixes()
    }

    /// Whether a decoding row asks for penalties, a bias or log-probabilities.
    fn needs_extras(&self) -> bool {
        self.table
            .iter()
            .flatten()
            .any(|r| r.ready() && r.request.needs_extras())
    }

    /// Admits the queue's head (a request for several choices, or one whose prompt starts
    /// with a cached prefix, alone; else with the next ones of its prompt bucket) into free
    /// slots; the events of the requests started, or `None` when nothing could be admitted.
    fn admit(&mut self) -> Result<Option<Vec<Event>>> {
        let free: Vec<usize> = (0..self.table.len())
            .filter(|&i| self.table[i].is_none())
            .collect();
        let Some(head) = self.queue.front() else {
            return Ok(None);
        };
        if free.len() < head.ids.len() {
            return Ok(None);
        }
        let need = vec![self.need(&head.request); head.ids.len()];
        // The cache room of the requests that ended goes back first.
        let slots = self.slots.as_mut().ok_or_else(lost)?;
        for &i in &free {
            self.model.release(slots, i);
        }
        if !self.model.fits(slots, &need) {
            return Ok(self.never_fits());
        }
        if head.ids.len() > 1 || self.cache.peek(&head.request.prompt).is_some() {
            let Some(q) = self.queue.pop_front() else {
                return Ok(None);
            };
            return self.admit_alone(q, &free).map(Some);
        }
        let Some(group) = self.next_group(&free) else {
            return Ok(None);
        };
        let rows: Vec<(usize, Vec<u32>)> = group
            .iter()
            .map(|(slot, _, r)| (*slot, r.prompt.clone()))
            .collect();
        let mut started = Vec::with_capacity(group.len());
        for (slot, _, r) in &group {
            let need = self.need(r);
            let slots = self.slots.as_mut().ok_or_else(lost)?;
            self.model.reserve(slots, *slot, need)?;
        }
        for (slot, id, r) in group {
            // A group holds no prompt that a cached prefix starts.
            self.cache.miss(r.prompt.len());
            self.table[slot] = Some(running(id, r, None));
            started.push(Event::Started { id, cached: 0 });
        }
        // Riding with decode, the first pieces wait for the step's mixed call.
        if !self.mixing() {
            self.fill(&rows)?;
        }
        Ok(Some(started))
    }

    /// The cache room a request reserves: its prompt and `max_tokens`.
    fn need(&self, r: &Request) -> usize {
        (r.prompt.len() + r.max_tokens).min(self.options.context())
    }

    /// When the queue's head does not fit the free cache room: nothing (it waits for the
    /// running requests), or, when none runs, its choices failed (it never will fit).
    fn never_fits(&mut self) -> Option<Vec<Event>> {
        if self.table.iter().any(Option::is_some) {
            return None;
        }
        let q = self.queue.pop_front()?;
        let need = self.need(&q.request);
        let error = format!(
            "{} choices of {need} tokens of prompt and max_tokens do not fit the slots' key/value \
             caches of {} tokens",
            q.ids.len(),
            self.options.kv_tokens.unwrap_or(0)
        );
        let failed = |&id| Event::Failed {
            id,
            error: error.clone(),
        };
        Some(q.ids.iter().map(failed).collect())
    }

    /// Admits `q` into the first of `free` (from its cached prefix, else its first piece),
    /// its later choices into the next slots, waiting for the first's prompt.
    fn admit_alone(&mut self, q: Queued, free: &[usize]) -> Result<Vec<Event>> {
        let first = free[0];
        let mut requests = q.ids.iter().zip(&q.samplings).map(|(&id, &sampling)| {
            let r = Request {
                sampling,
                ..q.request.clone()
            };
            (id, r)
        });
        let Some((id, r)) = requests.next() else {
            return Ok(Vec::new());
        };
        let prompt = r.prompt.clone();
        let need = self.need(&r);
        let slots = self.slots.as_mut().ok_or_else(lost)?;
        for &slot in &free[..q.ids.len()] {
            self.model.reserve(slots, slot, need)?;
        }
        self.table[first] = Some(running(id, r, None));
        for (k, (id, r)) in requests.enumerate() {
            self.table[free[k + 1]] = Some(running(id, r, Some(first)));
        }
        let mixing = self.mixing();
        let cached = match self.cache.lookup(&prompt) {
            Some((len, snapshot)) => {
                let slots = self.slots.take().ok_or_else(lost)?;
                self.slots = Some(self.model.restore(slots, first, snapshot)?);
                if let Some(r) = self.table[first].as_mut() {
                    r.fed = len;
                }
                self.stats.cached_tokens += len as u64;
                len
            }
            None if mixing => 0,
            None => {
                self.fill(&[(first, prompt)])?;
                0
            }
        };
        Ok(vec![Event::Started { id, cached }])
    }

    /// Copies each first choice whose prompt is in into the slots of its later choices,
    /// which start.
    fn settle_copies(&mut self, events: &mut Vec<Event>) -> Result<()> {
        for from in 0..self.table.len() {
            let waiting: Vec<usize> = (0..self.table.len())
                .filter(|&i| {
                    self.table[i]
                        .as_ref()
                        .is_some_and(|r| r.copy_of == Some(from))
                })
                .collect();
            let ready = self.table[from].as_ref().is_some_and(Running::ready);
            if waiting.is_empty() || !ready {
                continue;
            }
            let snapshot = self
                .model
                .snapshot(self.slots.as_ref().ok_or_else(lost)?, from)?;
            for &to in &waiting {
                let slots = self.take_slots()?;
                self.slots = Some(self.model.restore(slots, to, &snapshot)?);
                if let Some(r) = self.table[to].as_mut() {
                    r.fed = r.request.prompt.len();
                    r.copy_of = None;
                    events.push(Event::Started {
                        id: r.id,
                        cached: r.fed,
                    });
                }
            }
        }
        Ok(())
    }

    /// The rows whose prompts are still being fed, for their next piece: the first such row
    /// and the next ones whose piece has its bucket and, like it, starts its prompt or not, up
    /// to `prefill_batch` (rounded down to a power of two).
    fn next_pieces(&self) -> Option<Vec<(usize, Vec<u32>)>> {
        let chunk = self.options.prompt_piece;
        let waiting: Vec<(usize, Vec<u32>)> = self
            .table
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let r = s.as_ref().filter(|r| r.feeding())?;
                let rest = &r.request.prompt[r.fed..];
                Some((i, rest[..rest.len().min(chunk)].to_vec()))
            })
            .collect();
        let kind = |(slot, p): &(usize, Vec<u32>)| {
            let fresh = self.table[*slot].as_ref().is_some_and(Running::unfed);
            (self.model.prompt_bucket(p.len()).ok(), fresh)
        };
        let first = kind(waiting.first()?);
        let mut group: Vec<(usize, Vec<u32>)> = waiting
            .into_iter()
            .filter(|row| kind(row) == first)
            .take(self.options.prefill_batch)
            .collect();
        group.truncate(1 << group.len().ilog2());
        Some(group)
    }

    /// Prefills the next piece of each row's prompt into its slot (`rows` hold the rest of
    /// each prompt, or more; all start their prompts, or none does), then [`Self::fed`].
    fn fill(&mut self, rows: &[(usize, Vec<u32>)]) -> Result<()> {
        let chunk = self.options.prompt_piece;
        let pieces: Vec<(usize, &[u32])> = rows
            .iter()
            .map(|(slot, p)| (*slot, &p[..p.len().min(chunk)]))
            .collect();
        let continued = rows
            .first()
            .and_then(|(slot, _)| self.table[*slot].as_ref())
            .is_some_and(|r| !r.unfed());
        let slots = self.take_slots()?;
        self.slots = Some(self.model.fill_slots(slots, &pieces, continued)?);
        self.fed(&pieces)
    }

    /// Counts each row's piece (a slot and the piece fed into it) as fed, and keeps the state
    /// after each whole block of a prompt in the prefix cache.
    fn fed(&mut self, pieces: &[(usize, &[u32])]) -> Result<()> {
        self.stats.prefills += 1;
        for (slot, piece) in pieces {
            self.stats.prompt_tokens += piece.len() as u64;
            let Some(r) = self.table[*slot].as_mut() else {
                continue;
            };
            r.fed += piece.len();
            let prefix = &r.request.prompt[..r.fed];
            if self.cache.wants(prefix) {
                let slots = self.slots.as_ref().ok_or_else(lost)?;
                let snapshot = self.model.snapshot(slots, *slot)?;
                let bytes = self.model.snapshot_bytes(&snapshot);
                self.cache.insert(prefix, snapshot, bytes);
            }
        }
        Ok(())
    }

    /// The next queued requests to prefill together with the free slots they go to: the
    /// queue's head and the next ones of one choice whose first piece has its prompt bucket
    /// and that no cached prefix starts, as many as `free` and `prefill_batch` allow, rounded
    /// down to a power of two.
    fn next_group(&mut self, free: &[usize]) -> Option<Vec<(usize, RequestId, Request)>> {
        let head = self.queue.front()?;
        if free.is_empty() {
            return None;
        }
        let chunk = self.options.prompt_piece;
        let bucket = |r: &Request| self.model.prompt_bucket(r.prompt.len().min(chunk)).ok();
        let first = bucket(&head.request);
        let room = free.len().min(self.options.prefill_batch);
        let mut picked = Vec::new();
        let mut needs = Vec::new();
        let slots = self.slots.as_ref()?;
        for (at, q) in self.queue.iter().enumerate() {
            if picked.len() == room {
                break;
            }
            let alone = q.ids.len() > 1 || self.cache.peek(&q.request.prompt).is_some();
            if at == 0 || (!alone && bucket(&q.request) == first) {
                // In order: a request that does not fit the cache room stops the group.
                needs.push(self.need(&q.request));
                if !self.model.fits(slots, &needs) {
                    break;
                }
                picked.push(at);
            }
        }
        let size = 1 << picked.len().ilog2();
        picked.truncate(size);
        let mut group = Vec::with_capacity(size);
        for (k, at) in picked.into_iter().enumerate().rev() {
            let q = self.queue.remove(at)?;
            group.push((free[k], q.ids[0], q.request));
        }
        group.reverse();
        Some(group)
    }
    /// One segment over the slots in use, or with `pieces` one step riding with the pieces'
    /// prefill ([`SlotModel::run_mixed`]); the events it makes.
    fn run(&mut self, pieces: Option<&[(usize, Vec<u32>)]>) -> Result<Vec<Event>> {
        let n = self.table.len();
        // The rows whose prompts are in; a row still being prefilled waits.
        fn decoding(s: &Option<Running>) -> Option<&Running> {
            s.as_ref().filter(|r| r.ready())
        }
        let active: Vec<bool> = self.table.iter().map(|s| decoding(s).is_some()).collect();
        let sampling: Vec<Sampling> = self
            .table
            .iter()
            .map(|s| decoding(s).map_or(Sampling::Greedy, |r| r.request.sampling))
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
        let steps = match first || pieces.is_some() {
            true => 1,
            false => longest.unwrap_or(1).min(self.options.segment),
        };
        let rows: Vec<Option<&Running>> = self.table.iter().map(decoding).collect();
        let extras = extras_of(&rows);
        // A slot whose prompt is partly fed keeps its state; free slots' states may change.
        let keep: Vec<bool> = self
            .table
            .iter()
            .map(|s| s.as_ref().is_some_and(Running::partly_fed))
            .collect();
        let segment = Segment {
            capacity: self.options.segment,
            steps,
            active: &active,
            keep: &keep,
            sampling: &sampling,
            keys: &keys,
            eos: self.options.eos,
            extras: extras.as_ref().map(|(penalties, bias, context)| Extras {
                penalties,
                bias,
                context,
            }),
        };
        // Pieces come from `next_pieces`, already cut to the piece size.
        let fed: Vec<(usize, &[u32])> = pieces
            .unwrap_or_default()
            .iter()
            .map(|(slot, p)| (*slot, p.as_slice()))
            .collect();
        let slots = self.take_slots()?;
        let (slots, out) = match pieces {
            Some(_) => {
                let pieces: Vec<Piece> = fed
                    .iter()
                    .map(|&(slot, tokens)| Piece {
                        slot,
                        tokens,
                        fresh: self.table[slot].as_ref().is_some_and(Running::unfed),
                    })
                    .collect();
                self.model.run_mixed(slots, &pieces, &segment)?
            }
            None => self.model.run_segment(slots, &segment)?,
        };
        self.slots = Some(slots);
        self.stats.segments += 1;
        if out.tokens.len() != n || out.keys.len() != n {
            return Err(Error::InvalidArgument(
                "a segment returned the wrong number of rows".into(),
            ));
        }
        // The decoding rows' tokens first: the pieces' rows are not ready yet.
        let events = self.take_output(out);
        if pieces.is_some() {
            self.stats.mixed += 1;
            self.fed(&fed)?;
        }
        Ok(events)
    }

    /// The events of a segment's output: each decoding row's new tokens (up to `eos` or its
    /// last), and the rows that finished, whose slots are then free.
    fn take_output(&mut self, mut out: SegmentOutput) -> Vec<Event> {
        let mut events = Vec::new();
        for (i, slot) in self.table.iter_mut().enumerate() {
            let Some(r) = slot.as_mut().filter(|r| r.ready()) else {
                continue;
            };
            r.key = out.keys[i];
            r.fresh = false;
            let mut fresh = Vec::new();
            let mut reason = None;
            for &t in &out.tokens[i] {
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
            if !r.request.penalties.is_off() {
                r.made.extend(&fresh);
            }
            let mut logprobs = match (r.request.logprobs, out.logprobs.get_mut(i)) {
                (true, Some(l)) => std::mem::take(l),
                _ => Vec::new(),
            };
            logprobs.truncate(fresh.len());
            if !fresh.is_empty() {
                events.push(Event::Tokens {
                    id: r.id,
                    tokens: fresh,
                    logprobs,
                });
            }
            if let Some(reason) = reason {
                events.push(Event::Finished { id: r.id, reason });
                *slot = None;
            }
        }
        events
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
                .open_slots(self.options.slots, self.options.slot_size())?,
        );
        Ok(events)
    }
}

fn lost() -> Error {
    Error::InvalidArgument("the scheduler's slots were lost to an earlier error".into())
}
