//! Optimizers composed from gradient transformations (optax's `chain`): each [`Transform`]
//! maps the updates so far (the gradients at first) to new ones, keeping its own state; the
//! last ones usually scale by a negative learning rate, and [`apply_updates`] adds the result
//! to the parameters. All of it is graph code, so a whole training step stays one program.
//!
//! The state of a chain is a string-keyed map, a [`Tree`] like any other (uploaded, donated,
//! saved, carried through a `fori_loop`): `"{k}.count"` for transform `k`'s step count and
//! `"{k}.{slot}.{path}"` for its per-parameter slots (`mu` and `nu` of Adam, `trace` of
//! momentum), each of its parameter's type.
//!
//! ```
//! use stablegraph::ops::Graph;
//! use stablegraph::optim::{apply_updates, Chain, Schedule, Transform};
//! use stablegraph::tree::Tree;
//! use stablegraph::{DType, TensorType};
//!
//! # fn main() -> stablegraph::Result<()> {
//! // AdamW with clipping, as optax writes it.
//! let opt = Chain(vec![
//!     Transform::ClipByGlobalNorm(1.0),
//!     Transform::ScaleByAdam { b1: 0.9, b2: 0.999, eps: 1e-8 },
//!     Transform::AddDecayedWeights(0.01),
//!     Transform::ScaleByLearningRate(Schedule::Constant(1e-3)),
//! ]);
//! let types = vec![TensorType::new(DType::F32, &[4, 3]), TensorType::new(DType::F32, &[3])];
//! let state = opt.init(&types)?;
//! assert!(state.contains_key("1.mu.0") && state.contains_key("3.count"));
//! let g = Graph::new();
//! let params = types.try_map(|p, t| g.parameter(&format!("p{p}"), t.dtype, &t.dims))?;
//! let state = state.try_map(|_, a| g.constant(a))?;
//! let loss = params[0].sum(&[0])?.mul(&params[1])?.square()?.sum_all()?;
//! let grads = loss.grad_tree(&params)?;
//! let (updates, _next) = opt.update(&grads, &state, &params)?;
//! let params = apply_updates(&params, &updates)?;
//! assert_eq!(params[0].dims(), &[4, 3]);
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;

use super::{bad, compute_dtype, global_norm, WarmupCosine};
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::{Carry, Tensor};
use crate::tree::{Tree, Typed};

/// One gradient transformation (optax's names).
#[derive(Clone, Debug, PartialEq)]
pub enum Transform {
    /// Scales all updates together so that their global L2 norm is at most this, by
    /// `min(1, max / (norm + 1e-6))` (PyTorch's `clip_grad_norm_`; optax's differs by that
    /// `1e-6`).
    ClipByGlobalNorm(f64),
    /// Clamps every update into `[-v, v]` (`optax.clip`).
    ClipByValue(f64),
    /// Adam's scaling (`optax.scale_by_adam`): running moments `mu` and `nu`, and
    /// `mu / (1 - b1^t) / (sqrt(nu / (1 - b2^t)) + eps)` at the 1-based step `t`.
    ScaleByAdam {
        /// The first moment's decay.
        b1: f64,
        /// The second moment's decay.
        b2: f64,
        /// Added to the bias-corrected `sqrt(nu)`.
        eps: f64,
    },
    /// Momentum (`optax.trace`): `trace = decay * trace + u`, then `trace` (or, with
    /// `nesterov`, `decay * trace + u`).
    Trace {
        /// The trace's decay.
        decay: f64,
        /// Nesterov's variant.
        nesterov: bool,
    },
    /// Adds `weight_decay * p` for the parameters of rank 2 or more (optax's
    /// `add_decayed_weights` with the usual mask: matrices, not biases or norm weights).
    AddDecayedWeights(f64),
    /// Multiplies by a constant (`optax.scale`).
    Scale(f64),
    /// Multiplies by minus the learning rate of the step (`optax.scale_by_learning_rate`),
    /// counted from 1.
    ScaleByLearningRate(Schedule),
}

/// A learning rate per step.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// The same rate every step.
    Constant(f64),
    /// Warm-up, then cosine decay ([`WarmupCosine::lr`], computed in the graph).
    WarmupCosine(WarmupCosine),
}

/// Transforms applied in order (`optax.chain`).
#[derive(Clone, Debug, PartialEq)]
pub struct Chain(pub Vec<Transform>);

impl Transform {
    /// Its per-parameter slots and whether it counts steps.
    fn slots(&self) -> (&'static [&'static str], bool) {
        match self {
            Transform::ScaleByAdam { .. } => (&["mu", "nu"], true),
            Transform::Trace { .. } => (&["trace"], false),
            Transform::ScaleByLearningRate(_) => (&[], true),
            _ => (&[], false),
        }
    }
}

impl Chain {
    /// The state before the first step for `params` (any tree with typed leaves): zero slots of
    /// each parameter's type and i32 step counts of 0, as host arrays. An error names a
    /// parameter that is not a float.
    pub fn init<L: Typed, P: Tree<L>>(&self, params: &P) -> Result<BTreeMap<String, HostArray>> {
        let named: Vec<(String, TensorType)> = params
            .named()
            .into_iter()
            .map(|(p, l)| (p, l.tensor_type()))
            .collect();
        if let Some((p, t)) = named.iter().find(|(_, t)| !t.dtype.is_float()) {
            return Err(bad(
                "Chain::init",
                format!("the parameter `{p}` is {t}, not a float"),
            ));
        }
        let mut state = BTreeMap::new();
        for (k, t) in self.0.iter().enumerate() {
            let (slots, counts) = t.slots();
            for slot in slots {
                for (path, ty) in &named {
                    state.insert(slot_key(k, slot, path), HostArray::zeros(ty));
                }
            }
            if counts {
                state.insert(format!("{k}.count"), HostArray::scalar(0i32));
            }
        }
        Ok(state)
    }

    /// The updates for `grads` (in the parameters' structure) and the next state: each
    /// transform in turn, computed in f32 (f64 for f64 parameters) and rounded to the
    /// parameters' dtypes at the end. An error names a missing state entry or a gradient tree
    /// of another structure.
    pub fn update<P: Tree<Tensor>>(
        &self,
        grads: &P,
        state: &BTreeMap<String, Tensor>,
        params: &P,
    ) -> Result<(P, BTreeMap<String, Tensor>)> {
        params
            .try_zip_map(grads, |_, _, _| Ok(()))
            .map_err(|e| bad("Chain::update", format!("params and grads: {e}")))?;
        let named = params.named();
        let mut u: Vec<Tensor> = grads
            .leaves()
            .into_iter()
            .map(|g| g.astype(compute_dtype(g.dtype())))
            .collect::<Result<_>>()?;
        let mut next = state.clone();
        for (k, t) in self.0.iter().enumerate() {
            let step = Step {
                k,
                named: &named,
                state,
            };
            u = step.apply(t, u, &mut next)?;
        }
        let rounded = u
            .iter()
            .zip(&named)
            .map(|(x, (_, p))| x.astype(p.dtype()))
            .collect::<Result<Vec<_>>>()?;
        Ok((params.rebuild(rounded)?, next))
    }
}

/// `params + updates`, leaf by leaf, in each parameter's dtype (JAX's
/// `optax.apply_updates`).
pub fn apply_updates<P: Tree<Tensor>>(params: &P, updates: &P) -> Result<P> {
    params.try_zip_map(updates, |_, _, _| Ok(()))?;
    let sums = params
        .leaves()
        .into_iter()
        .zip(updates.leaves())
        .map(|(p, u)| {
            let c = compute_dtype(p.dtype());
            p.astype(c)?.add(&u.astype(c)?)?.astype(p.dtype())
        })
        .collect::<Result<Vec<_>>>()?;
    params.rebuild(sums)
}

/// The key of transform `k`'s slot `slot` of the parameter at `path`.
fn slot_key(k: usize, slot: &str, path: &str) -> String {
    match path {
        "" => format!("{k}.{slot}"),
        _ => format!("{k}.{slot}.{path}"),
    }
}

/// One transform's step: its index, the parameters with their paths, the state it reads.
struct Step<'a> {
    k: usize,
    named: &'a [(String, &'a Tensor)],
    state: &'a BTreeMap<String, Tensor>,
}

impl Step<'_> {
    /// The state entry `key`, an error naming it when missing.
    fn get(&self, key: &str) -> Result<Tensor> {
        self.state.get(key).cloned().ok_or_else(|| {
            bad(
                "Chain::update",
                format!("the state has no `{key}`; make it with Chain::init for these params"),
            )
        })
    }

    /// The next step count (`count + 1`, written to `next`), as `dtype`.
    fn count(&self, next: &mut BTreeMap<String, Tensor>, dtype: DType) -> Result<Tensor> {
        let key = format!("{}.count", self.k);
        let t = self.get(&key)?.add(1.0)?;
        next.insert(key, t.clone());
        t.astype(dtype)
    }

    /// Slot `slot` of parameter `i`, in `dtype`.
    fn slot(&self, slot: &str, i: usize, dtype: DType) -> Result<Tensor> {
        self.get(&slot_key(self.k, slot, &self.named[i].0))?
            .astype(dtype)
    }

    /// Writes slot `slot` of parameter `i` (rounded to the parameter's dtype).
    fn put(
        &self,
        next: &mut BTreeMap<String, Tensor>,
        slot: &str,
        i: usize,
        v: &Tensor,
    ) -> Result<()> {
        let key = slot_key(self.k, slot, &self.named[i].0);
        next.insert(key, v.astype(self.named[i].1.dtype())?);
        Ok(())
    }

    fn apply(
        &self,
        t: &Transform,
        u: Vec<Tensor>,
        next: &mut BTreeMap<String, Tensor>,
    ) -> Result<Vec<Tensor>> {
        match t {
            Transform::ClipByGlobalNorm(max) => {
                let Some(first) = u.first() else { return Ok(u) };
                let c = first.dtype();
                let norm = global_norm(&u)?.astype(c)?;
                let factor = first
                    .graph()
                    .scalar(*max, c)?
                    .div(&norm.add(1e-6)?)?
                    .minimum(1.0)?;
                u.iter()
                    .map(|x| x.mul(&factor.astype(x.dtype())?))
                    .collect()
            }
            Transform::ClipByValue(v) => u.iter().map(|x| x.clamp(-v, *v)).collect(),
            Transform::AddDecayedWeights(wd) => u
                .iter()
                .zip(self.named)
                .map(|(x, (_, p))| match p.rank() >= 2 && *wd != 0.0 {
                    true => x.add(&p.astype(x.dtype())?.mul(*wd)?),
                    false => Ok(x.clone()),
                })
                .collect(),
            Transform::Scale(f) => u.iter().map(|x| x.mul(*f)).collect(),
            Transform::ScaleByLearningRate(schedule) => {
                let Some(first) = u.first() else { return Ok(u) };
                let t = self.count(next, first.dtype())?;
                let lr = schedule.at(&t)?.neg()?;
                u.iter().map(|x| x.mul(&lr.astype(x.dtype())?)).collect()
            }
            Transform::Trace { decay, nesterov } => (0..u.len())
                .map(|i| {
                    let x = &u[i];
                    let trace = self.slot("trace", i, x.dtype())?.mul(*decay)?.add(x)?;
                    self.put(next, "trace", i, &trace)?;
                    match nesterov {
                        true => trace.mul(*decay)?.add(x),
                        false => Ok(trace),
                    }
                })
                .collect(),
            Transform::ScaleByAdam { b1, b2, eps } => self.adam(u, next, [*b1, *b2, *eps]),
        }
    }

    /// [`Transform::ScaleByAdam`].
    fn adam(
        &self,
        u: Vec<Tensor>,
        next: &mut BTreeMap<String, Tensor>,
        [b1, b2, eps]: [f64; 3],
    ) -> Result<Vec<Tensor>> {
        let Some(first) = u.first() else { return Ok(u) };
        let t = self.count(next, first.dtype())?;
        let g = first.graph();
        (0..u.len())
            .map(|i| {
                let x = &u[i];
                let c = x.dtype();
                let t = t.astype(c)?;
                let mu = self.slot("mu", i, c)?;
                let mu = mu.add(&x.sub(&mu)?.mul(1.0 - b1)?)?;
                let nu = self
                    .slot("nu", i, c)?
                    .mul(b2)?
                    .add(&x.square()?.mul(1.0 - b2)?)?;
                self.put(next, "mu", i, &mu)?;
                self.put(next, "nu", i, &nu)?;
                let bc1 = g.scalar(b1, c)?.pow(&t)?.neg()?.add(1.0)?;
                let bc2 = g.scalar(b2, c)?.pow(&t)?.neg()?.add(1.0)?;
                let denom = nu.div(&bc2)?.sqrt()?.add(eps)?;
                mu.div(&bc1)?.div(&denom)
            })
            .collect()
    }
}

impl Schedule {
    /// The learning rate at the 1-based step `t` (a float scalar), in `t`'s dtype.
    fn at(&self, t: &Tensor) -> Result<Tensor> {
        match self {
            Schedule::Constant(lr) => t.graph().scalar(*lr, t.dtype()),
            Schedule::WarmupCosine(w) => w.lr_at(t),
        }
    }
}

impl WarmupCosine {
    /// [`WarmupCosine::lr`] of the 1-based step `step` (a float scalar) as a graph value, so a
    /// schedule needs no runtime learning rate.
    pub fn lr_at(&self, step: &Tensor) -> Result<Tensor> {
        let (peak, warmup) = (self.peak_lr, self.warmup_steps as f64);
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = step
            .sub(warmup)?
            .clamp(0.0, decay_steps)?
            .div(decay_steps)?;
        let cosine = progress
            .mul(std::f64::consts::PI)?
            .cos()?
            .add(1.0)?
            .mul(0.5)?;
        let f = self.final_fraction;
        let decayed = cosine.mul(peak * (1.0 - f))?.add(peak * f)?;
        if self.warmup_steps == 0 {
            return Ok(decayed);
        }
        let warm = step.mul(peak / warmup)?;
        step.le(warmup)?.select(&warm, &decayed)
    }
}

impl Carry for BTreeMap<String, Tensor> {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        crate::tree::carry_flatten(self, out)
    }

    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        crate::tree::carry_unflatten(template, values)
    }
}
