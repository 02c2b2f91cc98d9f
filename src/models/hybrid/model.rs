//! A hybrid model on a PJRT client: its weights on the device, prefill over prompts (logits at
//! every position and the state after them), the one-token step, and greedy decoding.

use crate::tree::Tree;
use std::path::Path;

use super::config::{HybridConfig, SublayerKind};
use super::graph::{forward, Step, SublayerState};
use super::weights::HybridWeights;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::Parallel;
use crate::models::common::{LayerState, LoadOptions};
use crate::models::engine::attention::Positions;
use crate::models::engine::{self, host_input, Named, Placement, Programs, Variant};
use crate::ops::{Graph, Tensor};
use crate::runtime::Client;
use crate::target::Target;

/// The attention caches grow in steps of this many columns (at least).
pub(super) const CAPACITY_STEP: usize = 64;

/// Everything a hybrid model carries from one call to the next, for `b` rows.
#[derive(Debug, Clone)]
pub struct HybridState {
    /// One state per sublayer (Mamba-2 mixers and attention caches; nothing for MLPs).
    pub sublayers: Vec<SublayerState<HostArray>>,
    /// `[b, capacity]` f32: 0 where an attention cache column holds no real token, else that
    /// token's position plus one.
    pub valid: HostArray,
    /// Cache columns used so far (the same for every row; padding takes columns too).
    pub column: usize,
    /// Each row's next rotary position: how many real tokens it has seen.
    pub positions: Vec<i32>,
}

impl HybridState {
    /// The rows of the state.
    pub fn rows(&self) -> usize {
        self.positions.len()
    }

    /// The attention caches' capacity in columns.
    pub fn capacity(&self) -> usize {
        self.valid.dims().get(1).copied().unwrap_or(0)
    }
}

/// What a prefill returns.
#[derive(Debug, Clone)]
pub struct HybridPrefill {
    /// Logits at every position, `[b, L, vocab]` f32, `L` the longest prompt; shorter prompts
    /// are left-padded, so their positions end at `L - 1` too.
    pub logits: HostArray,
    /// The state after the prompts, to continue with [`Hybrid::step`] or
    /// [`Hybrid::prefill_from`].
    pub state: HybridState,
}

/// The host inputs of a forward pass, and the rows' positions after it.
pub(super) struct Fed {
    pub(super) ids: HostArray,
    pub(super) mask: HostArray,
    pub(super) rotary: HostArray,
    pub(super) valid: HostArray,
    pub(super) positions: Vec<i32>,
}

/// What a compiled program computes: (its kind, rows, positions, capacity, chunk).
pub(super) type ProgramKey = (Kind, usize, usize, usize, usize);

/// The kinds of program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// Prompts after a state.
    Prefill,
    /// Prompts from the start, the logits after the last position only.
    PrefillLast,
    /// Prompts after a state, the logits after the last position only (what a generation, a
    /// stream and a served slot start from).
    PrefillLastFrom,
    /// One token per row after a state.
    Step,
    /// Generation in one program, up to this many tokens.
    Generate(usize, Variant),
    /// A stream's segment of this many tokens, decoding all rows or this many of them, its
    /// full-attention caches in a pool of this many pages or rows first.
    Segment(usize, Variant, Option<usize>, Option<usize>),
}

/// A Bamba, Granite 4.0-H or Nemotron-H model whose weights live on `client`'s first device.
pub struct Hybrid {
    config: HybridConfig,
    types: HybridWeights<TensorType>,
    /// Whether decode steps gather the chosen experts (the default) or run them all.
    gather: bool,
    /// The weights on the device and the compiled programs.
    programs: Programs<ProgramKey>,
}

impl Hybrid {
    /// Uploads `weights` (of [`HybridWeights::types`] for `config`, in their dtype) to
    /// `client`. Weights of other types are an error naming each.
    pub fn new(
        client: &Client,
        config: HybridConfig,
        weights: &HybridWeights<HostArray>,
    ) -> Result<Self> {
        Hybrid::place(client, config, weights, None)
    }

    /// [`Hybrid::new`] over devices `0..devices` of `client`, split as `parallel` says: every
    /// program runs as one SPMD program over them, with one device's results. With heads, an
    /// error unless the devices divide the Mamba-2 heads and the attention and key/value
    /// heads (of the kinds of sublayer the model has).
    pub fn new_parallel(
        client: &Client,
        config: HybridConfig,
        weights: &HybridWeights<HostArray>,
        parallel: Parallel,
        devices: usize,
    ) -> Result<Self> {
        let a = &config.attention;
        let mut heads = Vec::new();
        if config.count(SublayerKind::Mamba) > 0 {
            heads.push(("Mamba-2 heads", config.mamba.num_heads));
        }
        if config.count(SublayerKind::Attention) > 0 {
            heads.extend([
                ("attention heads", a.num_heads),
                ("key/value heads", a.num_kv_heads),
            ]);
        }
        let placement = Placement::new(parallel, devices, &heads)?;
        Hybrid::place(client, config, weights, (devices > 1).then_some(placement))
    }

    fn place(
        client: &Client,
        config: HybridConfig,
        weights: &HybridWeights<HostArray>,
        placement: Option<Placement>,
    ) -> Result<Self> {
        let types = HybridWeights::<TensorType>::types(&config, weights.embedding.values.dtype())?;
        engine::check_weight_types("hybrid", &types.named(), &weights.named())?;
        let programs = Programs::upload(client, &weights.named(), placement)?;
        Ok(Hybrid {
            config,
            types,
            gather: true,
            programs,
        })
    }

    /// With `gather` (the default), a decode step's mixture of experts reads only each
    /// token's chosen experts' matrices; without, every expert runs on every token and the
    /// unchosen ones weigh 0 (as the prefill does). The same results up to rounding.
    pub fn with_gathered_experts(mut self, gather: bool) -> Self {
        self.gather = gather;
        self.programs.clear();
        self
    }

    /// Builds the model's programs for `target` instead of its client's: to read or check
    /// (say, with [`Hybrid::stablehlo`]) the programs of another platform. They still compile
    /// and run on the client, in that platform's forms.
    pub fn with_target(mut self, target: Target) -> Self {
        self.programs.set_target(target);
        self
    }

    /// The weights' names and types.
    pub(super) fn types(&self) -> &HybridWeights<TensorType> {
        &self.types
    }

    /// Whether decode steps gather the chosen experts.
    pub(super) fn gathers(&self) -> bool {
        self.gather
    }

    /// The dtype of the matrices (f32 or bf16).
    pub fn matmul_dtype(&self) -> DType {
        self.programs.matmul_dtype()
    }

    /// The bytes of the weights on the device.
    pub fn weight_bytes(&self) -> usize {
        self.programs.weight_bytes()
    }

    /// Loads the HF checkpoint in `dir` (`config.json` with `model_type` `bamba`,
    /// `granitemoehybrid` or `nemotron_h`, and its safetensors) with matrices in
    /// `matmul_dtype` (F32 or BF16).
    /// A config or tensors that do not fit are an [`Error::Checkpoint`].
    pub fn load(client: &Client, dir: &Path, matmul_dtype: DType) -> Result<Self> {
        let config = HybridConfig::load(dir).map_err(|e| e.in_checkpoint(dir))?;
        let weights = HybridWeights::load(dir, &config, matmul_dtype, &LoadOptions::default())
            .map_err(|e| e.in_checkpoint(dir))?;
        Hybrid::new(client, config, &weights)
    }

    /// The model's config.
    pub fn config(&self) -> &HybridConfig {
        &self.config
    }

    /// The state before any token, for `rows` rows and attention caches of `capacity`
    /// columns.
    pub fn empty_state(&self, rows: usize, capacity: usize) -> Result<HybridState> {
        let c = &self.config;
        let m = &c.mamba;
        let a = &c.attention;
        let zeros = |dims: &[usize]| HostArray::from_vec(dims, vec![0f32; dims.iter().product()]);
        let sublayers = c
            .sublayers
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let cols = c.cache_columns(i, capacity);
                Ok(match k {
                    SublayerKind::Mamba => SublayerState::Mamba(LayerState {
                        conv: zeros(&[rows, m.conv_dim(), m.conv_kernel])?,
                        ssm: zeros(&[rows, m.num_heads, m.head_dim, m.state_size])?,
                    }),
                    SublayerKind::Attention => SublayerState::Attention {
                        k: zeros(&[rows, a.num_kv_heads, a.head_dim, cols])?,
                        v: zeros(&[rows, a.num_kv_heads, cols, a.head_dim])?,
                    },
                    _ => SublayerState::None,
                })
            })
            .collect::<Result<_>>()?;
        Ok(HybridState {
            sublayers,
            valid: zeros(&[rows, capacity])?,
            column: 0,
            positions: vec![0; rows],
        })
    }

    /// Runs the prompts (token ids, at least one each, all below the vocabulary size), left-
    /// padded to the longest: the logits at every position and the state after the prompts.
    pub fn prefill(&self, prompts: &[Vec<u32>]) -> Result<HybridPrefill> {
        let state = self.empty_state(prompts.len(), 0)?;
        self.run_prefill(prompts, state, (0, 0), false)
    }

    /// [`Hybrid::prefill`] continuing from `state` (one row per prompt, as a prefill or step
    /// returned it): the prompts are fed after whatever made the state, so a prompt split in
    /// two gives the whole prompt's results. A state that does not fit is an error naming
    /// what is wrong.
    pub fn prefill_from(&self, prompts: &[Vec<u32>], state: HybridState) -> Result<HybridPrefill> {
        self.check_state("prefill_from", &state, prompts.len())?;
        self.run_prefill(prompts, state, (0, 0), false)
    }

    /// [`Hybrid::prefill`] (or, after `state`, [`Hybrid::prefill_from`]) with caches that
    /// have room for `reserve` more tokens, the prompts padded to at least `pad_to` positions:
    /// the logits after the last position only (`[b, 1, vocab]`; the head runs on it alone).
    pub(super) fn prefill_reserving(
        &self,
        prompts: &[Vec<u32>],
        state: Option<HybridState>,
        reserve: usize,
        pad_to: usize,
    ) -> Result<HybridPrefill> {
        let state = match state {
            Some(s) => {
                self.check_state("generate_from", &s, prompts.len())?;
                s
            }
            None => self.empty_state(prompts.len(), 0)?,
        };
        self.run_prefill(prompts, state, (reserve, pad_to), true)
    }

    /// The prefill, with room for `reserve` more columns after the prompts (padded to at least
    /// `pad_to` positions): the logits at every prompt position, or with `last_only` after the
    /// last.
    fn run_prefill(
        &self,
        prompts: &[Vec<u32>],
        state: HybridState,
        (reserve, pad_to): (usize, usize),
        last_only: bool,
    ) -> Result<HybridPrefill> {
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(Error::InvalidArgument(
                "Hybrid::prefill needs at least one prompt, and no empty prompt".into(),
            ));
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let (rows, chunk) = self.padded_rows(prompts, pad_to);
        let (logits, state) = self.forward(&rows, state, (chunk, reserve), last_only)?;
        Ok(HybridPrefill {
            logits: engine::last_positions(&logits, longest)?,
            state,
        })
    }

    /// The prompts left-padded (`None`) to a multiple of the Mamba-2 prefill's chunk (at least
    /// `pad_to` positions): the config's chunk, or the power of two above the longest prompt
    /// when that is smaller.
    pub(super) fn padded_rows(
        &self,
        prompts: &[Vec<u32>],
        pad_to: usize,
    ) -> (Vec<Vec<Option<u32>>>, usize) {
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(1).max(pad_to);
        let (len, chunk) = self.padding(longest);
        let rows = prompts
            .iter()
            .map(|p| {
                let mut row = vec![None; len - p.len()];
                row.extend(p.iter().map(|&t| Some(t)));
                row
            })
            .collect();
        (rows, chunk)
    }

    /// The padded length and the Mamba-2 chunk of prompts up to `longest` tokens: a multiple of
    /// the config's chunk, or of the power of two above `longest` when that is smaller.
    pub(super) fn padding(&self, longest: usize) -> (usize, usize) {
        let chunk = self
            .config
            .mamba
            .chunk_size
            .min(longest.max(1).next_power_of_two());
        (longest.max(1).next_multiple_of(chunk), chunk)
    }

    /// The weights on the device and the compiled programs.
    pub(super) fn programs(&self) -> &Programs<ProgramKey> {
        &self.programs
    }

    /// One new token per row after `state` (from [`Hybrid::prefill`] or an earlier step): the
    /// logits `[b, vocab]` and the next state. A state that does not fit, or a token outside
    /// the vocabulary, is an error naming it.
    pub fn step(&self, tokens: &[u32], state: HybridState) -> Result<(HostArray, HybridState)> {
        self.check_state("step", &state, tokens.len())?;
        let rows: Vec<Vec<Option<u32>>> = tokens.iter().map(|&t| vec![Some(t)]).collect();
        let (logits, state) = self.forward(&rows, state, (1, 0), false)?;
        let (b, v) = (tokens.len(), self.config.vocab_size);
        let logits =
            HostArray::from_bytes(&TensorType::new(DType::F32, &[b, v]), &logits.to_bytes())?;
        Ok((logits, state))
    }

    /// Greedy decoding of `new_tokens` tokens per prompt: a prefill with caches sized for
    /// them, then one [`Hybrid::step`] per token with the argmax taken on the host.
    pub fn greedy(&self, prompts: &[Vec<u32>], new_tokens: usize) -> Result<Vec<Vec<u32>>> {
        engine::greedy(self, prompts, new_tokens)
    }

    /// Feeds `rows` (equal lengths, `None` = padding) after `state`, growing the caches to hold
    /// them and `reserve` more columns: the logits `[b, L, vocab]` (`[b, 1, vocab]` with
    /// `last_only`) and the next state.
    fn forward(
        &self,
        rows: &[Vec<Option<u32>>],
        state: HybridState,
        (chunk, reserve): (usize, usize),
        last_only: bool,
    ) -> Result<(HostArray, HybridState)> {
        let (b, len) = (rows.len(), rows[0].len());
        let need = state.column + len + reserve;
        let state = if need > state.capacity() {
            let grown = need.max(2 * state.capacity());
            grow(state, grown.next_multiple_of(CAPACITY_STEP), &self.config)?
        } else {
            state
        };
        let cap = state.capacity();
        let fed = self.feed(rows, &state)?;
        let decode = len == 1;
        let template = state.sublayers.clone();
        let kind = match (decode, last_only) {
            (true, _) => Kind::Step,
            (false, true) => Kind::PrefillLastFrom,
            (false, false) => Kind::Prefill,
        };
        let program = self.program((kind, b, len, cap, chunk), |g, w| {
            let last = last_only && !decode;
            self.forward_outputs(g, w, (b, len, cap, chunk), (decode, last), &template)
        })?;
        let mut inputs = vec![
            host_input("tokens", fed.ids),
            host_input("mask", fed.mask),
            host_input("positions", fed.rotary),
            host_input("column", HostArray::scalar(state.column as i32)),
            host_input("valid", fed.valid.clone()),
        ];
        let tensors = state.sublayers.iter().flat_map(|s| s.tensors());
        for (i, t) in tensors.enumerate() {
            inputs.push(host_input(format!("state.{i}"), t.clone()));
        }
        let mut out = self.run(&program, inputs)?.into_iter();
        let logits = out
            .next()
            .ok_or_else(|| Error::InvalidArgument("no logits".into()))?;
        let mut take = || {
            out.next()
                .ok_or_else(|| Error::InvalidArgument("a program returned too few states".into()))
        };
        let sublayers = state
            .sublayers
            .iter()
            .map(|s| s.rebuild(&mut take))
            .collect::<Result<Vec<_>>>()?;
        Ok((
            logits,
            HybridState {
                sublayers,
                valid: fed.valid,
                column: state.column + len,
                positions: fed.positions,
            },
        ))
    }

    /// The outputs of a forward program for `(b, len, cap, chunk)` (rows, positions, cache
    /// columns, Mamba-2 chunk) after states shaped like `template`, a decode step or not and
    /// the last position's logits only or not: the logits `[b, len, vocab]` (`[b, 1, vocab]`),
    /// then the states' tensors. Parameters after the weights: `tokens`, `mask`, `positions`
    /// (rotary), `column`, `valid`, the states.
    pub(super) fn forward_outputs(
        &self,
        g: &Graph,
        w: &HybridWeights<Tensor>,
        (b, len, cap, chunk): (usize, usize, usize, usize),
        (decode, last_only): (bool, bool),
        template: &[SublayerState<HostArray>],
    ) -> Result<Vec<Tensor>> {
        let tokens = g.parameter("tokens", DType::I32, &[b, len])?;
        let m = g.parameter("mask", DType::F32, &[b, len])?;
        let rot = g.parameter("positions", DType::I32, &[b, len])?;
        let column = g.parameter("column", DType::I32, &[])?;
        let valid = g.parameter("valid", DType::F32, &[b, cap])?;
        let mut params = Vec::new();
        for (i, a) in template.iter().flat_map(|s| s.tensors()).enumerate() {
            params.push(g.parameter(&format!("state.{i}"), a.dtype(), a.dims())?);
        }
        let mut params = params.into_iter();
        let mut next_param = || {
            params
                .next()
                .ok_or_else(|| Error::InvalidArgument("too few state parameters".into()))
        };
        let states = template
            .iter()
            .map(|s| s.rebuild(&mut next_param))
            .collect::<Result<Vec<_>>>()?;
        let step = Step {
            tokens: &tokens,
            mask: &m,
            at: Positions {
                rotary: &rot,
                column: &column,
                valid: &valid,
            },
            decode,
            gather: decode && self.gather,
            chunk,
            remat: false,
            last_only,
        };
        let (logits, next) = forward(&step, &states, w, &self.config)?;
        let mut outs = vec![logits];
        outs.extend(next.iter().flat_map(|s| s.tensors().into_iter().cloned()));
        Ok(outs)
    }

    /// The host inputs for feeding `rows` (equal lengths, `None` = padding) after `state`
    /// (whose caches have room for them).
    pub(super) fn feed(&self, rows: &[Vec<Option<u32>>], state: &HybridState) -> Result<Fed> {
        let (b, len, cap) = (rows.len(), rows[0].len(), state.capacity());
        let mut ids = vec![0i32; b * len];
        let mut mask = vec![0f32; b * len];
        let mut rotary = vec![0i32; b * len];
        let mut valid: Vec<f32> = state.valid.to_f64_vec().iter().map(|&x| x as f32).collect();
        let mut positions = state.positions.clone();
        for (r, row) in rows.iter().enumerate() {
            for (i, t) in row.iter().enumerate() {
                if let Some(t) = *t {
                    ids[r * len + i] = self.token(t)?;
                    mask[r * len + i] = 1.0;
                    rotary[r * len + i] = positions[r];
                    valid[r * cap + state.column + i] = positions[r] as f32 + 1.0;
                    positions[r] += 1;
                }
            }
        }
        Ok(Fed {
            ids: HostArray::from_vec(&[b, len], ids)?,
            mask: HostArray::from_vec(&[b, len], mask)?,
            rotary: HostArray::from_vec(&[b, len], rotary)?,
            valid: HostArray::from_vec(&[b, cap], valid)?,
            positions,
        })
    }

    /// Checks that `state` has `b` rows and one state of the right kind and shape per
    /// sublayer; an error names `op` and the first thing that does not fit.
    fn check_state(&self, op: &str, state: &HybridState, b: usize) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("Hybrid::{op}: {what}")));
        if b == 0 {
            return bad("no rows".into());
        }
        if state.rows() != b || state.valid.dims().first() != Some(&b) {
            return bad(format!("the state has {} rows, expected {b}", state.rows()));
        }
        if state.valid.dims().len() != 2 || state.valid.dtype() != DType::F32 {
            return bad(format!(
                "the state's valid columns are {:?} {:?}, expected f32 [rows, capacity]",
                state.valid.dtype(),
                state.valid.dims()
            ));
        }
        if state.column > state.capacity() {
            return bad(format!(
                "the state's column {} is beyond its capacity {}",
                state.column,
                state.capacity()
            ));
        }
        let want = self.empty_state(b, state.capacity())?;
        if state.sublayers.len() != want.sublayers.len() {
            return bad(format!(
                "{} sublayer states, expected {}",
                state.sublayers.len(),
                want.sublayers.len()
            ));
        }
        for (i, (s, w)) in state.sublayers.iter().zip(&want.sublayers).enumerate() {
            let (got, exp) = (s.tensors(), w.tensors());
            let fits = got.len() == exp.len()
                && got
                    .iter()
                    .zip(&exp)
                    .all(|(a, e)| a.dtype() == DType::F32 && a.dims() == e.dims());
            if !fits {
                let dims: Vec<_> = got.iter().map(|a| a.dims().to_vec()).collect();
                let want: Vec<_> = exp.iter().map(|a| a.dims().to_vec()).collect();
                return bad(format!(
                    "sublayer {i}'s state is {dims:?}, expected f32 {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// `t` as an `i32` id, or an error if it is outside the vocabulary.
    fn token(&self, t: u32) -> Result<i32> {
        if (t as usize) < self.config.vocab_size {
            Ok(t as i32)
        } else {
            Err(Error::InvalidArgument(format!(
                "Hybrid: token {t} is outside the vocabulary (size {})",
                self.config.vocab_size
            )))
        }
    }

    /// The graph `build` makes (given a graph and the weights as its first parameters,
    /// returning the outputs).
    pub(super) fn graph(
        &self,
        build: impl FnOnce(&Graph, &HybridWeights<Tensor>) -> Result<Vec<Tensor>>,
    ) -> Result<Graph> {
        let g = Graph::with_target(self.programs.target());
        let w = self
            .types
            .try_map(|name, ty| g.parameter(&format!("w.{name}"), ty.dtype, &ty.dims))?;
        let outs = build(&g, &w)?;
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        Ok(g)
    }

    /// The compiled program `key`, built by `build` (as for [`Hybrid::graph`]) and compiled on
    /// first use.
    pub(super) fn program(
        &self,
        key: ProgramKey,
        build: impl FnOnce(&Graph, &HybridWeights<Tensor>) -> Result<Vec<Tensor>>,
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

/// `state` with its attention caches and `valid` widened to `capacity` columns (zeros); a
/// sliding sublayer's ring to as many as `cfg` gives it (no position has wrapped in a ring
/// narrower than its window, so its columns stay where they are).
pub(super) fn grow(state: HybridState, capacity: usize, cfg: &HybridConfig) -> Result<HybridState> {
    // The columns are axis 1 of `valid`, 3 of the keys and 2 of the values.
    let widen = |a: &HostArray, axis: usize, capacity: usize| -> Result<HostArray> {
        let (rows, old) = (a.dims()[0], a.dims()[axis]);
        take_columns(a, axis, &vec![(0..old).collect(); rows], capacity)
    };
    let sublayers = state
        .sublayers
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            SublayerState::Attention { k, v } => Ok(SublayerState::Attention {
                k: widen(k, 3, cfg.cache_columns(i, capacity))?,
                v: widen(v, 2, cfg.cache_columns(i, capacity))?,
            }),
            other => Ok(other.clone()),
        })
        .collect::<Result<_>>()?;
    Ok(HybridState {
        sublayers,
        valid: widen(&state.valid, 1, capacity)?,
        column: state.column,
        positions: state.positions,
    })
}

/// `a` (rows first) with axis `axis` rebuilt to `width`: index `j` of row `r` takes index
/// `from[r][j]` of `a`, zeros after `from[r]`. Runs of consecutive indices are copied at once.
pub(super) fn take_columns(
    a: &HostArray,
    axis: usize,
    from: &[Vec<usize>],
    width: usize,
) -> Result<HostArray> {
    let dims = a.dims().to_vec();
    let (rows, old) = (dims[0], dims[axis]);
    let outer: usize = dims[1..axis].iter().product();
    let inner = dims[axis + 1..].iter().product::<usize>() * a.dtype().size_in_bytes();
    let bytes = a.to_bytes();
    let mut out = vec![0u8; rows * outer * width * inner];
    for (r, from) in from.iter().enumerate().take(rows) {
        // (to, from, length) of each run.
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for (j, &c) in from.iter().enumerate().take(width) {
            match runs.last_mut() {
                Some((to, at, n)) if *to + *n == j && *at + *n == c => *n += 1,
                _ => runs.push((j, c, 1)),
            }
        }
        for o in 0..outer {
            let (src, dst) = (
                (r * outer + o) * old * inner,
                (r * outer + o) * width * inner,
            );
            for &(to, at, n) in &runs {
                out[dst + to * inner..dst + (to + n) * inner]
                    .copy_from_slice(&bytes[src + at * inner..src + (at + n) * inner]);
            }
        }
    }
    let mut dims = dims;
    dims[axis] = width;
    HostArray::from_bytes(&TensorType::new(a.dtype(), &dims), &out)
}
