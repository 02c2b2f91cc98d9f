//! Hybrid generation in one program: the prefill, then the shared decode loop
//! ([`crate::models::engine`]) stepping the model with its Mamba-2 states and its attention
//! caches (preallocated to the prompt and the capacity, each step's keys and values written in
//! place at its column) carried on the device.

use super::graph::{forward, Step, SublayerState};
use super::model::{Hybrid, HybridState, Kind};
use super::weights::HybridWeights;
use super::HybridConfig;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::{generate_capacity, GenerateOptions, LayerState};
use crate::models::engine::attention::{mark_valid, Positions};
use crate::models::engine::{
    self, decode_loop, host_input, rows, Decoding, Named, PagedState, Prepared, SegmentShape,
    SlotFamily, SlotSegment, Stepper, Variant,
};
use crate::ops::{Carry, Tensor};

impl Carry for SublayerState<Tensor> {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.extend(self.tensors().into_iter().cloned());
    }
    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        template
            .rebuild(&mut || {
                values
                    .next()
                    .ok_or_else(|| Error::InvalidArgument(String::new()))
            })
            .ok()
    }
}

/// A program's outputs made from a graph and the weights as its first parameters.
type Build<'a> = dyn Fn(&crate::ops::Graph, &HybridWeights<Tensor>) -> Result<Vec<Tensor>> + 'a;

/// What the decode loop carries for a hybrid: every sublayer's state, which cache columns
/// hold real tokens (`[b, C]` f32), the column of the next token (rank-0 i32, the same for
/// every row) and each row's next rotary position (`[b]` i32).
struct Carried {
    sublayers: Vec<SublayerState<Tensor>>,
    valid: Tensor,
    column: Tensor,
    positions: Tensor,
}

impl Carry for Carried {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        self.sublayers.flatten(out);
        out.extend([
            self.valid.clone(),
            self.column.clone(),
            self.positions.clone(),
        ]);
    }
    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        Some(Carried {
            sublayers: Vec::unflatten(&template.sublayers, values)?,
            valid: values.next()?,
            column: values.next()?,
            positions: values.next()?,
        })
    }
}

/// What the prompts leave: the logits after the last position (`[b, vocab]`), the states, and
/// the `mask` and `valid` parameters.
struct Prompted {
    logits: Tensor,
    sublayers: Vec<SublayerState<Tensor>>,
    mask: Tensor,
    valid: Tensor,
}

/// A hybrid's step inside the decode loop.
struct Steps<'a> {
    w: &'a HybridWeights<Tensor>,
    cfg: &'a HybridConfig,
    gather: bool,
}

impl Stepper for Steps<'_> {
    type State = Carried;
    fn step(&self, token: &Tensor, state: &Carried) -> Result<(Tensor, Carried)> {
        let g = token.graph();
        let b = token.dims()[0];
        let tokens = token.reshape(&[b as isize, 1])?;
        let mask = g.ones(DType::F32, &[b, 1])?;
        let rotary = state.positions.reshape(&[b as isize, 1])?;
        let valid = mark_valid(&state.valid, &state.column, &state.positions)?;
        let step = Step {
            tokens: &tokens,
            mask: &mask,
            at: Positions {
                rotary: &rotary,
                column: &state.column,
                valid: &valid,
            },
            decode: true,
            gather: self.gather,
            chunk: 1,
            remat: false,
            last_only: false,
        };
        let (logits, sublayers) = forward(&step, &state.sublayers, self.w, self.cfg)?;
        let logits = logits.reshape(&[b as isize, self.cfg.vocab_size as isize])?;
        Ok((
            logits,
            Carried {
                sublayers,
                valid,
                column: state.column.add(1.0)?,
                positions: state.positions.add(1.0)?,
            },
        ))
    }

    fn hold(&self, done: &Tensor, old: &Carried, next: Carried) -> Result<Carried> {
        let keep = |o: &Tensor, n: &Tensor| rows(done, n.rank())?.select(o, n);
        let sublayers = next
            .sublayers
            .iter()
            .zip(&old.sublayers)
            .map(|(n, o)| {
                Ok(match (n, o) {
                    (SublayerState::Mamba(n), SublayerState::Mamba(o)) => {
                        SublayerState::Mamba(LayerState {
                            conv: keep(&o.conv, &n.conv)?,
                            ssm: keep(&o.ssm, &n.ssm)?,
                        })
                    }
                    (
                        SublayerState::Attention { k, v },
                        SublayerState::Attention { k: ok, v: ov },
                    ) => SublayerState::Attention {
                        k: keep(ok, k)?,
                        v: keep(ov, v)?,
                    },
                    _ => SublayerState::None,
                })
            })
            .collect::<Result<_>>()?;
        // A shared column moves on for every row; a row's own column only while it decodes.
        let column = match next.column.rank() {
            0 => next.column,
            _ => keep(&old.column, &next.column)?,
        };
        Ok(Carried {
            sublayers,
            valid: keep(&old.valid, &next.valid)?,
            column,
            positions: keep(&old.positions, &next.positions)?,
        })
    }
}

impl Hybrid {
    /// Generates up to `options.max_new_tokens` tokens per prompt in ONE execution: the
    /// prefill and a device-side `while` loop of steps that picks each token (greedy or
    /// sampled, with penalties, stopping a row at `eos`, whose later positions repeat it), as
    /// [`Mamba2::generate`](crate::models::mamba2::Mamba2::generate) does. The attention
    /// caches hold the prompt and the capacity (the next power of two of `max_new_tokens`, at
    /// least 16); each step writes its keys and values in place. Options out of range are an
    /// error naming them.
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<u32>>> {
        engine::generate(self, prompts, options)
    }

    /// The generate program for `prompts` and `capacity` new tokens, and its inputs before the
    /// controls.
    pub(super) fn generate_program(
        &self,
        prompts: &[Vec<u32>],
        capacity: usize,
        v: Variant,
    ) -> Result<Prepared> {
        let b = prompts.len();
        let (rows_in, chunk) = self.padded_rows(prompts, 0);
        let len = rows_in[0].len();
        let cap = len + capacity;
        let empty = self.empty_state(b, cap)?;
        let fed = self.feed(&rows_in, &empty)?;
        let key = (Kind::Generate(capacity, v), b, len, cap, chunk);
        let program = self.program(key, |g, w| {
            self.generate_outputs(g, w, (b, len, cap, chunk), capacity, v, &empty)
        })?;
        Ok(Prepared {
            program,
            inputs: vec![
                host_input("tokens", fed.ids),
                host_input("mask", fed.mask),
                host_input("positions", fed.rotary),
                host_input("valid", fed.valid),
            ],
            len,
        })
    }

    /// The generate program's output (the tokens `[b, capacity]`) for `(b, len, cap, chunk)`
    /// (rows, prompt positions, cache columns, Mamba-2 chunk), from the state `empty`.
    fn generate_outputs(
        &self,
        g: &crate::ops::Graph,
        w: &HybridWeights<Tensor>,
        (b, len, cap, chunk): (usize, usize, usize, usize),
        capacity: usize,
        v: Variant,
        empty: &HybridState,
    ) -> Result<Vec<Tensor>> {
        let cfg = self.config();
        let c = engine::control_parameters(g, b, len + capacity, v)?;
        let p = self.prompt_pass(g, w, (b, len, cap, chunk), empty)?;
        let start = Decoding {
            logits: p.logits,
            states: Carried {
                sublayers: p.sublayers,
                valid: p.valid,
                column: g.scalar(len as f64, DType::I32)?,
                positions: p.mask.sum(&[1])?.astype(DType::I32)?,
            },
            done: g.full(0.0, DType::Pred, &[b])?,
            key: c.key,
            history: c.history,
        };
        let steps = Steps {
            w,
            cfg,
            gather: self.gathers(),
        };
        let (out, _, _) = decode_loop(&steps, start, &c.max_new, &c.picker, capacity, v)?;
        Ok(vec![out])
    }

    /// The prompts (parameters `tokens`, `mask`, `positions`, `valid`, for `(b, len, cap,
    /// chunk)` as in [`Hybrid::generate_program`]) through the model from the state `empty`:
    /// the logits after the last position only, and the states after the prompts.
    fn prompt_pass(
        &self,
        g: &crate::ops::Graph,
        w: &HybridWeights<Tensor>,
        (b, len, cap, chunk): (usize, usize, usize, usize),
        empty: &HybridState,
    ) -> Result<Prompted> {
        let cfg = self.config();
        let tokens = g.parameter("tokens", DType::I32, &[b, len])?;
        let mask = g.parameter("mask", DType::F32, &[b, len])?;
        let rotary = g.parameter("positions", DType::I32, &[b, len])?;
        let valid = g.parameter("valid", DType::F32, &[b, cap])?;
        let states = empty
            .sublayers
            .iter()
            .map(|s| {
                let mut dims = s.tensors().into_iter().map(|t| t.dims().to_vec());
                s.rebuild(&mut || g.zeros(DType::F32, &dims.next().unwrap_or_default()))
            })
            .collect::<Result<Vec<_>>>()?;
        let column = g.scalar(0.0, DType::I32)?;
        let step = Step {
            tokens: &tokens,
            mask: &mask,
            at: Positions {
                rotary: &rotary,
                column: &column,
                valid: &valid,
            },
            decode: false,
            gather: false,
            chunk,
            remat: false,
            last_only: true,
        };
        let (logits, sublayers) = forward(&step, &states, w, cfg)?;
        Ok(Prompted {
            logits: logits.reshape(&[b as isize, cfg.vocab_size as isize])?,
            sublayers,
            mask,
            valid,
        })
    }

    /// The logits after each prompt's last token (`[b, vocab]`, the prompts left-padded), from
    /// a program that computes nothing else (the head on the last position only, no state
    /// returned): what a generation's prefill costs.
    pub(super) fn prefill_last(&self, prompts: &[Vec<u32>]) -> Result<HostArray> {
        let b = prompts.len();
        let (rows_in, chunk) = self.padded_rows(prompts, 0);
        let len = rows_in[0].len();
        let empty = self.empty_state(b, len)?;
        let fed = self.feed(&rows_in, &empty)?;
        let program = self.program((Kind::PrefillLast, b, len, len, chunk), |g, w| {
            Ok(vec![
                self.prompt_pass(g, w, (b, len, len, chunk), &empty)?.logits,
            ])
        })?;
        let inputs = vec![
            host_input("tokens", fed.ids),
            host_input("mask", fed.mask),
            host_input("positions", fed.rotary),
            host_input("valid", fed.valid),
        ];
        self.run(&program, inputs)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::InvalidArgument("no logits".into()))
    }

    /// The StableHLO text of the prefill, step and generate programs for `prompts` (left-padded
    /// as the prefill pads them) and `options`, as `generate` and the host-side calls would
    /// compile them; for reading and for the CLI's `emit`.
    pub fn stablehlo(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
    ) -> Result<[String; 3]> {
        engine::check_options(options, self.config().vocab_size)?;
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(Error::InvalidArgument(
                "Hybrid::stablehlo needs at least one prompt, and no empty prompt".into(),
            ));
        }
        let (rows_in, chunk) = self.padded_rows(prompts, 0);
        let (b, len) = (prompts.len(), rows_in[0].len());
        let capacity = generate_capacity(options.max_new_tokens);
        let cap = len + capacity;
        let empty = self.empty_state(b, cap)?;
        let text = |f: &Build<'_>| self.graph(f)?.to_stablehlo();
        let v = engine::variant(options);
        let sublayers = &empty.sublayers;
        Ok([
            text(&|g, w| {
                self.forward_outputs(g, w, (b, len, cap, chunk), (false, false), sublayers)
            })?,
            text(&|g, w| self.forward_outputs(g, w, (b, 1, cap, 1), (true, false), sublayers))?,
            text(&|g, w| self.generate_outputs(g, w, (b, len, cap, chunk), capacity, v, &empty))?,
        ])
    }
}

impl Hybrid {
    /// [`Hybrid::generate`] in segments of up to `segment` tokens (at least 1), handing each
    /// segment's new tokens (one list per row, cut after a row's `eos`) to `on_tokens` as soon
    /// as they exist; `on_tokens` returning `false` stops early. One prefill (its caches sized
    /// for the whole generation), then one execution of a segment program (the shared decode
    /// loop, the caches written in place) per `segment` tokens. Returns every row's tokens, the
    /// same as `generate`'s.
    pub fn generate_stream(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
        segment: usize,
        on_tokens: impl FnMut(&[Vec<u32>]) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        Ok(engine::segments(self, prompts, None, options, segment, false, on_tokens)?.0)
    }

    /// [`Hybrid::generate`] continuing from `state` (when given: as a prefill, step or earlier
    /// `generate_from` returned it, one row per prompt), returning with the tokens the state
    /// after the prompts and every token emitted (a row that stopped at `eos` keeps its state
    /// from there; the attention caches grow to hold the new tokens), for
    /// [`Hybrid::prefill_from`] or another `generate_from`.
    pub fn generate_from(
        &self,
        prompts: &[Vec<u32>],
        state: Option<HybridState>,
        options: &GenerateOptions,
    ) -> Result<(Vec<Vec<u32>>, HybridState)> {
        let segment = generate_capacity(options.max_new_tokens);
        engine::segments(self, prompts, state, options, segment, true, |_| true)
    }

    /// The segment program of `s` (decoding `s.rows` of `s.slots` rows, or all, over the
    /// first `s.columns` of their caches of `s.capacity` columns; with `v.row_keys`, served
    /// slots: a cache column per row).
    pub(super) fn segment_program(&self, s: SlotSegment, v: Variant) -> Result<CompiledGraph> {
        let cfg = self.config();
        let (b, cap) = (s.slots, s.capacity);
        let key = (
            Kind::Segment(s.steps, v, s.rows, s.pages),
            b,
            s.width,
            cap,
            s.columns,
        );
        self.program(key, |g, w| {
            let steps = Steps {
                w,
                cfg,
                gather: self.gathers(),
            };
            let template = self.empty_state(b, cap)?.sublayers;
            let cut = match s.columns < cap {
                true => Some(cut_dims(&self.slot_types(1, s.columns)?)),
                false => None,
            };
            // Paged: the full-attention caches are pools of pages.
            let axes = self.slot_pages();
            let stored = s
                .pages
                .map(|pages| -> Result<_> {
                    let types = self.slot_types(b, cap)?;
                    Ok(engine::slots::stored_types(&types, &axes, Some(pages)))
                })
                .transpose()?;
            let column = self.slot_extents().first().copied().unwrap_or(0);
            let paged = s.pages.map(|_| PagedState {
                axes,
                capacity: cap,
                column,
            });
            let shape = SegmentShape {
                slots: b,
                rows: s.rows,
                vocab: cfg.vocab_size,
                steps: s.steps,
                width: s.width,
                cut,
                paged,
            };
            engine::segment_outputs(g, &steps, shape, v, |g| {
                carried_parameters(g, &template, (b, cap), v.row_keys, stored.as_deref())
            })
        })
    }

    /// The state by the names of the segment program's parameters (`state.1`, ...): each
    /// sublayer's tensors, then `valid`, `column` and `positions`.
    pub(super) fn flatten_state(&self, state: HybridState) -> Result<Vec<Named>> {
        let rows = state.rows();
        let mut flat: Vec<HostArray> = Vec::new();
        for s in state.sublayers {
            flat.extend(match s {
                SublayerState::Mamba(l) => vec![l.conv, l.ssm],
                SublayerState::Attention { k, v } => vec![k, v],
                SublayerState::None => Vec::new(),
            });
        }
        flat.push(state.valid);
        flat.push(HostArray::scalar(state.column as i32));
        flat.push(HostArray::from_vec(&[rows], state.positions)?);
        Ok(flat
            .into_iter()
            .enumerate()
            .map(|(i, a)| host_input(format!("state.{}", i + 1), a))
            .collect())
    }
}

/// A [`Carried`] of parameters shaped like `template`'s sublayer states, with `b` rows and
/// caches of `cap` columns (`(b, cap)`), or where given as `stored` (the served slots' tensors
/// as kept, paged ones pools of pages); with `per_row`, one cache column per row (`[b]`,
/// served slots), else one for all.
fn carried_parameters(
    g: &crate::ops::Graph,
    template: &[SublayerState<HostArray>],
    (b, cap): (usize, usize),
    per_row: bool,
    stored: Option<&[TensorType]>,
) -> Result<Carried> {
    let mut n = 0;
    let mut param = |dtype: DType, dims: &[usize]| {
        n += 1;
        let dims = stored
            .and_then(|s| s.get(n - 1))
            .map_or(dims, |t| &t.dims[..]);
        g.parameter(&format!("state.{n}"), dtype, dims)
    };
    let mut sublayers = Vec::with_capacity(template.len());
    for s in template {
        let mut dims = s.tensors().into_iter().map(|t| t.dims().to_vec());
        sublayers.push(s.rebuild(&mut || param(DType::F32, &dims.next().unwrap_or_default()))?);
    }
    Ok(Carried {
        sublayers,
        valid: param(DType::F32, &[b, cap])?,
        column: param(DType::I32, &[b][..usize::from(per_row)])?,
        positions: param(DType::I32, &[b])?,
    })
}

/// A [`HybridState`] from a segment program's flattened state (shaped like `template`).
pub(super) fn unflatten_state<T>(
    template: &[SublayerState<T>],
    flat: Vec<HostArray>,
) -> Result<HybridState> {
    let short = || Error::InvalidArgument("a generate segment returned too small a state".into());
    let mut it = flat.into_iter();
    let sublayers = template
        .iter()
        .map(|s| s.rebuild(&mut || it.next().ok_or_else(short)))
        .collect::<Result<Vec<_>>>()?;
    let valid = it.next().ok_or_else(short)?;
    let column = it
        .next()
        .ok_or_else(short)?
        .as_array::<i32>()?
        .iter()
        .copied()
        .next();
    let positions: Vec<i32> = it
        .next()
        .ok_or_else(short)?
        .as_array::<i32>()?
        .iter()
        .copied()
        .collect();
    Ok(HybridState {
        sublayers,
        valid,
        column: column.ok_or_else(short)? as usize,
        positions,
    })
}

/// Each tensor's dims after the rows.
fn cut_dims(types: &[TensorType]) -> Vec<Vec<usize>> {
    types.iter().map(|t| t.dims[1..].to_vec()).collect()
}
