//! Rules of the reductions and scans along axes: `Reduce`, `ArgReduce`, `Cumsum`, `Sort`.
//! None is defined for pred (convert to a number first). Their type rules first, then their
//! VJP rules, then their batching rules.

use super::batching::{shift, BatchStep, Batched};
use super::{arity, list, Rule};
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::autodiff::{Cotangents, Step};
use crate::ops::util::{node, nodes, scalar_bytes, typed_node};
use crate::ops::{ArgKind, Op, ReduceKind, Tensor};

/// `axis` names a dimension of `x`.
fn check_axis(axis: usize, x: &TensorType) -> Rule<()> {
    if axis >= x.rank() {
        return Err(format!("axis {axis} is out of range for {x}"));
    }
    Ok(())
}

/// `Reduce`: a number tensor; `axes` sorted, distinct, in range, which leave the shape.
pub(super) fn reduce(
    operands: &[&TensorType],
    kind: ReduceKind,
    axes: &[usize],
) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    if x.dtype == DType::Pred {
        return Err(format!(
            "a {} reduction is not defined for {x}; convert to a number first",
            kind.name()
        ));
    }
    let sorted = axes.windows(2).all(|w| w[0] < w[1]);
    if !sorted || axes.iter().any(|&a| a >= x.rank()) {
        return Err(format!(
            "axes {axes:?} are not sorted, distinct dimensions of {x}"
        ));
    }
    let kept: Vec<usize> = (0..x.rank())
        .filter(|i| !axes.contains(i))
        .map(|i| x.dims[i])
        .collect();
    Ok(TensorType::new(x.dtype, &kept))
}

/// `ArgReduce`: a number tensor with a non-empty `axis`, which leaves the shape; the requested
/// integer dtype, which must hold every index along the axis.
pub(super) fn arg_reduce(
    operands: &[&TensorType],
    axis: usize,
    target: TensorType,
) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    check_axis(axis, x)?;
    if x.dtype == DType::Pred || x.dims[axis] == 0 {
        return Err(format!(
            "needs a numeric tensor with a non-empty axis {axis}, got {x}"
        ));
    }
    let mut dims = x.dims.clone();
    dims.remove(axis);
    // Every index along the axis must be a value of the index dtype.
    let last = (x.dims[axis] - 1) as f64;
    if target.dims != dims || !target.dtype.is_int() || scalar_bytes(last, target.dtype).is_err() {
        return Err(format!(
            "gives integer indices of shape {dims:?} in a dtype holding {last}, the last index \
             along axis {axis} of {x}; {target} was asked for"
        ));
    }
    Ok(target)
}

/// `Cumsum`: a number tensor and one of its axes; its type.
pub(super) fn cumsum(operands: &[&TensorType], axis: usize) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    check_axis(axis, x)?;
    if x.dtype == DType::Pred {
        return Err(format!("cumsum is not defined for {x}"));
    }
    Ok(x.clone())
}

/// `Sort`: number keys and an optional second operand of their shape (any dtype); their types.
pub(super) fn sort(operands: &[&TensorType], axis: usize) -> Rule {
    let Some((keys, rest)) = operands.split_first().filter(|(_, rest)| rest.len() <= 1) else {
        return Err(format!(
            "takes keys and at most one more operand, got {} ({})",
            operands.len(),
            list(operands.iter())
        ));
    };
    check_axis(axis, keys)?;
    if keys.dtype == DType::Pred {
        return Err(format!("cannot sort {keys}"));
    }
    if let Some(other) = rest.first().filter(|t| t.dims != keys.dims) {
        return Err(format!(
            "the second operand {other} does not have the keys' shape {keys}"
        ));
    }
    Ok(operands.iter().map(|&t| t.clone()).collect())
}

// VJP rules. `ArgReduce` has none: its integer result carries no cotangent.

/// `t` (reduced over `axes` of a tensor of `full`'s type) broadcast back to `full`'s shape.
fn rebroadcast(t: &Tensor, full: &Tensor, axes: &[usize], s: &Step) -> Result<Tensor> {
    let kept: Vec<usize> = (0..full.rank()).filter(|d| !axes.contains(d)).collect();
    typed_node(
        t.graph(),
        Op::BroadcastInDim { dims: kept },
        &[t],
        TensorType::new(t.dtype(), full.dims()),
        "grad",
        s.loc,
    )
}

/// `t` reduced by `kind` over `axes`, a node of the gradient.
fn reduce_over(t: &Tensor, kind: ReduceKind, axes: &[usize], s: &Step) -> Result<Tensor> {
    let op = Op::Reduce {
        kind,
        axes: axes.to_vec(),
    };
    node(t.graph(), op, &[t], "grad", s.loc)
}

/// `Reduce`: the cotangent of `x` for `y = reduce(kind, x, axes)`: broadcast back for a sum,
/// times the product of the others for a product, shared evenly among the elements equal to
/// the extreme for a maximum or minimum.
pub(super) fn reduce_vjp(s: &Step, kind: ReduceKind, axes: &[usize]) -> Result<Cotangents> {
    let (x, y, ct) = (&s.inputs[0], &s.outputs[0], &s.ct(0)?);
    let ct_b = rebroadcast(ct, x, axes, s)?;
    let dx = match kind {
        ReduceKind::Sum => ct_b,
        ReduceKind::Prod => ct_b.mul(&product_of_others(s, axes)?)?,
        ReduceKind::Max | ReduceKind::Min => {
            let hit = x
                .eq(&rebroadcast(y, x, axes, s)?)?
                .convert_at(x.dtype(), s.loc)?;
            let count = rebroadcast(&reduce_over(&hit, ReduceKind::Sum, axes, s)?, x, axes, s)?;
            ct_b.mul(&hit)?.div(&count)?
        }
    };
    let mut out = s.none();
    out[0] = Some(dx);
    Ok(out)
}

/// For `y = prod(x, axes)`, each element's product of the others along `axes`: `y / x` where
/// no element is zero; with one zero, the product of the non-zero elements at the zero and 0
/// elsewhere; with more, 0.
fn product_of_others(s: &Step, axes: &[usize]) -> Result<Tensor> {
    let (x, y) = (&s.inputs[0], &s.outputs[0]);
    let is_zero = x.eq(0.0)?;
    let zeros = reduce_over(
        &is_zero.convert_at(x.dtype(), s.loc)?,
        ReduceKind::Sum,
        axes,
        s,
    )?;
    let nonzero = is_zero.select(1.0, x)?;
    let prod_nonzero = reduce_over(&nonzero, ReduceKind::Prod, axes, s)?;
    let zeros_b = rebroadcast(&zeros, x, axes, s)?;
    let y_b = rebroadcast(y, x, axes, s)?;
    let p_b = rebroadcast(&prod_nonzero, x, axes, s)?;
    let none = y_b.div(&nonzero)?;
    let one = is_zero.select(&p_b, 0.0)?;
    zeros_b
        .eq(0.0)?
        .select(&none, &zeros_b.eq(1.0)?.select(&one, 0.0)?)
}

/// `Cumsum`: the running sum of the cotangent from last to first.
pub(super) fn cumsum_vjp(s: &Step, axis: usize) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let mut out = s.none();
    out[0] = Some(
        ct.reverse_at(&[axis], s.loc)?
            .cumsum(axis as isize)?
            .reverse_at(&[axis], s.loc)?,
    );
    Ok(out)
}

/// `Sort`: the permutation the sort applied, from sorting the keys with their positions;
/// sorting it back (with each result's cotangent alongside) undoes it.
pub(super) fn sort_vjp(s: &Step, axis: usize, descending: bool) -> Result<Cotangents> {
    let keys = &s.inputs[0];
    let positions = keys.graph().iota(DType::I32, keys.dims(), axis as isize)?;
    let op = Op::Sort { axis, descending };
    let perm = nodes(keys.graph(), op, &[keys, &positions], None, "grad", s.loc)?.remove(1);
    let back = Op::Sort {
        axis,
        descending: false,
    };
    let mut out = s.none();
    for (k, slot) in out.iter_mut().enumerate() {
        if s.want[k] && s.cts[k].is_some() {
            let ct = s.ct(k)?;
            let restored = nodes(
                keys.graph(),
                back.clone(),
                &[&perm, &ct],
                None,
                "grad",
                s.loc,
            )?
            .remove(1);
            *slot = Some(restored);
        }
    }
    Ok(out)
}

// Batching rules: the same primitive along the axes shifted past the batch (axis 0).

/// `Reduce`: over the shifted axes; the batch stays.
pub(super) fn reduce_batch(
    s: &BatchStep,
    kind: ReduceKind,
    axes: &[usize],
) -> Result<Vec<Batched>> {
    s.leading(Op::Reduce {
        kind,
        axes: shift(axes),
    })
}

/// `ArgReduce`: along the shifted axis, in the node's index dtype.
pub(super) fn arg_reduce_batch(s: &BatchStep, kind: ArgKind, axis: usize) -> Result<Vec<Batched>> {
    s.leading(Op::ArgReduce {
        kind,
        axis: axis + 1,
    })
}

/// `Cumsum`: along the shifted axis.
pub(super) fn cumsum_batch(s: &BatchStep, axis: usize) -> Result<Vec<Batched>> {
    s.leading(Op::Cumsum { axis: axis + 1 })
}

/// `Sort`: along the shifted axis, keys and the permuted operand both batched.
pub(super) fn sort_batch(s: &BatchStep, axis: usize, descending: bool) -> Result<Vec<Batched>> {
    s.leading(Op::Sort {
        axis: axis + 1,
        descending,
    })
}
