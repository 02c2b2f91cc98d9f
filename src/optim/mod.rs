//! Optimizers written as graphs: an update is a few more nodes in the program that computes the
//! gradients, so a whole training step (forward, backward, update) compiles to one program that
//! can update its weights and moments in place (see [`crate::ops::Graph::donate`]). The learning
//! rate schedule ([`WarmupCosine`]) is computed on the host and passed to the program as a
//! runtime scalar.
//!
//! [`AdamW`] holds the hyperparameters, with the defaults of PyTorch's `torch.optim.AdamW`
//! (`amsgrad=False`, `maximize=False`) and no gradient clipping unless
//! [`AdamW::clip_norm`] asks for `torch.nn.utils.clip_grad_norm_` over all gradients.
//! [`AdamWState`] is what the optimizer carries from step to step (each parameter with its two
//! moments, and the step count); [`AdamW::update`] takes it and the gradients and returns the
//! next one:
//!
//! ```
//! use stablegraph::ops::Graph;
//! use stablegraph::optim::{AdamW, AdamWState, ParamState};
//! use stablegraph::DType;
//!
//! # fn main() -> stablegraph::Result<()> {
//! let g = Graph::new();
//! let w = g.parameter("w", DType::F32, &[4, 3])?;
//! let b = g.parameter("b", DType::F32, &[3])?;
//! let x = g.parameter("x", DType::F32, &[2, 4])?;
//! let loss = x.matmul(&w)?.add(&b)?.square()?.mean_all()?;
//! let grads = loss.grad(&[&w, &b])?;
//! // Moments at zero and no step done: a first step (decay the matrix, not the bias).
//! let state = AdamWState::new(vec![ParamState::new(w, true)?, ParamState::new(b, false)?])?;
//! let opt = AdamW { lr: 1e-2, clip_norm: Some(1.0), ..AdamW::default() };
//! let next = opt.update(&state, &grads, None)?;
//! g.set_outputs(&next.params().iter().collect::<Vec<_>>())?;
//! # Ok(())
//! # }
//! ```

use std::f64::consts::PI;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{Carry, Tensor};

mod chain;
mod tree;

pub use chain::{apply_updates, Chain, Schedule, Transform};
pub use tree::AdamWTree;

/// AdamW's hyperparameters (Loshchilov and Hutter, "Decoupled Weight Decay Regularization"), as
/// PyTorch computes it. For each parameter `p` with gradient `g`, first moment `m` and second
/// moment `v`, at the 1-based step `t`:
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
///
/// [`AdamW::default`] is `torch.optim.AdamW`'s defaults, which do not clip; set `clip_norm`
/// for clipping (common for language models: `Some(1.0)`):
///
/// ```
/// use stablegraph::optim::AdamW;
///
/// let opt = AdamW { lr: 3e-3, beta2: 0.95, clip_norm: Some(1.0), ..AdamW::default() };
/// assert_eq!(AdamW::default().clip_norm, None);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    /// The learning rate (when [`AdamW::update`] is given no runtime learning rate). Default
    /// `1e-3`.
    pub lr: f64,
    /// The decay of the first moment. Default `0.9`.
    pub beta1: f64,
    /// The decay of the second moment. Default `0.999`.
    pub beta2: f64,
    /// Added to the bias-corrected `sqrt(v)`. Default `1e-8`.
    pub eps: f64,
    /// Decoupled weight decay, applied to the parameters marked as decayed
    /// ([`ParamState::decay`]). Default `0.01`.
    pub weight_decay: f64,
    /// When set, the gradients are scaled so that their global L2 norm is at most this.
    /// Default `None`: no clipping.
    pub clip_norm: Option<f64>,
}

impl Default for AdamW {
    /// PyTorch's `torch.optim.AdamW` defaults: `lr = 1e-3`, `betas = (0.9, 0.999)`,
    /// `eps = 1e-8`, `weight_decay = 0.01`, and no gradient clipping.
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            clip_norm: None,
        }
    }
}

/// One parameter under AdamW: its value and its two moments (each of the parameter's type),
/// and whether weight decay applies to it.
#[derive(Debug, Clone)]
pub struct ParamState {
    /// The parameter, a float tensor of any shape.
    pub param: Tensor,
    /// The first moment (running mean of the gradients); zero before the first step.
    pub m: Tensor,
    /// The second moment (running mean of the squared gradients); zero before the first step.
    pub v: Tensor,
    /// Whether [`AdamW::weight_decay`] applies. Common practice decays matrices (embeddings,
    /// projections) and not biases, norm weights or per-channel scalars.
    pub decay: bool,
}

impl ParamState {
    /// `param` before its first step: both moments zero (constants in its graph).
    pub fn new(param: Tensor, decay: bool) -> Result<ParamState> {
        let zeros = || param.graph().zeros(param.dtype(), param.dims());
        let (m, v) = (zeros()?, zeros()?);
        Ok(ParamState { param, m, v, decay })
    }
}

/// What AdamW carries from one step to the next: every parameter with its moments, and the
/// number of steps done. [`AdamW::update`] takes one and returns the next.
///
/// In a training program the parameters, moments and step count are usually program
/// parameters, donated so that the update happens in place; build the state from them with a
/// struct literal. As a loop state ([`Carry`], for [`crate::ops::Graph::fori_loop`]) it
/// flattens to every parameter, then every `m`, then every `v`, then the step count.
#[derive(Debug, Clone)]
pub struct AdamWState {
    /// The parameters, in the order of their gradients.
    pub params: Vec<ParamState>,
    /// Steps done so far (0 before the first): a rank-0 integer or float tensor. The next
    /// update is step `step + 1` (1-based, for the bias corrections) and returns it as the new
    /// count. An i32 counts exactly up to `i32::MAX` steps, an f32 up to 2^24.
    pub step: Tensor,
}

impl AdamWState {
    /// The state before the first step: the step count an i32 zero (a constant in the
    /// parameters' graph), and `params` as given (see [`ParamState::new`]). An error when
    /// `params` is empty (there is no graph to put the count in).
    pub fn new(params: Vec<ParamState>) -> Result<AdamWState> {
        let first = params.first().ok_or_else(|| {
            bad(
                "AdamWState::new",
                "`params` is empty; give at least one parameter",
            )
        })?;
        let step = first.param.graph().scalar(0.0, DType::I32)?;
        Ok(AdamWState { params, step })
    }

    /// The parameters' values, in order.
    pub fn params(&self) -> Vec<Tensor> {
        self.params.iter().map(|p| p.param.clone()).collect()
    }
}

impl Carry for AdamWState {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.extend(self.params.iter().map(|p| p.param.clone()));
        out.extend(self.params.iter().map(|p| p.m.clone()));
        out.extend(self.params.iter().map(|p| p.v.clone()));
        out.push(self.step.clone());
    }

    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        let n = template.params.len();
        let mut take = || (0..n).map(|_| values.next()).collect::<Option<Vec<_>>>();
        let (p, m, v) = (take()?, take()?, take()?);
        let params = template
            .params
            .iter()
            .zip(p.into_iter().zip(m).zip(v))
            .map(|(t, ((param, m), v))| ParamState {
                param,
                m,
                v,
                decay: t.decay,
            })
            .collect();
        Some(AdamWState {
            params,
            step: values.next()?,
        })
    }
}

/// An error of `op`.
fn bad(op: &str, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{op}: {why}"))
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
        return Err(bad(
            "global_norm",
            "`grads` is empty; it needs at least one gradient",
        ));
    };
    if let Some((i, g)) = grads
        .iter()
        .enumerate()
        .find(|(_, g)| !g.dtype().is_float())
    {
        return Err(bad(
            "global_norm",
            format!("grads[{i}] is {}, expected a float tensor", g.ty()),
        ));
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
        let op = "AdamW::validate";
        let finite_nonneg = |name: &str, x: f64| {
            if x.is_finite() && x >= 0.0 {
                Ok(())
            } else {
                Err(bad(op, format!("{name} = {x} must be finite and >= 0")))
            }
        };
        finite_nonneg("lr", self.lr)?;
        finite_nonneg("eps", self.eps)?;
        finite_nonneg("weight_decay", self.weight_decay)?;
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(bad(op, format!("{name} = {b} must be in [0, 1)")));
            }
        }
        if let Some(c) = self.clip_norm {
            if !(c.is_finite() && c > 0.0) {
                return Err(bad(op, format!("clip_norm = {c} must be finite and > 0")));
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

    /// One AdamW step over every parameter of `state` at once (clipping the gradients first
    /// when [`AdamW::clip_norm`] is set); returns the next state: new parameters and moments,
    /// each of its old type, and the step count plus one.
    ///
    /// - `grads`: one gradient per parameter of `state`, in its order, each of its
    ///   parameter's type.
    /// - `lr`: a rank-0 float tensor, the learning rate of this step (a schedule such as
    ///   [`WarmupCosine`] computed on the host and passed in, or one computed in the graph),
    ///   or `None` for [`AdamW::lr`].
    ///
    /// The arithmetic is in f32 (f64 for f64 parameters), including for bf16 or f16
    /// parameters, whose results are rounded back to their dtype. A wrong number of gradients,
    /// a tensor of the wrong type, or hyperparameters that [`AdamW::validate`] rejects are an
    /// error naming them.
    pub fn update(
        &self,
        state: &AdamWState,
        grads: &[Tensor],
        lr: Option<&Tensor>,
    ) -> Result<AdamWState> {
        self.check("AdamW::update", state, grads, lr)?;
        let grads = if self.clip_norm.is_some() && !grads.is_empty() {
            self.clip(grads)?.0
        } else {
            grads.to_vec()
        };
        self.step(state, &grads, lr)
    }

    /// [`AdamW::update`], also returning the gradients' global L2 norm before clipping (what
    /// `clip_grad_norm_` returns; computed whether or not `clip_norm` is set), a rank-0 f32
    /// (f64 when a gradient is f64). An error also when `state` has no parameters.
    pub fn update_with_norm(
        &self,
        state: &AdamWState,
        grads: &[Tensor],
        lr: Option<&Tensor>,
    ) -> Result<(AdamWState, Tensor)> {
        self.check("AdamW::update_with_norm", state, grads, lr)?;
        let (grads, norm) = self.clip(grads)?;
        Ok((self.step(state, &grads, lr)?, norm))
    }

    /// The checks of [`AdamW::update`]: hyperparameters, and the arguments' number and types.
    fn check(
        &self,
        op: &str,
        state: &AdamWState,
        grads: &[Tensor],
        lr: Option<&Tensor>,
    ) -> Result<()> {
        self.validate().map_err(|e| bad(op, e))?;
        let n = state.params.len();
        if grads.len() != n {
            return Err(bad(
                op,
                format!(
                    "grads has {} entries but the state has {n} parameters; give one per \
                     parameter",
                    grads.len()
                ),
            ));
        }
        for (i, (s, g)) in state.params.iter().zip(grads).enumerate() {
            let ty = s.param.ty();
            if !ty.dtype.is_float() {
                return Err(bad(
                    op,
                    format!("params[{i}] is {ty}, expected a float tensor"),
                ));
            }
            for (name, t) in [("grads", g), ("m", &s.m), ("v", &s.v)] {
                if t.ty() != ty {
                    return Err(bad(
                        op,
                        format!(
                            "{name}[{i}] is {}, expected the type of params[{i}], {ty}",
                            t.ty()
                        ),
                    ));
                }
            }
        }
        let step = &state.step;
        if step.rank() != 0 || step.dtype() == DType::Pred {
            return Err(bad(
                op,
                format!(
                    "step is {}, expected a rank-0 integer or float (the steps done so far)",
                    step.ty()
                ),
            ));
        }
        match lr {
            Some(lr) if lr.rank() != 0 || !lr.dtype().is_float() => Err(bad(
                op,
                format!("lr is {}, expected a rank-0 float", lr.ty()),
            )),
            _ => Ok(()),
        }
    }

    /// The update itself, on checked arguments and gradients already clipped.
    fn step(
        &self,
        state: &AdamWState,
        grads: &[Tensor],
        lr: Option<&Tensor>,
    ) -> Result<AdamWState> {
        let t = state.step.add(1.0)?;
        // The per-step scalars in each compute dtype used, made on first use.
        let mut scalars: Vec<(DType, StepScalars)> = Vec::new();
        let mut params = Vec::with_capacity(state.params.len());
        for (s, grad) in state.params.iter().zip(grads) {
            let dtype = s.param.dtype();
            let c = compute_dtype(dtype);
            let k = match scalars.iter().position(|(d, _)| *d == c) {
                Some(k) => k,
                None => {
                    scalars.push((c, self.step_scalars(&t, lr, c)?));
                    scalars.len() - 1
                }
            };
            params.push(self.param_step(s, grad, &scalars[k].1, c)?);
        }
        Ok(AdamWState { params, step: t })
    }

    /// The scalars of step `t` in compute dtype `c`.
    fn step_scalars(&self, t: &Tensor, lr: Option<&Tensor>, c: DType) -> Result<StepScalars> {
        let rate = match lr {
            Some(lr) => lr.astype(c)?,
            None => t.graph().scalar(self.lr, c)?,
        };
        let t = t.astype(c)?;
        let g = t.graph();
        let bc1 = g.scalar(self.beta1, c)?.pow(&t)?.neg()?.add(1.0)?;
        let bc2 = g.scalar(self.beta2, c)?.pow(&t)?.neg()?.add(1.0)?;
        let keep = rate.mul(self.weight_decay)?.neg()?.add(1.0)?;
        Ok(StepScalars {
            rate,
            bc1,
            bc2,
            keep,
        })
    }

    /// One parameter's step, computed in `c` and rounded back to its dtype.
    fn param_step(
        &self,
        s: &ParamState,
        grad: &Tensor,
        k: &StepScalars,
        c: DType,
    ) -> Result<ParamState> {
        let dtype = s.param.dtype();
        let grad = grad.astype(c)?;
        let mut p = s.param.astype(c)?;
        if s.decay && self.weight_decay != 0.0 {
            p = p.mul(&k.keep)?;
        }
        let m = s.m.astype(c)?;
        let m = m.add(&grad.sub(&m)?.mul(1.0 - self.beta1)?)?;
        let v =
            s.v.astype(c)?
                .mul(self.beta2)?
                .add(&grad.square()?.mul(1.0 - self.beta2)?)?;
        let step_size = k.rate.div(&k.bc1)?;
        let denom = v.sqrt()?.div(&k.bc2.sqrt()?)?.add(self.eps)?;
        let p = p.sub(&m.div(&denom)?.mul(&step_size)?)?;
        Ok(ParamState {
            param: p.astype(dtype)?,
            m: m.astype(dtype)?,
            v: v.astype(dtype)?,
            decay: s.decay,
        })
    }
}

/// The scalars one step shares across its parameters, in one compute dtype: the learning rate,
/// the bias corrections' `1 - beta^t`, and the decay factor `1 - lr * weight_decay`.
struct StepScalars {
    rate: Tensor,
    bc1: Tensor,
    bc2: Tensor,
    keep: Tensor,
}

/// A learning-rate schedule: linear warm-up to a peak, then cosine decay to a fraction of it
/// (the shape of optax's `warmup_cosine_decay_schedule`, with its `alpha` as
/// `final_fraction`). Computed on the host, one value per optimizer step, and passed to
/// [`AdamW::update`] as a runtime learning rate. At the 1-based step `s`, with
/// `W = warmup_steps`, `T = total_steps` and `f = final_fraction`:
///
/// ```text
/// s <= W:  peak_lr * s / W
/// s >  W:  peak_lr * (f + (1 - f) * (1 + cos(pi * min(1, (s - W) / max(1, T - W)))) / 2)
/// ```
///
/// so step `W` is at the peak and step `T` (and every later one) at `f * peak_lr`.
///
/// ```
/// use stablegraph::optim::WarmupCosine;
///
/// let schedule = WarmupCosine::new(3e-3, 1000); // 50 warm-up steps, down to 3e-4
/// assert!((schedule.lr(50) - 3e-3).abs() < 1e-15);
/// assert!((schedule.lr(1000) - 3e-4).abs() < 1e-15);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosine {
    /// The learning rate at the end of the warm-up.
    pub peak_lr: f64,
    /// Steps of linear warm-up from `peak_lr / warmup_steps` (step 1) to `peak_lr`; 0 starts
    /// the decay at once.
    pub warmup_steps: u64,
    /// The step at which the decay ends.
    pub total_steps: u64,
    /// The final learning rate as a fraction of `peak_lr`, in `[0, 1]`.
    pub final_fraction: f64,
}

impl WarmupCosine {
    /// The schedule of the `mamba2 train` example: warm-up over the first `total_steps / 20`
    /// steps (at least 1, at most 100), then cosine decay to a tenth of `peak_lr` at
    /// `total_steps`.
    pub fn new(peak_lr: f64, total_steps: u64) -> WarmupCosine {
        WarmupCosine {
            peak_lr,
            warmup_steps: (total_steps / 20).clamp(1, 100),
            total_steps,
            final_fraction: 0.1,
        }
    }

    /// An error naming the first field out of range: `peak_lr` must be finite and at least 0,
    /// `final_fraction` in `[0, 1]`.
    pub fn validate(&self) -> Result<()> {
        let op = "WarmupCosine::validate";
        if !(self.peak_lr.is_finite() && self.peak_lr >= 0.0) {
            return Err(bad(
                op,
                format!("peak_lr = {} must be finite and >= 0", self.peak_lr),
            ));
        }
        if !(0.0..=1.0).contains(&self.final_fraction) {
            return Err(bad(
                op,
                format!("final_fraction = {} must be in [0, 1]", self.final_fraction),
            ));
        }
        Ok(())
    }

    /// The learning rate of the 1-based optimizer step `step` (see the formula on
    /// [`WarmupCosine`]; step 0 gives 0 when there is a warm-up).
    pub fn lr(&self, step: u64) -> f64 {
        let (peak, warmup) = (self.peak_lr, self.warmup_steps);
        if step <= warmup && warmup > 0 {
            return peak * step as f64 / warmup as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(warmup).max(1);
        let progress = step.saturating_sub(warmup) as f64 / decay_steps as f64;
        let cosine = 0.5 * (1.0 + (PI * progress.min(1.0)).cos());
        let f = self.final_fraction;
        peak * (f + (1.0 - f) * cosine)
    }
}
