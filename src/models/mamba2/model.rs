//! A Mamba-2 model on a device: weights uploaded once, and compiled programs for prefill, the
//! streaming step, and whole-sequence generation (prefill plus a `while` loop of recurrent steps
//! in one program).

use super::weights::named_differences;
use crate::tree::Tree;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use super::block;
use super::config::Mamba2Config;
use super::parallel::{Parallel, Placement};
use super::state::Mamba2State;
use super::weights::{HostWeights, Mamba2Weights};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::LayerState;
use crate::models::engine::{call, host_input, Family};
use crate::models::quant;
use crate::ops::{Graph, Tensor};
use crate::runtime::{Client, ShardedBuffer};
use crate::sharding::Sharding;
use crate::target::Target;

/// What a prefill returns.
#[derive(Debug)]
pub struct Prefill {
    /// From [`Mamba2::prefill`]: the logits after each row's prompt, `[b, vocab]` f32. From
    /// [`Mamba2::prefill_all_positions`]: the logits at every position of the padded batch,
    /// `[b, L, vocab]`, where row `r`'s prompt occupies its last `prompt_len[r]` positions
    /// (prompts are left-padded).
    pub logits: HostArray,
    /// Each row's prompt length.
    pub prompt_len: Vec<usize>,
    /// The state after the prompts, ready for [`Mamba2::step`].
    pub state: Mamba2State,
}

/// A Mamba-2 model whose weights live on one client's device, or split over several (see
/// [`Mamba2::new_parallel`]).
pub struct Mamba2 {
    config: Mamba2Config,
    client: Client,
    weights: Mamba2Weights<ShardedBuffer>,
    /// Where values live when the model spans several devices.
    placement: Option<Placement>,
    types: Mamba2Weights<TensorType>,
    /// The SSD chunk of every prefill, when set (see [`Mamba2::with_prefill_chunk`]).
    prefill_chunk: Option<usize>,
    /// How bf16 matrices enter products, when set (see [`Mamba2::with_bf16_dots`]).
    bf16_dots: Option<bool>,
    /// Where the programs run (decided once from the client).
    target: Target,
    programs: Mutex<HashMap<String, CompiledGraph>>,
}

/// Which positions' logits a prefill program returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LogitsAt {
    /// The last position: `[b, vocab]`.
    Last,
    /// Every position: `[b, L, vocab]`.
    All,
}

impl std::fmt::Debug for Mamba2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mamba2")
            .field("config", &self.config)
            .finish()
    }
}

impl Mamba2 {
    /// Uploads `weights` to `client`'s device 0. A config that [`Mamba2Config::validate`]
    /// rejects, or weights whose names, dtypes or shapes differ from
    /// [`Mamba2Weights::types`]`(config, dtype of the embedding)`, are an error listing every
    /// difference. Pass the weights by value (see [`HostWeights`]) to free each host tensor as
    /// it is uploaded: the process then peaks at one copy of the weights, not two.
    pub fn new<'a>(
        client: &Client,
        config: Mamba2Config,
        weights: impl HostWeights<'a>,
    ) -> Result<Mamba2> {
        Mamba2::place(client, config, weights, None)
    }

    /// [`Mamba2::new`] over devices `0..devices` of `client`, split as `parallel` says (see
    /// [`Parallel`]): every program runs as one SPMD program over them, with the same results
    /// as on one device. One device is [`Mamba2::new`]. An error when the head count (heads)
    /// does not divide, or the client has fewer devices (the CPU plugin makes more with the
    /// create option `cpu_device_count`); with batch parallelism, a batch that does not divide
    /// is an error when it is run.
    pub fn new_parallel<'a>(
        client: &Client,
        config: Mamba2Config,
        weights: impl HostWeights<'a>,
        parallel: Parallel,
        devices: usize,
    ) -> Result<Mamba2> {
        config.validate()?;
        let placement = Placement::new(parallel, devices, &config)?;
        client.check_mesh(&placement.mesh)?;
        Mamba2::place(client, config, weights, (devices > 1).then_some(placement))
    }

    fn place<'a>(
        client: &Client,
        config: Mamba2Config,
        weights: impl HostWeights<'a>,
        placement: Option<Placement>,
    ) -> Result<Mamba2> {
        config.validate()?;
        let weights = weights.into_cows()?;
        let types = weights.try_map(|_, a| Ok(a.ty()))?;
        check_weight_types(&types, &config)?;
        if placement.is_some() && types.embedding.dtype == quant::QUANTIZED {
            return Err(Error::InvalidArgument(
                "Mamba2::new_parallel: 8-bit weights run on one device so far; use f32 or bf16 \
                 matrices to split a model over devices"
                    .into(),
            ));
        }
        let target = Target::of(client);
        // Each host tensor (when owned) is dropped once it is on the device.
        let buffers = weights.try_into_map(|name, a| {
            let sharding = match &placement {
                Some(p) => p.sharding(&p.weight_spec(name, &a.ty()))?,
                None => Sharding::single(),
            };
            let buffer = client.sharded_buffer_from_host_array(&a, &sharding)?;
            if let Cow::Owned(host) = a {
                let bytes = host.ty().byte_size().unwrap_or(0);
                drop(host);
                // A tensor under glibc's mmap threshold went back to the heap, not to the
                // system: hand its pages back before the next device copy takes new ones.
                if bytes >= 1 << 20 {
                    crate::runtime::trim_host_heap();
                }
            }
            Ok(buffer)
        })?;
        Ok(Mamba2 {
            config,
            client: client.clone(),
            weights: buffers,
            placement,
            types,
            prefill_chunk: None,
            bf16_dots: None,
            target,
            programs: Mutex::new(HashMap::new()),
        })
    }

    /// Runs every prefill with SSD chunks of `chunk` positions (prompts padded to a multiple
    /// of it) instead of the automatic choice of [`Mamba2::prefill_chunk`]; `None` restores
    /// that choice. The chunk is the algorithm's block size, not a property of the weights: any
    /// chunk gives the same result up to rounding. A chunk of 0 or above
    /// [`MAX_PREFILL_CHUNK`] is an error.
    pub fn with_prefill_chunk(mut self, chunk: Option<usize>) -> Result<Mamba2> {
        if let Some(c) = chunk.filter(|&c| c == 0 || c > MAX_PREFILL_CHUNK) {
            return Err(Error::InvalidArgument(format!(
                "Mamba2::with_prefill_chunk: chunk ({c}) is not in 1..={MAX_PREFILL_CHUNK}"
            )));
        }
        self.prefill_chunk = chunk;
        self.programs
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        Ok(self)
    }

    /// The SSD chunk a prefill of prompts up to `longest` tokens uses: the one set with
    /// [`Mamba2::with_prefill_chunk`], or else the power of two covering `longest` (at least
    /// 16), capped by the config's `chunk_size` and by [`CPU_MAX_CHUNK`] on the CPU platform
    /// (measured there: smaller chunks are faster; see `docs/performance.md`), so that a short prompt is
    /// not padded to a long chunk.
    pub fn prefill_chunk(&self, longest: usize) -> usize {
        if let Some(chunk) = self.prefill_chunk {
            return chunk;
        }
        let mut chunk = self.config.chunk_size;
        if self.target.is_cpu() {
            chunk = chunk.min(CPU_MAX_CHUNK);
        }
        let covering = longest.max(16).checked_next_power_of_two();
        covering.map_or(chunk, |covering| chunk.min(covering))
    }

    /// The padded length (prompt bucket) of prompts up to `longest` tokens: the chunk
    /// ([`Mamba2::prefill_chunk`]`(longest)`) times the smallest of 1, 2, 3, 4, 6, 8, 12, 16, ...
    /// (the powers of two and 1.5 times them) that covers them. Every prompt length in a bucket
    /// runs one compiled program (the padding is masked), so lengths up to `L` need about
    /// `2 log2(L / chunk)` programs, and a prompt is padded by less than half. `None` when it
    /// overflows.
    pub fn prompt_bucket(&self, longest: usize) -> Option<usize> {
        let chunk = self.prefill_chunk(longest);
        crate::models::engine::bucket_chunks(longest.max(1).div_ceil(chunk))?.checked_mul(chunk)
    }

    /// Whether bf16 matrices enter their products as bf16 (`true`) or are converted to f32 in
    /// the program first (`false`): see [`Mamba2::with_bf16_dots`]. Without an explicit choice,
    /// the [`Target`]'s: `false` on a CPU platform whose processor has neither AVX512-BF16 nor
    /// AMX-BF16 (XLA's bf16 dot is slower than converting there; see `docs/performance.md`),
    /// `true` elsewhere.
    pub fn bf16_dots(&self) -> bool {
        if let Some(choice) = self.bf16_dots {
            return choice;
        }
        self.target.bf16_dot
    }

    /// Sets how bf16 matrices enter their products (see [`Mamba2::bf16_dots`]); `None`
    /// restores the automatic choice. Converting keeps the bf16 bytes on the device (the
    /// conversion is in the program; `generate` hoists it out of its loop) and computes in f32,
    /// which is also more precise. No effect on f32 weights, nor, on the CPU platform, on the
    /// products of one row in a program that reads the bf16 matrices as they are (a batch-1
    /// [`Mamba2::step`]): those are bf16 dots wherever the processor has bf16 dot instructions
    /// (see `block::linear`).
    pub fn with_bf16_dots(mut self, choice: Option<bool>) -> Mamba2 {
        self.bf16_dots = choice;
        self.programs
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self
    }

    /// The weights' names and types, as stored.
    pub(super) fn types(&self) -> &Mamba2Weights<TensorType> {
        &self.types
    }

    /// The weights as parameters of `g`, as stored.
    pub(super) fn weight_parameters(&self, g: &Graph) -> Result<Mamba2Weights<Tensor>> {
        block::weight_parameters(g, &self.types)
    }

    /// The weights as the products of a program read them: bf16 matrices converted to f32
    /// unless [`Mamba2::bf16_dots`] or `one_row` on the CPU platform (products of one row,
    /// which there read bf16 matrices without a converted copy; see `block::linear`). Programs
    /// with a loop convert: XLA hoists the conversion out of the loop, and the loop's one-row
    /// products over the f32 copy are slower as multiply-reduce than as dots (see
    /// `docs/performance.md`).
    pub(super) fn for_products(
        &self,
        w: &Mamba2Weights<Tensor>,
        one_row: bool,
    ) -> Result<Mamba2Weights<Tensor>> {
        let one_row = one_row && self.target.is_cpu();
        if self.bf16_dots() || one_row || self.matmul_dtype() != DType::BF16 {
            return Ok(w.clone());
        }
        w.try_map(|_, t| t.astype(DType::F32))
    }

    /// The config with the chunk of a prefill over `bucket` positions.
    pub(super) fn prefill_config(&self, bucket: usize) -> Mamba2Config {
        Mamba2Config {
            chunk_size: self.prefill_chunk(bucket),
            ..self.config.clone()
        }
    }

    /// Where the model's programs run, decided once from its client.
    pub fn target(&self) -> Target {
        self.target
    }

    /// Builds the model's programs for `target` instead of its client's: to read or check
    /// (say, with [`Mamba2::stablehlo`]) the programs of another platform. They still compile
    /// and run on the client, in that platform's forms.
    pub fn with_target(mut self, target: Target) -> Mamba2 {
        self.target = target;
        self.programs
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self
    }

    /// An empty graph for one of the model's programs (built for its [`Target`]).
    pub(super) fn graph(&self) -> Graph {
        Graph::with_target(self.target)
    }

    /// The client the model runs on.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The configuration.
    pub fn config(&self) -> &Mamba2Config {
        &self.config
    }

    /// The dtype of the matrices: f32, bf16, or [`quant::QUANTIZED`] for 8-bit matrices.
    pub fn matmul_dtype(&self) -> DType {
        self.types.embedding.dtype
    }

    /// The weights on the device, in tree order ([`crate::tree::Tree`]). With
    /// [`block::weight_parameters`] and [`Mamba2Weights::types`] they let a custom program (say,
    /// a benchmark's variant of prefill) run on this model's weights without a second upload.
    pub fn weights(&self) -> &Mamba2Weights<ShardedBuffer> {
        &self.weights
    }

    /// The number of devices the model spans (1 unless made by [`Mamba2::new_parallel`]).
    pub fn devices(&self) -> usize {
        self.placement.as_ref().map_or(1, Placement::devices)
    }

    /// The bytes of weights each device holds (all of them on one device; less when split over
    /// heads).
    pub fn weight_bytes_per_device(&self) -> usize {
        self.weights
            .named()
            .iter()
            .map(|(_, b)| b.bytes_per_device())
            .sum()
    }

    /// How the model is split over its devices (`None` on one device).
    pub fn parallel(&self) -> Option<Parallel> {
        self.placement.as_ref().map(|p| p.kind)
    }

    /// The prefill program of `batch` prompts padded to `bucket` positions (compiled once).
    pub(super) fn prefill_program(
        &self,
        batch: usize,
        bucket: usize,
        at: LogitsAt,
        from: bool,
    ) -> Result<CompiledGraph> {
        let key = format!("prefill b{batch} l{bucket} {at:?} from{from}");
        self.program(&key, || self.prefill_graph(batch, bucket, at, from))
    }

    /// How many programs the model has compiled.
    pub(super) fn compiled_programs(&self) -> usize {
        self.programs.lock().map_or(0, |p| p.len())
    }

    pub(super) fn weight_args(&self) -> Vec<&ShardedBuffer> {
        self.weights.named().into_iter().map(|(_, b)| b).collect()
    }

    /// Compiles (once per key) the program `build` makes.
    pub(super) fn program(
        &self,
        key: &str,
        build: impl FnOnce() -> Result<Graph>,
    ) -> Result<CompiledGraph> {
        let mut programs = self.programs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = programs.get(key) {
            return Ok(p.clone());
        }
        let compiled = build()?.compile(&self.client)?;
        programs.insert(key.to_string(), compiled.clone());
        Ok(compiled)
    }

    /// Puts a finished program of `batch` rows on the model's devices (nothing on one device).
    pub(super) fn placed(&self, g: Graph, batch: usize) -> Result<Graph> {
        if let Some(p) = &self.placement {
            p.check_batch(batch)?;
            p.apply(&g, batch)?;
        }
        Ok(g)
    }

    pub(super) fn state_types(&self, batch: usize) -> (TensorType, TensorType) {
        let c = &self.config;
        (
            TensorType::new(DType::F32, &[batch, c.conv_dim(), c.conv_kernel]),
            TensorType::new(DType::F32, &[batch, c.num_heads, c.head_dim, c.state_size]),
        )
    }

    /// A `batch`-row state as parameters `conv.{i}`, `ssm.{i}` of `g`, donated.
    pub(super) fn state_parameters(
        &self,
        g: &Graph,
        batch: usize,
    ) -> Result<Vec<LayerState<Tensor>>> {
        let (conv_t, ssm_t) = self.state_types(batch);
        (0..self.config.num_layers)
            .map(|i| {
                let conv = g.parameter(&format!("conv.{i}"), conv_t.dtype, &conv_t.dims)?;
                let ssm = g.parameter(&format!("ssm.{i}"), ssm_t.dtype, &ssm_t.dims)?;
                g.donate(&conv)?;
                g.donate(&ssm)?;
                Ok(LayerState { conv, ssm })
            })
            .collect()
    }

    /// The prefill program; with `from_state`, it continues from a state given after the mask.
    pub(super) fn prefill_graph(
        &self,
        batch: usize,
        bucket: usize,
        at: LogitsAt,
        from_state: bool,
    ) -> Result<Graph> {
        let g = self.graph();
        let w = self.for_products(&self.weight_parameters(&g)?, false)?;
        let tokens = g.parameter("tokens", DType::I32, &[batch, bucket])?;
        let mask = g.parameter("mask", DType::F32, &[batch, bucket])?;
        let init = if from_state {
            Some(self.state_parameters(&g, batch)?)
        } else {
            None
        };
        let (logits, states) = self.prefill_logits(&tokens, &mask, &w, at, init.as_deref())?;
        let mut outs = vec![logits];
        for s in states {
            outs.push(s.conv);
            outs.push(s.ssm);
        }
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        self.placed(g, batch)
    }

    /// The prefill of left-padded `tokens` `[b, L]` in a graph, from `init` (zero when `None`):
    /// the logits at `at` and the states. Prefill and generate both build it here.
    pub(super) fn prefill_logits(
        &self,
        tokens: &Tensor,
        mask: &Tensor,
        w: &Mamba2Weights<Tensor>,
        at: LogitsAt,
        init: Option<&[LayerState<Tensor>]>,
    ) -> Result<(Tensor, Vec<LayerState<Tensor>>)> {
        let [batch, bucket] = *tokens.dims() else {
            return Err(Error::InvalidArgument(format!(
                "prefill: tokens is {}, expected [b, L]",
                tokens.ty()
            )));
        };
        let cfg = self.prefill_config(bucket);
        let (hidden, states) = block::prefill(tokens, mask, w, &cfg, init)?;
        let hidden = match at {
            LogitsAt::All => hidden,
            LogitsAt::Last => hidden
                .narrow(1, bucket - 1, 1)?
                .reshape(&[batch as isize, cfg.hidden_size as isize])?,
        };
        Ok((block::head(&hidden, w, &cfg)?, states))
    }

    pub(super) fn step_graph(&self, batch: usize) -> Result<Graph> {
        let g = self.graph();
        // At batch 1 every product has one row: the step converts nothing on each call.
        let w = self.for_products(&self.weight_parameters(&g)?, batch == 1)?;
        let token = g.parameter("token", DType::I32, &[batch])?;
        let states = self.state_parameters(&g, batch)?;
        let (logits, next) = block::step(&token, &states, &w, &self.config)?;
        let mut outs = Vec::new();
        for s in next {
            outs.push(s.conv);
            outs.push(s.ssm);
        }
        outs.push(logits);
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        self.placed(g, batch)
    }

    /// Left-pads the prompts to their [`Mamba2::prompt_bucket`]: token ids and the real-token
    /// mask.
    pub(super) fn pad_prompts(
        &self,
        prompts: &[Vec<u32>],
    ) -> Result<(usize, HostArray, HostArray, Vec<usize>)> {
        if prompts.is_empty() || prompts.iter().any(|p| p.is_empty()) {
            return Err(Error::InvalidArgument(
                "give at least one prompt, and no empty prompt".into(),
            ));
        }
        let vocab = self.config.vocab_size;
        if let Some(bad) = prompts.iter().flatten().find(|&&t| t as usize >= vocab) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
        let too_long = || {
            Error::InvalidArgument(format!(
                "prompts: {} rows padded to {longest} tokens are too many to address",
                prompts.len()
            ))
        };
        let bucket = self.prompt_bucket(longest).ok_or_else(too_long)?;
        let total = prompts.len().checked_mul(bucket).ok_or_else(too_long)?;
        let mut ids = vec![0i32; total];
        let mut mask = vec![0f32; total];
        for (r, p) in prompts.iter().enumerate() {
            let start = r * bucket + bucket - p.len();
            for (k, &t) in p.iter().enumerate() {
                ids[start + k] = t as i32;
                mask[start + k] = 1.0;
            }
        }
        let b = prompts.len();
        Ok((
            bucket,
            HostArray::from_vec(&[b, bucket], ids)?,
            HostArray::from_vec(&[b, bucket], mask)?,
            prompts.iter().map(Vec::len).collect(),
        ))
    }

    /// Runs the prompts (left-padded to a common [`Mamba2::prompt_bucket`]) through the
    /// chunked SSD; returns the logits after each prompt (`[b, vocab]`) and the state for
    /// [`Mamba2::step`]. This is the prefill [`Mamba2::generate`] runs.
    pub fn prefill(&self, prompts: &[Vec<u32>]) -> Result<Prefill> {
        self.run_prefill(prompts, LogitsAt::Last, None)
    }

    /// [`Mamba2::prefill`] continuing from `state` (one row per prompt): the prompts are fed
    /// after whatever made the state, chunked like any prefill, so a conversation or a long
    /// document can be fed in pieces with O(1) memory. The state's buffers are donated. A state
    /// of another shape is an error naming the tensor.
    pub fn prefill_from(&self, prompts: &[Vec<u32>], state: Mamba2State) -> Result<Prefill> {
        self.run_prefill(prompts, LogitsAt::Last, Some(state))
    }

    /// [`Mamba2::prefill`] returning the logits at every position, `[b, L, vocab]` (costlier:
    /// the head runs `L` times).
    pub fn prefill_all_positions(&self, prompts: &[Vec<u32>]) -> Result<Prefill> {
        self.run_prefill(prompts, LogitsAt::All, None)
    }

    pub(super) fn run_prefill(
        &self,
        prompts: &[Vec<u32>],
        at: LogitsAt,
        state: Option<Mamba2State>,
    ) -> Result<Prefill> {
        let (bucket, ids, mask, prompt_len) = self.pad_prompts(prompts)?;
        let batch = prompts.len();
        if let Some(s) = &state {
            s.check(&self.config, batch)?;
        }
        let from = state.is_some();
        let program = self.prefill_program(batch, bucket, at, from)?;
        let mut inputs = vec![host_input("tokens", ids), host_input("mask", mask)];
        if let Some(s) = state {
            inputs.extend(self.flatten_state(s)?);
        }
        let mut outs = call(&self.client, &program, &self.weight_args(), inputs)?.into_iter();
        let logits = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("prefill returned nothing".into()))?;
        let logits = logits.to_host_array()?;
        Ok(Prefill {
            logits,
            prompt_len,
            state: layer_states(&mut outs, self.config.num_layers)?,
        })
    }

    /// The compiled step program of `batch` rows (what [`Mamba2::step`] runs), for
    /// inspection: its text, or over several devices the collectives XLA inserted
    /// ([`crate::runtime::Executable::collectives`]).
    pub fn step_program(&self, batch: usize) -> Result<CompiledGraph> {
        if batch == 0 {
            return Err(Error::InvalidArgument(
                "Mamba2::step_program: batch is 0; it needs at least one row".into(),
            ));
        }
        self.program(&format!("step b{batch}"), || self.step_graph(batch))
    }

    /// Feeds one token per row and returns the logits `[b, vocab]` and the next state. The
    /// state's buffers are donated: the step updates them in place.
    pub fn step(&self, tokens: &[u32], state: Mamba2State) -> Result<(HostArray, Mamba2State)> {
        let batch = tokens.len();
        state.check(&self.config, batch)?;
        if let Some(bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let program = self.step_program(batch)?;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let mut inputs = vec![host_input("token", HostArray::from_vec(&[batch], ids)?)];
        inputs.extend(self.flatten_state(state)?);
        let mut outs = call(&self.client, &program, &self.weight_args(), inputs)?.into_iter();
        let mut layers = Vec::new();
        for _ in 0..self.config.num_layers {
            match (outs.next(), outs.next()) {
                (Some(conv), Some(ssm)) => layers.push(LayerState { conv, ssm }),
                _ => {
                    return Err(Error::InvalidArgument(
                        "step returned too few outputs".into(),
                    ))
                }
            }
        }
        let logits = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("step returned no logits".into()))?;
        let logits = logits.to_host_array()?;
        Ok((logits, Mamba2State { layers }))
    }
}

/// Checks that the types of some weights are those [`Mamba2Weights::types`] gives `config` with
/// the embedding's dtype as the matmul dtype; one error lists every difference.
fn check_weight_types(types: &Mamba2Weights<TensorType>, config: &Mamba2Config) -> Result<()> {
    let want = Mamba2Weights::<TensorType>::types(config, types.embedding.dtype)
        .map_err(|e| Error::InvalidArgument(format!("Mamba2::new: argument `weights`: {e}")))?;
    let problems = named_differences(&types.named(), &want.named(), |t, ty| {
        (t != ty).then(|| format!("is {t}, expected {ty}"))
    });
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "Mamba2::new: argument `weights` does not fit the config: {}",
            problems.join("; ")
        )))
    }
}

/// The largest chunk [`Mamba2::with_prefill_chunk`] takes (every prompt is padded to a
/// multiple of it).
pub const MAX_PREFILL_CHUNK: usize = 1 << 16;

/// The largest prefill chunk on the CPU platform. Measured on the 130M shape (see `docs/performance.md`):
/// smaller chunks make the chunked SSD faster there, as its work per token grows with the chunk.
pub const CPU_MAX_CHUNK: usize = 64;

/// Collects layer states from program outputs, two per layer.
pub(super) fn layer_states(
    outs: &mut impl Iterator<Item = ShardedBuffer>,
    layers: usize,
) -> Result<Mamba2State> {
    let layers = (0..layers)
        .map(|_| match (outs.next(), outs.next()) {
            (Some(conv), Some(ssm)) => Ok(LayerState { conv, ssm }),
            _ => Err(Error::InvalidArgument(
                "a program returned too few state tensors".into(),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Mamba2State { layers })
}
