//! Differentiation rules given by the user, over trees: [`custom_vjp`], [`custom_jvp`] and
//! [`stop_gradient`] (the graph-level forms are [`crate::ops::Graph::custom_vjp`],
//! [`crate::ops::Graph::custom_jvp`] and [`crate::ops::Tensor::stop_gradient`]).

use std::cell::RefCell;
use std::rc::Rc;

use super::graph_of;
use crate::error::{Error, Result};
use crate::ops::Tensor;
use crate::tree::Tree;

/// A function whose value is `fwd(x).0` and whose reverse derivative is `bwd` (JAX's
/// `jax.custom_vjp` with `defvjp(fwd, bwd)`): `fwd` returns the result and the residuals `bwd`
/// needs; `bwd(residuals, cotangent)` returns the input's cotangent, in the input's structure.
/// `grad`, `jvp` (its transpose), `vmap` (per example) and their compositions use the rule.
/// The value is `fwd`'s, as under JAX's differentiation (JAX's own forward `f` is not asked
/// for).
///
/// ```
/// use stablegraph::ops::{Graph, Tensor};
/// use stablegraph::transforms::{custom_vjp, grad};
/// use stablegraph::{DType, HostArray};
///
/// # fn main() -> stablegraph::Result<()> {
/// // log(sum(exp(x))), computed stably, with the softmax as its gradient.
/// let lse = custom_vjp(
///     |x: Tensor| {
///         let m = x.max(&[0])?;
///         let y = x.sub(&m)?.exp()?.sum_all()?.log()?.add(&m)?;
///         Ok((y.clone(), (x, y)))
///     },
///     |(x, y): (Tensor, Tensor), ct: Tensor| x.sub(&y)?.exp()?.mul(&ct),
/// );
/// let g = Graph::new();
/// let x = g.parameter("x", DType::F64, &[2])?;
/// let dx = grad(&lse)(x)?;
/// g.set_outputs(&[&dx])?;
/// let out = g.evaluate(&[HostArray::from_vec(&[2], vec![1000.0f64, 1000.0])?])?;
/// assert!(out[0].to_f64_vec().iter().all(|g| (g - 0.5).abs() < 1e-12));
/// # Ok(())
/// # }
/// ```
pub fn custom_vjp<I, O, R, Fw, Bw>(fwd: Fw, bwd: Bw) -> impl Fn(I) -> Result<O>
where
    I: Tree<Tensor> + 'static,
    O: Tree<Tensor> + 'static,
    R: Tree<Tensor> + 'static,
    Fw: Fn(I) -> Result<(O, R)>,
    Bw: Fn(R, O) -> Result<I> + Clone + 'static,
{
    move |x: I| {
        let g = graph_of(&x, "custom_vjp")?;
        let leaves = x.flatten();
        let structure: Rc<RefCell<Option<(O, R)>>> = Rc::new(RefCell::new(None));
        let (seen, bwd) = (structure.clone(), bwd.clone());
        let rule = move |res: &[Tensor], cts: &[Tensor]| -> Result<Vec<Tensor>> {
            let seen = seen.borrow();
            let (o, r) = seen.as_ref().ok_or_else(not_run)?;
            let residuals = r.rebuild(res.iter().cloned())?;
            let ct = o.rebuild(cts.iter().cloned())?;
            Ok(bwd(residuals, ct)?.flatten())
        };
        let outs = g.custom_vjp(
            &leaves.iter().collect::<Vec<_>>(),
            |args| {
                let (o, r) = fwd(x.rebuild(args.iter().cloned())?)?;
                let flat = (o.flatten(), r.flatten());
                *structure.borrow_mut() = Some((o, r));
                Ok(flat)
            },
            rule,
        )?;
        let seen = structure.borrow();
        seen.as_ref().ok_or_else(not_run)?.0.rebuild(outs)
    }
}

/// A function `f` whose tangent is given by `rule(primals, tangents)` (JAX's
/// `jax.custom_jvp` with `defjvp`): the rule returns the tangent of the result (JAX's returns
/// the primal result too; here `f` gives it), linear in the tangents as JAX requires, since
/// `grad` uses its transpose. `vmap` and every other transformation respect it.
///
/// ```
/// use stablegraph::ops::{Graph, Tensor};
/// use stablegraph::transforms::{custom_jvp, grad};
/// use stablegraph::{DType, HostArray};
///
/// # fn main() -> stablegraph::Result<()> {
/// // A straight-through round (half up).
/// let st_round = custom_jvp(|x: Tensor| x.add(0.5)?.floor(), |_x: Tensor, t: Tensor| Ok(t));
/// let g = Graph::new();
/// let x = g.parameter("x", DType::F64, &[2])?;
/// let dx = grad(|x: Tensor| st_round(x.clone())?.mul(&x)?.sum_all())(x)?;
/// g.set_outputs(&[&dx])?;
/// let out = g.evaluate(&[HostArray::from_vec(&[2], vec![0.3f64, 1.7])?])?;
/// assert_eq!(out[0].to_f64_vec(), [0.3 + 0.0, 1.7 + 2.0]); // x + round(x)
/// # Ok(())
/// # }
/// ```
pub fn custom_jvp<I, O, F, J>(f: F, rule: J) -> impl Fn(I) -> Result<O>
where
    I: Tree<Tensor> + 'static,
    O: Tree<Tensor> + 'static,
    F: Fn(I) -> Result<O>,
    J: Fn(I, I) -> Result<O> + Clone + 'static,
{
    move |x: I| {
        let g = graph_of(&x, "custom_jvp")?;
        let leaves = x.flatten();
        let template = x.try_replace(|_, t| Ok(t.clone()))?;
        let rule = rule.clone();
        let tangents = move |p: &[Tensor], t: &[Tensor]| -> Result<Vec<Tensor>> {
            let primals = template.rebuild(p.iter().cloned())?;
            let tangents = template.rebuild(t.iter().cloned())?;
            Ok(rule(primals, tangents)?.flatten())
        };
        let structure: RefCell<Option<O>> = RefCell::new(None);
        let outs = g.custom_jvp(
            &leaves.iter().collect::<Vec<_>>(),
            |args| {
                let o = f(x.rebuild(args.iter().cloned())?)?;
                let flat = o.flatten();
                *structure.borrow_mut() = Some(o);
                Ok(flat)
            },
            tangents,
        )?;
        let o = structure.into_inner().ok_or_else(not_run)?;
        o.rebuild(outs)
    }
}

/// The same tree, through which no gradient flows (JAX's `lax.stop_gradient`).
pub fn stop_gradient<T: Tree<Tensor>>(x: &T) -> Result<T> {
    x.try_replace(|_, t| t.stop_gradient())
}

/// The error of a rule asked for before its function ran.
fn not_run() -> Error {
    Error::InvalidArgument("custom rule: internal: the function did not run".into())
}
