//! What every causal language model here offers, whatever its family ([`CausalLm`]), and
//! loading a checkpoint of any family by the `model_type` of its `config.json` ([`load`]).
//! Mamba-2 has more besides ([`Mamba2`]: several devices, prompt buckets, training).

use std::path::Path;

use serde_json::Value;

use super::common::{GenerateOptions, ModelState, Parallel};
use super::engine::{self, Family};
use super::hybrid::{self, Hybrid};
use super::mamba1::{self, Mamba1};
use super::mamba2::{Mamba2, Mamba2Config, Mamba2Weights, TrainOptions};
use super::training::{self, FineTuner, Gradients, Trainable};
use super::{gemma2, llama};
use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::optim::AdamW;
use crate::runtime::Client;
use crate::serving::{
    AnySlots, AnySnapshot, DynSlotModel, Piece, Segment, SegmentOutput, SlotModel, SlotSize,
};

/// A causal language model of any family on a device: prompts in, logits and tokens out, and
/// the state after them to continue from. `Send + Sync`: one loaded model can serve many
/// threads (its compiled programs are shared behind a lock).
pub trait CausalLm: Send + Sync {
    /// The family, for people ("Mamba-1", "Falcon-Mamba", "Bamba", ...).
    fn family(&self) -> &'static str;
    /// One line on the shape: layers, width, state, vocabulary.
    fn describe(&self) -> String;
    /// The vocabulary size.
    fn vocab_size(&self) -> usize;
    /// The dtype of the matrices (f32, bf16, or u8 for 8-bit ones).
    fn matmul_dtype(&self) -> DType;
    /// The bytes of the weights on the device (on each device, for a model split over
    /// several).
    fn weight_bytes(&self) -> usize;
    /// The logits at every position of the prompts (left-padded to the longest), `[b, L,
    /// vocab]` f32.
    fn prefill_logits(&self, prompts: &[Vec<u32>]) -> Result<HostArray>;
    /// The logits after each prompt, `[b, vocab]` f32: the prefill a generation starts with.
    fn prefill_last(&self, prompts: &[Vec<u32>]) -> Result<HostArray>;
    /// The positions prompts of up to `longest` tokens are padded to by the prefill.
    fn padded_len(&self, longest: usize) -> usize;
    /// The compiled one-token step program of `batch` rows, where the family has one of a
    /// fixed shape (Mamba-2; for inspection: its text, or over several devices the collectives
    /// XLA inserted); `None` otherwise.
    fn step_program(&self, batch: usize) -> Result<Option<crate::CompiledGraph>>;
    /// `new_tokens` greedy tokens per prompt, one step program call per token (the argmax on
    /// the host).
    fn greedy(&self, prompts: &[Vec<u32>], new_tokens: usize) -> Result<Vec<Vec<u32>>>;
    /// Up to `options.max_new_tokens` tokens per prompt in one program (prefill and a
    /// device-side decode loop; greedy or sampled, with penalties). A row that emits `eos`
    /// ends with it: each row is cut at its end, as the stream hands it over.
    fn generate(&self, prompts: &[Vec<u32>], options: &GenerateOptions) -> Result<Vec<Vec<u32>>>;
    /// [`CausalLm::generate`] in segments of up to `segment` tokens, each segment's new tokens
    /// handed to `on_tokens` as they exist (`false` stops early).
    fn generate_stream(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
        segment: usize,
        on_tokens: &mut dyn FnMut(&[Vec<u32>]) -> bool,
    ) -> Result<Vec<Vec<u32>>>;
    /// [`CausalLm::generate`] continuing from `state` (when given: one this model returned,
    /// one row per prompt), returning with the tokens the state after the prompts and every
    /// token emitted (a row that stopped at `eos` keeps its state from there): a conversation,
    /// turn by turn. A state of another family is an error naming both.
    fn generate_from(
        &self,
        prompts: &[Vec<u32>],
        state: Option<ModelState>,
        options: &GenerateOptions,
    ) -> Result<(Vec<Vec<u32>>, ModelState)>;
    /// The StableHLO text of the prefill, step and generate programs for `prompts` and
    /// `options`.
    fn stablehlo(&self, prompts: &[Vec<u32>], options: &GenerateOptions) -> Result<[String; 3]>;
    /// The model as serving slots ([`crate::serving`]): a `Box<dyn CausalLm>` is a
    /// [`SlotModel`] through it, so a [`crate::serving::Scheduler`] serves any family.
    fn as_slots(&self) -> &dyn DynSlotModel;
    /// The mean next-token cross-entropy of the prompts (each of `T` tokens predicts `T - 1`;
    /// shorter ones left-padded and masked), plus the router load-balancing loss when the
    /// config asks for one, and its gradient for every tensor of the checkpoint under its name
    /// (f32 weights on one device; an error otherwise).
    fn loss_and_grads(&self, prompts: &[Vec<u32>]) -> Result<Gradients>;
    /// A [`FineTuner`] starting from this model's weights (f32): AdamW `opt`, batches as
    /// `options` says, split over devices `0..devices` of the model's client.
    fn fine_tuner(&self, opt: AdamW, options: TrainOptions, devices: usize) -> Result<FineTuner>;
    /// [`CausalLm::generate_from`] continuing from the state file `state_in` (when given), and
    /// writing the state after the prompts and every token emitted to `state_out` (when
    /// given), as [`ModelState::save`] writes it. An error about the state file names it.
    fn generate_with_state_files(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
        state_in: Option<&Path>,
        state_out: Option<&Path>,
    ) -> Result<Vec<Vec<u32>>> {
        let state = state_in
            .map(|p| ModelState::load(p, self.family()))
            .transpose()?;
        if let (Some(s), Some(path)) = (&state, state_in) {
            s.check_family(self.family())
                .map_err(|e| Error::InvalidArgument(format!("state {}: {e}", path.display())))?;
        }
        let (tokens, state) = self.generate_from(prompts, state, options)?;
        if let Some(path) = state_out {
            state.save(path)?;
        }
        Ok(tokens)
    }
}

/// Every family on the engine that serves (its own slots, or the engine's through
/// `SlotFamily`) is a [`CausalLm`].
impl<F> CausalLm for F
where
    F: Family + Trainable + SlotModel + Send + Sync,
    F::Slots: Send + 'static,
    F::Snapshot: Send + 'static,
{
    fn family(&self) -> &'static str {
        Family::family(self)
    }
    fn describe(&self) -> String {
        Family::describe(self)
    }
    fn vocab_size(&self) -> usize {
        Family::vocab_size(self)
    }
    fn matmul_dtype(&self) -> DType {
        Family::matmul_dtype(self)
    }
    fn weight_bytes(&self) -> usize {
        Family::weight_bytes(self)
    }
    fn prefill_logits(&self, prompts: &[Vec<u32>]) -> Result<HostArray> {
        engine::check_prompts(Family::family(self), "prefill", prompts)?;
        self.logits_at_every_position(prompts)
    }
    fn prefill_last(&self, prompts: &[Vec<u32>]) -> Result<HostArray> {
        engine::check_prompts(Family::family(self), "prefill", prompts)?;
        Family::prefill_last(self, prompts)
    }
    fn padded_len(&self, longest: usize) -> usize {
        self.prompt_padding(longest)
    }
    fn step_program(&self, batch: usize) -> Result<Option<crate::CompiledGraph>> {
        Family::step_program(self, batch)
    }
    fn greedy(&self, prompts: &[Vec<u32>], new_tokens: usize) -> Result<Vec<Vec<u32>>> {
        engine::greedy(self, prompts, new_tokens)
    }
    fn generate(&self, prompts: &[Vec<u32>], options: &GenerateOptions) -> Result<Vec<Vec<u32>>> {
        Ok(engine::cut_at_eos(
            engine::generate(self, prompts, options)?,
            options.eos,
        ))
    }
    fn generate_stream(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
        segment: usize,
        on_tokens: &mut dyn FnMut(&[Vec<u32>]) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        let rows = engine::segments(self, prompts, None, options, segment, false, on_tokens)?.0;
        Ok(engine::cut_at_eos(rows, options.eos))
    }
    fn generate_from(
        &self,
        prompts: &[Vec<u32>],
        state: Option<ModelState>,
        options: &GenerateOptions,
    ) -> Result<(Vec<Vec<u32>>, ModelState)> {
        let (rows, state) = engine::generate_from(self, prompts, state, options)?;
        Ok((engine::cut_at_eos(rows, options.eos), state))
    }
    fn stablehlo(&self, prompts: &[Vec<u32>], options: &GenerateOptions) -> Result<[String; 3]> {
        Family::stablehlo(self, prompts, options)
    }
    fn loss_and_grads(&self, prompts: &[Vec<u32>]) -> Result<Gradients> {
        training::loss_and_grads(self, prompts)
    }
    fn fine_tuner(&self, opt: AdamW, options: TrainOptions, devices: usize) -> Result<FineTuner> {
        FineTuner::new(self, opt, options, devices)
    }
    fn as_slots(&self) -> &dyn DynSlotModel {
        self
    }
}

impl SlotModel for Box<dyn CausalLm> {
    type Slots = AnySlots;

    fn vocab_size(&self) -> usize {
        self.as_slots().vocab_size()
    }
    fn prompt_bucket(&self, len: usize) -> Result<usize> {
        self.as_slots().prompt_bucket(len)
    }
    fn open_slots(&self, slots: usize, size: SlotSize) -> Result<AnySlots> {
        self.as_slots().open_slots(slots, size)
    }
    fn fill_slots(
        &self,
        slots: AnySlots,
        rows: &[(usize, &[u32])],
        continued: bool,
    ) -> Result<AnySlots> {
        self.as_slots().fill_slots(slots, rows, continued)
    }
    fn prepare_fill(
        &self,
        slots: usize,
        size: SlotSize,
        rows: usize,
        bucket: usize,
        continued: bool,
    ) -> Result<()> {
        self.as_slots()
            .prepare_fill(slots, size, rows, bucket, continued)
    }
    fn prepare_segments(&self, slots: usize, size: SlotSize, capacity: usize) -> Result<()> {
        self.as_slots().prepare_segments(slots, size, capacity)
    }
    fn run_segment(&self, slots: AnySlots, segment: &Segment) -> Result<(AnySlots, SegmentOutput)> {
        self.as_slots().run_segment(slots, segment)
    }
    fn programs_compiled(&self) -> usize {
        self.as_slots().programs_compiled()
    }
    fn mixes(&self) -> bool {
        self.as_slots().mixes()
    }
    fn run_mixed(
        &self,
        slots: AnySlots,
        pieces: &[Piece],
        segment: &Segment,
    ) -> Result<(AnySlots, SegmentOutput)> {
        self.as_slots().run_mixed(slots, pieces, segment)
    }
    fn prepare_mixed(&self, slots: usize, rows: usize, bucket: usize) -> Result<()> {
        self.as_slots().prepare_mixed(slots, rows, bucket)
    }
    type Snapshot = AnySnapshot;
    fn snapshot(&self, slots: &AnySlots, slot: usize) -> Result<AnySnapshot> {
        self.as_slots().snapshot(slots, slot)
    }
    fn restore(&self, slots: AnySlots, slot: usize, snapshot: &AnySnapshot) -> Result<AnySlots> {
        self.as_slots().restore(slots, slot, snapshot)
    }
    fn snapshot_bytes(&self, snapshot: &AnySnapshot) -> usize {
        self.as_slots().snapshot_bytes(snapshot)
    }
    fn fits(&self, slots: &AnySlots, tokens: &[usize]) -> bool {
        self.as_slots().fits(slots, tokens)
    }
    fn reserve(&self, slots: &mut AnySlots, slot: usize, tokens: usize) -> Result<()> {
        self.as_slots().reserve(slots, slot, tokens)
    }
    fn release(&self, slots: &mut AnySlots, slot: usize) {
        self.as_slots().release(slots, slot)
    }
    fn prepare_snapshots(&self, slots: usize, size: SlotSize) -> Result<()> {
        self.as_slots().prepare_snapshots(slots, size)
    }
}

/// Every `model_type` [`load`] reads.
pub fn model_types() -> Vec<&'static str> {
    let mut v = vec!["mamba2"];
    v.extend(mamba1::MODEL_TYPES);
    v.extend(hybrid::MODEL_TYPES);
    v.extend(llama::MODEL_TYPES);
    v.push(gemma2::MODEL_TYPE);
    v
}

/// Whether the layer stack ([`Hybrid`]) runs `model_type`: the hybrids and the transformers.
fn on_the_stack(model_type: &str) -> bool {
    hybrid::MODEL_TYPES.contains(&model_type)
        || llama::MODEL_TYPES.contains(&model_type)
        || model_type == gemma2::MODEL_TYPE
}

/// Loads the checkpoint in `dir`, its family chosen by its config.json's `model_type` (a
/// `mamba_ssm` config without one is Mamba-2 when its `ssm_cfg.layer` says so, Mamba-1
/// otherwise), with matrices in `matmul_dtype`, on `client`'s first device. Another
/// `model_type`, a config or tensors that do not fit, or a missing file are one
/// [`Error::Checkpoint`] (kind [`crate::ErrorKind::Checkpoint`]) naming the directory and
/// every problem, worded the same for every family; another `model_type` lists the
/// supported ones.
pub fn load(client: &Client, dir: &Path, matmul_dtype: DType) -> Result<Box<dyn CausalLm>> {
    load_parallel(client, dir, matmul_dtype, Parallel::Heads, 1)
}

/// [`load`] over devices `0..devices` of `client`, split as `parallel` says (heads or the
/// batch; every program one SPMD program over them, with one device's results). With heads, an
/// error unless the devices divide the model's heads; the client must have the devices (the
/// CPU plugin makes more with `Client::cpu_with_devices`).
pub fn load_parallel(
    client: &Client,
    dir: &Path,
    matmul_dtype: DType,
    parallel: Parallel,
    devices: usize,
) -> Result<Box<dyn CausalLm>> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e).in_checkpoint(dir))?;
    let v: Value = serde_json::from_str(&super::common::json::strict_json(&text))
        .map_err(|e| Error::Checkpoint(format!("{}: not JSON: {e}", path.display())))?;
    let model_type = v.get("model_type").and_then(Value::as_str);
    let checkpoint = |e: Error| e.in_checkpoint(dir);
    let options = super::common::LoadOptions::default();
    let mamba1 = || -> Result<Box<dyn CausalLm>> {
        let config = mamba1::Mamba1Config::load(dir).map_err(checkpoint)?;
        let w = mamba1::Mamba1Weights::load(dir, &config, matmul_dtype, &options)
            .map_err(checkpoint)?;
        Ok(Box::new(Mamba1::new_parallel(
            client, config, &w, parallel, devices,
        )?))
    };
    let mamba2 = || -> Result<Box<dyn CausalLm>> {
        let config = Mamba2Config::from_file(path.clone()).map_err(checkpoint)?;
        let w = Mamba2Weights::load(dir, &config, matmul_dtype).map_err(checkpoint)?;
        Ok(Box::new(Mamba2::new_parallel(
            client, config, w, parallel, devices,
        )?))
    };
    match model_type {
        Some(t) if mamba1::MODEL_TYPES.contains(&t) => mamba1(),
        None if v.get("d_model").is_some()
            && v.pointer("/ssm_cfg/layer").and_then(Value::as_str) != Some("Mamba2") =>
        {
            mamba1()
        }
        Some(t) if on_the_stack(t) => {
            let config = hybrid::HybridConfig::load(dir).map_err(checkpoint)?;
            let w = hybrid::HybridWeights::load(dir, &config, matmul_dtype, &options)
                .map_err(checkpoint)?;
            Ok(Box::new(Hybrid::new_parallel(
                client, config, &w, parallel, devices,
            )?))
        }
        Some("mamba2") => mamba2(),
        None if v.pointer("/ssm_cfg/layer").and_then(Value::as_str) == Some("Mamba2") => mamba2(),
        _ => Err(Error::Checkpoint(format!(
            "{}: model_type {} is not supported here (supported: {})",
            path.display(),
            model_type.map_or("(none)".to_string(), |t| format!("{t:?}")),
            model_types().join(", ")
        ))),
    }
}
