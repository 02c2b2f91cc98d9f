//! Function transformations over trees, as in JAX: [`grad`], [`value_and_grad`] (and
//! [`value_and_grad_aux`], JAX's `has_aux`), [`grad_wrt`] (`argnums` by path), [`vmap`],
//! [`jvp`], [`vjp`], [`jacfwd`], [`jacrev`], [`hessian`], [`checkpoint`], [`custom_vjp`],
//! [`custom_jvp`] and [`stop_gradient`].
//!
//! Each takes a Rust function of a [`Tree`] of tensors (a tensor, a tuple of trees standing
//! for JAX's positional arguments, a `#[derive(Tree)]` struct, a `Vec`) and returns one, so
//! they compose as JAX's do: `vmap(grad(loss), (None, 0, 0))` is the per-example gradient,
//! as the parameters' tree with a batch axis in front. The functions trace: called on tensors
//! of a graph, they add nodes to it (under [`crate::jit::jit`], or on a [`crate::ops::Graph`]
//! you build), through the graph-level forms ([`crate::ops::Tensor::grad`],
//! [`crate::ops::Graph::vmap`], [`crate::ops::Graph::jvp`], ...), which stay for code that
//! works on flat lists of values.
//!
//! Which argument is differentiated: as in JAX, the first. A tuple input's first element
//! (`loss((params, x, y))` gives the gradient with respect to `params`); any other tree is the
//! one argument. [`grad_wrt`] selects leaves by path prefix instead.
//!
//! ```
//! use stablegraph::ops::{Graph, Tensor};
//! use stablegraph::transforms::{grad, vmap};
//! use stablegraph::tree::Tree;
//! use stablegraph::{DType, HostArray, Result};
//!
//! #[derive(Tree)]
//! struct Linear<T> {
//!     w: T,
//!     b: T,
//! }
//!
//! fn loss((p, x, y): (Linear<Tensor>, Tensor, Tensor)) -> Result<Tensor> {
//!     x.mul(&p.w)?.sum_all()?.add(&p.b)?.sub(&y)?.square()
//! }
//!
//! # fn main() -> Result<()> {
//! let g = Graph::new();
//! let p = Linear { w: g.parameter("w", DType::F64, &[3])?, b: g.parameter("b", DType::F64, &[])? };
//! let xs = g.parameter("xs", DType::F64, &[4, 3])?;
//! let ys = g.parameter("ys", DType::F64, &[4])?;
//! // One gradient per example, in the parameters' structure: w [4, 3], b [4].
//! let per_example = vmap(grad(loss), (None, 0, 0), 0)((p, xs, ys))?;
//! assert_eq!(per_example.w.dims(), &[4, 3]);
//! assert_eq!(per_example.b.dims(), &[4]);
//! # Ok(())
//! # }
//! ```

mod custom;
mod diff;
mod vmap;

pub use custom::{custom_jvp, custom_vjp, stop_gradient};
pub use diff::{
    checkpoint, grad, grad_wrt, hessian, jacfwd, jacrev, jvp, value_and_grad, value_and_grad_aux,
    vjp,
};
pub use vmap::{vmap, Axes, IntoAxes};

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::ops::{Graph, Tensor};
use crate::tree::Tree;

/// A function's input seen as JAX's positional arguments: the argument transformations such
/// as [`grad`] act on by default (`argnums=0`). A tuple's first element; any other tree is
/// its own first (and only) argument. `#[derive(Tree)]` implements it for `Name<Tensor>`.
pub trait Args: Tree<Tensor> {
    /// The first argument's type.
    type First: Tree<Tensor>;
    /// The path prefix of the first argument's leaves (`"0"` in a tuple, `""` otherwise).
    const FIRST: &'static str;
    /// The first argument.
    fn first(&self) -> &Self::First;
}

impl Args for Tensor {
    type First = Tensor;
    const FIRST: &'static str = "";
    fn first(&self) -> &Tensor {
        self
    }
}

impl<X: Tree<Tensor>> Args for Vec<X> {
    type First = Self;
    const FIRST: &'static str = "";
    fn first(&self) -> &Self {
        self
    }
}

impl<X: Tree<Tensor>> Args for BTreeMap<String, X> {
    type First = Self;
    const FIRST: &'static str = "";
    fn first(&self) -> &Self {
        self
    }
}

macro_rules! tuple_args {
    ($($x:ident),*) => {
        impl<A: Tree<Tensor>, $($x: Tree<Tensor>),*> Args for (A, $($x,)*) {
            type First = A;
            const FIRST: &'static str = "0";
            fn first(&self) -> &A {
                &self.0
            }
        }
    };
}

tuple_args!();
tuple_args!(B);
tuple_args!(B, C);
tuple_args!(B, C, D);
tuple_args!(B, C, D, E);
tuple_args!(B, C, D, E, F);

/// The graph a tree's tensors belong to; `what` names the transformation in the error of a
/// tree without leaves.
fn graph_of<T: Tree<Tensor>>(tree: &T, what: &str) -> Result<Graph> {
    tree.leaves()
        .first()
        .map(|t| t.graph().clone())
        .ok_or_else(|| Error::InvalidArgument(format!("{what}: the input has no tensors")))
}

/// Whether `path` is `prefix` or lies under it.
fn under(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'.'))
}
