//! A hybrid model as one graph: the embedding, every sublayer behind its RMS norm and
//! (scaled) residual, and the head; for a prompt (many positions per row) or one token per
//! row, continuing from the state of what came before.

use super::config::HybridConfig;
use super::layers::{mlp, moe};
use super::weights::{HybridWeights, Sublayer};
use crate::error::{Error, Result};
use crate::models::common::layers::rms;
use crate::models::common::LayerState;
use crate::models::engine::attention::{attention, Positions};
use crate::models::mamba2::block::{mixer_prefill, mixer_step};
use crate::models::mamba2::Mamba2Config;
use crate::ops::Tensor;

/// What one sublayer carries from token to token.
#[derive(Debug, Clone)]
pub enum SublayerState<T> {
    /// A Mamba-2 mixer's convolution inputs and SSM state (as Mamba-2's layers).
    Mamba(LayerState<T>),
    /// An attention sublayer's keys (`[b, kv_heads, head_dim, columns]` f32) and values
    /// (`[b, kv_heads, columns, head_dim]`): the state's capacity, or a sliding sublayer's
    /// ring ([`HybridConfig::cache_columns`]).
    Attention {
        /// Keys (rotated).
        k: T,
        /// Values.
        v: T,
    },
    /// An MLP or mixture of experts: nothing.
    None,
}

impl<T> SublayerState<T> {
    /// The tensors of the state, in order (none, two, or two).
    pub fn tensors(&self) -> Vec<&T> {
        match self {
            SublayerState::Mamba(s) => vec![&s.conv, &s.ssm],
            SublayerState::Attention { k, v } => vec![k, v],
            SublayerState::None => Vec::new(),
        }
    }

    /// The same kind of state made of `next()`'s tensors.
    pub(crate) fn rebuild<U>(
        &self,
        next: &mut impl FnMut() -> Result<U>,
    ) -> Result<SublayerState<U>> {
        Ok(match self {
            SublayerState::Mamba(_) => SublayerState::Mamba(LayerState {
                conv: next()?,
                ssm: next()?,
            }),
            SublayerState::Attention { .. } => SublayerState::Attention {
                k: next()?,
                v: next()?,
            },
            SublayerState::None => SublayerState::None,
        })
    }
}

/// The inputs of a forward pass besides the weights and the states.
pub(crate) struct Step<'a> {
    /// Token ids, `[b, L]` integers (`L` = 1 for a decode step).
    pub tokens: &'a Tensor,
    /// `[b, L]` f32: 1 for real tokens, 0 for left padding.
    pub mask: &'a Tensor,
    /// Where the tokens go: rotary positions, cache column, valid columns.
    pub at: Positions<'a>,
    /// Whether this is a decode step (`L` = 1: Mamba-2's O(1) step, experts gathered).
    pub decode: bool,
    /// Whether each token's experts are gathered (only the chosen experts' matrices read),
    /// else every expert runs and the unchosen ones weigh 0.
    pub gather: bool,
    /// The chunk of the Mamba-2 prefill (a divisor of `L`).
    pub chunk: usize,
    /// Whether each sublayer is recomputed in the backward pass (training, with no state
    /// wanted after it: the states returned are then the ones given).
    pub remat: bool,
    /// Whether only the last position's logits are wanted (`[b, 1, vocab]`): the head, the
    /// largest product of a long prompt, then runs on one position.
    pub last_only: bool,
}

/// What [`forward`] returns: the logits `[b, L, vocab]` f32, the states after the tokens, and
/// each mixture of experts' router logits `[b * L, experts]` (for a load-balancing loss).
pub(crate) struct Forwarded {
    /// `[b, L, vocab]` f32.
    pub logits: Tensor,
    /// One per sublayer.
    pub states: Vec<SublayerState<Tensor>>,
    /// One per mixture of experts, in order.
    pub router_logits: Vec<Tensor>,
}

/// The model over `s`'s tokens after `states` (one per sublayer): the logits `[b, L, vocab]`
/// f32 and the states after the tokens. A decode step (`L` = 1) runs on `[b, hidden]`, so its
/// products are matrices times vectors.
pub(crate) fn forward(
    s: &Step<'_>,
    states: &[SublayerState<Tensor>],
    w: &HybridWeights<Tensor>,
    cfg: &HybridConfig,
) -> Result<(Tensor, Vec<SublayerState<Tensor>>)> {
    let f = forward_all(s, states, w, cfg)?;
    Ok((f.logits, f.states))
}

/// [`forward`] with the router logits of every mixture of experts.
pub(crate) fn forward_all(
    s: &Step<'_>,
    states: &[SublayerState<Tensor>],
    w: &HybridWeights<Tensor>,
    cfg: &HybridConfig,
) -> Result<Forwarded> {
    if states.len() != w.sublayers.len() {
        return Err(Error::InvalidArgument(format!(
            "hybrid forward: {} states for {} sublayers",
            states.len(),
            w.sublayers.len()
        )));
    }
    // transformers clamps dt to the limit in the chunked prefill only, not in the decode step.
    let mamba = Mamba2Config {
        chunk_size: s.chunk,
        time_step_limit: if s.decode {
            (0.0, f64::INFINITY)
        } else {
            cfg.mamba.time_step_limit
        },
        ..cfg.mamba.clone()
    };
    let mut h = w.embedding.rows(s.tokens)?.mul(cfg.embedding_multiplier)?;
    if s.decode {
        // One position: [b, hidden], so every product is a matrix times vectors.
        h = h.squeeze(&[1])?;
    }
    let mut next = Vec::with_capacity(states.len());
    let mut router_logits = Vec::new();
    for (layer, state) in w.sublayers.iter().enumerate().zip(states) {
        let run = |h: &Tensor| sublayer(h, s, layer, state, &mamba, cfg);
        let out = if s.remat {
            let (out, routed) = h.graph().checkpoint(&h, |h| {
                let (out, _, routed) = run(h)?;
                Ok((out, routed.into_iter().collect::<Vec<_>>()))
            })?;
            router_logits.extend(routed);
            next.push(state.clone());
            out
        } else {
            let (out, st, routed) = run(&h)?;
            router_logits.extend(routed);
            next.push(st);
            out
        };
        h = h.add(&out.mul(cfg.residual_multiplier)?)?;
    }
    if s.last_only && !s.decode {
        let len = h.dims()[1];
        h = h.narrow(1, len - 1, 1)?;
    }
    let normed = rms(&h, cfg.norm_eps)?.mul(&norm_weight(&w.norm_f, cfg)?)?;
    let mut logits = w
        .lm_head
        .as_ref()
        .unwrap_or(&w.embedding)
        .apply(&normed, None)?;
    if s.decode {
        logits = logits.expand_dims(1)?;
    }
    let mut logits = logits.div(cfg.logits_scaling)?;
    if let Some(cap) = cfg.final_softcap {
        logits = logits.div(cap)?.tanh()?.mul(cap)?;
    }
    Ok(Forwarded {
        logits,
        states: next,
        router_logits,
    })
}

/// One sublayer's output (before the residual), its next state, and a mixture of experts'
/// router logits.
fn sublayer(
    h: &Tensor,
    s: &Step<'_>,
    (i, layer): (usize, &Sublayer<Tensor>),
    state: &SublayerState<Tensor>,
    mamba: &Mamba2Config,
    cfg: &HybridConfig,
) -> Result<(Tensor, SublayerState<Tensor>, Option<Tensor>)> {
    let norm_of = |x: &Tensor, n: &Tensor| rms(x, cfg.norm_eps)?.mul(&norm_weight(n, cfg)?);
    let norm = |n: &Tensor| norm_of(h, n);
    let post = |out: Tensor, n: &Option<Tensor>| match n {
        Some(n) => norm_of(&out, n),
        None => Ok(out),
    };
    let mismatch = || Error::InvalidArgument("hybrid forward: a state of the wrong kind".into());
    let (out, state) = match (layer, state) {
        (Sublayer::Mamba(w), SublayerState::Mamba(init)) => {
            let (out, st) = if s.decode {
                mixer_step(h, init, w, mamba)?
            } else {
                mixer_prefill(h, s.mask, w, mamba, Some(init))?
            };
            (out, SublayerState::Mamba(st))
        }
        (
            Sublayer::Attention {
                norm: n,
                attn,
                post_norm,
            },
            SublayerState::Attention { k, v },
        ) => {
            let x = if s.decode {
                norm(n)?.expand_dims(1)?
            } else {
                norm(n)?
            };
            let window = cfg.window(i);
            let (mut out, k, v) = attention(&x, &s.at, k, v, attn, &cfg.attention, window)?;
            if s.decode {
                out = out.squeeze(&[1])?;
            }
            (post(out, post_norm)?, SublayerState::Attention { k, v })
        }
        (
            Sublayer::Mlp {
                norm: n,
                mlp: m,
                post_norm,
            },
            SublayerState::None,
        ) => {
            let c = cfg.mlp.ok_or_else(mismatch)?;
            (post(mlp(&norm(n)?, m, c)?, post_norm)?, SublayerState::None)
        }
        (Sublayer::Moe { norm: n, moe: m }, SublayerState::None) => {
            let c = cfg.moe.as_ref().ok_or_else(mismatch)?;
            let (out, router) = moe(&norm(n)?, m, c, s.gather)?;
            return Ok((out, SublayerState::None, Some(router)));
        }
        _ => return Err(mismatch()),
    };
    Ok((out, state, None))
}

/// An RMS norm's weight with the config's offset added (Gemma's `1 + w`), `w` itself when none.
fn norm_weight(w: &Tensor, cfg: &HybridConfig) -> Result<Tensor> {
    match cfg.norm_offset {
        0.0 => Ok(w.clone()),
        offset => w.add(offset),
    }
}
