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

pub mod openai;
mod scheduler;

pub use scheduler::{
    Event, FinishReason, Request, RequestId, Scheduler, SchedulerOptions, SchedulerStats,
    SubmitError,
};

use crate::error::Result;
use crate::sampling::Sampling;

/// One segment program call over every slot: what each slot does, and how many steps.
#[derive(Debug, Clone)]
pub struct Segment<'a> {
    /// The most steps a call makes (the program's compiled length).
    pub capacity: usize,
    /// The steps this call makes (1 to `capacity`; the loop also ends once every active row
    /// has emitted `eos`).
    pub steps: usize,
    /// Which slots decode; the others keep their state untouched.
    pub active: &'a [bool],
    /// Each slot's token choice.
    pub sampling: &'a [Sampling],
    /// Each slot's sampling key (a slot's draws depend on its key alone).
    pub keys: &'a [[u32; 2]],
    /// A row stops at this token.
    pub eos: Option<u32>,
}

/// What a segment call returns.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentOutput {
    /// Per slot, `steps` tokens (rows that stopped repeat `eos`; inactive rows hold
    /// `max(eos, 0)`).
    pub tokens: Vec<Vec<u32>>,
    /// Each slot's key for its next draw.
    pub keys: Vec<[u32; 2]>,
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
    /// `slots` empty slots.
    fn open_slots(&self, slots: usize) -> Result<Self::Slots>;
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
    /// bucket `bucket` into `slots` slots (fresh, and with `continued` also continuing).
    fn prepare_fill(&self, slots: usize, rows: usize, bucket: usize, continued: bool)
        -> Result<()>;
    /// Compiles, without running, every segment program [`SlotModel::run_segment`] can run
    /// over `slots` slots with `capacity` steps (greedy and sampled), so that together with
    /// [`SlotModel::prepare_fill`] serving compiles nothing later.
    fn prepare_segments(&self, slots: usize, capacity: usize) -> Result<()>;
    /// Runs one segment over all slots (donated as in [`SlotModel::fill_slots`]).
    fn run_segment(
        &self,
        slots: Self::Slots,
        segment: &Segment,
    ) -> Result<(Self::Slots, SegmentOutput)>;
    /// How many programs the model has compiled so far.
    fn programs_compiled(&self) -> usize;
}
