//! The differentiating transformations over trees: gradients, Jacobians, Hessians, JVPs, VJPs
//! and `checkpoint`, each a function of a function (see the [module docs](super)).

use std::cell::RefCell;

use super::{graph_of, under, Args};
use crate::error::{Error, Result};
use crate::ops::Tensor;
use crate::tree::Tree;

/// The gradient of `f` (a rank-0 float result) with respect to its first argument, in that
/// argument's structure (JAX's `jax.grad`).
pub fn grad<I, F>(f: F) -> impl Fn(I) -> Result<I::First>
where
    I: Args,
    F: Fn(I) -> Result<Tensor>,
{
    move |x| Ok(value_and_grad_at(&|x| Ok((f(x)?, ())), x)?.1)
}

/// `f`'s value and its gradient with respect to its first argument (JAX's
/// `jax.value_and_grad`).
pub fn value_and_grad<I, F>(f: F) -> impl Fn(I) -> Result<(Tensor, I::First)>
where
    I: Args,
    F: Fn(I) -> Result<Tensor>,
{
    move |x| {
        let ((value, ()), grads) = value_and_grad_at(&|x| Ok((f(x)?, ())), x)?;
        Ok((value, grads))
    }
}

/// [`value_and_grad`] of a function that returns its value and auxiliary data (any tree, not
/// differentiated): `((value, aux), gradient)`, JAX's `has_aux=True`.
pub fn value_and_grad_aux<I, A, F>(f: F) -> impl Fn(I) -> Result<((Tensor, A), I::First)>
where
    I: Args,
    F: Fn(I) -> Result<(Tensor, A)>,
{
    move |x| value_and_grad_at(&f, x)
}

/// The gradient of `f` with respect to the leaves under the path prefixes `wrt` (`"0"`: the
/// first tuple element, `"0.fc1"`: the `fc1` field in it, `""`: everything), JAX's
/// `argnums` by path: the input's structure, with zeros of their type at the other leaves.
pub fn grad_wrt<I, F>(f: F, wrt: &[&str]) -> impl Fn(I) -> Result<I>
where
    I: Tree<Tensor>,
    F: Fn(I) -> Result<Tensor>,
{
    let prefixes: Vec<String> = wrt.iter().map(|p| p.to_string()).collect();
    move |x| {
        let paths = x.paths();
        if let Some(p) = prefixes
            .iter()
            .find(|p| !paths.iter().any(|path| under(path, p)))
        {
            return Err(Error::InvalidArgument(format!(
                "grad_wrt: no input leaf lies under `{p}` (the leaves: {})",
                paths.join(", ")
            )));
        }
        let chosen = |path: &str| prefixes.iter().any(|p| under(path, p));
        let x = x.try_replace(|path, t| {
            if chosen(path) {
                t.fresh()
            } else {
                Ok(t.clone())
            }
        })?;
        let wrt: Vec<Tensor> = x
            .named()
            .into_iter()
            .filter(|(p, _)| chosen(p))
            .map(|(_, t)| t.clone())
            .collect();
        let template = x.try_replace(|_, t| Ok(t.clone()))?;
        let value = f(x)?;
        let mut grads = value.grad(&wrt.iter().collect::<Vec<_>>())?.into_iter();
        template.try_replace(|path, t| match chosen(path) {
            true => grads.next().ok_or_else(|| {
                Error::InvalidArgument("grad_wrt: internal: a gradient is missing".into())
            }),
            false => t.graph().zeros(t.dtype(), t.dims()),
        })
    }
}

/// The Jacobian of `f` (one tensor out) with respect to its first argument, built from
/// forward products (JAX's `jax.jacfwd`): that argument's structure, each leaf of dims
/// `out.dims ++ leaf.dims`.
pub fn jacfwd<I, F>(f: F) -> impl Fn(I) -> Result<I::First>
where
    I: Args,
    F: Fn(I) -> Result<Tensor>,
{
    move |x| jacobian(&f, x, true)
}

/// [`jacfwd`] built from reverse products, one per element of the output (JAX's
/// `jax.jacrev`).
pub fn jacrev<I, F>(f: F) -> impl Fn(I) -> Result<I::First>
where
    I: Args,
    F: Fn(I) -> Result<Tensor>,
{
    move |x| jacobian(&f, x, false)
}

/// The Hessian of `f` (a rank-0 float result) with respect to its first argument, a tensor:
/// dims `x.dims ++ x.dims` (JAX's `jax.hessian`, the forward Jacobian of the gradient).
pub fn hessian<I, F>(f: F) -> impl Fn(I) -> Result<Tensor>
where
    I: Args<First = Tensor>,
    F: Fn(I) -> Result<Tensor>,
{
    move |x| {
        let (x, wrt, _) = fresh_first(x)?;
        let g = graph_of(&wrt, "hessian")?;
        let value = f(x)?;
        let gradient = value.grad(&[&wrt[0]])?.remove(0);
        g.jacfwd(&gradient, &wrt[0])
    }
}

/// `f(primals)` and its tangent when the primals move along `tangents` (a tree of the same
/// structure and types): JAX's `jax.jvp`, returning `(primals_out, tangents_out)`.
pub fn jvp<I, O, F>(f: F, primals: &I, tangents: &I) -> Result<(O, O)>
where
    I: Tree<Tensor>,
    O: Tree<Tensor>,
    F: FnOnce(I) -> Result<O>,
{
    let g = graph_of(primals, "jvp")?;
    if primals.paths() != tangents.paths() {
        return Err(Error::InvalidArgument(format!(
            "jvp: the tangents' leaves ({}) are not the primals' ({})",
            tangents.paths().join(", "),
            primals.paths().join(", ")
        )));
    }
    let x = primals.try_replace(|_, t| t.fresh())?;
    let wrt = x.flatten();
    let out = f(x)?;
    let outs = out.flatten();
    let ts = tangents.flatten();
    let t_out = g.jvp(&refs(&outs), &refs(&wrt), &refs(&ts))?;
    let t_out = out.rebuild(t_out)?;
    Ok((out, t_out))
}

/// `f(primals)` and its pullback (JAX's `jax.vjp`): a function from a cotangent of the
/// result (same structure and types) to the cotangent of the input (zeros at non-float
/// leaves).
pub fn vjp<I, O, F>(f: F, primals: &I) -> Result<(O, impl Fn(&O) -> Result<I>)>
where
    I: Tree<Tensor>,
    O: Tree<Tensor>,
    F: FnOnce(I) -> Result<O>,
{
    let g = graph_of(primals, "vjp")?;
    let x = primals.try_replace(|_, t| t.fresh())?;
    let template = x.try_replace(|_, t| Ok(t.clone()))?;
    let out = f(x)?;
    let outs = out.flatten();
    let out_paths = out.paths();
    let pullback = move |ct: &O| -> Result<I> {
        if ct.paths() != out_paths {
            return Err(Error::InvalidArgument(format!(
                "vjp: the cotangent's leaves ({}) are not the result's ({})",
                ct.paths().join(", "),
                out_paths.join(", ")
            )));
        }
        let cts = ct.flatten();
        let leaves = template.flatten();
        let floats: Vec<&Tensor> = leaves.iter().filter(|t| t.dtype().is_float()).collect();
        let mut found = g
            .vjp(
                &outs.iter().collect::<Vec<_>>(),
                &cts.iter().collect::<Vec<_>>(),
                &floats,
            )?
            .into_iter();
        template.try_replace(|_, t| match t.dtype().is_float() {
            true => found.next().ok_or_else(|| {
                Error::InvalidArgument("vjp: internal: a cotangent is missing".into())
            }),
            false => g.zeros(t.dtype(), t.dims()),
        })
    };
    Ok((out, pullback))
}

/// `f`, with what it computes recomputed in the backward pass instead of kept (JAX's
/// `jax.checkpoint`); see [`crate::ops::Graph::checkpoint`].
pub fn checkpoint<I, O, F>(f: F) -> impl Fn(I) -> Result<O>
where
    I: Tree<Tensor>,
    O: Tree<Tensor>,
    F: Fn(I) -> Result<O>,
{
    move |x| {
        let g = graph_of(&x, "checkpoint")?;
        let structure: RefCell<Option<O>> = RefCell::new(None);
        let flat = g.checkpoint(&x.flatten(), |leaves: &Vec<Tensor>| {
            let out = f(x.rebuild(leaves.iter().cloned())?)?;
            let flat = out.flatten();
            *structure.borrow_mut() = Some(out);
            Ok(flat)
        })?;
        let out = structure.into_inner().ok_or_else(|| {
            Error::InvalidArgument("checkpoint: internal: the function did not run".into())
        })?;
        out.rebuild(flat)
    }
}

/// References to each of `v`.
fn refs(v: &[Tensor]) -> Vec<&Tensor> {
    v.iter().collect()
}

/// `x` with its first argument's leaves replaced by fresh copies, those copies, and the first
/// argument's structure over them.
fn fresh_first<I: Args>(x: I) -> Result<(I, Vec<Tensor>, I::First)> {
    let x = x.try_replace(|path, t| match under(path, I::FIRST) {
        true => t.fresh(),
        false => Ok(t.clone()),
    })?;
    let template = x.first().try_replace(|_, t| Ok(t.clone()))?;
    let wrt = template.flatten();
    Ok((x, wrt, template))
}

/// [`value_and_grad_aux`] of one input.
fn value_and_grad_at<I: Args, A, F: Fn(I) -> Result<(Tensor, A)>>(
    f: &F,
    x: I,
) -> Result<((Tensor, A), I::First)> {
    let (x, wrt, template) = fresh_first(x)?;
    let (value, aux) = f(x)?;
    let grads = value.grad(&refs(&wrt))?;
    Ok(((value, aux), template.rebuild(grads)?))
}

/// The Jacobian of `f` with respect to the first argument, by forward or reverse products.
fn jacobian<I: Args, F: Fn(I) -> Result<Tensor>>(f: &F, x: I, forward: bool) -> Result<I::First> {
    let (x, wrt, template) = fresh_first(x)?;
    let g = graph_of(&wrt, if forward { "jacfwd" } else { "jacrev" })?;
    let out = f(x)?;
    let jacs = wrt
        .iter()
        .map(|w| match forward {
            true => g.jacfwd(&out, w),
            false => g.jacrev(&out, w),
        })
        .collect::<Result<Vec<_>>>()?;
    template.rebuild(jacs)
}
