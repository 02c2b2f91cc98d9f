//! Rules of the primitives that index by runtime values: `DynamicSlice`,
//! `DynamicUpdateSlice`, `Take`, `ScatterAdd`. Their type rules first, then their VJP rules.

use super::{arity, list, Rule};
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::autodiff::{zeros_like, Cotangents, Step};
use crate::ops::Tensor;

/// The start indices of a dynamic slice of `x`: one rank-0 integer per dimension, all of one
/// dtype.
fn check_starts(op: &str, x: &TensorType, starts: &[&TensorType]) -> Rule<()> {
    let int_scalars = starts
        .iter()
        .all(|s| s.rank() == 0 && s.dtype.is_int() && s.dtype == starts[0].dtype);
    if starts.len() != x.rank() || !int_scalars {
        return Err(format!(
            "{op} on {x} needs {} rank-0 integer start indices of one dtype, got [{}]",
            x.rank(),
            list(starts.iter())
        ));
    }
    Ok(())
}

/// `DynamicSlice`: the operand, then its start indices; a window of `sizes` (each at most the
/// operand's size) of the operand's dtype.
pub(super) fn dynamic_slice(operands: &[&TensorType], sizes: &[usize]) -> Rule<TensorType> {
    let Some((x, starts)) = operands.split_first() else {
        return Err("takes an operand and its start indices, got no operands".to_string());
    };
    check_starts("dynamic_slice", x, starts)?;
    if sizes.len() != x.rank() || sizes.iter().zip(&x.dims).any(|(s, d)| s > d) {
        return Err(format!("sizes {sizes:?} do not fit {x}"));
    }
    Ok(TensorType::new(x.dtype, sizes))
}

/// `DynamicUpdateSlice`: the operand, an update of its dtype and rank no larger than it, then
/// the start indices; the operand's type.
pub(super) fn dynamic_update_slice(operands: &[&TensorType]) -> Rule<TensorType> {
    let [x, update, starts @ ..] = operands else {
        return Err(format!(
            "takes an operand, an update and start indices, got {} operands",
            operands.len()
        ));
    };
    check_starts("dynamic_update_slice", x, starts)?;
    let fits = update.dtype == x.dtype
        && update.rank() == x.rank()
        && update.dims.iter().zip(&x.dims).all(|(u, d)| u <= d);
    if !fits {
        return Err(format!("update {update} does not fit into {x}"));
    }
    Ok((*x).clone())
}

/// `ScatterAdd`: a number table of rank 1 or more with at least one row, integer indices of any
/// shape `I`, and updates of the table's dtype and shape `I ++ table[1..]`; the table's type.
pub(super) fn scatter_add(operands: &[&TensorType]) -> Rule<TensorType> {
    let [table, indices, updates] = arity(operands)?;
    if table.rank() == 0 || table.dims[0] == 0 || !indices.dtype.is_int() {
        return Err(format!(
            "scatter_add needs a table of rank >= 1 with rows and integer indices, got table \
             {table} and indices {indices}"
        ));
    }
    if table.dtype == DType::Pred {
        return Err(format!("scatter_add adds numbers, not {table}"));
    }
    let mut dims = indices.dims.clone();
    dims.extend_from_slice(&table.dims[1..]);
    if updates.dtype != table.dtype || updates.dims != dims {
        return Err(format!(
            "the updates must be {} (the indices' shape, then the table's rows), got {updates}",
            TensorType::new(table.dtype, &dims)
        ));
    }
    Ok(table.clone())
}

/// `Take`: a table of rank 1 or more with at least one row, and integer indices of any shape
/// `I`; the table's dtype, shape `I ++ table[1..]`.
pub(super) fn take(operands: &[&TensorType]) -> Rule<TensorType> {
    let [table, indices] = arity(operands)?;
    if table.rank() == 0 || table.dims[0] == 0 || !indices.dtype.is_int() {
        return Err(format!(
            "take needs a table of rank >= 1 with rows and integer indices, got table {table} \
             and indices {indices}"
        ));
    }
    let mut dims = indices.dims.clone();
    dims.extend_from_slice(&table.dims[1..]);
    Ok(TensorType::new(table.dtype, &dims))
}

// VJP rules: each is the transpose of the indexing, at the same (clamped) indices; the
// indices themselves get none.

/// `DynamicSlice`: the cotangent written into zeros at the window.
pub(super) fn dynamic_slice_vjp(s: &Step) -> Result<Cotangents> {
    let starts: Vec<&Tensor> = s.inputs[1..].iter().collect();
    let zero = zeros_like(&s.inputs[0])?;
    let mut out = s.none();
    out[0] = Some(zero.dynamic_update_slice(&s.ct(0)?, &starts)?);
    Ok(out)
}

/// `DynamicUpdateSlice`: the operand's cotangent with the window zeroed; the update's, the
/// window of the cotangent.
pub(super) fn dynamic_update_slice_vjp(s: &Step) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let starts: Vec<&Tensor> = s.inputs[2..].iter().collect();
    let mut out = s.none();
    if s.want[0] {
        out[0] = Some(ct.dynamic_update_slice(&zeros_like(&s.inputs[1])?, &starts)?);
    }
    if s.want[1] {
        out[1] = Some(ct.dynamic_slice(&starts, s.inputs[1].dims())?);
    }
    Ok(out)
}

/// `Take`: the transpose of a gather, the cotangent rows added where they were picked.
pub(super) fn take_vjp(s: &Step) -> Result<Cotangents> {
    let zero = zeros_like(&s.inputs[0])?;
    let mut out = s.none();
    out[0] = Some(zero.index_add(&s.inputs[1], &s.ct(0)?)?);
    Ok(out)
}

/// `ScatterAdd`: the table's cotangent passes through; the updates', its rows at the indices.
pub(super) fn scatter_add_vjp(s: &Step) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let mut out = s.none();
    if s.want[2] {
        out[2] = Some(ct.take(&s.inputs[1])?);
    }
    out[0] = Some(ct);
    Ok(out)
}
