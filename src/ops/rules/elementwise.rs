//! Rules of the elementwise primitives: `Unary`, `Binary`, `Compare`, `Select`, `Clamp`,
//! `Convert`, `BitcastConvert`. Operands already have one shape (the builders broadcast).

use super::{arity, list, Rule};
use crate::dtype::{DType, TensorType};
use crate::ops::{BinaryOp, UnaryOp};

/// Which dtypes a unary op is defined for: `not` for pred and integers, `neg`, `abs` and
/// `sign` for every number, the others for floats.
fn unary_accepts(u: UnaryOp, d: DType) -> bool {
    match u {
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => d != DType::Pred,
        UnaryOp::Not => d == DType::Pred || d.is_int(),
        _ => d.is_float(),
    }
}

/// Which dtypes a binary op is defined for: the logical ops for pred and integers, shifts for
/// integers, the arithmetic ones (`max` and `min` included) for every number.
fn binary_accepts(b: BinaryOp, d: DType) -> bool {
    match b {
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => d == DType::Pred || d.is_int(),
        BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => d.is_int(),
        _ => d != DType::Pred,
    }
}

/// `Unary`: the operand's type.
pub(super) fn unary(operands: &[&TensorType], u: UnaryOp) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    if !unary_accepts(u, x.dtype) {
        return Err(format!("{} is not defined for {x}", u.name()));
    }
    Ok(x.clone())
}

/// `Binary`: two operands of one type, which is the result's.
pub(super) fn binary(operands: &[&TensorType], b: BinaryOp) -> Rule<TensorType> {
    let [x, y] = arity(operands)?;
    if x != y {
        return Err(format!("operands {x}, {y} differ in type"));
    }
    if !binary_accepts(b, x.dtype) {
        return Err(format!("{} is not defined for {x}", b.name()));
    }
    Ok(x.clone())
}

/// `Compare`: two operands of one type (any); a pred of their shape.
pub(super) fn compare(operands: &[&TensorType]) -> Rule<TensorType> {
    let [x, y] = arity(operands)?;
    if x != y {
        return Err(format!("operands {x}, {y} differ in type"));
    }
    Ok(TensorType::new(DType::Pred, &x.dims))
}

/// `Select`: a pred condition and two branches, all of one shape; the branches' type.
pub(super) fn select(operands: &[&TensorType]) -> Rule<TensorType> {
    let [c, t, f] = arity(operands)?;
    if t != f {
        return Err(format!(
            "the branches {t}, {f} differ in type; convert one explicitly"
        ));
    }
    let want = TensorType::new(DType::Pred, &t.dims);
    if *c != want {
        return Err(format!("the condition must be {want}, got {c}"));
    }
    Ok(t.clone())
}

/// `Clamp`: `lo`, `x`, `hi` of one numeric type, which is the result's.
pub(super) fn clamp(operands: &[&TensorType]) -> Rule<TensorType> {
    let [lo, x, hi] = arity(operands)?;
    if lo != x || hi != x || x.dtype == DType::Pred {
        return Err(format!(
            "clamp needs lo, x and hi of one numeric type, got {}",
            list(operands.iter())
        ));
    }
    Ok(x.clone())
}

/// `Convert`: any dtype to any dtype, same shape.
pub(super) fn convert(operands: &[&TensorType], to: TensorType) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    if x.dims != to.dims {
        return Err(format!("cannot convert {x} to {to}: the shapes differ"));
    }
    Ok(to)
}

/// `BitcastConvert`: same shape, another dtype of the same element size; never pred (whose
/// bit width is 1).
pub(super) fn bitcast_convert(operands: &[&TensorType], to: TensorType) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    let (from, into) = (x.dtype, to.dtype);
    let why = if x.dims != to.dims {
        Some("the shapes differ")
    } else if from == DType::Pred || into == DType::Pred {
        Some("pred has no bit layout")
    } else if from.size_in_bytes() != into.size_in_bytes() {
        Some("the element sizes differ")
    } else {
        None
    };
    match why {
        Some(why) => Err(format!("cannot reinterpret {x} as {to}: {why}")),
        None => Ok(to),
    }
}
