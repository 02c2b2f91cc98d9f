//! The engine every family's generation shares: the device-side decode loop (a `while` loop
//! that picks each token on the device, greedy or sampled, with penalties, stopping at `eos`)
//! over any model that can take one step ([`Stepper`]), and what its programs take.

use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::mamba2::{GenerateOptions, MAX_NEW_TOKENS};
use crate::ops::{Carry, Graph, Tensor};
use crate::sampling::{self, PenaltySettings, SampleSettings, Sampling, TokenHistory};

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
}

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
/// are done, the key, and the history (flattened in that order; no history, no tensor).
struct Tail {
    out: Tensor,
    done: Tensor,
    key: Tensor,
    history: Option<TokenHistory>,
}

impl Carry for Tail {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.extend([self.out.clone(), self.done.clone(), self.key.clone()]);
        if let Some(h) = &self.history {
            h.flatten(out);
        }
    }
    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        let (out, done, key) = (values.next()?, values.next()?, values.next()?);
        let history = match &template.history {
            Some(h) => Some(TokenHistory::unflatten(h, values)?),
            None => None,
        };
        Some(Tail {
            out,
            done,
            key,
            history,
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
}

impl Picker {
    /// One token per row from `logits` (penalised for `history` when penalties are on), `eos`
    /// for the rows in `done`; and the key for the next draw.
    fn pick(
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
/// and where decoding stands. With `v.state_out` a row that had stopped keeps the state it
/// stopped with.
pub(crate) fn decode_loop<M: Stepper>(
    model: &M,
    start: Decoding<M::State>,
    max_steps: &Tensor,
    picker: &Picker,
    capacity: usize,
    v: Variant,
) -> Result<(Tensor, Decoding<M::State>)> {
    let g = max_steps.graph();
    let eos = &picker.eos;
    let batch = start.done.dims()[0];
    let out = eos.maximum(0.0)?.broadcast_to(&[batch, capacity])?;
    let i = g.scalar(0.0, DType::I32)?;
    let zero = g.scalar(0.0, DType::I32)?;
    // Picks a token per row (the eos for rows that have stopped) and writes it at `i`.
    let pick = |i: &Tensor, logits: &Tensor, t: &Tail| {
        let (token, key) = picker.pick(logits, &t.done, &t.key, t.history.as_ref())?;
        let out = t
            .out
            .dynamic_update_slice(&token.expand_dims(1)?, &[&zero, i])?;
        Ok::<_, Error>((token, out, key))
    };
    // Without the final state, the last token needs no step: the loop stops one short and
    // its last pick follows it.
    let steps = if v.needs_last_step() {
        max_steps.clone()
    } else {
        max_steps.sub(1.0)?
    };
    let tail = Tail {
        out,
        done: start.done,
        key: start.key,
        history: start.history,
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
            let (token, out, key) = pick(i, logits, t)?;
            let (logits, mut next) = model.step(&token, states)?;
            if v.state_out {
                next = model.hold(&t.done, states, next)?;
            }
            let done = t.done.or(&token.eq(eos)?)?;
            let history = t.history.as_ref().map(|h| h.push(&token)).transpose()?;
            let tail = Tail {
                out,
                done,
                key,
                history,
            };
            Ok((i.add(1.0)?, logits, next, tail))
        },
    )?;
    let tail = if v.needs_last_step() {
        tail
    } else {
        // `i < max_steps` here; after an early end (every row stopped) this writes an eos.
        // The history after this last token is not needed.
        let (token, out, key) = pick(&i, &logits, &tail)?;
        let done = tail.done.or(&token.eq(eos)?)?;
        Tail {
            out,
            done,
            key,
            history: tail.history,
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
    ))
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
        },
        key,
        history,
    })
}

/// The values of [`control_parameters`] for `options` and `prompts` left-padded to `len`
/// positions in a history of `width`.
pub(crate) fn control_inputs(
    prompts: &[Vec<u32>],
    options: &GenerateOptions,
    vocab: usize,
    len: usize,
    width: usize,
    v: Variant,
) -> Result<Vec<HostArray>> {
    let batch = prompts.len();
    // Both fit an i32: max_new_tokens <= MAX_NEW_TOKENS and eos < vocab (checked).
    let mut inputs = vec![
        HostArray::scalar(options.max_new_tokens as i32),
        HostArray::scalar(options.eos.map_or(-1, |e| e as i32)),
    ];
    if v.sample {
        inputs.push(HostArray::from_vec(&[2], options.sampling.key().to_vec())?);
        inputs.extend(SampleSettings::host_values(
            &options.sampling,
            batch,
            vocab,
        )?);
    }
    if v.penalties {
        let settings = PenaltySettings::host_values(&options.penalties, batch)?;
        let history = TokenHistory::host_values(prompts, len, width)?;
        inputs.extend(settings.into_iter().chain(history).map(|(_, a)| a));
    }
    Ok(inputs)
}

/// The generate program's variant for `options` (no state in or out, not a segment).
pub(crate) fn variant(options: &GenerateOptions) -> Variant {
    Variant {
        sample: matches!(options.sampling, Sampling::Sample { .. }),
        from_state: false,
        state_out: false,
        segment: false,
        penalties: !options.penalties.is_off(),
        row_keys: false,
    }
}

/// Checks generation options against a vocabulary of `vocab` tokens: sampling settings and
/// penalties in range, `eos` in the vocabulary, `max_new_tokens` at most [`MAX_NEW_TOKENS`].
pub(crate) fn check_options(options: &GenerateOptions, vocab: usize) -> Result<()> {
    options.sampling.check(vocab)?;
    options.penalties.check()?;
    if options.max_new_tokens > MAX_NEW_TOKENS {
        return Err(Error::InvalidArgument(format!(
            "options.max_new_tokens ({}) is more than {MAX_NEW_TOKENS}",
            options.max_new_tokens
        )));
    }
    if let Some(e) = options.eos {
        if e as usize >= vocab {
            return Err(Error::InvalidArgument(format!(
                "options.eos ({e}) is outside the vocabulary of {vocab}"
            )));
        }
    }
    Ok(())
}

/// The first `max_new` tokens of each of `batch` rows of a generate program's `[b, capacity]`
/// i32 output.
pub(crate) fn rows_of_tokens(out: &HostArray, max_new: usize) -> Result<Vec<Vec<u32>>> {
    let capacity = out.dims().get(1).copied().unwrap_or(0);
    let values = out.as_array::<i32>()?;
    let flat: Vec<i32> = values.iter().copied().collect();
    Ok(flat
        .chunks(capacity.max(1))
        .map(|row| {
            row[..max_new.min(row.len())]
                .iter()
                .map(|&t| t as u32)
                .collect()
        })
        .collect())
}

/// The segment program of a streamed generation for a model whose state `state_parameters`
/// adds to `g`: parameters (after the weights) `logits` `[b, vocab]`, the state, `done` (pred
/// `[b]`), `key`, `max_steps`, `eos`, with `v.sample` the [`SampleSettings`], and with
/// `v.penalties` the [`PenaltySettings`] and the [`TokenHistory`] of `width` positions. Up to
/// `segment` decode steps; returns the outputs: the tokens `[b, segment]`, then the new
/// logits, state, `done`, `key`, and with `v.penalties` the history (the order
/// [`stream_segments`] reads).
#[allow(clippy::too_many_arguments)]
pub(crate) fn segment_outputs<M: Stepper>(
    g: &Graph,
    model: &M,
    batch: usize,
    vocab: usize,
    segment: usize,
    width: usize,
    v: Variant,
    state_parameters: impl FnOnce(&Graph) -> Result<M::State>,
) -> Result<Vec<Tensor>> {
    let logits = g.parameter("logits", DType::F32, &[batch, vocab])?;
    let states = state_parameters(g)?;
    let done = g.parameter("done", DType::Pred, &[batch])?;
    let key = g.parameter("key", DType::U32, &v.key_dims(batch))?;
    let max_steps = g.parameter("max_steps", DType::I32, &[])?;
    let eos = g.parameter("eos", DType::I32, &[])?;
    let sample = if v.sample {
        Some(SampleSettings::parameters(g, batch)?)
    } else {
        None
    };
    let (penalties, history) = penalty_parameters(g, v, batch, width)?;
    let start = Decoding {
        logits,
        states,
        done,
        key,
        history,
    };
    let picker = Picker {
        eos,
        sample,
        penalties,
    };
    let (out, end) = decode_loop(model, start, &max_steps, &picker, segment, v)?;
    let mut outs = vec![out, end.logits];
    end.states.flatten(&mut outs);
    outs.push(end.done);
    outs.push(end.key);
    if let Some(h) = end.history {
        outs.extend([h.tokens, h.matched, h.len]);
    }
    Ok(outs)
}

/// Where a streamed generation starts: the logits after the prompts (`[b, vocab]`) and the
/// state after them, flattened (as the segment program takes it), with the prompts left-padded
/// to `len` positions in a penalty history of `width`.
pub(crate) struct StreamStart {
    /// The logits of the first new token.
    pub(crate) logits: HostArray,
    /// The state's tensors, in the segment program's order.
    pub(crate) state: Vec<HostArray>,
    /// The prompts' padded length.
    pub(crate) len: usize,
    /// The penalty history's width (`len` and the new tokens' room).
    pub(crate) width: usize,
}

/// Runs a streamed generation segment by segment through `run` (the segment program of
/// [`segment_outputs`], up to `segment` tokens a call), handing each segment's new tokens
/// (one list per row, cut after a row's `eos`) to `on_tokens`, which stops the stream by
/// returning `false`. Returns every row's tokens, rows that stopped repeating their `eos` to
/// `max_new_tokens` as `generate` does, and the state after the last segment (flattened).
#[allow(clippy::too_many_arguments)]
pub(crate) fn stream_segments(
    prompts: &[Vec<u32>],
    options: &GenerateOptions,
    vocab: usize,
    segment: usize,
    start: StreamStart,
    v: Variant,
    mut run: impl FnMut(&[HostArray]) -> Result<Vec<HostArray>>,
    mut on_tokens: impl FnMut(&[Vec<u32>]) -> bool,
) -> Result<(Vec<Vec<u32>>, Vec<HostArray>)> {
    let batch = prompts.len();
    let mut all = vec![Vec::new(); batch];
    let mut fixed = vec![HostArray::scalar(options.eos.map_or(-1, |e| e as i32))];
    if v.sample {
        fixed.extend(SampleSettings::host_values(
            &options.sampling,
            batch,
            vocab,
        )?);
    }
    let mut history = Vec::new();
    if v.penalties {
        let settings = PenaltySettings::host_values(&options.penalties, batch)?;
        fixed.extend(settings.into_iter().map(|(_, a)| a));
        let h = TokenHistory::host_values(prompts, start.len, start.width)?;
        history.extend(h.into_iter().map(|(_, a)| a));
    }
    let (mut logits, mut state) = (start.logits, start.state);
    let mut done = HostArray::from_vec(&[batch], vec![false; batch])?;
    let mut key = HostArray::from_vec(&[2], options.sampling.key().to_vec())?;
    let eos = options.eos.map_or(-1, |e| e as i32);
    let mut stopped = vec![false; batch];
    let mut made = 0;
    while made < options.max_new_tokens && stopped.iter().any(|s| !s) {
        let steps = segment.min(options.max_new_tokens - made);
        let (n_state, n_history) = (state.len(), history.len());
        let mut inputs = vec![logits];
        inputs.extend(state);
        // Fits an i32: steps <= MAX_NEW_TOKENS.
        inputs.extend([done, key, HostArray::scalar(steps as i32)]);
        inputs.extend(fixed.iter().cloned());
        inputs.extend(history);
        let mut outs = run(&inputs)?.into_iter();
        let short = || Error::InvalidArgument("a generate segment returned too little".into());
        let tokens = outs.next().ok_or_else(short)?;
        logits = outs.next().ok_or_else(short)?;
        state = outs.by_ref().take(n_state).collect();
        done = outs.next().ok_or_else(short)?;
        key = outs.next().ok_or_else(short)?;
        history = outs.collect();
        if state.len() != n_state || history.len() != n_history {
            return Err(short());
        }
        let mut fresh = vec![Vec::new(); batch];
        for (r, row) in rows_of_tokens(&tokens, steps)?.into_iter().enumerate() {
            for t in row {
                if stopped[r] {
                    break;
                }
                fresh[r].push(t);
                stopped[r] = eos >= 0 && t as i32 == eos;
            }
            all[r].extend(&fresh[r]);
        }
        made += steps;
        if !on_tokens(&fresh) {
            break;
        }
    }
    if let Some(e) = options.eos {
        for row in &mut all {
            if row.last() == Some(&e) {
                row.resize(options.max_new_tokens, e);
            }
        }
    }
    Ok((all, state))
}

/// The last `keep` positions (at most `L`) of `[b, L, vocab]` f32 logits, `[b, keep, vocab]`.
pub(crate) fn last_positions(logits: &HostArray, keep: usize) -> Result<HostArray> {
    let (b, len, vocab) = match *logits.dims() {
        [b, len, vocab] if len > 0 => (b, len, vocab),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "expected logits [b, L, vocab], got {:?}",
                logits.dims()
            )))
        }
    };
    let keep = keep.min(len);
    let bytes = logits.to_bytes();
    let row = vocab * 4;
    let out: Vec<u8> = (0..b)
        .flat_map(|r| bytes[((r + 1) * len - keep) * row..(r + 1) * len * row].to_vec())
        .collect();
    HostArray::from_bytes(
        &crate::dtype::TensorType::new(DType::F32, &[b, keep, vocab]),
        &out,
    )
}

/// The logits of the last position of `[b, L, vocab]` f32 logits, as `[b, vocab]`.
pub(crate) fn last_position(logits: &HostArray) -> Result<HostArray> {
    let last = last_positions(logits, 1)?;
    let dims = [last.dims()[0], last.dims()[2]];
    HostArray::from_bytes(
        &crate::dtype::TensorType::new(DType::F32, &dims),
        &last.to_bytes(),
    )
}

/// Checks a stream's `segment` (1 to [`MAX_NEW_TOKENS`]).
pub(crate) fn check_segment(segment: usize) -> Result<()> {
    if segment == 0 || segment > MAX_NEW_TOKENS {
        return Err(Error::InvalidArgument(format!(
            "generate_stream: segment ({segment}) is not in 1..={MAX_NEW_TOKENS}"
        )));
    }
    Ok(())
}

/// Writes named f32 or i32 host arrays to `path` as safetensors (a state file).
pub(crate) fn save_tensors(path: &std::path::Path, tensors: &[(String, &HostArray)]) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, a)| {
            let dtype = match a.dtype() {
                DType::F32 => Ok(Dtype::F32),
                DType::I32 => Ok(Dtype::I32),
                other => Err(Error::InvalidArgument(format!(
                    "state: {name} is {other}, expected f32 or i32"
                ))),
            }?;
            Ok((name.clone(), dtype, a.dims().to_vec(), a.to_bytes()))
        })
        .collect::<Result<_>>()?;
    let views = data
        .iter()
        .map(|(name, dtype, dims, bytes)| {
            let view = TensorView::new(*dtype, dims.clone(), bytes)
                .map_err(|e| Error::InvalidArgument(format!("state: {name}: {e}")))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| {
        Error::InvalidArgument(format!("writing the state to {}: {e}", path.display()))
    })
}

/// Reads every tensor of the safetensors state file `path` (f32 or i32) by name. An
/// unreadable file, or a tensor of another dtype, is an error naming the file and tensor.
pub(crate) fn load_tensors(
    path: &std::path::Path,
) -> Result<std::collections::BTreeMap<String, HostArray>> {
    use safetensors::tensor::Dtype;
    let bytes = std::fs::read(path)
        .map_err(|e| Error::io(format!("reading the state {}", path.display()), e))?;
    let bad = |why: String| Error::InvalidArgument(format!("state {}: {why}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{e}")))?;
    file.tensors()
        .into_iter()
        .map(|(name, t)| {
            let dtype = match t.dtype() {
                Dtype::F32 => DType::F32,
                Dtype::I32 => DType::I32,
                other => return Err(bad(format!("{name} is {other:?}, expected F32 or I32"))),
            };
            let ty = crate::dtype::TensorType::new(dtype, t.shape());
            Ok((name, HostArray::from_bytes(&ty, t.data())?))
        })
        .collect()
}

/// Fails unless `dtype` is a matrix dtype `family`'s models take (f32 or bf16); 8-bit
/// weights are named as what they are, Mamba-2's only so far.
pub(crate) fn check_float_matrices(family: &str, dtype: crate::dtype::DType) -> Result<()> {
    use crate::dtype::DType;
    match dtype {
        DType::F32 | DType::BF16 => Ok(()),
        d if d == crate::models::quant::QUANTIZED => Err(Error::InvalidArgument(format!(
            "8-bit matrices run Mamba-2 checkpoints only so far; load this {family} model with \
             f32 or bf16 matrices"
        ))),
        other => Err(Error::InvalidArgument(format!(
            "matmul_dtype {other} is not f32 or bf16"
        ))),
    }
}

/// Checks host weights against the types a model expects (by name, in order); an error names
/// `family` and every tensor of the wrong dtype or shape.
pub(crate) fn check_weight_types(
    family: &str,
    want: &[(String, &crate::dtype::TensorType)],
    got: &[(String, &HostArray)],
) -> Result<()> {
    let mut wrong: Vec<String> = Vec::new();
    if want.len() != got.len() {
        wrong.push(format!("{} tensors, expected {}", got.len(), want.len()));
    }
    for ((name, ty), (_, a)) in want.iter().zip(got) {
        if a.dtype() != ty.dtype || a.dims() != ty.dims.as_slice() {
            wrong.push(format!(
                "{name} is {:?} {:?}, expected {ty}",
                a.dtype(),
                a.dims()
            ));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{family} weights do not fit the config: {}",
        wrong.join("; ")
    )))
}

/// A model's compiled programs by what they compute (`K`), and its weights on the device,
/// which every program takes first.
pub(crate) struct Programs<K> {
    client: crate::runtime::Client,
    weights: Vec<crate::runtime::Buffer>,
    cache: std::sync::Mutex<std::collections::HashMap<K, crate::compiled::CompiledGraph>>,
}

impl<K: std::hash::Hash + Eq> Programs<K> {
    /// No programs yet, for `weights` on `client`'s first device.
    pub(crate) fn new(
        client: &crate::runtime::Client,
        weights: Vec<crate::runtime::Buffer>,
    ) -> Self {
        Programs {
            client: client.clone(),
            weights,
            cache: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The bytes of the weights on the device.
    pub(crate) fn weight_bytes(&self) -> usize {
        self.weights
            .iter()
            .map(|b| b.element_count() * b.dtype().size_in_bytes())
            .sum()
    }

    /// The dtype of the matrices: that of the largest weight (f32 when there is none).
    pub(crate) fn matmul_dtype(&self) -> crate::dtype::DType {
        self.weights
            .iter()
            .max_by_key(|b| b.element_count())
            .map_or(crate::dtype::DType::F32, |b| b.dtype())
    }

    /// Forgets the compiled programs (after a setting that changes them).
    pub(crate) fn clear(&mut self) {
        self.cache = std::sync::Mutex::new(std::collections::HashMap::new());
    }

    /// The program `key`, compiled from the graph `build` returns (its outputs set) on first
    /// use.
    pub(crate) fn get(
        &self,
        key: K,
        build: impl FnOnce() -> Result<Graph>,
    ) -> Result<crate::compiled::CompiledGraph> {
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| Error::InvalidArgument("a program cache was poisoned".into()))?;
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let program = build()?.compile(&self.client)?;
        cache.insert(key, program.clone());
        Ok(program)
    }

    /// Runs `program` on the weights and `inputs` (uploaded), downloading its outputs.
    pub(crate) fn run(
        &self,
        program: &crate::compiled::CompiledGraph,
        inputs: &[HostArray],
    ) -> Result<Vec<HostArray>> {
        let uploaded = inputs
            .iter()
            .map(|a| self.client.buffer_from_host_array(a))
            .collect::<Result<Vec<_>>>()?;
        let mut args: Vec<&crate::runtime::Buffer> = self.weights.iter().collect();
        args.extend(uploaded.iter());
        program
            .run_buffers(&args)?
            .iter()
            .map(crate::runtime::Buffer::to_host_array)
            .collect()
    }
}

/// Greedy decoding on the host: the argmax of `logits` (`[b, L, vocab]`, the prompts'
/// prefill) at the last position, then `new_tokens - 1` calls of `step` (the last tokens in,
/// the next logits `[b, vocab]` out), each followed by the argmax. The path the tests hold the
/// device-side loop against.
pub(crate) fn greedy_on_host(
    logits: &HostArray,
    new_tokens: usize,
    mut step: impl FnMut(&[u32]) -> Result<HostArray>,
) -> Result<Vec<Vec<u32>>> {
    let argmax_rows = |a: &HostArray| -> Vec<u32> {
        let vocab = a.dims().last().copied().unwrap_or(1).max(1);
        a.to_f64_vec().chunks(vocab).map(argmax).collect()
    };
    let rows = logits.dims()[0];
    if new_tokens == 0 {
        return Ok(vec![Vec::new(); rows]);
    }
    let mut picks = argmax_rows(&last_position(logits)?);
    let mut out: Vec<Vec<u32>> = picks.iter().map(|&t| vec![t]).collect();
    for _ in 1..new_tokens {
        picks = argmax_rows(&step(&picks)?);
        for (o, &t) in out.iter_mut().zip(&picks) {
            o.push(t);
        }
    }
    Ok(out)
}

/// The index of the largest value (the first of equals).
fn argmax(v: &[f64]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}
