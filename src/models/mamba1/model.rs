//! A Mamba-1 model on a PJRT client: its weights on the device, prefill over prompts (logits at
//! every position and the states after them), and the one-token step.

use crate::tree::Tree;
use std::path::Path;

use super::block::{self, pair_states, Mamba1State, Scan};
use super::{Mamba1Config, Mamba1Weights};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::layers::layer_state_names;
use crate::models::common::Parallel;
use crate::models::common::{generate_capacity, GenerateOptions, LayerState, LoadOptions};
use crate::models::engine::{
    self, decode_loop, host_input, rows, Decoding, Named, Placement, Programs, Stepper, Value,
    Variant,
};
use crate::ops::{Graph, Tensor};
use crate::runtime::Client;

/// A Mamba-1 (or Falcon-Mamba) model whose weights live on `client`'s first device.
pub struct Mamba1 {
    config: Mamba1Config,
    types: Mamba1Weights<TensorType>,
    scan: Scan,
    /// The weights on the device and the compiled programs.
    programs: Programs<ProgramKey>,
}

/// Generated tokens (one list per row) and the states after them.
type Generated = (Vec<Vec<u32>>, Vec<Mamba1State<HostArray>>);

/// What a compiled program computes: (its kind, rows, positions, scan).
pub(super) type ProgramKey = (Kind, usize, usize, Scan);

/// The kinds of program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// A prefill from a zero state.
    Prefill,
    /// A prefill from states given as inputs.
    PrefillFrom,
    /// One token per row.
    Step,
    /// Generation in one program, up to this many tokens.
    Generate(usize, Variant),
    /// A stream's segment of this many tokens, with a penalty history of this width, decoding
    /// all rows or this many of them.
    Segment(usize, Variant, usize, Option<usize>),
}

/// What a prefill returns.
#[derive(Debug, Clone)]
pub struct Mamba1Prefill {
    /// Logits at every position, `[b, L, vocab]` f32, `L` the longest prompt; shorter prompts
    /// are left-padded, so their positions end at `L - 1` too.
    pub logits: HostArray,
    /// Each block's state after the prompts (`conv` `[b, d_inner, K]`, `ssm`
    /// `[b, d_inner, N]`), to continue with [`Mamba1::step`] or [`Mamba1::prefill_from`].
    pub states: Vec<Mamba1State<HostArray>>,
}

impl Mamba1 {
    /// Uploads `weights` (of [`Mamba1Weights::types`] for `config`, in their dtype) to `client`.
    /// Weights of other types are an error naming each.
    pub fn new(
        client: &Client,
        config: Mamba1Config,
        weights: &Mamba1Weights<HostArray>,
    ) -> Result<Self> {
        Mamba1::place(client, config, weights, None)
    }

    /// [`Mamba1::new`] over devices `0..devices` of `client`, split as `parallel` says: every
    /// program runs as one SPMD program over them, with one device's results. With heads, an
    /// error unless the devices divide the inner channels (the selective scan's heads).
    pub fn new_parallel(
        client: &Client,
        config: Mamba1Config,
        weights: &Mamba1Weights<HostArray>,
        parallel: Parallel,
        devices: usize,
    ) -> Result<Self> {
        let heads = [("inner channels", config.d_inner)];
        let placement = Placement::new(parallel, devices, &heads)?;
        Mamba1::place(client, config, weights, (devices > 1).then_some(placement))
    }

    fn place(
        client: &Client,
        config: Mamba1Config,
        weights: &Mamba1Weights<HostArray>,
        placement: Option<Placement>,
    ) -> Result<Self> {
        let matmul = weights.embedding.values.dtype();
        let types = Mamba1Weights::<TensorType>::types(&config, matmul)?;
        engine::check_weight_types("Mamba-1", &types.named(), &weights.named())?;
        let programs = Programs::upload(client, &weights.named(), placement)?;
        Ok(Mamba1 {
            config,
            types,
            scan: if programs.target().is_cpu() {
                Scan::Loop
            } else {
                Scan::Associative
            },
            programs,
        })
    }

    /// The dtype of the matrices (f32 or bf16).
    pub fn matmul_dtype(&self) -> DType {
        self.programs.matmul_dtype()
    }

    /// The bytes of the weights on the device.
    pub fn weight_bytes(&self) -> usize {
        self.programs.weight_bytes()
    }

    /// Loads the HF checkpoint in `dir` (`config.json` with `model_type` `mamba` or
    /// `falcon_mamba`, and its safetensors) with matrices in `matmul_dtype` (F32 or BF16).
    /// A config or tensors that do not fit are an [`Error::Checkpoint`].
    pub fn load(client: &Client, dir: &Path, matmul_dtype: DType) -> Result<Self> {
        let config = Mamba1Config::load(dir).map_err(|e| e.in_checkpoint(dir))?;
        let weights = Mamba1Weights::load(dir, &config, matmul_dtype, &LoadOptions::default())
            .map_err(|e| e.in_checkpoint(dir))?;
        Mamba1::new(client, config, &weights)
    }

    /// The weights on the device and the compiled programs.
    pub(super) fn programs(&self) -> &Programs<ProgramKey> {
        &self.programs
    }

    /// The weights' names and types.
    pub(super) fn types(&self) -> &Mamba1Weights<TensorType> {
        &self.types
    }

    /// How the prefill's selective scan runs.
    pub(super) fn scan(&self) -> Scan {
        self.scan
    }

    /// Runs every prefill's selective scan as `scan` says (by default [`Scan::Loop`] on the CPU
    /// platform, [`Scan::Associative`] elsewhere): the same results up to rounding.
    pub fn with_scan(mut self, scan: Scan) -> Self {
        self.scan = scan;
        self
    }

    /// The model's config.
    pub fn config(&self) -> &Mamba1Config {
        &self.config
    }

    /// Runs the prompts (token ids, at least one each, all below the vocabulary size), left-
    /// padded to the longest: the logits at every position and the states after the prompts.
    pub fn prefill(&self, prompts: &[Vec<u32>]) -> Result<Mamba1Prefill> {
        self.run_prefill(prompts, None, 0)
    }

    /// [`Mamba1::prefill`] continuing from `states` (one per block, one row per prompt, as a
    /// prefill or step returned them): the prompts are fed after whatever made the states, so
    /// a prompt split in two gives the whole prompt's results. States of the wrong number or
    /// shape are an error naming them.
    pub fn prefill_from(
        &self,
        prompts: &[Vec<u32>],
        states: &[Mamba1State<HostArray>],
    ) -> Result<Mamba1Prefill> {
        self.check_states("prefill_from", states, prompts.len())?;
        self.run_prefill(prompts, Some(states), 0)
    }

    /// The prefill of `prompts` left-padded to the longest, or to `pad_to` positions when that
    /// is more, after `init` (zero states when `None`).
    pub(super) fn run_prefill(
        &self,
        prompts: &[Vec<u32>],
        init: Option<&[Mamba1State<HostArray>]>,
        pad_to: usize,
    ) -> Result<Mamba1Prefill> {
        let len = prompts.iter().map(Vec::len).max().unwrap_or(0).max(pad_to);
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(Error::InvalidArgument(
                "Mamba1::prefill needs at least one prompt, and no empty prompt".into(),
            ));
        }
        let b = prompts.len();
        let (ids, mask) = self.padded(prompts, len, "prefill")?;
        let kind = if init.is_some() {
            Kind::PrefillFrom
        } else {
            Kind::Prefill
        };
        let from_state = init.is_some();
        let program = self.program((kind, b, len, self.scan), |g, w| {
            self.prefill_outputs(g, w, b, len, from_state)
        })?;
        let mut inputs = vec![host_input("tokens", ids), host_input("mask", mask)];
        let states = init.unwrap_or_default();
        let values = states.iter().flat_map(|s| [s.conv.clone(), s.ssm.clone()]);
        let names = layer_state_names(states.len());
        inputs.extend(names.into_iter().zip(values.map(Value::Host)));
        let mut out = self.run(&program, inputs)?.into_iter();
        let logits = out
            .next()
            .ok_or_else(|| Error::InvalidArgument("no logits".into()))?;
        Ok(Mamba1Prefill {
            logits,
            states: pair_states(out)?,
        })
    }

    /// One state per block as parameters of `g`, for `b` rows.
    pub(super) fn state_parameters(&self, g: &Graph, b: usize) -> Result<Vec<Mamba1State<Tensor>>> {
        let (conv, ssm) = self.state_dims(b);
        (0..self.config.num_layers)
            .map(|i| {
                Ok(Mamba1State {
                    conv: g.parameter(&format!("conv.{i}"), DType::F32, &conv)?,
                    ssm: g.parameter(&format!("ssm.{i}"), DType::F32, &ssm)?,
                })
            })
            .collect()
    }

    /// The dims of a block's conv and ssm states for `b` rows.
    pub(super) fn state_dims(&self, b: usize) -> ([usize; 3], [usize; 3]) {
        let c = &self.config;
        ([b, c.d_inner, c.conv_kernel], [b, c.d_inner, c.state_size])
    }

    /// Checks that `states` hold one f32 state per block for `b` rows; an error names `op` and
    /// the first state that does not fit.
    pub(super) fn check_states(
        &self,
        op: &str,
        states: &[Mamba1State<HostArray>],
        b: usize,
    ) -> Result<()> {
        let layers = self.config.num_layers;
        if states.len() != layers {
            return Err(Error::InvalidArgument(format!(
                "Mamba1::{op}: {} states, expected one per layer ({layers})",
                states.len()
            )));
        }
        let (conv_dims, ssm_dims) = self.state_dims(b);
        for (i, s) in states.iter().enumerate() {
            for (what, a, dims) in [("conv", &s.conv, conv_dims), ("ssm", &s.ssm, ssm_dims)] {
                if a.dtype() != DType::F32 || a.dims() != dims {
                    return Err(Error::InvalidArgument(format!(
                        "Mamba1::{op}: state {i}'s {what} is {:?} {:?}, expected f32 {dims:?}",
                        a.dtype(),
                        a.dims()
                    )));
                }
            }
        }
        Ok(())
    }

    /// One new token per row after `states` (from [`Mamba1::prefill`] or an earlier step, one
    /// per block): the logits `[b, vocab]` and the next states. States of the wrong number or
    /// shape, or a token outside the vocabulary, are an error naming it.
    pub fn step(
        &self,
        tokens: &[u32],
        states: &[Mamba1State<HostArray>],
    ) -> Result<(HostArray, Vec<Mamba1State<HostArray>>)> {
        let b = tokens.len();
        if b == 0 {
            return Err(Error::InvalidArgument(
                "Mamba1::step needs at least one token".into(),
            ));
        }
        self.check_states("step", states, b)?;
        let ids = tokens
            .iter()
            .map(|&t| self.token(t, "step"))
            .collect::<Result<Vec<i32>>>()?;
        let program = self.program((Kind::Step, b, 1, Scan::Loop), |g, w| {
            self.step_outputs(g, w, b)
        })?;
        let mut inputs = vec![host_input("tokens", HostArray::from_vec(&[b], ids)?)];
        let values = states.iter().flat_map(|s| [s.conv.clone(), s.ssm.clone()]);
        let names = layer_state_names(states.len());
        inputs.extend(names.into_iter().zip(values.map(Value::Host)));
        let mut out = self.run(&program, inputs)?.into_iter();
        let logits = out
            .next()
            .ok_or_else(|| Error::InvalidArgument("no logits".into()))?;
        Ok((logits, pair_states(out)?))
    }

    /// The prompts left-padded to `len` positions: token ids `[b, len]` i32 and the mask
    /// `[b, len]` f32 (1 at real tokens); a token outside the vocabulary is an error naming
    /// `op`.
    pub(super) fn padded(
        &self,
        prompts: &[Vec<u32>],
        len: usize,
        op: &str,
    ) -> Result<(HostArray, HostArray)> {
        let b = prompts.len();
        let mut ids = vec![0i32; b * len];
        let mut mask = vec![0f32; b * len];
        for (r, p) in prompts.iter().enumerate() {
            let pad = len - p.len();
            for (i, &t) in p.iter().enumerate() {
                ids[r * len + pad + i] = self.token(t, op)?;
                mask[r * len + pad + i] = 1.0;
            }
        }
        Ok((
            HostArray::from_vec(&[b, len], ids)?,
            HostArray::from_vec(&[b, len], mask)?,
        ))
    }

    /// Generates up to `options.max_new_tokens` tokens per prompt in ONE execution: the
    /// prefill and a device-side `while` loop of steps that picks each token (greedy or
    /// sampled, with penalties, stopping a row at `eos`, whose later positions repeat it), as
    /// [`Mamba2::generate`](crate::models::mamba2::Mamba2::generate) does. Options out of range
    /// are an error naming them.
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<u32>>> {
        engine::generate(self, prompts, options)
    }

    /// [`Mamba1::generate`] in segments of up to `segment` tokens (at least 1), handing each
    /// segment's new tokens (one list per row, cut after a row's `eos`) to `on_tokens` as soon
    /// as they exist; `on_tokens` returning `false` stops early. One prefill, then one
    /// execution of a segment program (the shared decode loop) per `segment` tokens. Returns
    /// every row's tokens, the same as `generate`'s.
    pub fn generate_stream(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
        segment: usize,
        on_tokens: impl FnMut(&[Vec<u32>]) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        Ok(engine::segments(self, prompts, None, options, segment, false, on_tokens)?.0)
    }

    /// [`Mamba1::generate`] continuing from `states` (when given: one per block, as a prefill,
    /// step or earlier `generate_from` returned them), returning with the tokens the states
    /// after the prompts and every token emitted (a row that stopped at `eos` keeps its state
    /// from there), for [`Mamba1::prefill_from`] or another `generate_from`.
    pub fn generate_from(
        &self,
        prompts: &[Vec<u32>],
        states: Option<&[Mamba1State<HostArray>]>,
        options: &GenerateOptions,
    ) -> Result<Generated> {
        let segment = generate_capacity(options.max_new_tokens);
        let init = states.map(<[_]>::to_vec);
        engine::segments(self, prompts, init, options, segment, true, |_| true)
    }

    /// Greedy decoding of `new_tokens` tokens per prompt: a prefill, then one [`Mamba1::step`]
    /// per token with the argmax taken on the host.
    pub fn greedy(&self, prompts: &[Vec<u32>], new_tokens: usize) -> Result<Vec<Vec<u32>>> {
        engine::greedy(self, prompts, new_tokens)
    }

    /// `t` as an `i32` id, or an error naming `op` if it is outside the vocabulary.
    fn token(&self, t: u32, op: &str) -> Result<i32> {
        if (t as usize) < self.config.vocab_size {
            Ok(t as i32)
        } else {
            Err(Error::InvalidArgument(format!(
                "Mamba1::{op}: token {t} is outside the vocabulary (size {})",
                self.config.vocab_size
            )))
        }
    }

    /// The prefill program's outputs for `b` rows of `len` positions (after states given as
    /// parameters when `from_state`): the logits at every position, then each block's state.
    pub(super) fn prefill_outputs(
        &self,
        g: &Graph,
        w: &Mamba1Weights<Tensor>,
        b: usize,
        len: usize,
        from_state: bool,
    ) -> Result<Vec<Tensor>> {
        let tokens = g.parameter("tokens", DType::I32, &[b, len])?;
        let m = g.parameter("mask", DType::F32, &[b, len])?;
        let start = match from_state {
            true => Some(self.state_parameters(g, b)?),
            false => None,
        };
        let (logits, states) =
            block::prefill(&tokens, &m, w, &self.config, self.scan, start.as_deref())?;
        let mut outs = vec![logits];
        outs.extend(states.into_iter().flat_map(|s| [s.conv, s.ssm]));
        Ok(outs)
    }

    /// The step program's outputs for `b` rows: the logits, then each block's state.
    fn step_outputs(&self, g: &Graph, w: &Mamba1Weights<Tensor>, b: usize) -> Result<Vec<Tensor>> {
        let tok = g.parameter("tokens", DType::I32, &[b])?;
        let params = self.state_parameters(g, b)?;
        let (logits, next) = block::step(&tok, &params, w, &self.config)?;
        let mut outs = vec![logits];
        outs.extend(next.into_iter().flat_map(|s| [s.conv, s.ssm]));
        Ok(outs)
    }

    /// The generate program's output (the tokens `[b, capacity]`) for `b` rows of `len`
    /// prompt positions.
    pub(super) fn generate_outputs(
        &self,
        g: &Graph,
        w: &Mamba1Weights<Tensor>,
        b: usize,
        len: usize,
        capacity: usize,
        v: Variant,
    ) -> Result<Vec<Tensor>> {
        let tokens = g.parameter("tokens", DType::I32, &[b, len])?;
        let m = g.parameter("mask", DType::F32, &[b, len])?;
        let c = engine::control_parameters(g, b, len + capacity, v)?;
        let (logits, states) = block::prefill(&tokens, &m, w, &self.config, self.scan, None)?;
        let vocab = self.config.vocab_size as isize;
        let start = Decoding {
            logits: logits
                .narrow(1, len - 1, 1)?
                .reshape(&[b as isize, vocab])?,
            states,
            done: g.full(0.0, DType::Pred, &[b])?,
            key: c.key,
            history: c.history,
        };
        let steps = Steps {
            w,
            cfg: &self.config,
        };
        let (out, _, _) = decode_loop(&steps, start, &c.max_new, &c.picker, capacity, v)?;
        Ok(vec![out])
    }

    /// The StableHLO text of the prefill, step and generate programs for `prompts` (left-padded
    /// to the longest) and `options`, as `generate` would compile them; for reading and for
    /// the CLI's `emit`.
    pub fn stablehlo(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
    ) -> Result<[String; 3]> {
        engine::check_options(options, self.config.vocab_size)?;
        let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if prompts.is_empty() || len == 0 {
            return Err(Error::InvalidArgument(
                "Mamba1::stablehlo needs at least one prompt".into(),
            ));
        }
        let b = prompts.len();
        let capacity = generate_capacity(options.max_new_tokens);
        let v = engine::variant(options);
        Ok([
            self.text(|g, w| self.prefill_outputs(g, w, b, len, false))?,
            self.text(|g, w| self.step_outputs(g, w, b))?,
            self.text(|g, w| self.generate_outputs(g, w, b, len, capacity, v))?,
        ])
    }

    /// The graph `build` makes (given a graph and the weights as its first parameters,
    /// returning the outputs).
    fn graph(
        &self,
        build: impl FnOnce(&Graph, &Mamba1Weights<Tensor>) -> Result<Vec<Tensor>>,
    ) -> Result<Graph> {
        let g = Graph::with_target(self.programs.target());
        let w = block::weight_parameters(&g, &self.types)?;
        let outs = build(&g, &w)?;
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        Ok(g)
    }

    /// The StableHLO text of the graph `build` makes.
    fn text(
        &self,
        build: impl FnOnce(&Graph, &Mamba1Weights<Tensor>) -> Result<Vec<Tensor>>,
    ) -> Result<String> {
        self.graph(build)?.to_stablehlo()
    }

    /// The compiled program `key`, built by `build` (as for [`Mamba1::graph`]) and compiled on
    /// first use.
    pub(super) fn program(
        &self,
        key: ProgramKey,
        build: impl FnOnce(&Graph, &Mamba1Weights<Tensor>) -> Result<Vec<Tensor>>,
    ) -> Result<CompiledGraph> {
        self.programs.get(key, key.1, || self.graph(build))
    }

    /// Runs `program` on the weights and `inputs`, downloading its outputs.
    pub(super) fn run(
        &self,
        program: &CompiledGraph,
        inputs: Vec<Named>,
    ) -> Result<Vec<HostArray>> {
        self.programs.run(program, inputs)
    }
}

/// Mamba-1's step inside the decode loop.
pub(super) struct Steps<'a> {
    pub(super) w: &'a Mamba1Weights<Tensor>,
    pub(super) cfg: &'a Mamba1Config,
}

impl Stepper for Steps<'_> {
    type State = Vec<LayerState<Tensor>>;
    fn step(&self, token: &Tensor, state: &Self::State) -> Result<(Tensor, Self::State)> {
        block::step(token, state, self.w, self.cfg)
    }
    fn hold(&self, done: &Tensor, old: &Self::State, next: Self::State) -> Result<Self::State> {
        next.into_iter()
            .zip(old)
            .map(|(n, s)| {
                Ok(LayerState {
                    conv: rows(done, 3)?.select(&s.conv, &n.conv)?,
                    ssm: rows(done, 3)?.select(&s.ssm, &n.ssm)?,
                })
            })
            .collect()
    }
}
