//! The engine every family's generation shares: the device-side decode loop (a `while` loop
//! that picks each token on the device, greedy or sampled, with penalties, stopping at `eos`)
//! over any model that can take one step ([`Stepper`]), and what its programs take; the host
//! side every family shares ([`host`]: generate, stream, continue, greedy); and the programs
//! and weights of a model on the device ([`programs`]).

pub(crate) mod attention;
pub(crate) mod host;
mod placement;
mod programs;
mod slot_inputs;
pub(crate) mod slots;

pub(crate) use host::*;
pub(crate) use placement::Placement;
pub(crate) use programs::{call, check_weight_types, Device, Named, Programs, Value};
use slots::{gather_pages, scatter_pages};
pub(crate) use slots::{prompt_bucket, SlotFamily, SlotSegment};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{Carry, Graph, Tensor};
use crate::sampling::{self, PenaltySettings, SampleSettings, TokenHistory};

/// A model's one-token step inside a decode loop.
pub(crate) trait Stepper {
    /// What the model carries from token to token.
    type State: Carry;
    /// The logits `[b, vocab]` after one token per row (`[b]` i32), and the next state.
    fn step(&self, token: &Tensor, state: &Self::State) -> Result<(Tensor, Self::State)>;
    /// `next`, except that the rows in `done` (pred `[b]`) keep `old`.
    fn hold(&self, done: &Tensor, old: &Self::State, next: Self::State) -> Result<Self::State>;
}

/// What a generate program takes and returns besides its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    /// Sampling (else greedy).
    pub(crate) sample: bool,
    /// Continues from a state given as parameters.
    pub(crate) from_state: bool,
    /// Returns the final state.
    pub(crate) state_out: bool,
    /// Continues in later calls (a stream segment): needs the logits after the last token.
    pub(crate) segment: bool,
    /// Applies penalties (takes their settings and a token history).
    pub(crate) penalties: bool,
    /// Takes one sampling key per row (u32 `[b, 2]`) instead of one for the batch: each row
    /// then samples the same tokens whatever the other rows hold (served slots).
    pub(crate) row_keys: bool,
    /// With `state_out`, which rows that do not decode keep their state.
    pub(crate) hold: Hold,
    /// Takes a logit bias per row (f32 `[b, vocab]`, added before the token is picked) and
    /// returns each step's log-probabilities ([`LOGPROB_TOP`] most likely too).
    pub(crate) extras: bool,
}

/// With [`Variant::state_out`], which rows that do not decode keep their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Hold {
    /// Every step holds the rows that have stopped (a continued generation goes on from where
    /// each row stopped), which costs a copy of the state per step.
    EveryStep,
    /// Only the rows done at the start, held once after the loop (a pass over the whole
    /// state); a row that stops within the call has a state of no further use (served slots:
    /// it is freed).
    Once,
    /// None: the rows done at the start hold nothing that is needed after the call (served
    /// slots that are free), so their states may change.
    Never,
}

/// How many of the most likely tokens' log-probabilities a program with
/// [`Variant::extras`] returns per step.
pub(crate) const LOGPROB_TOP: usize = 20;

impl Variant {
    /// The shape of the sampling key the program takes for `batch` rows.
    pub(crate) fn key_dims(&self, batch: usize) -> Vec<usize> {
        if self.row_keys {
            vec![batch, 2]
        } else {
            vec![2]
        }
    }

    /// Whether the token the loop picks last must be stepped through the model: when the state
    /// or the logits after it are wanted.
    fn needs_last_step(&self) -> bool {
        self.state_out || self.segment
    }
}

/// Where decoding stands between steps, on the device.
pub(crate) struct Decoding<S> {
    /// The logits of the next token, `[b, vocab]`.
    pub(crate) logits: Tensor,
    /// The model's state.
    pub(crate) states: S,
    /// The rows that have emitted `eos`, pred `[b]`.
    pub(crate) done: Tensor,
    /// The sampling key.
    pub(crate) key: Tensor,
    /// The context so far, when penalties are on.
    pub(crate) history: Option<TokenHistory>,
}

/// The part of the decode loop's carry after the model's: the tokens written so far, which rows
/// are done, the key, the history and the log-probabilities (flattened in that order; none, no
/// tensor).
struct Tail {
    out: Tensor,
    done: Tensor,
    key: Tensor,
    history: Option<TokenHistory>,
    logprobs: Option<Logprobs>,
}

/// Each step's log-probabilities so far: the chosen token's (f32 `[b, steps]`) and the
/// [`LOGPROB_TOP`] most likely tokens' (f32 and i32 `[b, steps, LOGPROB_TOP]`).
pub(crate) struct Logprobs {
    pub(crate) chosen: Tensor,
    pub(crate) top: Tensor,
    pub(crate) top_ids: Tensor,
}

impl Logprobs {
    /// Zeros for `batch` rows of `steps` steps.
    fn zeros(g: &Graph, batch: usize, steps: usize) -> Result<Logprobs> {
        Ok(Logprobs {
            chosen: g.zeros(DType::F32, &[batch, steps])?,
            top: g.zeros(DType::F32, &[batch, steps, LOGPROB_TOP])?,
            top_ids: g.zeros(DType::I32, &[batch, steps, LOGPROB_TOP])?,
        })
    }

    /// With step `i` written: the log-softmax of `logits` at `token` and its largest values.
    fn write(&self, i: &Tensor, logits: &Tensor, token: &Tensor) -> Result<Logprobs> {
        let g = i.graph();
        let zero = g.scalar(0.0, DType::I32)?;
        let lp = logits.log_softmax(-1)?;
        let chosen = lp.take_along_axis(&token.expand_dims(1)?, -1)?;
        let (top, ids) = lp.top_k(LOGPROB_TOP)?;
        let ids = ids.astype(DType::I32)?;
        Ok(Logprobs {
            chosen: self.chosen.dynamic_update_slice(&chosen, &[&zero, i])?,
            top: self
                .top
                .dynamic_update_slice(&top.expand_dims(1)?, &[&zero, i, &zero])?,
            top_ids: self
                .top_ids
                .dynamic_update_slice(&ids.expand_dims(1)?, &[&zero, i, &zero])?,
        })
    }
}

impl Carry for Tail {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.extend([self.out.clone(), self.done.clone(), self.key.clone()]);
        if let Some(h) = &self.history {
            h.flatten(out);
        }
        if let Some(l) = &self.logprobs {
            out.extend([l.chosen.clone(), l.top.clone(), l.top_ids.clone()]);
        }
    }
    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        let (out, done, key) = (values.next()?, values.next()?, values.next()?);
        let history = match &template.history {
            Some(h) => Some(TokenHistory::unflatten(h, values)?),
            None => None,
        };
        let logprobs = match &template.logprobs {
            Some(_) => Some(Logprobs {
                chosen: values.next()?,
                top: values.next()?,
                top_ids: values.next()?,
            }),
            None => None,
        };
        Some(Tail {
            out,
            done,
            key,
            history,
            logprobs,
        })
    }
}

/// How a decode program picks its tokens: its runtime settings.
pub(crate) struct Picker {
    /// The end-of-sequence token, rank-0 i32 (-1 for none).
    pub(crate) eos: Tensor,
    /// The sampling settings, when the program samples (else it is greedy).
    pub(crate) sample: Option<SampleSettings>,
    /// The penalty settings, when the program applies penalties.
    pub(crate) penalties: Option<PenaltySettings>,
    /// A bias added to each row's logits (f32 `[b, vocab]`), when the program takes one.
    pub(crate) bias: Option<Tensor>,
}

impl Picker {
    /// One token per row from `logits` (penalised for `history` when penalties are on), `eos`
    /// for the rows in `done`; and the key for the next draw.
    pub(crate) fn pick(
        &self,
        logits: &Tensor,
        done: &Tensor,
        key: &Tensor,
        history: Option<&TokenHistory>,
    ) -> Result<(Tensor, Tensor)> {
        let penalized = match (&self.penalties, history) {
            (Some(p), Some(h)) => Some(sampling::penalize(logits, p, h)?),
            _ => None,
        };
        let logits = penalized.as_ref().unwrap_or(logits);
        let biased = match &self.bias {
            Some(b) => Some(logits.add(b)?),
            None => None,
        };
        let logits = biased.as_ref().unwrap_or(logits);
        let (token, key) = match &self.sample {
            Some(settings) => sampling::sample(logits, settings, key)?,
            None => (sampling::greedy(logits)?, key.clone()),
        };
        let token = done.not()?.select(&token, &self.eos)?;
        Ok((token, key))
    }
}

/// A `[b]` pred reshaped to `[b, 1, ...]` of `rank` dimensions, to select whole rows.
pub(crate) fn rows(done: &Tensor, rank: usize) -> Result<Tensor> {
    let mut dims = vec![1isize; rank];
    dims[0] = done.dims()[0] as isize;
    done.reshape(&dims)
}

/// Up to `max_steps` (rank-0 i32, at most `capacity`) decode steps from `start` inside one
/// `while` loop, each picking its token as `picker` says, ending early when every row has
/// emitted `picker.eos` (rank-0 i32, -1 for none). Returns the tokens `[b, capacity]`
/// (positions after a row's `eos`, and those the loop did not reach, hold `max(eos, 0)`)
/// and where decoding stands, and with `v.extras` each step's [`Logprobs`]. With `v.state_out` a
/// row that had stopped keeps the state it stopped with as `v.hold` says.
pub(crate) fn decode_loop<M: Stepper>(
    model: &M,
    start: Decoding<M::State>,
    max_steps: &Tensor,
    picker: &Picker,
    capacity: usize,
    v: Variant,
) -> Result<(Tensor, Decoding<M::State>, Option<Logprobs>)> {
    let g = max_steps.graph();
    let eos = &picker.eos;
    let batch = start.done.dims()[0];
    let out = eos.maximum(0.0)?.broadcast_to(&[batch, capacity])?;
    let i = g.scalar(0.0, DType::I32)?;
    let zero = g.scalar(0.0, DType::I32)?;
    // Picks a token per row (the eos for rows that have stopped) and writes it at `i`, with
    // its log-probabilities when asked for.
    let pick = |i: &Tensor, logits: &Tensor, t: &Tail| {
        let (token, key) = picker.pick(logits, &t.done, &t.key, t.history.as_ref())?;
        let out = t
            .out
            .dynamic_update_slice(&token.expand_dims(1)?, &[&zero, i])?;
        let logprobs = t.logprobs.as_ref();
        let logprobs = logprobs.map(|l| l.write(i, logits, &token)).transpose()?;
        Ok::<_, Error>((token, out, key, logprobs))
    };
    // Without the final state, the last token needs no step: the loop stops one short and
    // its last pick follows it.
    let last = if v.needs_last_step() { 0.0 } else { 1.0 };
    let steps = max_steps.sub(last)?;
    let logprobs = v
        .extras
        .then(|| Logprobs::zeros(g, batch, capacity))
        .transpose()?;
    let held = held_rows::<M>(v, &start.done, &start.states)?;
    let tail = Tail {
        out,
        done: start.done,
        key: start.key,
        history: start.history,
        logprobs,
    };
    let init = (i, start.logits, start.states, tail);
    let (i, logits, states, tail) = g.while_loop(
        &init,
        |(i, _, _, t)| {
            let more = i.lt(&steps)?;
            let open = t.done.not()?.astype(DType::I32)?.max(&[0])?.gt(0.0)?;
            more.and(&open)
        },
        |(i, logits, states, t)| {
            let (token, out, key, logprobs) = pick(i, logits, t)?;
            let (logits, mut next) = model.step(&token, states)?;
            if v.state_out && v.hold == Hold::EveryStep {
                next = model.hold(&t.done, states, next)?;
            }
            let done = t.done.or(&token.eq(eos)?)?;
            let history = t.history.as_ref().map(|h| h.push(&token)).transpose()?;
            let tail = Tail {
                out,
                done,
                key,
                history,
                logprobs,
            };
            Ok((i.add(1.0)?, logits, next, tail))
        },
    )?;
    let states = match held {
        Some((done, old)) => model.hold(&done, &old, states)?,
        None => states,
    };
    let tail = if v.needs_last_step() {
        tail
    } else {
        // `i < max_steps` here; after an early end (every row stopped) this writes an eos.
        // The history after this last token is not needed.
        let (token, out, key, logprobs) = pick(&i, &logits, &tail)?;
        let done = tail.done.or(&token.eq(eos)?)?;
        Tail {
            out,
            done,
            key,
            history: tail.history,
            logprobs,
        }
    };
    Ok((
        tail.out,
        Decoding {
            logits,
            states,
            done: tail.done,
            key: tail.key,
            history: tail.history,
        },
        tail.logprobs,
    ))
}

/// With `v.state_out` and [`Hold::Once`], the rows done at the start (`done`) and their
/// `states`, which the loop's end restores.
fn held_rows<M: Stepper>(
    v: Variant,
    done: &Tensor,
    states: &M::State,
) -> Result<Option<(Tensor, M::State)>> {
    if !(v.state_out && v.hold == Hold::Once) {
        return Ok(None);
    }
    let mut flat = Vec::new();
    states.flatten(&mut flat);
    let copy = M::State::unflatten(states, &mut flat.into_iter())
        .ok_or_else(|| Error::InvalidArgument("decode: the state did not rebuild".into()))?;
    Ok(Some((done.clone(), copy)))
}

/// With `v.penalties`, the [`PenaltySettings`] and a [`TokenHistory`] of `width` positions as
/// parameters of `g`.
pub(crate) fn penalty_parameters(
    g: &Graph,
    v: Variant,
    batch: usize,
    width: usize,
) -> Result<(Option<PenaltySettings>, Option<TokenHistory>)> {
    if !v.penalties {
        return Ok((None, None));
    }
    Ok((
        Some(PenaltySettings::parameters(g, batch)?),
        Some(TokenHistory::parameters(g, batch, width)?),
    ))
}

/// The runtime controls of a generate program, as parameters: `max_new`, `eos`, and as `v`
/// says the sampling key and settings, the penalty settings and the [`TokenHistory`] of
/// `width` positions (in that order; [`control_inputs`] gives their values).
pub(crate) struct Controls {
    /// How many tokens to make (rank-0 i32).
    pub(crate) max_new: Tensor,
    /// How tokens are picked.
    pub(crate) picker: Picker,
    /// The sampling key (zeros when greedy).
    pub(crate) key: Tensor,
    /// The context so far, when penalties are on.
    pub(crate) history: Option<TokenHistory>,
}

/// Adds the [`Controls`] of a generate program for `batch` rows to `g`.
pub(crate) fn control_parameters(
    g: &Graph,
    batch: usize,
    width: usize,
    v: Variant,
) -> Result<Controls> {
    let max_new = g.parameter("max_new", DType::I32, &[])?;
    let eos = g.parameter("eos", DType::I32, &[])?;
    let (key, sample) = if v.sample {
        let key = g.parameter("key", DType::U32, &[2])?;
        (key, Some(SampleSettings::parameters(g, batch)?))
    } else {
        (g.zeros(DType::U32, &[2])?, None)
    };
    let (penalties, history) = penalty_parameters(g, v, batch, width)?;
    Ok(Controls {
        max_new,
        picker: Picker {
            eos,
            sample,
            penalties,
            bias: None,
        },
        key,
        history,
    })
}

/// The shape of a segment program ([`segment_outputs`]).
#[derive(Debug, Clone)]
pub(crate) struct SegmentShape {
    /// The rows the logits and state hold.
    pub(crate) slots: usize,
    /// The rows decoded when only some of them are (served slots): the program then takes
    /// their indices and writes them back, the other rows untouched.
    pub(crate) rows: Option<usize>,
    /// The vocabulary size.
    pub(crate) vocab: usize,
    /// Up to this many decode steps.
    pub(crate) steps: usize,
    /// The penalty history's positions.
    pub(crate) width: usize,
    /// Served slots decoded over their caches' leading columns: each state tensor's dims
    /// after the rows (in the state's flattened order) that the decoded rows are cut to and
    /// written back at the start of; `None`: whole.
    pub(crate) cut: Option<Vec<Vec<usize>>>,
    /// Served slots whose caches are paged ([`slots::PageTable`]): the program then also takes
    /// the page table, `pages` (i32 `[slots, capacity / PAGE]`).
    pub(crate) paged: Option<PagedState>,
}

/// Which of a segment's state tensors are pools of pages.
#[derive(Debug, Clone)]
pub(crate) struct PagedState {
    /// Each state tensor's paged column axis, in the state's flattened order (`None`: not
    /// paged).
    pub(crate) axes: Vec<Option<usize>>,
    /// A slot's cache columns.
    pub(crate) capacity: usize,
    /// The state tensor (i32 `[rows]`) of each row's next cache column: a segment writes only
    /// the pages from there on back.
    pub(crate) column: usize,
}

/// The segment program of a streamed generation (or of served slots) for a model whose state
/// `state_parameters` adds to `g`: parameters (after the weights) `logits` `[slots, vocab]`,
/// the state (both donated), with `shape.rows: Some(m)` the indices of the rows to decode
/// (`rows`, i32 `[m]`, distinct), `done` (pred), `key`, `max_steps`, `eos`, with `v.sample`
/// the [`SampleSettings`], with `v.penalties` the [`PenaltySettings`] and the
/// [`TokenHistory`] of `width` positions (donated), and with `v.extras` the `logit_bias`, all
/// of the decoded rows. Up to `shape.steps` decode steps; returns the outputs: the tokens
/// `[rows, steps]`, then the new logits and state (of every slot), `done`, `key`, with
/// `v.penalties` the history (the order [`stream_segments`] reads), and with `v.extras` the
/// [`Logprobs`].
pub(crate) fn segment_outputs<M: Stepper>(
    g: &Graph,
    model: &M,
    shape: SegmentShape,
    v: Variant,
    state_parameters: impl FnOnce(&Graph) -> Result<M::State>,
) -> Result<Vec<Tensor>> {
    let all_logits = g.parameter("logits", DType::F32, &[shape.slots, shape.vocab])?;
    g.donate(&all_logits)?;
    let all_states = state_parameters(g)?;
    let mut all = vec![all_logits];
    all_states.flatten(&mut all);
    for t in &all[1..] {
        g.donate(t)?;
    }
    let index = match shape.rows {
        Some(m) => Some(g.parameter("rows", DType::I32, &[m])?),
        None => None,
    };
    let cut = shape.cut.as_deref();
    let paged = match &shape.paged {
        Some(p) => {
            let t = slots::PageTable::array_type(shape.slots, p.capacity);
            Some((p, g.parameter("pages", t.dtype, &t.dims)?))
        }
        None => None,
    };
    let pages = paged.as_ref().map(|(p, t)| (*p, t));
    let picked = pick_rows(&all, index.as_ref(), cut, pages)?;
    // Where the decoded rows write their first new keys and values, when paged.
    let first = match &shape.paged {
        Some(p) => Some(picked.get(1 + p.column).ok_or_else(missing_column)?.clone()),
        None => None,
    };
    let mut picked = picked.into_iter();
    let missing = || Error::InvalidArgument("segment: the state did not rebuild".into());
    let logits = picked.next().ok_or_else(missing)?;
    let states = M::State::unflatten(&all_states, &mut picked).ok_or_else(missing)?;
    let batch = shape.rows.unwrap_or(shape.slots);
    let done = g.parameter("done", DType::Pred, &[batch])?;
    let key = g.parameter("key", DType::U32, &v.key_dims(batch))?;
    let max_steps = g.parameter("max_steps", DType::I32, &[])?;
    let eos = g.parameter("eos", DType::I32, &[])?;
    let sample = if v.sample {
        Some(SampleSettings::parameters(g, batch)?)
    } else {
        None
    };
    let (penalties, history) = penalty_parameters(g, v, batch, shape.width)?;
    if let Some(h) = &history {
        g.donate(&h.tokens)?;
        g.donate(&h.matched)?;
    }
    let start = Decoding {
        logits,
        states,
        done,
        key,
        history,
    };
    let bias = match v.extras {
        true => Some(g.parameter("logit_bias", DType::F32, &[batch, shape.vocab])?),
        false => None,
    };
    let picker = Picker {
        eos,
        sample,
        penalties,
        bias,
    };
    let (out, end, logprobs) = decode_loop(model, start, &max_steps, &picker, shape.steps, v)?;
    let mut state_outs = vec![end.logits];
    end.states.flatten(&mut state_outs);
    let written = match first {
        Some(c) => Some((c, shape.steps)),
        None => None,
    };
    state_outs = put_back(all, state_outs, index.as_ref(), pages, written)?;
    let mut outs = vec![out];
    outs.extend(state_outs);
    outs.push(end.done);
    outs.push(end.key);
    if let Some(h) = end.history {
        outs.extend([h.tokens, h.matched, h.len]);
    }
    if let Some(l) = logprobs {
        outs.extend([l.chosen, l.top, l.top_ids]);
    }
    Ok(outs)
}

/// The rows of `all` (`[slots, ...]` each: the logits, then the state) a segment decodes: those
/// `index` (i32 `[m]`) names, all when `None`; with `cut`, each state tensor's leading part of
/// the dims `cut` gives it (after the rows), copied alone; a paged one (`paged`, with the page
/// table) gathered from its rows' pages.
fn pick_rows(
    all: &[Tensor],
    index: Option<&Tensor>,
    cut: Option<&[Vec<usize>]>,
    paged: Option<(&PagedState, &Tensor)>,
) -> Result<Vec<Tensor>> {
    let g = all[0].graph();
    let zero = g.scalar(0.0, DType::I32)?;
    let short = || Error::InvalidArgument("segment: fewer cut dims than state tensors".into());
    all.iter()
        .enumerate()
        .map(|(k, t)| {
            let dims = match (k, cut) {
                (0, _) | (_, None) => None,
                (k, Some(c)) => Some(c.get(k - 1).ok_or_else(short)?),
            };
            if let Some((axis, p, pages)) = paged_axis(paged, k) {
                let columns = dims.map_or(p.capacity, |d| d[axis - 1]);
                return gather_pages(t, &page_rows(pages, index, columns)?, axis);
            }
            match (index, dims) {
                (Some(i), None) => t.take(i),
                (None, None) => Ok(t.clone()),
                (None, Some(d)) => {
                    let mut sizes = vec![t.dims()[0]];
                    sizes.extend(d);
                    let starts = vec![&zero; sizes.len()];
                    t.dynamic_slice(&starts, &sizes)
                }
                (Some(i), Some(d)) => {
                    let mut sizes = vec![1];
                    sizes.extend(d);
                    let rows = (0..i.dims()[0])
                        .map(|r| {
                            let at = i.narrow(0, r, 1)?.reshape(&[])?;
                            let mut starts = vec![&at];
                            starts.extend(std::iter::repeat_n(&zero, d.len()));
                            t.dynamic_slice(&starts, &sizes)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Tensor::concat(&rows.iter().collect::<Vec<_>>(), 0)
                }
            }
        })
        .collect()
}

/// The paged column axis of `all`'s tensor `k` (the logits first, never paged), with the
/// paging and the page table.
fn paged_axis<'a>(
    paged: Option<(&'a PagedState, &'a Tensor)>,
    k: usize,
) -> Option<(usize, &'a PagedState, &'a Tensor)> {
    let (p, pages) = paged?;
    let axis = p.axes.get(k.checked_sub(1)?).copied().flatten()?;
    Some((axis, p, pages))
}

/// The page table's rows for the decoded rows (`index`, all when `None`), their first pages
/// up to `columns`.
fn page_rows(pages: &Tensor, index: Option<&Tensor>, columns: usize) -> Result<Tensor> {
    let rows = match index {
        Some(i) => pages.take(i)?,
        None => pages.clone(),
    };
    rows.narrow(1, 0, columns / slots::PAGE)
}

fn missing_column() -> Error {
    Error::InvalidArgument("segment: the paged state has no column tensor".into())
}

/// Each of `all` (the logits, then the state, every slot) with the decoded rows `outs` written
/// back ([`pick_rows`]'s inverse): at the rows `index` names (all when `None`), at the start of
/// each row where `outs` are smaller, a paged one into its rows' pages: with `written` (each
/// row's first column written, i32 `[rows]`, and the most columns written after it) only the
/// pages those columns can fall in.
fn put_back(
    all: Vec<Tensor>,
    outs: Vec<Tensor>,
    index: Option<&Tensor>,
    paged: Option<(&PagedState, &Tensor)>,
    written: Option<(Tensor, usize)>,
) -> Result<Vec<Tensor>> {
    all.into_iter()
        .zip(outs)
        .enumerate()
        .map(|(k, (t, out))| {
            if let Some((axis, _, pages)) = paged_axis(paged, k) {
                let table = page_rows(pages, index, out.dims()[axis])?;
                return match &written {
                    Some((first, steps)) => {
                        let (table, out) = written_pages(&table, &out, axis, first, *steps)?;
                        scatter_pages(&t, &table, &out, axis)
                    }
                    None => scatter_pages(&t, &table, &out, axis),
                };
            }
            let one = std::slice::from_ref(&out);
            Ok(match index {
                Some(index) => scatter_rows(vec![t], one, index)?.remove(0),
                None => write_leading(vec![t], one)?.remove(0),
            })
        })
        .collect()
}

/// The pages of `rows` (`[m, ...]`, `n` pages of columns on `axis`, their page table rows
/// `table` `[m, n]`) that columns `first ..= first + steps - 1` of each row may fall in: the
/// table's entries and the rows' columns of `ceil(steps / PAGE) + 1` pages from the first's
/// page (moved back to stay inside the window); all when that is no fewer.
fn written_pages(
    table: &Tensor,
    rows: &Tensor,
    axis: usize,
    first: &Tensor,
    steps: usize,
) -> Result<(Tensor, Tensor)> {
    let (m, n) = (table.dims()[0], table.dims()[1]);
    let t = steps.div_ceil(slots::PAGE) + 1;
    if t >= n {
        return Ok((table.clone(), rows.clone()));
    }
    let g = table.graph();
    // The first page written back, per row: at most n - t.
    let start = first
        .astype(DType::I32)?
        .div(slots::PAGE as f64)? // not negative: an integer division floors
        .clamp(0.0, (n - t) as f64)?;
    let at = start
        .expand_dims(1)?
        .add(&g.iota(DType::I32, &[m, t], 1)?)?;
    let table = table.take_along_axis(&at, 1)?;
    let zero = g.scalar(0.0, DType::I32)?;
    let mut sizes = rows.dims().to_vec();
    sizes[0] = 1;
    sizes[axis] = t * slots::PAGE;
    let parts = (0..m)
        .map(|r| {
            let column = start
                .narrow(0, r, 1)?
                .reshape(&[])?
                .mul(slots::PAGE as f64)?;
            let row = g.scalar(r as f64, DType::I32)?;
            let mut starts = vec![&zero; rows.rank()];
            starts[0] = &row;
            starts[axis] = &column;
            rows.dynamic_slice(&starts, &sizes)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((table, Tensor::concat(&parts.iter().collect::<Vec<_>>(), 0)?))
}

/// Each of `into` with the matching one of `parts` written at its start (where it is smaller:
/// a state decoded over its leading columns).
fn write_leading(into: Vec<Tensor>, parts: &[Tensor]) -> Result<Vec<Tensor>> {
    into.into_iter()
        .zip(parts)
        .map(|(t, part)| {
            if t.dims() == part.dims() {
                return Ok(part.clone());
            }
            let zero = t.graph().scalar(0.0, DType::I32)?;
            t.dynamic_update_slice(part, &vec![&zero; t.rank()])
        })
        .collect()
}

/// Each of `into` (`[slots, ...]`) with the rows of the matching `rows` (`[m, ...]`) written at
/// the slots `index` (i32 `[m]`) names (at the start of each row's other axes where `rows` are
/// smaller).
pub(crate) fn scatter_rows(
    into: Vec<Tensor>,
    rows: &[Tensor],
    index: &Tensor,
) -> Result<Vec<Tensor>> {
    let g = index.graph();
    let zero = g.scalar(0.0, DType::I32)?;
    let m = index.dims()[0];
    let at: Vec<Tensor> = (0..m)
        .map(|r| index.narrow(0, r, 1)?.reshape(&[]))
        .collect::<Result<_>>()?;
    into.into_iter()
        .zip(rows)
        .map(|(mut t, src)| {
            for (r, at) in at.iter().enumerate() {
                let mut starts = vec![at];
                starts.extend(std::iter::repeat_n(&zero, src.rank() - 1));
                t = t.dynamic_update_slice(&src.narrow(0, r, 1)?, &starts)?;
            }
            Ok(t)
        })
        .collect()
}

/// The smallest of 1, 2, 3, 4, 6, 8, 12, ... (2^k and 3 * 2^k) at least `n` (> 0): how many
/// chunks a prompt bucket holds. `None` when it overflows.
pub(crate) fn bucket_chunks(n: usize) -> Option<usize> {
    let power = n.checked_next_power_of_two()?;
    let three_quarters = power / 4 * 3;
    Some(if three_quarters >= n {
        three_quarters
    } else {
        power
    })
}
