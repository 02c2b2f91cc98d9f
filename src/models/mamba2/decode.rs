//! The decode programs: generation as one compiled program (prefill, then a `while` loop of
//! recurrent steps that picks each token on the device) and the segment program of
//! [`Mamba2::generate_stream`].

use super::block::{self, LayerState};
use super::generate::{generate_capacity, GenerateOptions};
use super::model::{LogitsAt, Mamba2};
use super::weights::Mamba2Weights;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{Carry, Graph, Tensor};
use crate::sampling::{self, PenaltySettings, SampleSettings, Sampling, TokenHistory};

impl Carry for LayerState<Tensor> {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.push(self.conv.clone());
        out.push(self.ssm.clone());
    }
    fn unflatten(_: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        Some(LayerState {
            conv: values.next()?,
            ssm: values.next()?,
        })
    }
}

/// What a generate program takes and returns besides its tokens.
#[derive(Debug, Clone, Copy)]
pub(super) struct Variant {
    /// Sampling (else greedy).
    pub(super) sample: bool,
    /// Continues from a state given as parameters.
    pub(super) from_state: bool,
    /// Returns the final state.
    pub(super) state_out: bool,
    /// Continues in later calls (a stream segment): needs the logits after the last token.
    pub(super) segment: bool,
    /// Applies penalties (takes their settings and a token history).
    pub(super) penalties: bool,
}

impl Variant {
    /// Whether the token the loop picks last must be stepped through the model: when the state
    /// or the logits after it are wanted.
    fn needs_last_step(&self) -> bool {
        self.state_out || self.segment
    }
}

/// Where decoding stands between steps, on the device.
struct Decoding {
    /// The logits of the next token, `[b, vocab]`.
    logits: Tensor,
    /// One state per layer.
    states: Vec<LayerState<Tensor>>,
    /// The rows that have emitted `eos`, pred `[b]`.
    done: Tensor,
    /// The sampling key.
    key: Tensor,
    /// The context so far, when penalties are on.
    history: Option<TokenHistory>,
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
struct Picker {
    /// The end-of-sequence token, rank-0 i32 (-1 for none).
    eos: Tensor,
    /// The sampling settings, when the program samples (else it is greedy).
    sample: Option<SampleSettings>,
    /// The penalty settings, when the program applies penalties.
    penalties: Option<PenaltySettings>,
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
fn rows(done: &Tensor, rank: usize) -> Result<Tensor> {
    let mut dims = vec![1isize; rank];
    dims[0] = done.dims()[0] as isize;
    done.reshape(&dims)
}

impl Mamba2 {
    /// The StableHLO text of the prefill, step and generate programs for a batch shape (for
    /// reading and for `emit`): `batch` rows (at least 1) of prompts padded to `bucket`
    /// positions (a value of [`Mamba2::prompt_bucket`]). Wrong sizes or options are an error
    /// naming them.
    pub fn stablehlo(
        &self,
        batch: usize,
        bucket: usize,
        options: &GenerateOptions,
    ) -> Result<[String; 3]> {
        if batch == 0 {
            return Err(Error::InvalidArgument(
                "Mamba2::stablehlo: batch is 0; it needs at least one row".into(),
            ));
        }
        if bucket == 0 || self.prompt_bucket(bucket) != Some(bucket) {
            return Err(Error::InvalidArgument(format!(
                "Mamba2::stablehlo: bucket ({bucket}) is not a prompt bucket; \
                 Mamba2::prompt_bucket gives them (here {:?})",
                self.prompt_bucket(bucket.max(1))
            )));
        }
        self.check_options(options)?;
        Ok([
            self.prefill_graph(batch, bucket, LogitsAt::Last, false)?
                .to_stablehlo()?,
            self.step_graph(batch)?.to_stablehlo()?,
            self.generate_graph(
                batch,
                bucket,
                generate_capacity(options.max_new_tokens),
                Variant {
                    sample: matches!(options.sampling, Sampling::Sample { .. }),
                    from_state: false,
                    state_out: false,
                    segment: false,
                    penalties: !options.penalties.is_off(),
                },
            )?
            .to_stablehlo()?,
        ])
    }

    /// The generate program for `batch` rows of `bucket` prompt positions and up to `capacity`
    /// new tokens. Parameters after the weights: `tokens`, `mask`, with `v.from_state` the
    /// state to continue from (donated), `max_new` (i32, at most `capacity`), `eos` (i32, -1 for
    /// none), with `v.sample` the `key` and the [`SampleSettings`], and with `v.penalties` the
    /// [`PenaltySettings`] and the [`TokenHistory`] of the prompts (`bucket + capacity`
    /// positions). Outputs: `[batch, capacity]` i32 tokens, of which the first `max_new` per
    /// row are meant, and with `v.state_out` the state after the prompt and every emitted token.
    pub(super) fn generate_graph(
        &self,
        batch: usize,
        bucket: usize,
        capacity: usize,
        v: Variant,
    ) -> Result<Graph> {
        let g = Graph::new();
        let w = self.for_products(&self.weight_parameters(&g)?, false)?;
        let tokens = g.parameter("tokens", DType::I32, &[batch, bucket])?;
        let mask = g.parameter("mask", DType::F32, &[batch, bucket])?;
        let init = if v.from_state {
            Some(self.state_parameters(&g, batch)?)
        } else {
            None
        };
        let max_new = g.parameter("max_new", DType::I32, &[])?;
        let eos = g.parameter("eos", DType::I32, &[])?;
        let sampler = if v.sample {
            let key = g.parameter("key", DType::U32, &[2])?;
            Some((key, SampleSettings::parameters(&g, batch)?))
        } else {
            None
        };
        let (penalties, history) = penalty_parameters(&g, v, batch, bucket + capacity)?;
        let (logits, states) =
            self.prefill_logits(&tokens, &mask, &w, LogitsAt::Last, init.as_deref())?;
        let done = g.full(0.0, DType::Pred, &[batch])?;
        let (key, sample) = match sampler {
            Some((key, settings)) => (key, Some(settings)),
            None => (g.zeros(DType::U32, &[2])?, None),
        };
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
        let (out, end) = self.decode_loop(&w, start, &max_new, &picker, capacity, v)?;
        let states = end.states;
        let mut outs = vec![out];
        if v.state_out {
            for s in states {
                outs.push(s.conv);
                outs.push(s.ssm);
            }
        }
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        self.placed(g, batch)
    }

    /// Up to `max_steps` (rank-0 i32, at most `capacity`) decode steps from `start` inside one
    /// `while` loop, each picking its token as `picker` says, ending early when every row has
    /// emitted `picker.eos` (rank-0 i32, -1 for none). Returns the tokens `[b, capacity]`
    /// (positions after a row's `eos`, and those the loop did not reach, hold `max(eos, 0)`)
    /// and where decoding stands. With `v.state_out` a row that had stopped keeps the state it
    /// stopped with.
    fn decode_loop(
        &self,
        w: &Mamba2Weights<Tensor>,
        start: Decoding,
        max_steps: &Tensor,
        picker: &Picker,
        capacity: usize,
        v: Variant,
    ) -> Result<(Tensor, Decoding)> {
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
            Ok::<_, crate::error::Error>((token, out, key))
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
                let (logits, mut next) = block::step(&token, states, w, self.config())?;
                if v.state_out {
                    for (n, s) in next.iter_mut().zip(states) {
                        n.conv = rows(&t.done, 3)?.select(&s.conv, &n.conv)?;
                        n.ssm = rows(&t.done, 4)?.select(&s.ssm, &n.ssm)?;
                    }
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

    /// The segment program of [`Mamba2::generate_stream`]: up to `segment` decode steps from
    /// where decoding stands. Parameters after the weights: `logits` `[b, vocab]`, the state
    /// (both donated), `done` (pred `[b]`), `key`, `max_steps`, `eos`, with `v.sample` the
    /// [`SampleSettings`], and with `v.penalties` the [`PenaltySettings`] and the
    /// [`TokenHistory`] of `width` positions (donated). Outputs: the tokens `[b, segment]`,
    /// then the new logits, state (two per layer), `done`, `key`, and with `v.penalties` the
    /// history.
    pub(super) fn segment_graph(
        &self,
        batch: usize,
        segment: usize,
        v: Variant,
        width: usize,
    ) -> Result<Graph> {
        let g = Graph::new();
        let w = self.for_products(&self.weight_parameters(&g)?, false)?;
        let logits = g.parameter("logits", DType::F32, &[batch, self.config().vocab_size])?;
        g.donate(&logits)?;
        let states = self.state_parameters(&g, batch)?;
        let done = g.parameter("done", DType::Pred, &[batch])?;
        let key = g.parameter("key", DType::U32, &[2])?;
        let max_steps = g.parameter("max_steps", DType::I32, &[])?;
        let eos = g.parameter("eos", DType::I32, &[])?;
        let sample = if v.sample {
            Some(SampleSettings::parameters(&g, batch)?)
        } else {
            None
        };
        let (penalties, history) = penalty_parameters(&g, v, batch, width)?;
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
        let picker = Picker {
            eos,
            sample,
            penalties,
        };
        let (out, end) = self.decode_loop(&w, start, &max_steps, &picker, segment, v)?;
        let mut outs = vec![out, end.logits];
        for s in end.states {
            outs.push(s.conv);
            outs.push(s.ssm);
        }
        outs.push(end.done);
        outs.push(end.key);
        if let Some(h) = end.history {
            outs.extend([h.tokens, h.matched, h.len]);
        }
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        self.placed(g, batch)
    }
}

/// With `v.penalties`, the [`PenaltySettings`] and a [`TokenHistory`] of `width` positions as
/// parameters of `g`.
fn penalty_parameters(
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
