//! Prefill that rides with decode: one program over served slots in which some rows take one
//! decode step and a group of others consumes a piece of its prompt, every token-wise product
//! (`in_proj`, `out_proj`, the head) over both kinds of rows at once, so the decoding rows
//! share the weight reads of the prefill instead of waiting for it.

use super::block::{embed, head, mixer_inputs, mixer_output, prefill_core, step_core};
use super::model::Mamba2;
use super::weights::{LayerWeights, Mamba2Weights};
use super::Mamba2Config;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::LayerState;
use crate::models::engine::{rows, scatter_rows, Picker};
use crate::ops::{Graph, Tensor};
use crate::sampling::SampleSettings;

/// The first `n` rows of `t` and the rest, the rest reshaped to `[g, L, ...]`.
fn split_rows(t: &Tensor, n: usize, g: usize, len: usize) -> Result<(Tensor, Tensor)> {
    let total = t.dims()[0];
    let mut dims: Vec<isize> = vec![g as isize, len as isize];
    dims.extend(t.dims()[1..].iter().map(|&d| d as isize));
    Ok((
        t.narrow(0, 0, n)?,
        t.narrow(0, n, total - n)?.reshape(&dims)?,
    ))
}

/// `[g, L, ...]` as `[g * L, ...]`.
fn flat_rows(t: &Tensor) -> Result<Tensor> {
    let mut dims: Vec<isize> = vec![(t.dims()[0] * t.dims()[1]) as isize];
    dims.extend(t.dims()[2..].iter().map(|&d| d as isize));
    t.reshape(&dims)
}

/// One block over `step` rows taking one token (`[s, hidden]`, after `state`) and `piece`
/// rows taking a left-padded piece (`[g, L, hidden]`, `mask` `[g, L]`, after `init`): the
/// hidden states after the block (residual added) and the states after it, steps first.
fn block_mixed(
    step: &Tensor,
    state: &LayerState<Tensor>,
    piece: &Tensor,
    mask: &Tensor,
    init: &LayerState<Tensor>,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<(Tensor, LayerState<Tensor>, Tensor, LayerState<Tensor>)> {
    let (s, g, len) = (step.dims()[0], piece.dims()[0], piece.dims()[1]);
    let hidden = Tensor::concat(&[step, &flat_rows(piece)?], 0)?;
    let (z, xbc, dt) = mixer_inputs(&hidden, w, cfg)?;
    let (xbc_s, xbc_p) = split_rows(&xbc, s, g, len)?;
    let (dt_s, dt_p) = split_rows(&dt, s, g, len)?;
    let (y_s, x_s, state_s) = step_core(&xbc_s, &dt_s, state, w, cfg)?;
    let (y_p, x_p, state_p) = prefill_core(&xbc_p, &dt_p, mask, w, cfg, Some(init))?;
    let y = Tensor::concat(&[&y_s, &flat_rows(&y_p)?], 0)?;
    let x = Tensor::concat(&[&x_s, &flat_rows(&x_p)?], 0)?;
    let hidden = hidden.add(&mixer_output(&y, &x, &z, w, cfg)?)?;
    let (h_s, h_p) = split_rows(&hidden, s, g, len)?;
    Ok((h_s, state_s, h_p, state_p))
}

/// What [`mixed_forward`] returns: per kind of row, the logits after it (`[rows, vocab]`; for
/// the pieces, after their last position) and each layer's state.
struct Mixed {
    step_logits: Tensor,
    step_states: Vec<LayerState<Tensor>>,
    piece_logits: Tensor,
    piece_states: Vec<LayerState<Tensor>>,
}

/// The whole model over one token per step row (`tokens` `[s]`, after `states`) and a
/// left-padded piece per piece row (`piece` `[g, L]` integers, `mask` `[g, L]`, after `init`;
/// `L` a multiple of `cfg`'s chunk).
fn mixed_forward(
    tokens: &Tensor,
    states: &[LayerState<Tensor>],
    piece: &Tensor,
    mask: &Tensor,
    init: &[LayerState<Tensor>],
    w: &Mamba2Weights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<Mixed> {
    let (s, [g, len]) = match *piece.dims() {
        [g, len] => (tokens.dims()[0], [g, len]),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "mixed: piece is {}, expected [g, L]",
                piece.ty()
            )))
        }
    };
    let (mut h_s, mut h_p) = (embed(tokens, w)?, embed(piece, w)?);
    let (mut step_states, mut piece_states) = (Vec::new(), Vec::new());
    for ((layer, state), init) in w.layers.iter().zip(states).zip(init) {
        let (a, sa, b, sb) = block_mixed(&h_s, state, &h_p, mask, init, layer, cfg)?;
        (h_s, h_p) = (a, b);
        step_states.push(sa);
        piece_states.push(sb);
    }
    let last = h_p
        .narrow(1, len - 1, 1)?
        .reshape(&[g as isize, cfg.hidden_size as isize])?;
    let logits = head(&Tensor::concat(&[&h_s, &last], 0)?, w, cfg)?;
    Ok(Mixed {
        step_logits: logits.narrow(0, 0, s)?,
        step_states,
        piece_logits: logits.narrow(0, s, g)?,
        piece_states,
    })
}

impl Mamba2 {
    /// The mixed program over `slots` slots: one decode step for the slots not `done` and a
    /// piece of `len` positions (a prompt bucket) for `group` others. Parameters after the
    /// weights: `logits` `[slots, vocab]` and the state (donated), `done` (pred `[slots]`),
    /// `key` (u32 `[slots, 2]`), `eos`, with `sample` the [`SampleSettings`], then
    /// `piece_tokens` (i32 `[group, len]`, left-padded), `piece_mask` (f32), `piece_rows` (the
    /// pieces' slots, i32 `[group]`, distinct and not decoding) and `piece_fresh` (pred
    /// `[group]`: the piece starts an empty state, else it continues its slot's). Outputs: the
    /// tokens `[slots]` (`eos` for `done` rows), the logits and state of every slot (the
    /// decoded rows stepped, the pieces' rows after their pieces, the others as they were),
    /// `done` (the rows that had stopped or emitted `eos`) and the keys, as a segment returns
    /// them.
    pub(super) fn mixed_graph(
        &self,
        slots: usize,
        group: usize,
        len: usize,
        sample: bool,
    ) -> Result<Graph> {
        let g = self.graph();
        let w = self.for_products(&self.weight_parameters(&g)?, false)?;
        let vocab = self.config().vocab_size;
        let logits = g.parameter("logits", DType::F32, &[slots, vocab])?;
        g.donate(&logits)?;
        let states = self.state_parameters(&g, slots)?;
        let done = g.parameter("done", DType::Pred, &[slots])?;
        let key = g.parameter("key", DType::U32, &[slots, 2])?;
        let picker = Picker {
            eos: g.parameter("eos", DType::I32, &[])?,
            sample: sample
                .then(|| SampleSettings::parameters(&g, slots))
                .transpose()?,
            penalties: None,
            bias: None,
        };
        let piece = g.parameter("piece_tokens", DType::I32, &[group, len])?;
        let mask = g.parameter("piece_mask", DType::F32, &[group, len])?;
        let at = g.parameter("piece_rows", DType::I32, &[group])?;
        let fresh = g.parameter("piece_fresh", DType::Pred, &[group])?;
        let (token, key) = picker.pick(&logits, &done, &key, None)?;
        let zeroed = |t: &Tensor| {
            let taken = t.take(&at)?;
            let zero = g.zeros(taken.dtype(), taken.dims())?;
            rows(&fresh, taken.rank())?.select(&zero, &taken)
        };
        let init = states
            .iter()
            .map(|s| {
                Ok(LayerState {
                    conv: zeroed(&s.conv)?,
                    ssm: zeroed(&s.ssm)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let cfg = self.prefill_config(len);
        let m = mixed_forward(&token, &states, &piece, &mask, &init, &w, &cfg)?;
        // Rows not decoding keep their logits and state; then the pieces' rows are written.
        let hold = |old: &Tensor, new: &Tensor| rows(&done, old.rank())?.select(old, new);
        let mut all = vec![hold(&logits, &m.step_logits)?];
        let mut pieces = vec![m.piece_logits];
        for ((old, new), p) in states.iter().zip(&m.step_states).zip(m.piece_states) {
            all.push(hold(&old.conv, &new.conv)?);
            all.push(hold(&old.ssm, &new.ssm)?);
            pieces.extend([p.conv, p.ssm]);
        }
        let done = done.or(&token.eq(&picker.eos)?)?;
        let mut outs = vec![token];
        outs.extend(scatter_rows(all, &pieces, &at)?);
        outs.extend([done, key]);
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        self.placed(g, slots)
    }
}
