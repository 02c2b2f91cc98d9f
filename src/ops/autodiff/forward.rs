//! Forward-mode products and what they give: [`Graph::jvp`] (JAX's `jax.jvp`),
//! [`Tensor::hvp`] (Hessian-vector products), [`Graph::jacfwd`] and [`Graph::jacrev`].
//!
//! `jvp` transposes the VJP: for `y = f(x)` the VJP `u ↦ Jᵀu` is linear in the cotangent `u`,
//! so the tangent `J t` is the VJP of `⟨Jᵀu, t⟩` with respect to `u` (taken at `u = 0`). It is
//! exact and needs no rule beyond the reverse ones, so everything `grad` differentiates
//! (loops, conditionals, collectives) has a JVP too; it costs a backward pass and its
//! transpose, about three times the forward work where native forward rules would cost one.
//! The Jacobians are built one row (`jacrev`) or one column (`jacfwd`) at a time, unrolled in
//! the graph: meant for small ones (at most 4,096 products).

use std::panic::Location;

use super::{vjp_at, OP};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::graph::{graph_error, Graph};
use crate::ops::tensor::Tensor;
use crate::ops::util::Loc;

/// The most rows (`jacrev`) or columns (`jacfwd`) a Jacobian is built from.
pub(crate) const MAX_JACOBIAN_PRODUCTS: usize = 4096;

impl Graph {
    /// Forward-mode product: the tangent of each of `outputs` when `wrt` move along
    /// `tangents` (one per value of `wrt`, of its type): `Σᵢ ∂output/∂wrt[i] · tangents[i]`,
    /// new values of the graph with the outputs' types. `outputs` and `wrt` are float values
    /// of this graph. The primal outputs are `outputs` themselves (JAX's `jvp` returns both).
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F64, &[2])?;
    /// let t = g.parameter("t", DType::F64, &[2])?;
    /// let y = x.mul(&x)?; // x², so the tangent is 2 x t
    /// let dy = g.jvp(&[&y], &[&x], &[&t])?.remove(0);
    /// g.set_outputs(&[&dy])?;
    /// let ins = [HostArray::from_vec(&[2], vec![3.0f64, -1.0])?, HostArray::from_vec(&[2], vec![1.0f64, 0.5])?];
    /// assert_eq!(g.evaluate(&ins)?[0].to_f64_vec(), [6.0, -1.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn jvp(
        &self,
        outputs: &[&Tensor],
        wrt: &[&Tensor],
        tangents: &[&Tensor],
    ) -> Result<Vec<Tensor>> {
        jvp_at(self, outputs, wrt, tangents, Location::caller())
    }

    /// The Jacobian of `output` with respect to `wrt`, `output.dims ++ wrt.dims`, built from
    /// one VJP per element of `output` (JAX's `jacrev`).
    #[track_caller]
    pub fn jacrev(&self, output: &Tensor, wrt: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let along = Along {
            op: "jacrev",
            what: "the output",
            dims: output.dims(),
            dtype: output.dtype(),
        };
        let rows = self.along_basis(&along, wrt.dims(), output.dtype(), loc, |u| {
            Ok(vjp_at(self, &[output], &[u], &[wrt], loc)?.remove(0))
        })?; // [out..., wrt...] already
        let mut dims = output.dims().to_vec();
        dims.extend_from_slice(wrt.dims());
        rows.reshape_at(&dims, loc)
    }

    /// The Jacobian of `output` with respect to `wrt`, `output.dims ++ wrt.dims`, built from
    /// one JVP per element of `wrt` (JAX's `jacfwd`).
    #[track_caller]
    pub fn jacfwd(&self, output: &Tensor, wrt: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let along = Along {
            op: "jacfwd",
            what: "wrt",
            dims: wrt.dims(),
            dtype: wrt.dtype(),
        };
        let cols = self.along_basis(&along, output.dims(), output.dtype(), loc, |t| {
            Ok(jvp_at(self, &[output], &[wrt], &[t], loc)?.remove(0))
        })?; // [wrt..., out...]: the wrt axes go last
        let m = wrt.dims().iter().product::<usize>();
        let mut flat = vec![m as isize];
        flat.extend(output.dims().iter().map(|&d| d as isize));
        let r = output.rank() as isize;
        let perm: Vec<isize> = (1..=r).chain([0]).collect();
        let mut dims = output.dims().to_vec();
        dims.extend_from_slice(wrt.dims());
        cols.reshape(&flat)?
            .transpose(&perm)?
            .reshape_at(&dims, loc)
    }

    /// `product(e)` for every basis direction `e` of `along`, stacked in order:
    /// `along.dims ++ rest` (each product has the shape `rest`), zeros of `dtype` when either
    /// side is empty. At most [`MAX_JACOBIAN_PRODUCTS`] products.
    fn along_basis(
        &self,
        along: &Along,
        rest: &[usize],
        dtype: DType,
        loc: Loc,
        product: impl Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let n = along.dims.iter().product::<usize>();
        if n > MAX_JACOBIAN_PRODUCTS {
            return Err(graph_error(
                along.op,
                format!(
                    "{n} elements of {}: a Jacobian is built from one product each, at most \
                     {MAX_JACOBIAN_PRODUCTS}; use vjp or jvp with the directions you need",
                    along.what
                ),
                loc,
            ));
        }
        let mut dims = along.dims.to_vec();
        dims.extend_from_slice(rest);
        if n == 0 || rest.contains(&0) {
            return self.full_at(0.0, dtype, &dims, loc);
        }
        let basis = self.basis(n, along.dtype, loc)?;
        let parts = (0..n)
            .map(|e| {
                let direction = basis.narrow(0, e, 1)?.reshape_at(along.dims, loc)?;
                product(&direction)?.expand_dims(0)
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        let joined = match refs.as_slice() {
            [one] => (*one).clone(),
            _ => Tensor::concat(&refs, 0)?,
        };
        joined.reshape_at(&dims, loc)
    }

    /// The identity `[n, n]` in `dtype`: row `e` is the `e`-th basis vector.
    fn basis(&self, n: usize, dtype: DType, loc: Loc) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(graph_error(
                OP,
                format!("a Jacobian needs float values, got {dtype}"),
                loc,
            ));
        }
        let rows = self.iota(DType::I64, &[n, n], 0)?;
        let cols = self.iota(DType::I64, &[n, n], 1)?;
        rows.eq(&cols)?.convert(dtype)
    }
}

impl Tensor {
    /// The Hessian-vector product of this rank-0 float value: `Σⱼ ∂²self/∂wrt[i]∂wrt[j] ·
    /// vectors[j]` for each `i` (the gradient of `⟨∇self, v⟩`), new values with the types of
    /// `wrt`.
    #[track_caller]
    pub fn hvp(&self, wrt: &[&Tensor], vectors: &[&Tensor]) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        check_pairs("hvp", wrt, vectors, "vectors", loc)?;
        let grads = self.grad(wrt)?;
        match inner_product(&grads, vectors)? {
            Some(d) => d.grad(wrt),
            None => Ok(Vec::new()),
        }
    }
}

/// The side a Jacobian is built along: one product per element of it.
struct Along<'a> {
    /// The builder, for errors.
    op: &'static str,
    /// The side, for errors.
    what: &'static str,
    /// Its shape and dtype.
    dims: &'a [usize],
    dtype: DType,
}

/// The transformation behind [`Graph::jvp`].
pub(crate) fn jvp_at(
    g: &Graph,
    outputs: &[&Tensor],
    wrt: &[&Tensor],
    tangents: &[&Tensor],
    loc: Loc,
) -> Result<Vec<Tensor>> {
    check_pairs("jvp", wrt, tangents, "tangents", loc)?;
    // One placeholder cotangent per output; the VJP is linear in them.
    let us = outputs
        .iter()
        .map(|o| g.full_at(0.0, o.dtype(), o.dims(), loc))
        .collect::<Result<Vec<_>>>()?;
    let u_refs: Vec<&Tensor> = us.iter().collect();
    let pulled = vjp_at(g, outputs, &u_refs, wrt, loc)?;
    let Some(inner) = inner_product(&pulled, tangents)? else {
        return us
            .iter()
            .map(|u| g.full_at(0.0, u.dtype(), u.dims(), loc))
            .collect();
    };
    let one = g.full_at(1.0, inner.dtype(), &[], loc)?;
    vjp_at(g, &[&inner], &[&one], &u_refs, loc)
}

/// `Σᵢ sum(a[i] * b[i])`, a rank-0 value; `None` for no pairs.
fn inner_product(a: &[Tensor], b: &[&Tensor]) -> Result<Option<Tensor>> {
    let mut total: Option<Tensor> = None;
    for (x, y) in a.iter().zip(b) {
        let term = x.mul(*y)?.sum_all()?;
        total = Some(match total {
            None => term,
            Some(t) => t.add(&term)?,
        });
    }
    Ok(total)
}

/// Checks that `values` has one value of each of `wrt`'s types (`what` names them for `op`).
fn check_pairs(
    op: &'static str,
    wrt: &[&Tensor],
    values: &[&Tensor],
    what: &str,
    loc: Loc,
) -> Result<()> {
    if wrt.len() != values.len() {
        return Err(graph_error(
            op,
            format!(
                "{} values to differentiate by but {} {what}",
                wrt.len(),
                values.len()
            ),
            loc,
        ));
    }
    for (k, (w, v)) in wrt.iter().zip(values).enumerate() {
        if w.ty() != v.ty() {
            return Err(graph_error(
                op,
                format!(
                    "argument {k} is {} but its entry of {what} is {}",
                    w.ty(),
                    v.ty()
                ),
                loc,
            ));
        }
    }
    Ok(())
}
