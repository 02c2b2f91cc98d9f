//! Mamba-2 on tiny shapes, one binary with a file per topic: [`ssd`] (the chunked scan equals
//! the recurrence), [`fixtures`] (logits, states and tokens against HF transformers),
//! [`consistency`] (prefill, steps, batches and sampling agree with each other), [`state`]
//! (continuing from a state), [`parallel`] (over several devices), [`weights`] (checkpoints) and
//! [`train`] (loss, gradients and the trainer). The real 130M shape is `tests/mamba2_130m.rs`
//! (ignored, slow); `tests/load.rs` runs one model from four threads alone in its binary.

#[path = "../common/mod.rs"]
mod common;

mod consistency;
mod fixtures;
mod parallel;
mod quant;
mod ssd;
mod state;
mod train;
mod weights;
