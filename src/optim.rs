//! Optimizers written as graphs: an update is a few more nodes in the program that computes the
//! gradients, so a whole training step (forward, backward, update) compiles to one program that
//! can update its weights and moments in place (see [`crate::ops::Graph::donate`]).
//!
//! [`AdamW`] follows PyTorch's `torch.optim.AdamW` (with `amsgrad=False`, `maximize=False`)
//! exactly, and its optional clipping `torch.nn.utils.clip_grad_norm_` over all gradients.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Tensor;

/// AdamW (Loshchilov and Hutter, "Decoupled Weight Decay Regularization"), as PyTorch computes
/// it. For each parameter `p` with gradient `g`, first moment `m` and second moment `v`, at the
/// 1-based step `t`:
///
/// ```text
/// g  = g * min(1, clip_norm / (norm + 1e-6))   if clip_norm is set (norm: over ALL gradients)
/// p  = p * (1 - lr * weight_decay)              if p is decayed
/// m  = m + (1 - beta1) * (g - m)
/// v  = beta2 * v + (1 - beta2) * g * g
/// p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// ```
///
/// The clipping factor is `torch.nn.utils.clip_grad_norm_`'s: the global L2 norm of every
/// gradient together, and the factor clamped to at most 1 (so it is 1 when the norm is below
/// `clip_norm` by more than the `1e-6`).
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    /// The learning rate (when [`AdamW::update`] is given no runtime learning rate).
    pub lr: f64,
    /// The decay of the first moment.
    pub beta1: f64,
    /// The decay of the second moment.
    pub beta2: f64,
    /// Added to the bias-corrected `sqrt(v)`.
    pub eps: f64,
    /// Decoupled weight decay, applied to the parameters marked as decayed.
    pub weight_decay: f64,
    /// When set, the gradients are scaled so that their global L2 norm is at most this.
    pub clip_norm: Option<f64>,
}

impl Default for AdamW {
    /// PyTorch's AdamW defaults (`lr = 1e-3`, `betas = (0.9, 0.999)`, `eps = 1e-8`,
    /// `weight_decay = 0.01`) with clipping at a global norm of 1.
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            clip_norm: Some(1.0),
        }
    }
}

/// An error of `AdamW::<op>`.
fn bad(op: &str, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("AdamW::{op}: {why}"))
}

/// The dtype a float `dtype` is computed in: f64 for f64, f32 otherwise.
fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The global L2 norm of `grads` (floats, of one graph): `sqrt(sum_i sum(g_i^2))`, a rank-0
/// tensor, computed in f32 (f64 when a gradient is f64). An error for an empty list or a
/// gradient that is not a float.
pub fn global_norm(grads: &[Tensor]) -> Result<Tensor> {
    let Some(first) = grads.first() else {
        return Err(Error::InvalidArgument(
            "global_norm: `grads` is empty; it needs at least one gradient".into(),
        ));
    };
    if let Some((i, g)) = grads
        .iter()
        .enumerate()
        .find(|(_, g)| !g.dtype().is_float())
    {
        return Err(Error::InvalidArgument(format!(
            "global_norm: grads[{i}] is {}, expected a float tensor",
            g.ty()
        )));
    }
    let dtype = if grads.iter().any(|g| g.dtype() == DType::F64) {
        DType::F64
    } else {
        DType::F32
    };
    let mut total = first.graph().scalar(0.0, dtype)?;
    for g in grads {
        total = total.add(&g.astype(dtype)?.square()?.sum_all()?)?;
    }
    total.sqrt()
}

impl AdamW {
    /// An error naming the first hyperparameter out of range: `lr`, `eps` and `weight_decay`
    /// must be finite and at least 0, `beta1` and `beta2` in `[0, 1)`, `clip_norm` finite and
    /// above 0.
    pub fn validate(&self) -> Result<()> {
        let finite_nonneg = |name: &str, x: f64| {
            if x.is_finite() && x >= 0.0 {
                Ok(())
            } else {
                Err(bad(
                    "validate",
                    format!("{name} = {x} must be finite and >= 0"),
                ))
            }
        };
        finite_nonneg("lr", self.lr)?;
        finite_nonneg("eps", self.eps)?;
        finite_nonneg("weight_decay", self.weight_decay)?;
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(bad("validate", format!("{name} = {b} must be in [0, 1)")));
            }
        }
        if let Some(c) = self.clip_norm {
            if !(c.is_finite() && c > 0.0) {
                return Err(bad(
                    "validate",
                    format!("clip_norm = {c} must be finite and > 0"),
                ));
            }
        }
        Ok(())
    }

    /// The gradients scaled as `torch.nn.utils.clip_grad_norm_(grads, clip_norm)` scales them
    /// (unchanged without `clip_norm`), and their global norm before scaling (see
    /// [`global_norm`]). Each clipped gradient keeps its dtype.
    pub fn clip(&self, grads: &[Tensor]) -> Result<(Vec<Tensor>, Tensor)> {
        let norm = global_norm(grads)?;
        let Some(max) = self.clip_norm else {
            return Ok((grads.to_vec(), norm));
        };
        let coef = norm
            .graph()
            .scalar(max, norm.dtype())?
            .div(&norm.add(1e-6)?)?
            .minimum(1.0)?;
        let clipped = grads
            .iter()
            .map(|g| {
                let c = compute_dtype(g.dtype());
                g.astype(c)?.mul(&coef.astype(c)?)?.astype(g.dtype())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((clipped, norm))
    }

    /// One AdamW step over every parameter at once; returns the new parameters, first moments
    /// and second moments, each in the order and type of `params`.
    ///
    /// - `params`: float tensors (any shape); `grads`, `m` and `v`: one per parameter, each of
    ///   its parameter's dtype and shape (start `m` and `v` at zero).
    /// - `decay`: one flag per parameter, whether weight decay applies to it. Common practice
    ///   decays matrices (embeddings, projections) and not biases, norm weights or per-channel
    ///   scalars.
    /// - `step`: a rank-0 integer or float tensor, the 1-based number of this step (for the
    ///   bias corrections).
    /// - `lr`: a rank-0 float tensor, the learning rate of this step (for a schedule computed
    ///   on the host or in the graph), or `None` for [`AdamW::lr`].
    ///
    /// The arithmetic is in f32 (f64 for f64 parameters), including for bf16 or f16
    /// parameters, whose results are rounded back to their dtype. Lists of different lengths,
    /// a tensor of the wrong type, or hyperparameters that [`AdamW::validate`] rejects are an
    /// error naming them.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::type_complexity)]
    pub fn update(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        m: &[Tensor],
        v: &[Tensor],
        decay: &[bool],
        step: &Tensor,
        lr: Option<&Tensor>,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>, Vec<Tensor>)> {
        self.validate()?;
        let n = params.len();
        for (name, len) in [
            ("grads", grads.len()),
            ("m", m.len()),
            ("v", v.len()),
            ("decay", decay.len()),
        ] {
            if len != n {
                return Err(bad(
                    "update",
                    format!("{name} has {len} entries but params has {n}; give one per parameter"),
                ));
            }
        }
        for (i, p) in params.iter().enumerate() {
            if !p.dtype().is_float() {
                return Err(bad(
                    "update",
                    format!("params[{i}] is {}, expected a float tensor", p.ty()),
                ));
            }
            for (name, list) in [("grads", grads), ("m", m), ("v", v)] {
                if list[i].ty() != p.ty() {
                    return Err(bad(
                        "update",
                        format!(
                            "{name}[{i}] is {}, expected the type of params[{i}], {}",
                            list[i].ty(),
                            p.ty()
                        ),
                    ));
                }
            }
        }
        if step.rank() != 0 || step.dtype() == DType::Pred {
            return Err(bad(
                "update",
                format!(
                    "step is {}, expected a rank-0 integer or float (the 1-based step number)",
                    step.ty()
                ),
            ));
        }
        if let Some(lr) = lr {
            if lr.rank() != 0 || !lr.dtype().is_float() {
                return Err(bad(
                    "update",
                    format!("lr is {}, expected a rank-0 float", lr.ty()),
                ));
            }
        }
        if n == 0 {
            return Ok((Vec::new(), Vec::new(), Vec::new()));
        }
        let grads = if self.clip_norm.is_some() {
            self.clip(grads)?.0
        } else {
            grads.to_vec()
        };
        // The per-step scalars in each compute dtype used: learning rate, the bias
        // corrections' `1 - beta^t`, and the decay factor `1 - lr * weight_decay`.
        let g = step.graph();
        let mut scalars: Vec<(DType, [Tensor; 4])> = Vec::new();
        let mut scalars_for = |c: DType| -> Result<[Tensor; 4]> {
            if let Some((_, s)) = scalars.iter().find(|(d, _)| *d == c) {
                return Ok(s.clone());
            }
            let rate = match lr {
                Some(lr) => lr.astype(c)?,
                None => g.scalar(self.lr, c)?,
            };
            let t = step.astype(c)?;
            let bc1 = g.scalar(self.beta1, c)?.pow(&t)?.neg()?.add(1.0)?;
            let bc2 = g.scalar(self.beta2, c)?.pow(&t)?.neg()?.add(1.0)?;
            let keep = rate.mul(self.weight_decay)?.neg()?.add(1.0)?;
            let s = [rate, bc1, bc2, keep];
            scalars.push((c, s.clone()));
            Ok(s)
        };
        let (mut new_p, mut new_m, mut new_v) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for i in 0..n {
            let dtype = params[i].dtype();
            let c = compute_dtype(dtype);
            let [rate, bc1, bc2, keep] = scalars_for(c)?;
            let grad = grads[i].astype(c)?;
            let mut p = params[i].astype(c)?;
            if decay[i] && self.weight_decay != 0.0 {
                p = p.mul(&keep)?;
            }
            let mi = m[i].astype(c)?;
            let mi = mi.add(&grad.sub(&mi)?.mul(1.0 - self.beta1)?)?;
            let vi = v[i]
                .astype(c)?
                .mul(self.beta2)?
                .add(&grad.square()?.mul(1.0 - self.beta2)?)?;
            let step_size = rate.div(&bc1)?;
            let denom = vi.sqrt()?.div(&bc2.sqrt()?)?.add(self.eps)?;
            let p = p.sub(&mi.div(&denom)?.mul(&step_size)?)?;
            new_p.push(p.astype(dtype)?);
            new_m.push(mi.astype(dtype)?);
            new_v.push(vi.astype(dtype)?);
        }
        Ok((new_p, new_m, new_v))
    }
}
