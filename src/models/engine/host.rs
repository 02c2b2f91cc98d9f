//! Generation on the host side, written once for every family ([`Family`]): the checks, the
//! one-program `generate`, streaming and continuation in segments of the device-side decode
//! loop, greedy decoding with the argmax on the host, and the values the programs take.

use super::programs::{call, Named, Value};
use super::{Hold, Variant};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::{generate_capacity, GenerateOptions, ModelState, MAX_NEW_TOKENS};
use crate::runtime::{Client, ShardedBuffer};
use crate::sampling::{PenaltySettings, SampleSettings, Sampling, TokenHistory};

/// What a family supplies for the engine to generate with it: its prefill and step on the
/// host, its generate and segment programs (built from its graphs and the shared decode loop),
/// and its state as the programs and [`ModelState`] hold it. Everything else (checks, the
/// calls' order, streaming, continuation, greedy decoding) is the engine's.
pub(crate) trait Family {
    /// What the model carries between calls, on the host.
    type State;
    /// The family, for people ("Mamba-1", "Bamba", ...).
    fn family(&self) -> &'static str;
    /// One line on the shape: layers, width, state, vocabulary.
    fn describe(&self) -> String;
    /// The vocabulary size.
    fn vocab_size(&self) -> usize;
    /// The dtype of the matrices.
    fn matmul_dtype(&self) -> DType;
    /// The bytes of the weights on the device.
    fn weight_bytes(&self) -> usize;
    /// The StableHLO text of the prefill, step and generate programs for `prompts` and
    /// `options`.
    fn stablehlo(&self, prompts: &[Vec<u32>], options: &GenerateOptions) -> Result<[String; 3]>;
    /// The prompts (checked: at least one, none empty), left-padded to at least `pad_to`
    /// positions, fed after `init` (a fresh state when `None`) with room for `reserve` more
    /// tokens: the logits at each prompt position, or at the last only (`[b, 1, vocab]`;
    /// every caller reads the last).
    fn prefill_reserving(
        &self,
        prompts: &[Vec<u32>],
        init: Option<Self::State>,
        reserve: usize,
        pad_to: usize,
    ) -> Result<Prefilled<Self::State>>;
    /// The logits at every position of the prompts (left-padded to the longest), `[b, L,
    /// vocab]` f32.
    fn logits_at_every_position(&self, prompts: &[Vec<u32>]) -> Result<HostArray> {
        Ok(self.prefill_reserving(prompts, None, 0, 0)?.logits)
    }
    /// The logits after each prompt's last token (`[b, vocab]`, the prompts left-padded): by
    /// default the last position of [`Family::prefill_reserving`]'s; a family with a program
    /// that computes only those overrides it.
    fn prefill_last(&self, prompts: &[Vec<u32>]) -> Result<HostArray> {
        last_position(&self.prefill_reserving(prompts, None, 0, 0)?.logits)
    }
    /// The positions prompts of up to `longest` tokens are padded to by a prefill (by default
    /// `longest` itself).
    fn prompt_padding(&self, longest: usize) -> usize {
        longest
    }
    /// The compiled one-token step program of `batch` rows, where the family has one of a
    /// fixed shape (for inspection: its text, the collectives XLA inserted over devices).
    fn step_program(&self, batch: usize) -> Result<Option<CompiledGraph>> {
        let _ = batch;
        Ok(None)
    }
    /// One token per row after `state`: the logits `[b, vocab]` and the next state.
    fn step_tokens(&self, tokens: &[u32], state: Self::State) -> Result<(HostArray, Self::State)>;
    /// The program that generates up to `capacity` tokens after `prompts` in one call, as `v`
    /// says, and its inputs before the controls ([`control_inputs`]); with `init` (only when
    /// [`Family::generate_carries_state`]) it continues from that state.
    fn generate_program(
        &self,
        prompts: &[Vec<u32>],
        init: Option<Self::State>,
        capacity: usize,
        v: Variant,
    ) -> Result<Prepared>;
    /// Whether the generate program can continue from a state and return the state after it
    /// (`v.from_state`, `v.state_out`): [`generate_from`] is then one program call, else a
    /// prefill and one segment.
    fn generate_carries_state(&self) -> bool {
        false
    }
    /// The segment program (the shared [`super::segment_outputs`]) of up to `segment` steps
    /// from a state shaped like `state`, with a penalty history of `width` positions.
    fn segment_program(
        &self,
        state: &Self::State,
        segment: usize,
        width: usize,
        v: Variant,
    ) -> Result<CompiledGraph>;
    /// The state's tensors by the names of the segment program's parameters, in the order its
    /// outputs return them.
    fn flatten_state(&self, state: Self::State) -> Result<Vec<Named>>;
    /// A state from a program's outputs in the order of [`Family::flatten_state`].
    fn unflatten_state(&self, flat: Vec<Value>) -> Result<Self::State>;
    /// The state as named tensors.
    fn to_model_state(&self, state: Self::State) -> Result<ModelState>;
    /// A state from named tensors (of this family; the names checked, the shapes checked when
    /// it is used).
    fn state_from_model(&self, state: ModelState) -> Result<Self::State>;
    /// The client the weights live on.
    fn client(&self) -> &Client;
    /// The weights on the device, in the order every program takes them first.
    fn weight_buffers(&self) -> Vec<&ShardedBuffer>;
}

/// Fails when a generate program that does not continue from a state is given one (a family
/// whose [`Family::generate_carries_state`] is `false`).
pub(crate) fn refuse_state(family: &str, given: bool) -> Result<()> {
    match given {
        true => Err(Error::InvalidArgument(format!(
            "{family}: the generate program does not continue from a state (the engine \
             continues in a segment)"
        ))),
        false => Ok(()),
    }
}

/// Runs `program` of `f` on its weights and `inputs` by name ([`call`]); the outputs stay on
/// the device.
pub(crate) fn run<F: Family>(
    f: &F,
    program: &CompiledGraph,
    inputs: Vec<Named>,
) -> Result<Vec<ShardedBuffer>> {
    call(f.client(), program, &f.weight_buffers(), inputs)
}

/// What [`Family::prefill_reserving`] returns.
pub(crate) struct Prefilled<S> {
    /// The logits at the positions of the left-padded prompts, `[b, L, vocab]`: every position
    /// (`L` the longest prompt) or only the last (`L` = 1).
    pub(crate) logits: HostArray,
    /// The state after the prompts.
    pub(crate) state: S,
    /// The prompts' positions as a penalty history counts them (their padded length).
    pub(crate) width: usize,
}

/// A generate program and its inputs before the controls.
pub(crate) struct Prepared {
    /// The program.
    pub(crate) program: CompiledGraph,
    /// Its inputs after the weights and before the controls, by name.
    pub(crate) inputs: Vec<Named>,
    /// The prompts' positions as the penalty history counts them.
    pub(crate) len: usize,
}

/// Fails unless there is at least one prompt and none is empty, naming `family` and `op`.
pub(crate) fn check_prompts(family: &str, op: &str, prompts: &[Vec<u32>]) -> Result<()> {
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(Error::InvalidArgument(format!(
            "{family} {op}: needs at least one prompt, and no empty prompt"
        )));
    }
    Ok(())
}

/// Up to `options.max_new_tokens` tokens per prompt in ONE program call: the prefill and the
/// device-side decode loop (greedy or sampled, with penalties, stopping a row at `eos`, whose
/// later positions repeat it).
pub(crate) fn generate<F: Family>(
    f: &F,
    prompts: &[Vec<u32>],
    options: &GenerateOptions,
) -> Result<Vec<Vec<u32>>> {
    Ok(one_program(f, prompts, None, false, options)?.0)
}

/// Each row's tokens, and the state after them when asked for.
type Generated<S> = (Vec<Vec<u32>>, Option<S>);

/// [`generate`] continuing from `init` (when given, only when
/// [`Family::generate_carries_state`]) and, with `state_out`, returning the state after the
/// prompts and every token emitted.
fn one_program<F: Family>(
    f: &F,
    prompts: &[Vec<u32>],
    init: Option<F::State>,
    state_out: bool,
    options: &GenerateOptions,
) -> Result<Generated<F::State>> {
    check_options(options, f.vocab_size())?;
    check_prompts(f.family(), "generate", prompts)?;
    if options.max_new_tokens == 0 {
        let state = match state_out {
            true => Some(f.prefill_reserving(prompts, init, 0, 0)?.state),
            false => None,
        };
        return Ok((vec![Vec::new(); prompts.len()], state));
    }
    let v = Variant {
        from_state: init.is_some(),
        state_out,
        ..variant(options)
    };
    let capacity = generate_capacity(options.max_new_tokens);
    let p = f.generate_program(prompts, init, capacity, v)?;
    let mut inputs = p.inputs;
    let (len, vocab) = (p.len, f.vocab_size());
    inputs.extend(control_inputs(
        prompts,
        options,
        vocab,
        len,
        len + capacity,
        v,
    )?);
    let mut outs = run(f, &p.program, inputs)?.into_iter();
    let tokens = outs
        .next()
        .ok_or_else(|| Error::InvalidArgument("generate returned nothing".into()))?;
    let rows = rows_of_tokens(&tokens.to_host_array()?, options.max_new_tokens)?;
    let state = match state_out {
        true => Some(f.unflatten_state(outs.map(Value::Device).collect())?),
        false => None,
    };
    Ok((rows, state))
}

/// The prefill (after `init`, when given) with room for the generation, then segments of up
/// to `segment` tokens, each segment's tokens handed to `on_tokens` (`false` stops); with
/// `state_out` rows that stopped keep their state. Returns the tokens and the last state.
pub(crate) fn segments<F: Family>(
    f: &F,
    prompts: &[Vec<u32>],
    init: Option<F::State>,
    options: &GenerateOptions,
    segment: usize,
    state_out: bool,
    on_tokens: impl FnMut(&[Vec<u32>]) -> bool,
) -> Result<(Vec<Vec<u32>>, F::State)> {
    let vocab = f.vocab_size();
    check_options(options, vocab)?;
    check_segment(segment)?;
    check_prompts(f.family(), "generate", prompts)?;
    let capacity = generate_capacity(options.max_new_tokens);
    let pre = f.prefill_reserving(prompts, init, capacity, 0)?;
    if options.max_new_tokens == 0 {
        return Ok((vec![Vec::new(); prompts.len()], pre.state));
    }
    let v = Variant {
        segment: true,
        state_out,
        ..variant(options)
    };
    let width = pre.width + capacity;
    let program = f.segment_program(&pre.state, segment, width, v)?;
    let start = StreamStart {
        logits: last_position(&pre.logits)?,
        state: f.flatten_state(pre.state)?,
        len: pre.width,
        width,
    };
    let call = |inputs: Vec<Named>| run(f, &program, inputs);
    let (tokens, flat) =
        stream_segments(prompts, options, vocab, segment, start, v, call, on_tokens)?;
    Ok((tokens, f.unflatten_state(flat)?))
}

/// [`generate`] continuing from `state` (when given; of this family, one row per prompt),
/// returning with the tokens the state after the prompts and every token emitted (a row that
/// stopped at `eos` keeps its state from there).
pub(crate) fn generate_from<F: Family>(
    f: &F,
    prompts: &[Vec<u32>],
    state: Option<ModelState>,
    options: &GenerateOptions,
) -> Result<(Vec<Vec<u32>>, ModelState)> {
    let init = state.map(|s| f.state_from_model(s)).transpose()?;
    let (tokens, state) = continue_from(f, prompts, init, options)?;
    Ok((tokens, f.to_model_state(state)?))
}

/// [`generate`] continuing from `init` (when given), returning with the tokens the state after
/// the prompts and every token emitted: one program when [`Family::generate_carries_state`],
/// else a prefill and one segment.
pub(crate) fn continue_from<F: Family>(
    f: &F,
    prompts: &[Vec<u32>],
    init: Option<F::State>,
    options: &GenerateOptions,
) -> Result<(Vec<Vec<u32>>, F::State)> {
    if f.generate_carries_state() {
        let (tokens, state) = one_program(f, prompts, init, true, options)?;
        let state = state.ok_or_else(|| {
            Error::InvalidArgument("generate_from: the program returned no state".into())
        })?;
        return Ok((tokens, state));
    }
    let segment = generate_capacity(options.max_new_tokens);
    segments(f, prompts, init, options, segment, true, |_| true)
}

/// Each row up to and including its first `eos` (rows without one whole).
pub(crate) fn cut_at_eos(mut rows: Vec<Vec<u32>>, eos: Option<u32>) -> Vec<Vec<u32>> {
    if let Some(e) = eos {
        for row in &mut rows {
            if let Some(at) = row.iter().position(|&t| t == e) {
                row.truncate(at + 1);
            }
        }
    }
    rows
}

/// `new_tokens` greedy tokens per prompt: a prefill with room for them, then one
/// [`Family::step_tokens`] per token with the argmax taken on the host (the path the tests hold the
/// device-side loop against).
pub(crate) fn greedy<F: Family>(
    f: &F,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> Result<Vec<Vec<u32>>> {
    check_prompts(f.family(), "greedy", prompts)?;
    let p = f.prefill_reserving(prompts, None, new_tokens, 0)?;
    let mut state = Some(p.state);
    greedy_on_host(&p.logits, new_tokens, |picks| {
        let s = state
            .take()
            .ok_or_else(|| Error::InvalidArgument("no state".into()))?;
        let (logits, next) = f.step_tokens(picks, s)?;
        state = Some(next);
        Ok(logits)
    })
}

/// The values of [`control_parameters`] for `options` and `prompts` left-padded to `len`
/// positions in a history of `width`, by name.
pub(crate) fn control_inputs(
    prompts: &[Vec<u32>],
    options: &GenerateOptions,
    vocab: usize,
    len: usize,
    width: usize,
    v: Variant,
) -> Result<Vec<Named>> {
    // Both fit an i32: max_new_tokens <= MAX_NEW_TOKENS and eos < vocab (checked).
    let mut inputs = vec![host_input(
        "max_new",
        HostArray::scalar(options.max_new_tokens as i32),
    )];
    let picker = picker_inputs(prompts.len(), options, vocab, v)?;
    inputs.extend(picker.into_iter().map(|(n, a)| host_input(n, a)));
    if v.sample {
        let key = HostArray::from_vec(&[2], options.sampling.key().to_vec())?;
        inputs.push(host_input("key", key));
    }
    if v.penalties {
        let history = TokenHistory::host_values(prompts, len, width)?;
        inputs.extend(history.into_iter().map(|(n, a)| host_input(n, a)));
    }
    Ok(inputs)
}

/// The inputs that say how a decode program picks its tokens (the same in every segment), by
/// name: `eos`, with `v.sample` the [`SampleSettings`], with `v.penalties` the
/// [`PenaltySettings`].
fn picker_inputs(
    batch: usize,
    options: &GenerateOptions,
    vocab: usize,
    v: Variant,
) -> Result<Vec<(&'static str, HostArray)>> {
    let mut inputs = vec![(
        "eos",
        HostArray::scalar(options.eos.map_or(-1, |e| e as i32)),
    )];
    if v.sample {
        let values = SampleSettings::host_values(&options.sampling, batch, vocab)?;
        inputs.extend(["temperature", "top_k", "top_p"].into_iter().zip(values));
    }
    if v.penalties {
        inputs.extend(PenaltySettings::host_values(&options.penalties, batch)?);
    }
    Ok(inputs)
}

/// A host array as the input `name`.
pub(crate) fn host_input(name: impl Into<String>, a: HostArray) -> Named {
    (name.into(), Value::Host(a))
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
        extras: false,
        hold: Hold::EveryStep,
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

/// Where a streamed generation starts: the logits after the prompts (`[b, vocab]`) and the
/// state after them, by name (as the segment program takes it), with the prompts left-padded
/// to `len` positions in a penalty history of `width`.
pub(crate) struct StreamStart {
    /// The logits of the first new token.
    pub(crate) logits: HostArray,
    /// The state's tensors, by the segment program's names.
    pub(crate) state: Vec<Named>,
    /// The prompts' padded length.
    pub(crate) len: usize,
    /// The penalty history's width (`len` and the new tokens' room).
    pub(crate) width: usize,
}

/// Runs a streamed generation segment by segment through `run` (the segment program of
/// [`segment_outputs`], up to `segment` tokens a call), handing each segment's new tokens
/// (one list per row, cut after a row's `eos`) to `on_tokens`, which stops the stream by
/// returning `false`. Between segments the logits, state, `done`, key and penalty history stay
/// on the device (the program may donate them). Returns every row's tokens, rows that stopped
/// repeating their `eos` to `max_new_tokens` as `generate` does, and the state after the last
/// segment (in the order of [`StreamStart::state`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn stream_segments(
    prompts: &[Vec<u32>],
    options: &GenerateOptions,
    vocab: usize,
    segment: usize,
    start: StreamStart,
    v: Variant,
    mut run: impl FnMut(Vec<Named>) -> Result<Vec<ShardedBuffer>>,
    mut on_tokens: impl FnMut(&[Vec<u32>]) -> bool,
) -> Result<(Vec<Vec<u32>>, Vec<Value>)> {
    let batch = prompts.len();
    let mut all = vec![Vec::new(); batch];
    let mut history: Vec<Named> = Vec::new();
    if v.penalties {
        let h = TokenHistory::host_values(prompts, start.len, start.width)?;
        history.extend(h.into_iter().map(|(n, a)| host_input(n, a)));
    }
    let mut at = vec![host_input("logits", start.logits)];
    at.extend(start.state);
    at.push(host_input(
        "done",
        HostArray::from_vec(&[batch], vec![false; batch])?,
    ));
    at.push(host_input(
        "key",
        HostArray::from_vec(&[2], options.sampling.key().to_vec())?,
    ));
    // The outputs after the tokens, in order: these inputs, then the history.
    let names: Vec<String> = at.iter().chain(&history).map(|(n, _)| n.clone()).collect();
    at.extend(history);
    let picker = picker_inputs(batch, options, vocab, v)?;
    let eos = options.eos.map_or(-1, |e| e as i32);
    let mut stopped = vec![false; batch];
    let mut made = 0;
    while made < options.max_new_tokens && stopped.iter().any(|s| !s) {
        let steps = segment.min(options.max_new_tokens - made);
        let mut inputs = at;
        // Fits an i32: steps <= MAX_NEW_TOKENS.
        inputs.push(host_input("max_steps", HostArray::scalar(steps as i32)));
        inputs.extend(picker.iter().map(|(n, a)| host_input(*n, a.clone())));
        let mut outs = run(inputs)?.into_iter();
        let short = || Error::InvalidArgument("a generate segment returned too little".into());
        let tokens = outs.next().ok_or_else(short)?.to_host_array()?;
        at = names
            .iter()
            .map(|n| Ok((n.clone(), Value::Device(outs.next().ok_or_else(short)?))))
            .collect::<Result<_>>()?;
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
    // The state: after the logits, before `done`, `key` and the history.
    let n_state = names.len() - 3 - usize::from(v.penalties) * 3;
    let state = at
        .into_iter()
        .skip(1)
        .take(n_state)
        .map(|(_, v)| v)
        .collect();
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
