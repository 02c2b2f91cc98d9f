//! The hybrids' non-Mamba sublayers as graphs: causal grouped-query attention over a key/value
//! cache updated in place, rotary embeddings, MLPs and mixtures of experts.

use super::config::{Activation, AttentionConfig, MlpConfig, MoeConfig, Routing};
use super::weights::{AttentionWeights, MlpWeights, MoeWeights};
use crate::dtype::DType;
use crate::error::Result;
use crate::models::common::layers::linear;
use crate::ops::Tensor;

/// The score of a position a query may not see: finite, so a row that sees nothing (a padded
/// position) gets a uniform softmax rather than NaN.
const HIDDEN: f64 = -1e30;

/// `spec` over `x` (f32) and a weight `w` in its own dtype, returning f32.
fn contract(spec: &str, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Tensor::einsum(spec, &[&x.astype(w.dtype())?, w])?.astype(DType::F32)
}

/// Rotary embedding of the first `cfg.rotary_dim` channels of each head of `x` (`[b, L, heads,
/// head_dim]`) at `positions` (`[b, L]` integers): HF's `rotate_half` convention, the frequency
/// of channel pair `i` being `theta^(-2i / rotary_dim)`; the other channels pass unchanged.
pub(crate) fn rotary(x: &Tensor, positions: &Tensor, cfg: &AttentionConfig) -> Result<Tensor> {
    let r = cfg.rotary_dim;
    if r == 0 {
        return Ok(x.clone());
    }
    let g = x.graph();
    let half = r / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| (1.0 / cfg.rope_theta.powf((2 * i) as f64 / r as f64)) as f32)
        .collect();
    let inv = g.constant(&crate::array::HostArray::from_vec(&[half], inv)?)?;
    let angles = positions.astype(DType::F32)?.expand_dims(-1)?.mul(&inv)?; // [b, L, half]
    let both = Tensor::concat(&[&angles, &angles], -1)?.expand_dims(2)?; // [b, L, 1, r]
    let (cos, sin) = (both.cos()?, both.sin()?);
    let turned = x.narrow(-1, 0, r)?;
    let rotated = Tensor::concat(
        &[
            &turned.narrow(-1, half, half)?.neg()?,
            &turned.narrow(-1, 0, half)?,
        ],
        -1,
    )?;
    let out = turned.mul(&cos)?.add(&rotated.mul(&sin)?)?;
    if r == cfg.head_dim {
        return Ok(out);
    }
    Tensor::concat(&[&out, &x.narrow(-1, r, cfg.head_dim - r)?], -1)
}

/// What attention reads besides its input: where the new positions go in the cache and
/// which cache columns hold real tokens.
pub(crate) struct Positions<'a> {
    /// Rotary positions of the new tokens, `[b, L]` integers.
    pub rotary: &'a Tensor,
    /// The cache column of the first new token: a scalar `i32` (the same for every row), or
    /// one per row (`[b]` `i32`: served slots, each at its own point).
    pub column: &'a Tensor,
    /// `[b, C]` f32: 1 where a cache column holds a real token, the new ones included.
    pub valid: &'a Tensor,
}

/// Causal self-attention of `x` (`[b, L, hidden]` f32, normalised) whose keys and values are
/// written into the caches `k` and `v` (`[b, C, kv_heads, head_dim]` f32) at `at.column`: new
/// token `i` sees the cache columns up to its own that `at.valid` marks. Returns the output
/// `[b, L, hidden]` and the updated caches.
pub(crate) fn attention(
    x: &Tensor,
    at: &Positions<'_>,
    k: &Tensor,
    v: &Tensor,
    w: &AttentionWeights<Tensor>,
    cfg: &AttentionConfig,
) -> Result<(Tensor, Tensor, Tensor)> {
    let g = x.graph();
    let (b, len) = (x.dims()[0], x.dims()[1]);
    let (h, kvh, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let cap = k.dims()[1];
    let bias = |i: usize| w.biases.as_ref().map(|bs| bs.as_array()[i]);
    let split = |t: Tensor, heads: usize| {
        t.reshape(&[b as isize, len as isize, heads as isize, hd as isize])
    };
    let q = rotary(&split(w.q.apply(x, bias(0))?, h)?, at.rotary, cfg)?;
    let kn = rotary(&split(w.k.apply(x, bias(1))?, kvh)?, at.rotary, cfg)?;
    let vn = split(w.v.apply(x, bias(2))?, kvh)?;
    let (k, v) = write_cache(k, v, &kn, &vn, at.column)?;
    let rep = h / kvh;
    let q = q.reshape(&[
        b as isize,
        len as isize,
        kvh as isize,
        rep as isize,
        hd as isize,
    ])?;
    let scores = Tensor::einsum("blgrd,bcgd->bgrlc", &[&q, &k])?.mul(cfg.scale)?;
    // Query i (cache column `column + i`) sees the valid columns up to its own.
    let dims = [1, len, cap];
    let col = g.iota(DType::I32, &dims, 2)?;
    let own = g.iota(DType::I32, &dims, 1)?.add(&per_row(at.column, 3)?)?;
    let visible = col
        .le(&own)?
        .and(&at.valid.expand_dims(1)?.gt(0.5)?)? // [b, L, C]
        .expand_dims(1)?
        .expand_dims(1)?
        .broadcast_to(scores.dims())?;
    let p = visible.select(&scores, HIDDEN)?.softmax(-1)?;
    let out = Tensor::einsum("bgrlc,bcgd->blgrd", &[&p, &v])?.reshape(&[
        b as isize,
        len as isize,
        (h * hd) as isize,
    ])?;
    Ok((w.o.apply(&out, bias(3))?, k, v))
}

/// `column` (a scalar, or `[b]` one per row) shaped to broadcast over `rank` axes, rows first.
fn per_row(column: &Tensor, rank: usize) -> Result<Tensor> {
    if column.rank() == 0 {
        return Ok(column.clone());
    }
    let mut dims = vec![1isize; rank];
    dims[0] = column.dims()[0] as isize;
    column.reshape(&dims)
}

/// The caches `k` and `v` (`[b, C, kv_heads, head_dim]`) with the new keys and values (`[b, L,
/// kv_heads, head_dim]`) written from `column` on: in place at a scalar column; at one column
/// per row (one new position each, a served decode step) by selecting that column's row.
fn write_cache(
    k: &Tensor,
    v: &Tensor,
    kn: &Tensor,
    vn: &Tensor,
    column: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let g = k.graph();
    if column.rank() == 0 {
        let zero = g.scalar(0.0, DType::I32)?;
        let starts = [&zero, column, &zero, &zero];
        return Ok((
            k.dynamic_update_slice(kn, &starts)?,
            v.dynamic_update_slice(vn, &starts)?,
        ));
    }
    let (b, cap) = (k.dims()[0], k.dims()[1]);
    let hot = g
        .iota(DType::I32, &[b, cap, 1, 1], 1)?
        .eq(&per_row(column, 4)?)?
        .broadcast_to(k.dims())?;
    Ok((
        hot.select(&kn.broadcast_to(k.dims())?, k)?,
        hot.select(&vn.broadcast_to(v.dims())?, v)?,
    ))
}

/// The activation of an MLP's up projection `u` (`[..., rows]`).
fn activate(u: &Tensor, act: Activation, intermediate: usize) -> Result<Tensor> {
    match act {
        Activation::SwiGlu => {
            u.narrow(-1, 0, intermediate)?
                .silu()?
                .mul(&u.narrow(-1, intermediate, intermediate)?)
        }
        Activation::Relu2 => u.relu()?.square(),
    }
}

/// An MLP on `x` (`[..., hidden]` f32).
pub(crate) fn mlp(x: &Tensor, w: &MlpWeights<Tensor>, cfg: MlpConfig) -> Result<Tensor> {
    let u = w.up.apply(x, None)?;
    w.down
        .apply(&activate(&u, cfg.activation, cfg.intermediate)?, None)
}

/// The chosen experts (`[T, k]` integers) and their weights (`[T, k]` f32) for the router
/// logits (`[T, experts]` f32).
fn route(
    logits: &Tensor,
    correction: Option<&Tensor>,
    cfg: &MoeConfig,
) -> Result<(Tensor, Tensor)> {
    match cfg.routing {
        Routing::SoftmaxTopK => {
            let (top, idx) = logits.top_k(cfg.top_k)?;
            Ok((idx, top.softmax(-1)?))
        }
        Routing::SigmoidGrouped {
            n_group,
            topk_group,
            normalize,
            scale,
        } => {
            let t = logits.dims()[0] as isize;
            let e = cfg.num_experts;
            let scores = logits.sigmoid()?;
            let choice = match correction {
                Some(c) => scores.add(c)?,
                None => scores.clone(),
            };
            let grouped = choice.reshape(&[t, n_group as isize, (e / n_group) as isize])?;
            let group_scores = grouped.top_k(2)?.0.sum(&[-1])?; // [T, G]
            let (_, groups) = group_scores.top_k(topk_group)?;
            let kept = groups
                .one_hot(n_group, DType::F32)?
                .sum(&[1])? // [T, G]
                .expand_dims(-1)?
                .broadcast_to(&[t as usize, n_group, e / n_group])?
                .reshape(&[t, e as isize])?;
            let choice = kept.gt(0.5)?.select(&choice, f64::NEG_INFINITY)?;
            let (_, idx) = choice.top_k(cfg.top_k)?;
            let mut weights = scores.take_along_axis(&idx, -1)?;
            if normalize {
                weights = weights.div(&weights.sum_keepdims(&[-1])?.add(1e-20)?)?;
            }
            Ok((idx, weights.mul(scale)?))
        }
    }
}

/// A mixture of experts on `x` (`[..., hidden]` f32), and the router's logits `[tokens,
/// experts]`. With `gather`, each token reads only its chosen experts' matrices (decode);
/// otherwise every expert runs on every token and the unchosen ones weigh 0 (prefill, where
/// most experts are chosen by some token anyway).
pub(crate) fn moe(
    x: &Tensor,
    w: &MoeWeights<Tensor>,
    cfg: &MoeConfig,
    gather: bool,
) -> Result<(Tensor, Tensor)> {
    let dims = x.dims().to_vec();
    let hidden = dims[dims.len() - 1];
    let flat = x.reshape(&[-1, hidden as isize])?;
    let logits = linear(&flat, &w.router, None)?;
    let (idx, weights) = route(&logits, w.correction.as_ref(), cfg)?;
    let (act, i) = (cfg.expert.activation, cfg.expert.intermediate);
    let routed = if gather {
        // Only the chosen experts' matrices are read (8-bit ones widened as they are).
        let up = w.experts.up.take(&idx)?.float_values()?; // [T, k, rows, hidden]
        let u = contract("td,tkrd->tkr", &flat, &up)?;
        let down = w.experts.down.take(&idx)?.float_values()?; // [T, k, hidden, i]
        let y = contract("tki,tkdi->tkd", &activate(&u, act, i)?, &down)?;
        Tensor::einsum("tkd,tk->td", &[&y, &weights])?
    } else {
        let u = contract("td,erd->ter", &flat, &w.experts.up.float_values()?)?;
        let down = w.experts.down.float_values()?;
        let y = contract("tei,edi->ted", &activate(&u, act, i)?, &down)?;
        let combine = Tensor::einsum(
            "tke,tk->te",
            &[&idx.one_hot(cfg.num_experts, DType::F32)?, &weights],
        )?;
        Tensor::einsum("ted,te->td", &[&y, &combine])?
    };
    let out = match (&w.shared, cfg.shared) {
        (Some(s), Some(c)) => routed.add(&mlp(&flat, s, c)?)?,
        _ => routed,
    };
    let back: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
    Ok((out.reshape(&back)?, logits))
}
