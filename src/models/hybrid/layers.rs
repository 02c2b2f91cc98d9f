//! The hybrids' MLPs and mixtures of experts as graphs (their attention is the engine's,
//! [`crate::models::engine::attention`]).

use super::config::{Activation, MlpConfig, MoeConfig, Routing};
use super::weights::{MlpWeights, MoeWeights};
use crate::dtype::DType;
use crate::error::Result;
use crate::models::common::layers::linear;
use crate::ops::Tensor;

/// `spec` over `x` (f32) and a weight `w` in its own dtype, returning f32.
fn contract(spec: &str, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Tensor::einsum(spec, &[&x.astype(w.dtype())?, w])?.astype(DType::F32)
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
        Activation::GeluTanhGlu => {
            u.narrow(-1, 0, intermediate)?
                .gelu()?
                .mul(&u.narrow(-1, intermediate, intermediate)?)
        }
    }
}

/// An MLP on `x` (`[..., hidden]` f32).
pub(crate) fn mlp(x: &Tensor, w: &MlpWeights<Tensor>, cfg: MlpConfig) -> Result<Tensor> {
    let biases = w.biases.as_ref();
    let u = w.up.apply(x, biases.map(|b| &b.up))?;
    let a = activate(&u, cfg.activation, cfg.intermediate)?;
    w.down.apply(&a, biases.map(|b| &b.down))
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
