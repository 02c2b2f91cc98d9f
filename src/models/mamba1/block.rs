//! The Mamba-1 graphs: a block over a prompt (the selective scan as a log-depth associative
//! scan or as a loop over positions, see [`Scan`]), a block for one new token (the O(1)
//! recurrence), and the whole model around them.

use super::{Mamba1Config, Mamba1Layer, Mamba1Weights};
use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::layers::{remembered_inputs, rms};
use crate::models::common::materialize::window_sum;
use crate::models::common::LayerState;
use crate::ops::{Graph, Tensor};
use crate::tree::Tree;

/// One block's recurrent state: `conv`, the last `K` inputs of the convolution, oldest first,
/// `[b, d_inner, K]`; `ssm`, the selective scan's state `h`, `[b, d_inner, N]`. The same
/// struct as Mamba-2's [`LayerState`](crate::models::LayerState).
pub type Mamba1State<T> = LayerState<T>;

/// The block's RMS norm and `in_proj`, split into the mixer input `x` and the gate `z`
/// (`[..., d_inner]` each); positions where `mask` is 0 are zeroed first (as HF does).
fn mixer_inputs(
    hidden: &Tensor,
    mask: Option<&Tensor>,
    w: &Mamba1Layer<Tensor>,
    cfg: &Mamba1Config,
) -> Result<(Tensor, Tensor)> {
    let mut normed = rms(hidden, cfg.norm_eps)?.mul(&w.norm)?;
    if let Some(m) = mask {
        normed = normed.mul(m)?;
    }
    let xz = w.in_proj.apply(&normed, w.in_proj_bias.as_ref())?;
    Ok((
        xz.narrow(-1, 0, cfg.d_inner)?,
        xz.narrow(-1, cfg.d_inner, cfg.d_inner)?,
    ))
}

/// The input-dependent `dt` (`[..., d_inner]`, after `dt_proj` and the softplus), `B` and `C`
/// (`[..., N]`) of the convolved input `xc`; Falcon-Mamba normalises `dt`'s low-rank input,
/// `B` and `C` first.
fn selective_terms(
    xc: &Tensor,
    w: &Mamba1Layer<Tensor>,
    cfg: &Mamba1Config,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (r, n) = (cfg.time_step_rank, cfg.state_size);
    let dbc = w.x_proj.apply(xc, None)?;
    let mut low = dbc.narrow(-1, 0, r)?;
    let mut b = dbc.narrow(-1, r, n)?;
    let mut c = dbc.narrow(-1, r + n, n)?;
    if let Some(eps) = cfg.mixer_rms_eps {
        low = rms(&low, eps)?;
        b = rms(&b, eps)?;
        c = rms(&c, eps)?;
    }
    let dt = w.dt_proj.apply(&low, Some(&w.dt_proj_bias))?.softplus()?;
    Ok((dt, b, c))
}

/// The end of a block: the `D` skip, the gate, `out_proj`, and the residual.
fn mixer_output(
    hidden: &Tensor,
    y: &Tensor,
    xc: &Tensor,
    z: &Tensor,
    w: &Mamba1Layer<Tensor>,
) -> Result<Tensor> {
    let y = y.add(&xc.mul(&w.d)?)?.mul(&z.silu()?)?;
    hidden.add(&w.out_proj.apply(&y, w.out_proj_bias.as_ref())?)
}

/// The selective scan `h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t`, `y_t = C_t . h_t`, over all
/// positions at once: [`Graph::associative_scan`](crate::ops::Graph::associative_scan) of the
/// pairs `(exp(dt_t A), dt_t x_t B_t)` under `(a, u) . (a', u') = (a a', a' u + u')` (2 log2 L
/// levels of elementwise work over `[b, L, d_inner, N]`), then `h0` (the state before the
/// prompt) carried in by the cumulative decay. Returns `y` `[b, L, d_inner]` and the last
/// state `[b, d_inner, N]`.
pub(crate) fn selective_scan(
    x: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    h0: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let (batch, len, di) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    let n = a.dims()[1];
    let decay = dt.expand_dims(-1)?.mul(a)?.exp()?; // [b, L, di, N]
    let u = dt.mul(x)?.expand_dims(-1)?.mul(&b.expand_dims(2)?)?; // [b, L, di, N]
    let (decay, mut h) = x
        .graph()
        .associative_scan(&(decay, u), 1, |(a, u), (a2, u2)| {
            Ok((a.mul(a2)?, a2.mul(u)?.add(u2)?))
        })?;
    if let Some(h0) = h0 {
        h = h.add(&decay.mul(&h0.expand_dims(1)?)?)?;
    }
    let y = Tensor::einsum("bldn,bln->bld", &[&h, c])?;
    let last = h
        .narrow(1, len - 1, 1)?
        .reshape(&[batch as isize, di as isize, n as isize])?;
    Ok((y, last))
}

/// The same scan as [`selective_scan`] as a `fori_loop` over positions (one state update per
/// trip, `h` `[b, d_inner, N]` carried from `h0`, zero when `None`).
pub(crate) fn selective_scan_loop(
    x: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    h0: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let g = x.graph();
    let (batch, len, di) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    let n = a.dims()[1];
    let zero = g.scalar(0.0, DType::I64)?;
    let y0 = g.zeros(DType::F32, &[batch, len, di])?;
    let h0 = match h0 {
        Some(h) => h.clone(),
        None => g.zeros(DType::F32, &[batch, di, n])?,
    };
    g.fori_loop(0, len, &(y0, h0), |t, (y, h)| {
        let at = |v: &Tensor, width: usize| -> Result<Tensor> {
            v.dynamic_slice(&[&zero, t, &zero], &[batch, 1, width])?
                .reshape(&[batch as isize, width as isize])
        };
        let (xt, dtt) = (at(x, di)?, at(dt, di)?);
        let decay = dtt.expand_dims(-1)?.mul(a)?.exp()?;
        let input = dtt
            .mul(&xt)?
            .expand_dims(-1)?
            .mul(&at(b, n)?.expand_dims(1)?)?;
        let h = h.mul(&decay)?.add(&input)?;
        let yt = Tensor::einsum("bdn,bn->bd", &[&h, &at(c, n)?])?;
        let y = y.dynamic_update_slice(&yt.expand_dims(1)?, &[&zero, t, &zero])?;
        Ok((y, h))
    })
}

/// How a prefill runs the selective scan over the prompt (the same results up to rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scan {
    /// A log-depth associative scan over all positions at once: `ceil(log2 L)` rounds of
    /// elementwise work over `[b, L, d_inner, N]`. The default off the CPU.
    Associative,
    /// A `fori_loop` over positions, one state update per trip. The default on the CPU, where
    /// it measured 4-6x faster than the associative form on the 130M shape (`cargo bench
    /// --bench mamba1`; see `docs/mamba1.md`).
    Loop,
}

/// One block over `hidden` `[b, L, hidden]` with `mask` `[b, L]` (f32, 0 at left padding),
/// from `init` (zero when `None`): the new hidden states and the state after the last
/// position. Padding positions leave the state as it is (their `dt` is masked to 0).
pub(crate) fn block_prefill(
    hidden: &Tensor,
    mask: &Tensor,
    w: &Mamba1Layer<Tensor>,
    cfg: &Mamba1Config,
    scan: Scan,
    init: Option<&Mamba1State<Tensor>>,
) -> Result<(Tensor, Mamba1State<Tensor>)> {
    let (len, k) = (hidden.dims()[1], cfg.conv_kernel);
    let m = mask.expand_dims(-1)?;
    let (x, z) = mixer_inputs(hidden, Some(&m), w, cfg)?;
    let mut history = x.pad(&[0, k as isize - 1, 0], &[0, 0, 0], &[0, 0, 0], 0.0)?;
    if let Some(init) = init.filter(|_| k > 1) {
        history = history.add(&remembered_inputs(init, mask, k, len)?)?;
    }
    let conv = history.narrow(1, len - 1, k)?.transpose(&[0, 2, 1])?;
    let xc = history
        .causal_conv1d(&w.conv_weight, w.conv_bias.as_ref())?
        .narrow(1, k - 1, len)?
        .silu()?
        .mul(&m)?;
    let (dt, b, c) = selective_terms(&xc, w, cfg)?;
    let dt = dt.mul(&m)?;
    let a = w.a_log.exp()?.neg()?;
    let h0 = init.map(|s| &s.ssm);
    let (y, ssm) = match scan {
        Scan::Associative => selective_scan(&xc, &dt, &a, &b, &c, h0)?,
        Scan::Loop => selective_scan_loop(&xc, &dt, &a, &b, &c, h0)?,
    };
    Ok((
        mixer_output(hidden, &y, &xc, &z, w)?,
        Mamba1State { conv, ssm },
    ))
}

/// One block for one new token per row, `hidden` `[b, hidden]`: the new hidden state and the
/// block's next state.
pub(crate) fn block_step(
    hidden: &Tensor,
    state: &Mamba1State<Tensor>,
    w: &Mamba1Layer<Tensor>,
    cfg: &Mamba1Config,
) -> Result<(Tensor, Mamba1State<Tensor>)> {
    let k = cfg.conv_kernel;
    let (x, z) = mixer_inputs(hidden, None, w, cfg)?;
    let window = Tensor::concat(&[&state.conv.narrow(2, 1, k - 1)?, &x.expand_dims(2)?], 2)?;
    let mut xc = window_sum(&window, &w.conv_weight)?;
    if let Some(bias) = &w.conv_bias {
        xc = xc.add(bias)?;
    }
    let xc = xc.silu()?;
    let (dt, b, c) = selective_terms(&xc, w, cfg)?;
    let a = w.a_log.exp()?.neg()?;
    let decay = dt.expand_dims(-1)?.mul(&a)?.exp()?; // [b, di, N]
    let input = dt.mul(&xc)?.expand_dims(-1)?.mul(&b.expand_dims(1)?)?;
    let ssm = state.ssm.mul(&decay)?.add(&input)?;
    let y = Tensor::einsum("bdn,bn->bd", &[&ssm, &c])?;
    Ok((
        mixer_output(hidden, &y, &xc, &z, w)?,
        Mamba1State { conv: window, ssm },
    ))
}

/// The final norm and the head (the embedding when tied): logits `[..., vocab]`.
pub(crate) fn head(
    hidden: &Tensor,
    w: &Mamba1Weights<Tensor>,
    cfg: &Mamba1Config,
) -> Result<Tensor> {
    let normed = rms(hidden, cfg.norm_eps)?.mul(&w.norm_f)?;
    w.lm_head
        .as_ref()
        .unwrap_or(&w.embedding)
        .apply(&normed, None)
}

/// The weights as parameters of `g`, named `w.<checkpoint name>`.
pub(crate) fn weight_parameters(
    g: &Graph,
    types: &Mamba1Weights<crate::dtype::TensorType>,
) -> Result<Mamba1Weights<Tensor>> {
    types.try_map(|name, ty| g.parameter(&format!("w.{name}"), ty.dtype, &ty.dims))
}

/// The whole model over left-padded prompts `tokens` `[b, L]` (integers) with `mask` `[b, L]`
/// (f32), from `init` (one state per block; zero when `None`): the logits at every position
/// `[b, L, vocab]` and each block's state after the last.
pub(crate) fn prefill(
    tokens: &Tensor,
    mask: &Tensor,
    w: &Mamba1Weights<Tensor>,
    cfg: &Mamba1Config,
    scan: Scan,
    init: Option<&[Mamba1State<Tensor>]>,
) -> Result<(Tensor, Vec<Mamba1State<Tensor>>)> {
    let mut hidden = w.embedding.rows(tokens)?;
    let mut states = Vec::with_capacity(w.layers.len());
    for (i, layer) in w.layers.iter().enumerate() {
        let start = init.and_then(|s| s.get(i));
        let (h, s) = block_prefill(&hidden, mask, layer, cfg, scan, start)?;
        hidden = h;
        states.push(s);
    }
    Ok((head(&hidden, w, cfg)?, states))
}

/// The whole model for one new token per row, `tokens` `[b]`: the logits `[b, vocab]` and the
/// next states.
pub(crate) fn step(
    tokens: &Tensor,
    states: &[Mamba1State<Tensor>],
    w: &Mamba1Weights<Tensor>,
    cfg: &Mamba1Config,
) -> Result<(Tensor, Vec<Mamba1State<Tensor>>)> {
    let mut hidden = w.embedding.rows(tokens)?;
    let mut next = Vec::with_capacity(states.len());
    for (layer, state) in w.layers.iter().zip(states) {
        let (h, s) = block_step(&hidden, state, layer, cfg)?;
        hidden = h;
        next.push(s);
    }
    Ok((head(&hidden, w, cfg)?, next))
}

/// Pairs `conv, ssm, conv, ssm, ...` into states.
pub(crate) fn pair_states(
    mut it: impl Iterator<Item = HostArray>,
) -> Result<Vec<Mamba1State<HostArray>>> {
    let mut states = Vec::new();
    while let Some(conv) = it.next() {
        let ssm = it
            .next()
            .ok_or_else(|| Error::InvalidArgument("a conv state without its ssm state".into()))?;
        states.push(Mamba1State { conv, ssm });
    }
    Ok(states)
}
