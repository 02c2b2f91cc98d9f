//! Rules of the reductions and scans along axes: `Reduce`, `ArgReduce`, `Cumsum`, `Sort`.
//! None is defined for pred (convert to a number first).

use super::{arity, list, Rule};
use crate::dtype::{DType, TensorType};
use crate::ops::util::scalar_bytes;
use crate::ops::ReduceKind;

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

/// `ArgReduce`: a number tensor with a non-empty `axis`, which leaves the shape; `i64`.
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
