//! Rules of the data-movement primitives: `Constant`, `Iota`, `BroadcastInDim`, `Reshape`,
//! `Transpose`, `Slice`, `Concatenate`, `Pad`, `Reverse` (and `OptimizationBarrier`'s VJP and
//! batching rules). Their type rules first, then their VJP rules, then their batching rules.

use super::batching::{front, shift, BatchStep, Batched};
use super::{arity, list, Rule};
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::autodiff::{scalar, Cotangents, Step};
use crate::ops::util::node;
use crate::ops::{Op, ReduceKind, Tensor};

/// `Constant`: no operands; `data` holds every element's bytes or one element's (a splat).
pub(super) fn constant(operands: &[&TensorType], data: &[u8], ty: TensorType) -> Rule<TensorType> {
    arity::<0>(operands)?;
    let size = ty.dtype.size_in_bytes();
    let full = ty
        .dims
        .iter()
        .try_fold(size, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("{ty} is too large to address"))?;
    if data.len() != full && data.len() != size {
        return Err(format!(
            "{} bytes do not fit {ty}: expected {full} (every element) or {size} (a splat)",
            data.len()
        ));
    }
    Ok(ty)
}

/// `Iota`: no operands; a numeric result whose dimension `dim` is counted.
pub(super) fn iota(operands: &[&TensorType], dim: usize, ty: TensorType) -> Rule<TensorType> {
    arity::<0>(operands)?;
    if ty.dtype == DType::Pred {
        return Err("iota needs a numeric dtype, not pred".to_string());
    }
    if dim >= ty.rank() {
        return Err(format!("dimension {dim} is out of range for {ty}"));
    }
    Ok(ty)
}

/// `BroadcastInDim`: operand dimension `i` becomes result dimension `dims[i]` (strictly
/// increasing), where it has size 1 or the result's size; same dtype.
pub(super) fn broadcast_in_dim(
    operands: &[&TensorType],
    dims: &[usize],
    to: TensorType,
) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    let fits = x.dtype == to.dtype
        && dims.len() == x.rank()
        && dims.windows(2).all(|w| w[0] < w[1])
        && dims
            .iter()
            .zip(&x.dims)
            .all(|(&d, &n)| to.dims.get(d).is_some_and(|&size| n == 1 || n == size));
    if !fits {
        return Err(format!(
            "cannot broadcast {x} to {to} along dimensions {dims:?}"
        ));
    }
    Ok(to)
}

/// `Reshape`: same dtype, same element count.
pub(super) fn reshape(operands: &[&TensorType], to: TensorType) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    let count = to.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if x.dtype != to.dtype || count != Some(x.element_count()) {
        return Err(format!("cannot reshape {x} to {to}"));
    }
    Ok(to)
}

/// `Transpose`: `perm` is a permutation of the operand's dimensions.
pub(super) fn transpose(operands: &[&TensorType], perm: &[usize]) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    let mut sorted = perm.to_vec();
    sorted.sort_unstable();
    if !sorted.iter().copied().eq(0..x.rank()) {
        return Err(format!("permutation {perm:?} does not fit {x}"));
    }
    let dims: Vec<usize> = perm.iter().map(|&p| x.dims[p]).collect();
    Ok(TensorType::new(x.dtype, &dims))
}

/// `Slice`: one `start <= limit <= size` and `stride >= 1` per dimension.
pub(super) fn slice(
    operands: &[&TensorType],
    start: &[usize],
    limit: &[usize],
    stride: &[usize],
) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    let r = x.rank();
    let ok = start.len() == r
        && limit.len() == r
        && stride.len() == r
        && (0..r).all(|i| start[i] <= limit[i] && limit[i] <= x.dims[i] && stride[i] >= 1);
    if !ok {
        return Err(format!(
            "start {start:?}, limit {limit:?}, stride {stride:?} do not fit {x}"
        ));
    }
    let dims: Vec<usize> = (0..r)
        .map(|i| (limit[i] - start[i]).div_ceil(stride[i]))
        .collect();
    Ok(TensorType::new(x.dtype, &dims))
}

/// `Concatenate`: one or more operands of one dtype and rank, equal sizes except along `axis`.
pub(super) fn concatenate(operands: &[&TensorType], axis: usize) -> Rule<TensorType> {
    let Some(first) = operands.first() else {
        return Err("needs at least one operand".to_string());
    };
    if axis >= first.rank() {
        return Err(format!("axis {axis} is out of range for {first}"));
    }
    let compatible = operands.iter().all(|t| {
        t.dtype == first.dtype
            && t.rank() == first.rank()
            && (0..first.rank()).all(|i| i == axis || t.dims[i] == first.dims[i])
    });
    if !compatible {
        return Err(format!(
            "cannot join [{}] along axis {axis}",
            list(operands.iter())
        ));
    }
    let mut dims = first.dims.clone();
    dims[axis] = operands
        .iter()
        .try_fold(0usize, |n, t| n.checked_add(t.dims[axis]))
        .ok_or_else(|| {
            format!(
                "joining [{}] along axis {axis} is too large",
                list(operands.iter())
            )
        })?;
    Ok(TensorType::new(first.dtype, &dims))
}

/// `Pad`: a rank-0 padding value of the operand's dtype; per dimension `low` and `high`
/// elements (negative crops) and `interior` between neighbours, leaving a size of at least 0.
pub(super) fn pad(
    operands: &[&TensorType],
    low: &[i64],
    high: &[i64],
    interior: &[usize],
) -> Rule<TensorType> {
    let [x, value] = arity(operands)?;
    let bad =
        |why: &str| format!("low {low:?}, high {high:?}, interior {interior:?} on {x}: {why}");
    let r = x.rank();
    if low.len() != r || high.len() != r || interior.len() != r {
        return Err(bad("one entry per dimension is needed"));
    }
    if value.rank() != 0 || value.dtype != x.dtype {
        return Err(bad(
            "the padding value must be a scalar of the operand's dtype",
        ));
    }
    let mut dims = Vec::with_capacity(r);
    for i in 0..r {
        // low + d + (d - 1) * interior + high, in i128 (checked: d and interior may be huge).
        let d = x.dims[i] as i128;
        let n = (d - 1)
            .max(0)
            .checked_mul(interior[i] as i128)
            .and_then(|gaps| gaps.checked_add(d))
            .and_then(|inner| inner.checked_add(i128::from(low[i])))
            .and_then(|n| n.checked_add(i128::from(high[i])))
            .ok_or_else(|| bad("a dimension would be too large"))?;
        if n < 0 {
            return Err(bad("a dimension would become negative"));
        }
        dims.push(usize::try_from(n).map_err(|_| bad("a dimension would be too large"))?);
    }
    Ok(TensorType::new(x.dtype, &dims))
}

/// `Reverse`: distinct axes of the operand; its type.
pub(super) fn reverse(operands: &[&TensorType], axes: &[usize]) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    let distinct = axes.iter().enumerate().all(|(i, a)| !axes[..i].contains(a));
    if !distinct || axes.iter().any(|&a| a >= x.rank()) {
        return Err(format!("axes {axes:?} are not distinct dimensions of {x}"));
    }
    Ok(x.clone())
}

// VJP rules: each moves the cotangent back to where the operand's elements were. `Constant`
// and `Iota` have no operands.

/// `BroadcastInDim`: the cotangent summed back to the operand's type, over the new dimensions
/// and over the stretched size-1 ones.
pub(super) fn broadcast_in_dim_vjp(s: &Step, dims: &[usize]) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let operand = s.inputs[0].ty();
    let mut summed: Vec<usize> = (0..ct.rank()).filter(|d| !dims.contains(d)).collect();
    for (i, &d) in dims.iter().enumerate() {
        if operand.dims[i] == 1 && ct.dims()[d] != 1 {
            summed.push(d);
        }
    }
    summed.sort_unstable();
    let reduced = if summed.is_empty() {
        ct.clone()
    } else {
        let op = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: summed,
        };
        node(ct.graph(), op, &[&ct], "grad", s.loc)?
    };
    let mut out = s.none();
    out[0] = Some(reduced.reshape_at(&operand.dims, s.loc)?);
    Ok(out)
}

/// `Reshape`: the cotangent reshaped back.
pub(super) fn reshape_vjp(s: &Step) -> Result<Cotangents> {
    let mut out = s.none();
    out[0] = Some(s.ct(0)?.reshape_at(s.inputs[0].dims(), s.loc)?);
    Ok(out)
}

/// `Transpose`: the cotangent transposed by the inverse permutation.
pub(super) fn transpose_vjp(s: &Step, perm: &[usize]) -> Result<Cotangents> {
    let mut inverse = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    let mut out = s.none();
    out[0] = Some(s.ct(0)?.transpose_at(&inverse, s.loc)?);
    Ok(out)
}

/// `Slice`: the cotangent padded with zeros back to the operand's shape (edges before and
/// after, `stride - 1` between the picked elements).
pub(super) fn slice_vjp(s: &Step, start: &[usize], stride: &[usize]) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let dims = s.inputs[0].dims();
    let mut high = Vec::with_capacity(dims.len());
    for d in 0..dims.len() {
        let (st, n) = (start[d], ct.dims()[d]);
        let end = if n == 0 {
            st
        } else {
            st + (n - 1) * stride[d] + 1
        };
        high.push((dims[d] - end) as i64);
    }
    let low: Vec<i64> = start.iter().map(|&v| v as i64).collect();
    let interior: Vec<usize> = stride.iter().map(|&v| v - 1).collect();
    let zero = scalar(&ct, 0.0, s)?;
    let mut out = s.none();
    out[0] = Some(ct.pad_with_at(&zero, &low, &high, &interior, s.loc)?);
    Ok(out)
}

/// `Concatenate`: each operand's part of the cotangent, sliced along `axis`.
pub(super) fn concatenate_vjp(s: &Step, axis: usize) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let mut out = s.none();
    let mut at = 0;
    for (k, t) in s.inputs.iter().enumerate() {
        let len = t.dims()[axis];
        if s.want[k] {
            let mut start = vec![0; ct.rank()];
            let mut limit = ct.dims().to_vec();
            start[axis] = at;
            limit[axis] = at + len;
            out[k] = Some(ct.slice_all_at(&start, &limit, &vec![1; ct.rank()], s.loc)?);
        }
        at += len;
    }
    Ok(out)
}

/// `Pad`: the operand's cotangent undoes the edges (cropping what was added, zero-filling what
/// was cropped), then keeps every `(interior + 1)`-th element; the padding value's is the sum
/// of the rest.
pub(super) fn pad_vjp(
    s: &Step,
    low: &[i64],
    high: &[i64],
    interior: &[usize],
) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let zero = scalar(&ct, 0.0, s)?;
    let neg = |v: &[i64]| v.iter().map(|&a| -a).collect::<Vec<i64>>();
    let unpadded = ct.pad_with_at(&zero, &neg(low), &neg(high), &vec![0; ct.rank()], s.loc)?;
    let stride: Vec<usize> = interior.iter().map(|&i| i + 1).collect();
    let operand = unpadded.slice_all_at(&vec![0; ct.rank()], unpadded.dims(), &stride, s.loc)?;
    let mut out = s.none();
    if s.want[1] {
        out[1] = Some(ct.sum_all()?.sub(&operand.sum_all()?)?);
    }
    out[0] = Some(operand);
    Ok(out)
}

/// `Reverse`: the cotangent reversed along the same axes.
pub(super) fn reverse_vjp(s: &Step, axes: &[usize]) -> Result<Cotangents> {
    let mut out = s.none();
    out[0] = Some(s.ct(0)?.reverse_at(axes, s.loc)?);
    Ok(out)
}

/// `OptimizationBarrier`: each output's cotangent is its input's, passed through a barrier of
/// their own (as JAX transposes it).
pub(super) fn optimization_barrier_vjp(s: &Step) -> Result<Cotangents> {
    let cts = (0..s.outputs.len())
        .map(|k| s.ct(k))
        .collect::<Result<Vec<_>>>()?;
    let passed = Tensor::optimization_barrier(&cts.iter().collect::<Vec<_>>())?;
    Ok(passed.into_iter().map(Some).collect())
}

// Batching rules: the batch is one more leading axis, so each rule shifts the primitive's
// axes past it. `Constant` and `Iota` have no operands, so are never batched.

/// `BroadcastInDim`: the batch maps to the result's axis 0.
pub(super) fn broadcast_in_dim_batch(s: &BatchStep, dims: &[usize]) -> Result<Vec<Batched>> {
    s.leading(Op::BroadcastInDim {
        dims: front(0, &shift(dims)),
    })
}

/// `Reshape`: the same reshape to the node's type with the batch in front.
pub(super) fn reshape_batch(s: &BatchStep) -> Result<Vec<Batched>> {
    s.leading(Op::Reshape)
}

/// `Transpose`: the batch stays first.
pub(super) fn transpose_batch(s: &BatchStep, perm: &[usize]) -> Result<Vec<Batched>> {
    s.leading(Op::Transpose {
        perm: front(0, &shift(perm)),
    })
}

/// `Slice`: the whole batch axis, step 1.
pub(super) fn slice_batch(
    s: &BatchStep,
    start: &[usize],
    limit: &[usize],
    stride: &[usize],
) -> Result<Vec<Batched>> {
    s.leading(Op::Slice {
        start: front(0, start),
        limit: front(s.b, limit),
        stride: front(1, stride),
    })
}

/// `Concatenate`: along the shifted axis, every operand batched.
pub(super) fn concatenate_batch(s: &BatchStep, axis: usize) -> Result<Vec<Batched>> {
    s.leading(Op::Concatenate { axis: axis + 1 })
}

/// `Pad`: no padding along the batch; the padding value stays a scalar, so a batched one has
/// no rule yet.
pub(super) fn pad_batch(
    s: &BatchStep,
    low: &[i64],
    high: &[i64],
    interior: &[usize],
) -> Result<Vec<Batched>> {
    if s.ins[1].1 {
        return Err(s.error("pad with a batched padding value has no batching rule yet"));
    }
    let op = Op::Pad {
        low: front(0, low),
        high: front(0, high),
        interior: front(0, interior),
    };
    s.make(op, &[&s.widened(0)?, &s.ins[1].0], true)
}

/// `Reverse`: the shifted axes.
pub(super) fn reverse_batch(s: &BatchStep, axes: &[usize]) -> Result<Vec<Batched>> {
    s.leading(Op::Reverse { axes: shift(axes) })
}

/// `OptimizationBarrier`: one barrier over every operand batched.
pub(super) fn optimization_barrier_batch(s: &BatchStep) -> Result<Vec<Batched>> {
    s.leading(Op::OptimizationBarrier)
}
