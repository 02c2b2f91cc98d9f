//! AdamW over parameter trees: its state as a tree ([`AdamWTree`]), [`AdamW::init`] and
//! [`AdamW::apply`].

use super::{bad, AdamW, AdamWState, ParamState};
use crate::array::HostArray;
use crate::error::Result;
use crate::ops::{Carry, Tensor};
use crate::tree::{at, Tree, Typed};

/// AdamW's state for a tree of parameters `P` with leaves `L`: both moments in the
/// parameters' structure and the step count. It is a [`Tree`] itself (leaves `m.<path>`,
/// `v.<path>`, then `step`), so it is uploaded, passed to [`crate::jit`] programs, donated and
/// saved as one value. [`AdamW::init`] makes the first; [`AdamW::apply`] the next.
#[derive(Debug, Clone)]
pub struct AdamWTree<P, L> {
    /// The first moments, one per parameter.
    pub m: P,
    /// The second moments, one per parameter.
    pub v: P,
    /// Steps done so far (an i32 scalar from [`AdamW::init`]).
    pub step: L,
}

impl<L, P: Tree<L>> Tree<L> for AdamWTree<P, L> {
    type Map<U> = AdamWTree<P::Map<U>, U>;

    fn visit_at<'a>(&'a self, path: &mut String, f: &mut dyn FnMut(&str, &'a L)) {
        at(path, "m", |p| self.m.visit_at(p, f));
        at(path, "v", |p| self.v.visit_at(p, f));
        at(path, "step", |p| f(p, &self.step));
    }

    fn try_map_at<'a, U>(
        &'a self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &'a L) -> Result<U>,
    ) -> Result<Self::Map<U>> {
        Ok(AdamWTree {
            m: at(path, "m", |p| self.m.try_map_at(p, f))?,
            v: at(path, "v", |p| self.v.try_map_at(p, f))?,
            step: at(path, "step", |p| f(p, &self.step))?,
        })
    }

    fn try_into_map_at<U>(
        self,
        path: &mut String,
        f: &mut dyn FnMut(&str, L) -> Result<U>,
    ) -> Result<Self::Map<U>> {
        let AdamWTree { m, v, step } = self;
        Ok(AdamWTree {
            m: at(path, "m", |p| m.try_into_map_at(p, f))?,
            v: at(path, "v", |p| v.try_into_map_at(p, f))?,
            step: at(path, "step", |p| f(p, step))?,
        })
    }

    fn try_replace_at(
        &self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &L) -> Result<L>,
    ) -> Result<Self> {
        Ok(AdamWTree {
            m: at(path, "m", |p| self.m.try_replace_at(p, f))?,
            v: at(path, "v", |p| self.v.try_replace_at(p, f))?,
            step: at(path, "step", |p| f(p, &self.step))?,
        })
    }
}

impl<P: Tree<Tensor>> Carry for AdamWTree<P, Tensor> {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        crate::tree::carry_flatten(self, out)
    }

    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        crate::tree::carry_unflatten(template, values)
    }
}

impl AdamW {
    /// The state before the first step for the parameters `params` (any tree with typed
    /// leaves: host arrays, buffers, tensor types, graph values): zero moments of each
    /// parameter's type and an i32 step count of 0, as host arrays (optax's `init`). An error
    /// names a parameter that is not a float.
    pub fn init<L: Typed, P: Tree<L>>(
        &self,
        params: &P,
    ) -> Result<AdamWTree<P::Map<HostArray>, HostArray>> {
        let zeros = || {
            params.try_map(|path, leaf| {
                let ty = leaf.tensor_type();
                if !ty.dtype.is_float() {
                    return Err(bad(
                        "AdamW::init",
                        format!("the parameter `{path}` is {ty}, not a float"),
                    ));
                }
                Ok(HostArray::zeros(&ty))
            })
        };
        Ok(AdamWTree {
            m: zeros()?,
            v: zeros()?,
            step: HostArray::scalar(0i32),
        })
    }

    /// One step for a tree of parameters: [`AdamW::update`] with `grads` in the parameters'
    /// structure (see [`Tensor::grad_tree`]), weight decay on the parameters of rank 2 or more
    /// (matrices, embeddings, kernels; not biases or norm weights). Returns the next
    /// parameters and state. An error names the first path where `grads` or the moments do not
    /// match `params`.
    pub fn apply<P: Tree<Tensor>>(
        &self,
        params: &P,
        grads: &P,
        state: &AdamWTree<P, Tensor>,
        lr: Option<&Tensor>,
    ) -> Result<(P, AdamWTree<P, Tensor>)> {
        self.apply_masked(params, grads, state, lr, |_, p| p.rank() >= 2)
    }

    /// [`AdamW::apply`] with weight decay where `decay(path, parameter)` says.
    pub fn apply_masked<P: Tree<Tensor>>(
        &self,
        params: &P,
        grads: &P,
        state: &AdamWTree<P, Tensor>,
        lr: Option<&Tensor>,
        decay: impl Fn(&str, &Tensor) -> bool,
    ) -> Result<(P, AdamWTree<P, Tensor>)> {
        let (flat, grads) = self.flat_state(params, grads, state, decay)?;
        let next = self.update(&flat, &grads, lr)?;
        unflat_state(params, state, &next)
    }

    /// [`AdamW::apply`] that also returns the gradients' global L2 norm before clipping
    /// ([`AdamW::update_with_norm`]'s).
    pub fn apply_with_norm<P: Tree<Tensor>>(
        &self,
        params: &P,
        grads: &P,
        state: &AdamWTree<P, Tensor>,
        lr: Option<&Tensor>,
    ) -> Result<(P, AdamWTree<P, Tensor>, Tensor)> {
        let (flat, grads) = self.flat_state(params, grads, state, |_, p| p.rank() >= 2)?;
        let (next, norm) = self.update_with_norm(&flat, &grads, lr)?;
        let (params, state) = unflat_state(params, state, &next)?;
        Ok((params, state, norm))
    }

    /// The flat state and gradients of a tree's, after checking that the gradients and both
    /// moments have the parameters' structure.
    fn flat_state<P: Tree<Tensor>>(
        &self,
        params: &P,
        grads: &P,
        state: &AdamWTree<P, Tensor>,
        decay: impl Fn(&str, &Tensor) -> bool,
    ) -> Result<(AdamWState, Vec<Tensor>)> {
        for (what, other) in [("grads", grads), ("m", &state.m), ("v", &state.v)] {
            params
                .try_zip_map(other, |_, _, _| Ok(()))
                .map_err(|e| bad("AdamW::apply", format!("params and {what}: {e}")))?;
        }
        let flat = AdamWState {
            params: params
                .named()
                .into_iter()
                .zip(state.m.leaves().into_iter().zip(state.v.leaves()))
                .map(|((path, p), (m, v))| ParamState {
                    param: p.clone(),
                    m: m.clone(),
                    v: v.clone(),
                    decay: decay(&path, p),
                })
                .collect(),
            step: state.step.clone(),
        };
        Ok((flat, grads.flatten()))
    }
}

/// The parameters and state of `next` in the structure of `params` and `state`.
fn unflat_state<P: Tree<Tensor>>(
    params: &P,
    state: &AdamWTree<P, Tensor>,
    next: &AdamWState,
) -> Result<(P, AdamWTree<P, Tensor>)> {
    let part = |f: fn(&ParamState) -> Tensor| next.params.iter().map(f).collect::<Vec<_>>();
    Ok((
        params.rebuild(part(|p| p.param.clone()))?,
        AdamWTree {
            m: state.m.rebuild(part(|p| p.m.clone()))?,
            v: state.v.rebuild(part(|p| p.v.clone()))?,
            step: next.step.clone(),
        },
    ))
}
