//! The decode programs: generation as one compiled program (prefill, then a `while` loop of
//! recurrent steps that picks each token on the device) and the segment program of
//! [`Mamba2::generate_stream`].

use super::block;
use super::model::{LogitsAt, Mamba2};
use super::weights::Mamba2Weights;
use super::Mamba2Config;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::LayerState;
use crate::models::common::{generate_capacity, GenerateOptions};
pub(super) use crate::models::engine::Variant;
use crate::models::engine::{
    decode_loop, penalty_parameters, rows, segment_outputs, Decoding, Hold, Picker, SegmentShape,
    Stepper,
};
use crate::ops::{Carry, Graph, Tensor};
use crate::sampling::{SampleSettings, Sampling};

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

/// Mamba-2's step inside the decode loop.
struct Steps<'a> {
    w: &'a Mamba2Weights<Tensor>,
    cfg: &'a Mamba2Config,
}

impl Stepper for Steps<'_> {
    type State = Vec<LayerState<Tensor>>;
    fn step(&self, token: &Tensor, state: &Self::State) -> Result<(Tensor, Self::State)> {
        block::step(token, state, self.w, self.cfg)
    }
    fn hold(&self, done: &Tensor, old: &Self::State, next: Self::State) -> Result<Self::State> {
        let mut next = next;
        for (n, s) in next.iter_mut().zip(old) {
            n.conv = rows(done, 3)?.select(&s.conv, &n.conv)?;
            n.ssm = rows(done, 4)?.select(&s.ssm, &n.ssm)?;
        }
        Ok(next)
    }
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
                    row_keys: false,
                    extras: false,
                    hold: Hold::EveryStep,
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
        let g = self.graph();
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
            bias: None,
        };
        let (out, end, _) = decode_loop(
            &Steps {
                w: &w,
                cfg: self.config(),
            },
            start,
            &max_new,
            &picker,
            capacity,
            v,
        )?;
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
        self.segment_graph_rows(batch, None, segment, v, width)
    }

    /// [`Mamba2::segment_graph`], or with `rows: Some(m)` the segment of `m` of the `slots`
    /// rows that the logits and state hold (the engine's [`segment_outputs`]): the program then
    /// takes the rows' indices (i32 `[m]`, distinct) after the state, decodes those rows
    /// (`done`, the keys and settings are `[m]`, as are the tokens, `done` and keys it returns)
    /// and writes them back into the logits and state it returns, the other rows untouched.
    pub(super) fn segment_graph_rows(
        &self,
        slots: usize,
        rows: Option<usize>,
        segment: usize,
        v: Variant,
        width: usize,
    ) -> Result<Graph> {
        let g = self.graph();
        let w = self.for_products(&self.weight_parameters(&g)?, false)?;
        let shape = SegmentShape {
            slots,
            rows,
            vocab: self.config().vocab_size,
            steps: segment,
            width,
            cut: None,
            paged: None,
        };
        let steps = Steps {
            w: &w,
            cfg: self.config(),
        };
        let outs = segment_outputs(&g, &steps, shape, v, |g| self.state_parameters(g, slots))?;
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        self.placed(g, slots)
    }
}
