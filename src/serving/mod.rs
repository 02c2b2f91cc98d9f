//! Continuous batching for serving many requests at once, compiler-first: a fixed set of
//! slots (the rows of compiled segment programs) holds the requests being decoded; the device
//! runs up to `segment` steps for all of them in one program call; between calls the host
//! retires the requests that finished and prefills queued ones into the freed slots, without
//! touching the others. An SSM's whole per-request state is a fixed-size row, so joining and
//! leaving needs no paging, and nothing recompiles once each program has run once.
//!
//! [`Scheduler`] is the loop (no HTTP: the `serve` subcommand of the example CLI puts a server
//! around it); [`SlotModel`] is what it needs from a model; [`openai`] reads and writes
//! OpenAI's completions format.

pub mod chat;
pub mod openai;
mod prefix_cache;
mod request;
mod scheduler;
mod table;

pub use request::{
    Event, FinishReason, Request, RequestId, SchedulerOptions, SchedulerStats, SubmitError,
};
pub use scheduler::Scheduler;

use crate::error::{Error, Result};
use crate::sampling::{Penalties, Sampling};

/// What each slot holds at most: the tokens of prompt and generation of one request, fed in
/// pieces of up to `piece` tokens (a model with attention sizes its caches by both, as each
/// piece is padded to its bucket before its keys and values are kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotSize {
    /// The most tokens of prompt and generation.
    pub context: usize,
    /// The most prompt tokens fed in one call.
    pub piece: usize,
    /// The tokens the slots' paged caches hold together (a model that pages its caches keeps
    /// them in one pool of pages, which a request takes as it is admitted); `None`: room for
    /// every slot's whole context.
    pub pool: Option<usize>,
}

/// One segment program call over every slot: what each slot does, and how many steps.
#[derive(Debug, Clone)]
pub struct Segment<'a> {
    /// The most steps a call makes (the program's compiled length).
    pub capacity: usize,
    /// The steps this call makes (1 to `capacity`; the loop also ends once every active row
    /// has emitted `eos`).
    pub steps: usize,
    /// Which slots decode.
    pub active: &'a [bool],
    /// Which slots that do not decode keep their state untouched (a prompt being fed in
    /// pieces); the states of the others (free slots) may change.
    pub keep: &'a [bool],
    /// Each slot's token choice.
    pub sampling: &'a [Sampling],
    /// Each slot's sampling key (a slot's draws depend on its key alone).
    pub keys: &'a [[u32; 2]],
    /// A row stops at this token.
    pub eos: Option<u32>,
    /// Penalties, logit biases and log-probabilities, when an active slot asks for one of
    /// them (the call then decodes every slot, in a program that does all three).
    pub extras: Option<Extras<'a>>,
}

/// What a segment with [`Segment::extras`] takes per slot.
#[derive(Debug, Clone)]
pub struct Extras<'a> {
    /// Each slot's penalties ([`Penalties::NONE`]: none).
    pub penalties: &'a [Penalties],
    /// Each slot's logit bias: (token, bias) added to the logits before the token is picked.
    pub bias: &'a [Vec<(u32, f32)>],
    /// Each slot's context so far (its prompt and the tokens it made), which the penalties
    /// read.
    pub context: &'a [Vec<u32>],
}

/// A generated token's log-probability and the most likely tokens at its position: the
/// log-softmax of the model's logits, before penalties, bias and temperature.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLogprobs {
    /// The token's log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One piece of a prompt that a mixed call ([`SlotModel::run_mixed`]) feeds into a slot.
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    /// The slot.
    pub slot: usize,
    /// The piece's tokens.
    pub tokens: &'a [u32],
    /// It starts the prompt (from an empty state); else it continues what the slot holds.
    pub fresh: bool,
}

/// What a segment call returns.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentOutput {
    /// Per slot, `steps` tokens (rows that stopped repeat `eos`; inactive rows hold
    /// `max(eos, 0)`).
    pub tokens: Vec<Vec<u32>>,
    /// Each slot's key for its next draw.
    pub keys: Vec<[u32; 2]>,
    /// With [`Segment::extras`], per slot, each step's log-probabilities (empty for inactive
    /// slots); else empty.
    pub logprobs: Vec<Vec<StepLogprobs>>,
}

/// A model a [`Scheduler`] can serve: device-side slots that prompts are prefilled into and
/// that decode together in segments.
pub trait SlotModel {
    /// The slots on the device: each slot's state and the logits of its next token.
    type Slots;
    /// The vocabulary size.
    fn vocab_size(&self) -> usize;
    /// The padded length prompts of `len` tokens are prefilled at (prompts with the same
    /// bucket are prefilled together in one call).
    fn prompt_bucket(&self, len: usize) -> Result<usize>;
    /// `slots` empty slots, each holding what `size` says.
    fn open_slots(&self, slots: usize, size: SlotSize) -> Result<Self::Slots>;
    /// Prefills `rows` (slot index, prompt) together and writes each prompt's state and logits
    /// into its slot; the other slots are untouched. With `continued`, each prompt continues
    /// from the state its slot holds (the next piece of a prompt fed in pieces); else from an
    /// empty state. The slots' buffers are donated: on an error they are gone.
    fn fill_slots(
        &self,
        slots: Self::Slots,
        rows: &[(usize, &[u32])],
        continued: bool,
    ) -> Result<Self::Slots>;
    /// Compiles, without running, what [`SlotModel::fill_slots`] runs for `rows` prompts of
    /// bucket `bucket` into `slots` slots of `size` (fresh, and with `continued` also
    /// continuing).
    fn prepare_fill(
        &self,
        slots: usize,
        size: SlotSize,
        rows: usize,
        bucket: usize,
        continued: bool,
    ) -> Result<()>;
    /// Compiles, without running, every segment program [`SlotModel::run_segment`] can run
    /// over `slots` slots of `size` with `capacity` steps (greedy and sampled), so
    /// that together with [`SlotModel::prepare_fill`] serving compiles nothing later.
    fn prepare_segments(&self, slots: usize, size: SlotSize, capacity: usize) -> Result<()>;
    /// Runs one segment over all slots (donated as in [`SlotModel::fill_slots`]).
    fn run_segment(
        &self,
        slots: Self::Slots,
        segment: &Segment,
    ) -> Result<(Self::Slots, SegmentOutput)>;
    /// How many programs the model has compiled so far.
    fn programs_compiled(&self) -> usize;
    /// Whether [`SlotModel::run_mixed`] runs: prefill that rides with decode (no by default).
    fn mixes(&self) -> bool {
        false
    }
    /// Prefill riding with decode, one call: each of `pieces` (one prompt bucket, distinct
    /// slots not decoding) fed into its slot, and one decode step for `segment`'s active slots
    /// (its `steps` 1, without extras), every token-wise product over both at once. The slots
    /// are donated, as in [`SlotModel::fill_slots`]. An error for a model that does not mix.
    fn run_mixed(
        &self,
        slots: Self::Slots,
        pieces: &[Piece],
        segment: &Segment,
    ) -> Result<(Self::Slots, SegmentOutput)> {
        let _ = (slots, pieces, segment);
        Err(Error::InvalidArgument(
            "this model has no mixed program (prefill does not ride with decode)".into(),
        ))
    }
    /// Compiles, without running, the mixed programs (greedy and sampled) for `rows` pieces
    /// of bucket `bucket` into `slots` slots; nothing for a model that does not mix.
    fn prepare_mixed(&self, slots: usize, rows: usize, bucket: usize) -> Result<()> {
        let _ = (slots, rows, bucket);
        Ok(())
    }
    /// One slot's state and next-token logits, copied out of the slots (the prefix cache keeps
    /// them; `n` choices start from copies of one prefilled prompt).
    type Snapshot;
    /// A copy of slot `slot` (the slots are untouched).
    fn snapshot(&self, slots: &Self::Slots, slot: usize) -> Result<Self::Snapshot>;
    /// The slots with slot `slot` overwritten by `snapshot` (the slots are donated, as in
    /// [`SlotModel::fill_slots`]).
    fn restore(
        &self,
        slots: Self::Slots,
        slot: usize,
        snapshot: &Self::Snapshot,
    ) -> Result<Self::Slots>;
    /// The device memory a snapshot holds, in bytes.
    fn snapshot_bytes(&self, snapshot: &Self::Snapshot) -> usize;
    /// Compiles, without running, the snapshot and restore programs for `slots` slots of
    /// `size`.
    fn prepare_snapshots(&self, slots: usize, size: SlotSize) -> Result<()>;
    /// Whether slots that hold nothing could now take requests of `tokens` tokens of prompt
    /// and generation each, together (always, for a model without paged caches).
    fn fits(&self, slots: &Self::Slots, tokens: &[usize]) -> bool {
        let _ = (slots, tokens);
        true
    }
    /// Gives slot `slot` the cache room of `tokens` tokens, what it held before released
    /// first; an error when there is not as much room ([`SlotModel::fits`] says first).
    /// Without a reservation a slot takes room as it fills, while there is some.
    fn reserve(&self, slots: &mut Self::Slots, slot: usize, tokens: usize) -> Result<()> {
        let _ = (slots, slot, tokens);
        Ok(())
    }
    /// Gives the cache room slot `slot` holds back (it holds nothing after).
    fn release(&self, slots: &mut Self::Slots, slot: usize) {
        let _ = (slots, slot);
    }
}

/// Checks a segment's per-slot lists against `slots` and its steps against its capacity.
pub(crate) fn check_segment(segment: &Segment, slots: usize) -> Result<()> {
    let lens = [
        ("active", segment.active.len()),
        ("keep", segment.keep.len()),
        ("sampling", segment.sampling.len()),
        ("keys", segment.keys.len()),
    ];
    if let Some((name, len)) = lens.iter().find(|(_, len)| *len != slots) {
        return Err(Error::InvalidArgument(format!(
            "segment.{name} has {len} entries for {slots} slots"
        )));
    }
    if segment.steps == 0 || segment.steps > segment.capacity {
        return Err(Error::InvalidArgument(format!(
            "segment.steps ({}) is not in 1..={}",
            segment.steps, segment.capacity
        )));
    }
    if let Some(x) = &segment.extras {
        let lens = [
            ("penalties", x.penalties.len()),
            ("bias", x.bias.len()),
            ("context", x.context.len()),
        ];
        if let Some((name, len)) = lens.iter().find(|(_, len)| *len != slots) {
            return Err(Error::InvalidArgument(format!(
                "segment.extras.{name} has {len} entries for {slots} slots"
            )));
        }
    }
    if segment.capacity > crate::models::MAX_NEW_TOKENS {
        return Err(Error::InvalidArgument(format!(
            "segment.capacity ({}) is more than {}",
            segment.capacity,
            crate::models::MAX_NEW_TOKENS
        )));
    }
    Ok(())
}

/// The slots of any model, their type erased: what [`DynSlotModel`] takes and returns.
pub struct AnySlots(Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for AnySlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnySlots")
    }
}

impl AnySlots {
    /// The slots as `S`, or an error when they are another model's.
    fn take<S: 'static>(self) -> Result<S> {
        self.0.downcast::<S>().map(|s| *s).map_err(|_| {
            Error::InvalidArgument("these slots belong to a model of another kind".into())
        })
    }
}

/// A [`SlotModel`] with its slots' type erased ([`AnySlots`]), so that models of different
/// families serve behind one type (`Box<dyn CausalLm>` is a [`SlotModel`] through it). Every
/// [`SlotModel`] whose slots are `Send` is one.
pub trait DynSlotModel {
    /// [`SlotModel::vocab_size`].
    fn vocab_size(&self) -> usize;
    /// [`SlotModel::prompt_bucket`].
    fn prompt_bucket(&self, len: usize) -> Result<usize>;
    /// [`SlotModel::open_slots`].
    fn open_slots(&self, slots: usize, size: SlotSize) -> Result<AnySlots>;
    /// [`SlotModel::fill_slots`].
    fn fill_slots(
        &self,
        slots: AnySlots,
        rows: &[(usize, &[u32])],
        continued: bool,
    ) -> Result<AnySlots>;
    /// [`SlotModel::prepare_fill`].
    fn prepare_fill(
        &self,
        slots: usize,
        size: SlotSize,
        rows: usize,
        bucket: usize,
        continued: bool,
    ) -> Result<()>;
    /// [`SlotModel::prepare_segments`].
    fn prepare_segments(&self, slots: usize, size: SlotSize, capacity: usize) -> Result<()>;
    /// [`SlotModel::run_segment`].
    fn run_segment(&self, slots: AnySlots, segment: &Segment) -> Result<(AnySlots, SegmentOutput)>;
    /// [`SlotModel::programs_compiled`].
    fn programs_compiled(&self) -> usize;
    /// [`SlotModel::mixes`].
    fn mixes(&self) -> bool;
    /// [`SlotModel::run_mixed`].
    fn run_mixed(
        &self,
        slots: AnySlots,
        pieces: &[Piece],
        segment: &Segment,
    ) -> Result<(AnySlots, SegmentOutput)>;
    /// [`SlotModel::prepare_mixed`].
    fn prepare_mixed(&self, slots: usize, rows: usize, bucket: usize) -> Result<()>;
    /// [`SlotModel::snapshot`].
    fn snapshot(&self, slots: &AnySlots, slot: usize) -> Result<AnySnapshot>;
    /// [`SlotModel::restore`].
    fn restore(&self, slots: AnySlots, slot: usize, snapshot: &AnySnapshot) -> Result<AnySlots>;
    /// [`SlotModel::snapshot_bytes`].
    fn snapshot_bytes(&self, snapshot: &AnySnapshot) -> usize;
    /// [`SlotModel::prepare_snapshots`].
    fn prepare_snapshots(&self, slots: usize, size: SlotSize) -> Result<()>;
    /// [`SlotModel::fits`].
    fn fits(&self, slots: &AnySlots, tokens: &[usize]) -> bool;
    /// [`SlotModel::reserve`].
    fn reserve(&self, slots: &mut AnySlots, slot: usize, tokens: usize) -> Result<()>;
    /// [`SlotModel::release`].
    fn release(&self, slots: &mut AnySlots, slot: usize);
}

impl<M: SlotModel> DynSlotModel for M
where
    M::Slots: Send + 'static,
    M::Snapshot: Send + 'static,
{
    fn vocab_size(&self) -> usize {
        SlotModel::vocab_size(self)
    }
    fn prompt_bucket(&self, len: usize) -> Result<usize> {
        SlotModel::prompt_bucket(self, len)
    }
    fn open_slots(&self, slots: usize, size: SlotSize) -> Result<AnySlots> {
        Ok(AnySlots(Box::new(SlotModel::open_slots(
            self, slots, size,
        )?)))
    }
    fn fill_slots(
        &self,
        slots: AnySlots,
        rows: &[(usize, &[u32])],
        continued: bool,
    ) -> Result<AnySlots> {
        let slots = SlotModel::fill_slots(self, slots.take()?, rows, continued)?;
        Ok(AnySlots(Box::new(slots)))
    }
    fn prepare_fill(
        &self,
        slots: usize,
        size: SlotSize,
        rows: usize,
        bucket: usize,
        continued: bool,
    ) -> Result<()> {
        SlotModel::prepare_fill(self, slots, size, rows, bucket, continued)
    }
    fn prepare_segments(&self, slots: usize, size: SlotSize, capacity: usize) -> Result<()> {
        SlotModel::prepare_segments(self, slots, size, capacity)
    }
    fn run_segment(&self, slots: AnySlots, segment: &Segment) -> Result<(AnySlots, SegmentOutput)> {
        let (slots, out) = SlotModel::run_segment(self, slots.take()?, segment)?;
        Ok((AnySlots(Box::new(slots)), out))
    }
    fn programs_compiled(&self) -> usize {
        SlotModel::programs_compiled(self)
    }
    fn mixes(&self) -> bool {
        SlotModel::mixes(self)
    }
    fn run_mixed(
        &self,
        slots: AnySlots,
        pieces: &[Piece],
        segment: &Segment,
    ) -> Result<(AnySlots, SegmentOutput)> {
        let (slots, out) = SlotModel::run_mixed(self, slots.take()?, pieces, segment)?;
        Ok((AnySlots(Box::new(slots)), out))
    }
    fn prepare_mixed(&self, slots: usize, rows: usize, bucket: usize) -> Result<()> {
        SlotModel::prepare_mixed(self, slots, rows, bucket)
    }
    fn snapshot(&self, slots: &AnySlots, slot: usize) -> Result<AnySnapshot> {
        let slots = slots.0.downcast_ref::<M::Slots>().ok_or_else(other_model)?;
        let snapshot = SlotModel::snapshot(self, slots, slot)?;
        Ok(AnySnapshot(Box::new(snapshot)))
    }
    fn restore(&self, slots: AnySlots, slot: usize, snapshot: &AnySnapshot) -> Result<AnySlots> {
        let snapshot = snapshot
            .0
            .downcast_ref::<M::Snapshot>()
            .ok_or_else(other_model)?;
        let slots = SlotModel::restore(self, slots.take()?, slot, snapshot)?;
        Ok(AnySlots(Box::new(slots)))
    }
    fn snapshot_bytes(&self, snapshot: &AnySnapshot) -> usize {
        snapshot
            .0
            .downcast_ref::<M::Snapshot>()
            .map_or(0, |s| SlotModel::snapshot_bytes(self, s))
    }
    fn prepare_snapshots(&self, slots: usize, size: SlotSize) -> Result<()> {
        SlotModel::prepare_snapshots(self, slots, size)
    }
    fn fits(&self, slots: &AnySlots, tokens: &[usize]) -> bool {
        let slots = slots.0.downcast_ref::<M::Slots>();
        slots.is_some_and(|s| SlotModel::fits(self, s, tokens))
    }
    fn reserve(&self, slots: &mut AnySlots, slot: usize, tokens: usize) -> Result<()> {
        let slots = slots.0.downcast_mut::<M::Slots>().ok_or_else(other_model)?;
        SlotModel::reserve(self, slots, slot, tokens)
    }
    fn release(&self, slots: &mut AnySlots, slot: usize) {
        if let Some(slots) = slots.0.downcast_mut::<M::Slots>() {
            SlotModel::release(self, slots, slot);
        }
    }
}

fn other_model() -> Error {
    Error::InvalidArgument("these slots or this snapshot belong to a model of another kind".into())
}

/// A slot's snapshot of any model, its type erased: what [`DynSlotModel`] takes and returns.
pub struct AnySnapshot(Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for AnySnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnySnapshot")
    }
}
