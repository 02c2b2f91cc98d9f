//! Generation on the host side: the public `generate` calls, and the arguments they hand the
//! decode programs.

use super::decode::Variant;
use super::model::{layer_states, state_args, LogitsAt, Mamba2};
use super::state::Mamba2State;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::error::{Error, Result};
use crate::models::common::{generate_capacity, GenerateOptions, MAX_NEW_TOKENS};
use crate::runtime::ShardedBuffer;
use crate::sampling::{Penalties, PenaltySettings, SampleSettings, Sampling, TokenHistory};

impl Mamba2 {
    /// [`Mamba2::generate`] in segments of up to `segment` tokens (at least 1), handing each
    /// segment's new tokens (one list per row, cut after a row's `eos`) to `on_tokens` as soon
    /// as they exist, for printing text as it is produced. The loop still runs on the device:
    /// one prefill, then one execution of a compiled segment program per `segment` tokens, the
    /// state, logits, key and penalty history staying on the device (donated) between them.
    /// `on_tokens` returning `false` stops early. Returns every row's tokens, the same as
    /// `generate`'s.
    pub fn generate_stream(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
        segment: usize,
        mut on_tokens: impl FnMut(&[Vec<u32>]) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        self.check_options(options)?;
        if segment == 0 || segment > MAX_NEW_TOKENS {
            return Err(Error::InvalidArgument(format!(
                "generate_stream: segment ({segment}) is not in 1..={MAX_NEW_TOKENS}"
            )));
        }
        let batch = prompts.len();
        let pre = self.prefill(prompts)?;
        let mut all = vec![Vec::new(); batch];
        if options.max_new_tokens == 0 {
            return Ok(all);
        }
        let v = Variant {
            sample: matches!(options.sampling, Sampling::Sample { .. }),
            from_state: true,
            state_out: false,
            segment: true,
            penalties: !options.penalties.is_off(),
            row_keys: false,
        };
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
        let bucket = self.prompt_bucket(longest).unwrap_or(longest);
        let width = bucket + generate_capacity(options.max_new_tokens);
        // The history's width matters only to the program with penalties.
        let key_id = match v.penalties {
            true => format!("segment b{batch} k{segment} w{width} {v:?}"),
            false => format!("segment b{batch} k{segment} {v:?}"),
        };
        let program = self.program(&key_id, || self.segment_graph(batch, segment, v, width))?;
        let done = HostArray::from_vec(&[batch], vec![false; batch])?;
        let key = HostArray::from_vec(&[2], options.sampling.key().to_vec())?;
        let (penalties, history) = match v.penalties {
            true => self.penalty_inputs(prompts, &options.penalties, bucket, width)?,
            false => (Vec::new(), Vec::new()),
        };
        let mut at = Stream {
            logits: self.input("logits", &pre.logits, batch)?,
            state: pre.state,
            done: self.input("done", &done, batch)?,
            key: self.input("key", &key, batch)?,
            history,
        };
        let eos_id = options.eos.map_or(-1, |e| e as i32);
        let mut fixed = vec![self.input("eos", &HostArray::scalar(eos_id), batch)?];
        if v.sample {
            fixed.extend(self.sample_settings(&vec![options.sampling; batch])?);
        }
        fixed.extend(penalties);
        let mut stopped = vec![false; batch];
        let mut made = 0;
        while made < options.max_new_tokens && stopped.iter().any(|s| !s) {
            let steps = segment.min(options.max_new_tokens - made);
            let (tokens, next) = self.run_segment(&program, at, steps, &fixed)?;
            at = next;
            let mut fresh = vec![Vec::new(); batch];
            for (r, row) in tokens.chunks(segment).take(batch).enumerate() {
                for &t in &row[..steps] {
                    if stopped[r] {
                        break;
                    }
                    fresh[r].push(t as u32);
                    stopped[r] = eos_id >= 0 && t == eos_id;
                }
                all[r].extend(&fresh[r]);
            }
            made += steps;
            if !on_tokens(&fresh) {
                break;
            }
        }
        // Rows that stopped repeat their eos to `max_new_tokens`, as in `generate`.
        if let Some(e) = options.eos {
            for row in &mut all {
                if row.last() == Some(&e) {
                    row.resize(options.max_new_tokens, e);
                }
            }
        }
        Ok(all)
    }

    /// Runs one segment of `steps` tokens from `at`, with the inputs that stay the same
    /// (`eos`, then the sampling and penalty settings the program takes); returns the tokens
    /// (`[b, segment]`, row-major) and where the stream stands after them.
    fn run_segment(
        &self,
        program: &CompiledGraph,
        at: Stream,
        steps: usize,
        fixed: &[ShardedBuffer],
    ) -> Result<(Vec<i32>, Stream)> {
        let batch = at.state.batch();
        // Fits an i32: steps <= MAX_NEW_TOKENS.
        let max_steps = self.input("max_steps", &HostArray::scalar(steps as i32), batch)?;
        let mut args = self.weight_args();
        args.push(&at.logits);
        args.extend(state_args(Some(&at.state)));
        args.extend([&at.done, &at.key, &max_steps]);
        args.extend(fixed);
        args.extend(&at.history);
        let outs = program.run_sharded(&args)?;
        drop(args);
        let mut outs = outs.into_iter();
        let missing = || Error::InvalidArgument("a generate segment returned too little".into());
        let tokens = i32s(&outs.next().ok_or_else(missing)?)?;
        let logits = outs.next().ok_or_else(missing)?;
        let state = layer_states(&mut outs, self.config().num_layers)?;
        let next = Stream {
            logits,
            state,
            done: outs.next().ok_or_else(missing)?,
            key: outs.next().ok_or_else(missing)?,
            history: outs.collect(),
        };
        if next.history.len() != at.history.len() {
            return Err(missing());
        }
        Ok((tokens, next))
    }

    /// Generates up to `max_new_tokens` tokens per prompt in ONE execution: prefill and a
    /// device-side `while` loop of recurrent steps, with no host round trip per token. Prompts
    /// of different lengths are left-padded and masked; each row equals its prompt alone. A
    /// row that emits `eos` stops (its later positions repeat `eos`); the loop ends early when
    /// all rows have stopped. Returns the new tokens of each row (without the prompt).
    ///
    /// One compiled program serves every sampling setting, seed, penalty setting and `eos`,
    /// and every `max_new_tokens` up to its capacity (the next power of two, at least 16): they
    /// are runtime inputs. Greedy and sampled generation are two programs (greedy carries no
    /// sampling work), each with and without penalties (without, it carries no penalty work);
    /// a new batch size, prompt bucket or capacity compiles once.
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<u32>>> {
        Ok(self.run_generate(prompts, None, false, options)?.0)
    }

    /// [`Mamba2::generate`] continuing from `state` (when given; its buffers are donated), and
    /// returning, with the tokens, the state after the prompts and every token emitted (a row
    /// that stopped at `eos` keeps its state from there), ready for [`Mamba2::prefill_from`] or
    /// another `generate_from`: a conversation, turn by turn, in O(1) memory.
    pub fn generate_from(
        &self,
        prompts: &[Vec<u32>],
        state: Option<Mamba2State>,
        options: &GenerateOptions,
    ) -> Result<(Vec<Vec<u32>>, Mamba2State)> {
        let (tokens, state) = self.run_generate(prompts, state, true, options)?;
        let state = state.ok_or_else(|| {
            Error::InvalidArgument("generate_from: the program returned no state".into())
        })?;
        Ok((tokens, state))
    }

    fn run_generate(
        &self,
        prompts: &[Vec<u32>],
        state: Option<Mamba2State>,
        state_out: bool,
        options: &GenerateOptions,
    ) -> Result<(Vec<Vec<u32>>, Option<Mamba2State>)> {
        self.check_options(options)?;
        let (bucket, ids, mask, _) = self.pad_prompts(prompts)?;
        let batch = prompts.len();
        if let Some(s) = &state {
            s.check(self.config(), batch)?;
        }
        let state = state.map(|s| self.placed_state(s, batch)).transpose()?;
        if options.max_new_tokens == 0 {
            let state = if state_out {
                Some(self.run_prefill(prompts, LogitsAt::Last, state)?.state)
            } else {
                None
            };
            return Ok((vec![Vec::new(); batch], state));
        }
        let capacity = generate_capacity(options.max_new_tokens);
        let v = Variant {
            sample: matches!(options.sampling, Sampling::Sample { .. }),
            from_state: state.is_some(),
            state_out,
            segment: false,
            penalties: !options.penalties.is_off(),
            row_keys: false,
        };
        let key_id = format!("generate b{batch} l{bucket} n{capacity} {v:?}");
        let program = self.program(&key_id, || self.generate_graph(batch, bucket, capacity, v))?;
        let scalar = |name: &str, v: i32| self.input(name, &HostArray::scalar(v), batch);
        // Both fit an i32: max_new_tokens <= MAX_NEW_TOKENS and eos < vocab (checked).
        let max_new = scalar("max_new", options.max_new_tokens as i32)?;
        let eos = scalar("eos", options.eos.map_or(-1, |e| e as i32))?;
        let ids = self.input("tokens", &ids, batch)?;
        let mask = self.input("mask", &mask, batch)?;
        let mut inputs = vec![max_new, eos];
        if v.sample {
            let key = HostArray::from_vec(&[2], options.sampling.key().to_vec())?;
            inputs.push(self.input("key", &key, batch)?);
            inputs.extend(self.sample_settings(&vec![options.sampling; batch])?);
        }
        if v.penalties {
            let width = bucket + capacity;
            let (settings, history) =
                self.penalty_inputs(prompts, &options.penalties, bucket, width)?;
            inputs.extend(settings);
            inputs.extend(history);
        }
        let mut args = self.weight_args();
        args.push(&ids);
        args.push(&mask);
        args.extend(state_args(state.as_ref()));
        args.extend(&inputs);
        let outs = program.run_sharded(&args)?;
        drop(args);
        drop(state);
        let mut outs = outs.into_iter();
        let tokens = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("generate returned nothing".into()))?;
        let tokens = i32s(&tokens)?;
        let tokens = tokens
            .chunks(capacity)
            .take(batch)
            .map(|row| {
                row[..options.max_new_tokens]
                    .iter()
                    .map(|&t| t as u32)
                    .collect()
            })
            .collect();
        let state = if state_out {
            Some(layer_states(&mut outs, self.config().num_layers)?)
        } else {
            None
        };
        Ok((tokens, state))
    }

    /// Checks generation options against the model: sampling settings and penalties in range,
    /// `eos` in the vocabulary, `max_new_tokens` at most [`MAX_NEW_TOKENS`].
    pub(super) fn check_options(&self, options: &GenerateOptions) -> Result<()> {
        crate::models::engine::check_options(options, self.config().vocab_size)
    }

    /// The [`SampleSettings`] parameters of one setting per row, on the device.
    pub(super) fn sample_settings(&self, rows: &[Sampling]) -> Result<Vec<ShardedBuffer>> {
        let values = SampleSettings::row_host_values(rows, self.config().vocab_size)?;
        ["temperature", "top_k", "top_p"]
            .iter()
            .zip(&values)
            .map(|(name, a)| self.input(name, a, rows.len()))
            .collect()
    }

    /// The [`PenaltySettings`] parameters of `penalties`, and the [`TokenHistory`] of
    /// `prompts` left-padded to `bucket` positions in a history of `width`, on the device.
    fn penalty_inputs(
        &self,
        prompts: &[Vec<u32>],
        penalties: &Penalties,
        bucket: usize,
        width: usize,
    ) -> Result<(Vec<ShardedBuffer>, Vec<ShardedBuffer>)> {
        let batch = prompts.len();
        let upload = |values: &[(&str, HostArray)]| -> Result<Vec<ShardedBuffer>> {
            values
                .iter()
                .map(|(name, a)| self.input(name, a, batch))
                .collect()
        };
        let settings = upload(&PenaltySettings::host_values(penalties, batch)?)?;
        let history = upload(&TokenHistory::host_values(prompts, bucket, width)?)?;
        Ok((settings, history))
    }
}

/// Where a [`Mamba2::generate_stream`] stands between segments, on the device.
struct Stream {
    /// The logits of the next token.
    logits: ShardedBuffer,
    /// The model's state.
    state: Mamba2State,
    /// Which rows have emitted `eos`.
    done: ShardedBuffer,
    /// The sampling key.
    key: ShardedBuffer,
    /// The penalties' [`TokenHistory`] (three buffers), or nothing without penalties.
    history: Vec<ShardedBuffer>,
}

/// The values of an i32 array, downloaded.
fn i32s(b: &ShardedBuffer) -> Result<Vec<i32>> {
    Ok(b.to_host_array()?
        .as_array::<i32>()?
        .iter()
        .copied()
        .collect())
}
