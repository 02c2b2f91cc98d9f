//! Rules of the elementwise primitives: `Unary`, `Binary`, `Compare`, `Select`, `Clamp`,
//! `Convert`, `BitcastConvert`. Operands already have one shape (the builders broadcast).
//! Their type rules first, then their VJP rules, then their batching rule.

use super::batching::{BatchStep, Batched};
use super::{arity, list, Rule};
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::autodiff::{scalar, zeros_like, Cotangents, Step};
use crate::ops::{BinaryOp, Tensor, UnaryOp};

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

// VJP rules: the operands' cotangents from the result's (conventions at non-smooth points in
// `ops::autodiff`'s docs). `Compare` has none: its pred result carries no cotangent.

/// `Unary`: the cotangent of `x` for `y = op(x)`; none for the piecewise-constant functions.
pub(super) fn unary_vjp(s: &Step, op: UnaryOp) -> Result<Cotangents> {
    let (x, y, ct) = (&s.inputs[0], &s.outputs[0], &s.ct(0)?);
    let mut out = s.none();
    out[0] = Some(match op {
        UnaryOp::Neg => ct.neg()?,
        UnaryOp::Abs => ct.mul(&x.sign()?)?,
        UnaryOp::Exp => ct.mul(y)?,
        UnaryOp::Expm1 => ct.mul(&y.add(1.0)?)?,
        UnaryOp::Log => ct.div(x)?,
        UnaryOp::Log1p => ct.div(&x.add(1.0)?)?,
        UnaryOp::Sqrt => ct.div(&y.mul(2.0)?)?,
        UnaryOp::Rsqrt => ct.mul(&y.div(x)?.mul(-0.5)?)?,
        UnaryOp::Tanh => ct.mul(&y.mul(y)?.neg()?.add(1.0)?)?,
        UnaryOp::Logistic => ct.mul(&y.mul(&y.neg()?.add(1.0)?)?)?,
        UnaryOp::Sin => ct.mul(&x.cos()?)?,
        UnaryOp::Cos => ct.mul(&x.sin()?)?.neg()?,
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Sign | UnaryOp::Not => return Ok(out),
    });
    Ok(out)
}

/// `Binary`: the cotangents of `a` and `b` for `y = op(a, b)`; none for the logical ops.
pub(super) fn binary_vjp(s: &Step, op: BinaryOp) -> Result<Cotangents> {
    let (a, b, y, ct) = (&s.inputs[0], &s.inputs[1], &s.outputs[0], &s.ct(0)?);
    let want = |k: usize| s.want[k];
    let (da, db) = match op {
        BinaryOp::Add => (Some(ct.clone()), Some(ct.clone())),
        BinaryOp::Sub => (Some(ct.clone()), Some(ct.neg()?)),
        BinaryOp::Mul => (
            want(0).then(|| ct.mul(b)).transpose()?,
            want(1).then(|| ct.mul(a)).transpose()?,
        ),
        BinaryOp::Div => (
            want(0).then(|| ct.div(b)).transpose()?,
            want(1).then(|| ct.mul(y)?.div(b)?.neg()).transpose()?,
        ),
        BinaryOp::Pow => pow_vjp(s, a, b, y, ct)?,
        BinaryOp::Max | BinaryOp::Min => {
            // The cotangent goes to the operand that was picked, half to each on a tie.
            let picked = |p: &Tensor, q: &Tensor| -> Result<Tensor> {
                let half = p.eq(q)?.select(&scalar(y, 0.5, s)?, &scalar(y, 1.0, s)?)?;
                let share = p.eq(y)?.select(&half, 0.0)?;
                ct.mul(&share)
            };
            (
                want(0).then(|| picked(a, b)).transpose()?,
                want(1).then(|| picked(b, a)).transpose()?,
            )
        }
        BinaryOp::Rem => {
            // a - b trunc(a / b): d/db = -trunc(a / b).
            let db = if want(1) {
                let q = a.div(b)?;
                let trunc = q.sign()?.mul(&q.abs()?.floor()?)?;
                Some(ct.mul(&trunc)?.neg()?)
            } else {
                None
            };
            (Some(ct.clone()), db)
        }
        BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical => (None, None),
    };
    let mut out = s.none();
    out[0] = da;
    out[1] = db;
    Ok(out)
}

/// The cotangents of `a` and `b` for `y = a ^ b`: `d/da = b a^(b-1)`, 0 where `b = 0`;
/// `d/db = ln(a) a^b`, 0 where `a = 0` (JAX's).
fn pow_vjp(
    s: &Step,
    a: &Tensor,
    b: &Tensor,
    y: &Tensor,
    ct: &Tensor,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let da = if s.want[0] {
        let zero = zeros_like(a)?;
        let d = b.mul(&a.pow(&b.sub(1.0)?)?)?;
        Some(ct.mul(&b.eq(0.0)?.select(&zero, &d)?)?)
    } else {
        None
    };
    let db = if s.want[1] {
        let safe = a.eq(0.0)?.select(1.0, a)?;
        Some(ct.mul(&safe.log()?.mul(y)?)?)
    } else {
        None
    };
    Ok((da, db))
}

/// `Select`: the cotangent goes to the branch that was picked; none to the predicate.
pub(super) fn select_vjp(s: &Step) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let zero = zeros_like(&ct)?;
    let mut out = s.none();
    out[1] = Some(s.inputs[0].select(&ct, &zero)?);
    out[2] = Some(s.inputs[0].select(&zero, &ct)?);
    Ok(out)
}

/// `Clamp`: `y = min(max(x, lo), hi)` as JAX differentiates it: the cotangent goes to `x`
/// strictly inside `(lo, hi)`, else to the bound `x` is clamped to.
pub(super) fn clamp_vjp(s: &Step) -> Result<Cotangents> {
    let (lo, v, hi) = (&s.inputs[0], &s.inputs[1], &s.inputs[2]);
    let ct = s.ct(0)?;
    let zero = zeros_like(&ct)?;
    let inside = v.gt(lo)?.and(&v.lt(hi)?)?;
    let mut out = s.none();
    out[1] = Some(inside.select(&ct, &zero)?);
    out[0] = Some(lo.gt(v)?.and(&lo.lt(hi)?)?.select(&ct, &zero)?);
    out[2] = Some(hi.lt(v)?.select(&ct, &zero)?);
    Ok(out)
}

/// `Convert`: between floats, the cotangent converted back; none from or to other dtypes.
pub(super) fn convert_vjp(s: &Step) -> Result<Cotangents> {
    let (x, y) = (&s.inputs[0], &s.outputs[0]);
    let mut out = s.none();
    if x.dtype().is_float() && y.dtype().is_float() {
        out[0] = Some(s.ct(0)?.convert_at(x.dtype(), s.loc)?);
    }
    Ok(out)
}

/// `BitcastConvert`: not differentiable between floats; nothing flows through integers.
pub(super) fn bitcast_convert_vjp(s: &Step) -> Result<Cotangents> {
    if s.inputs[0].dtype().is_float() && s.outputs[0].dtype().is_float() {
        return Err(s.not_differentiable("reinterpreting float bits"));
    }
    Ok(s.none())
}

// Batching rule.

/// Every elementwise primitive: the same primitive on every operand batched (an unbatched one
/// repeated over the batch), its requested dtype kept.
pub(super) fn elementwise_batch(s: &BatchStep) -> Result<Vec<Batched>> {
    s.leading(s.node.op.clone())
}
