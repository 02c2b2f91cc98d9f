//! Elementwise ops: `Unary`, `Binary`, `Compare`, `Select`, `Clamp`, `Convert`, `BitcastConvert`.
//!
//! Operands have the types the ops' rules allow (checked before evaluation), so they already
//! have the output shape (broadcasting is explicit in the graph). `f16` and `bf16` values are
//! computed in `f32` and rounded back to nearest even.

use half::{bf16, f16};
use ndarray::{ArrayD, Zip};

use super::scalar::{Float, FromScalar, Int, Num, ToScalar};
use super::Ctx;
use crate::array::{HostArray, HostElement};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{BinaryOp, Comparison, UnaryOp};
use crate::with_host_array;

/// `f(a, b)` elementwise over two arrays of one shape (checked by the caller).
fn zip2<A: Copy, B: Copy, R>(a: &ArrayD<A>, b: &ArrayD<B>, f: impl Fn(A, B) -> R) -> ArrayD<R> {
    Zip::from(a).and(b).map_collect(|&x, &y| f(x, y))
}

/// `f(a, b, c)` elementwise over three arrays of one shape (checked by the caller).
fn zip3<A: Copy, B: Copy, C: Copy, R>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    c: &ArrayD<C>,
    f: impl Fn(A, B, C) -> R,
) -> ArrayD<R> {
    Zip::from(a)
        .and(b)
        .and(c)
        .map_collect(|&x, &y, &z| f(x, y, z))
}

fn int_unary<T: Int>(a: &ArrayD<T>, op: UnaryOp) -> Option<HostArray> {
    let f = T::unary_fn(op)?;
    Some(T::wrap(a.mapv(f)))
}

fn float_unary<T: Float>(a: &ArrayD<T>, op: UnaryOp) -> Option<HostArray> {
    let f = T::unary_fn(op)?;
    Some(T::wrap(a.mapv(f)))
}

/// `Unary`: the output has the operand's type.
pub(super) fn unary(ctx: &Ctx, op: UnaryOp) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    let half = <f32 as Float>::unary_fn(op);
    let result = match x {
        HostArray::Pred(a) => match op {
            UnaryOp::Not => Some(HostArray::from(a.mapv(|v| !v))),
            _ => None,
        },
        HostArray::U8(a) => int_unary(a, op),
        HostArray::U32(a) => int_unary(a, op),
        HostArray::U64(a) => int_unary(a, op),
        HostArray::I8(a) => int_unary(a, op),
        HostArray::I32(a) => int_unary(a, op),
        HostArray::I64(a) => int_unary(a, op),
        HostArray::F16(a) => half.map(|f| a.mapv(|v| f16::from_f32(f(v.to_f32()))).into()),
        HostArray::BF16(a) => half.map(|f| a.mapv(|v| bf16::from_f32(f(v.to_f32()))).into()),
        HostArray::F32(a) => float_unary(a, op),
        HostArray::F64(a) => float_unary(a, op),
    };
    result.ok_or_else(|| ctx.err(format!("{} is not defined for {}", op.name(), x.ty())))
}

fn int_binary<T: Int>(a: &ArrayD<T>, b: &HostArray, op: BinaryOp) -> Option<HostArray> {
    Some(T::wrap(zip2(a, T::peek(b)?, T::binary_fn(op))))
}

fn float_binary<T: Float>(a: &ArrayD<T>, b: &HostArray, op: BinaryOp) -> Option<HostArray> {
    Some(T::wrap(zip2(a, T::peek(b)?, T::binary_fn(op)?)))
}

/// `f16`/`bf16` binary op computed in `f32`.
fn narrow_binary<T: HostElement>(
    a: &ArrayD<T>,
    b: &HostArray,
    op: BinaryOp,
    widen: fn(T) -> f32,
    narrow: fn(f32) -> T,
) -> Option<HostArray> {
    let f = <f32 as Float>::binary_fn(op)?;
    Some(T::wrap(zip2(a, T::peek(b)?, |x, y| {
        narrow(f(widen(x), widen(y)))
    })))
}

/// `Binary`: both operands and the output have one type.
pub(super) fn binary(ctx: &Ctx, op: BinaryOp) -> Result<HostArray> {
    let args = ctx.args(2)?;
    let b = args[1];
    let result = match args[0] {
        HostArray::Pred(a) => {
            let f: Option<fn(bool, bool) -> bool> = match op {
                BinaryOp::And => Some(|x, y| x & y),
                BinaryOp::Or => Some(|x, y| x | y),
                BinaryOp::Xor => Some(|x, y| x ^ y),
                _ => None,
            };
            f.and_then(|f| Some(HostArray::from(zip2(a, bool::peek(b)?, f))))
        }
        HostArray::U8(a) => int_binary(a, b, op),
        HostArray::U32(a) => int_binary(a, b, op),
        HostArray::U64(a) => int_binary(a, b, op),
        HostArray::I8(a) => int_binary(a, b, op),
        HostArray::I32(a) => int_binary(a, b, op),
        HostArray::I64(a) => int_binary(a, b, op),
        HostArray::F16(a) => narrow_binary(a, b, op, f16::to_f32, f16::from_f32),
        HostArray::BF16(a) => narrow_binary(a, b, op, bf16::to_f32, bf16::from_f32),
        HostArray::F32(a) => float_binary(a, b, op),
        HostArray::F64(a) => float_binary(a, b, op),
    };
    result.ok_or_else(|| ctx.err(format!("{} is not defined for {}", op.name(), args[0].ty())))
}

/// The comparison function for `dir` (IEEE for floats: NaN compares unequal to everything).
fn comparison<T: PartialOrd>(dir: Comparison) -> fn(T, T) -> bool {
    match dir {
        Comparison::Eq => |a, b| a == b,
        Comparison::Ne => |a, b| a != b,
        Comparison::Lt => |a, b| a < b,
        Comparison::Le => |a, b| a <= b,
        Comparison::Gt => |a, b| a > b,
        Comparison::Ge => |a, b| a >= b,
    }
}

fn compare_as<T: HostElement + PartialOrd>(
    a: &ArrayD<T>,
    b: &HostArray,
    dir: Comparison,
) -> Option<ArrayD<bool>> {
    Some(zip2(a, T::peek(b)?, comparison(dir)))
}

fn compare_narrow<T: HostElement>(
    a: &ArrayD<T>,
    b: &HostArray,
    dir: Comparison,
    widen: fn(T) -> f32,
) -> Option<ArrayD<bool>> {
    let f = comparison::<f32>(dir);
    Some(zip2(a, T::peek(b)?, |x, y| f(widen(x), widen(y))))
}

/// `Compare`: two operands of one type; a `Pred` output of their shape.
pub(super) fn compare(ctx: &Ctx, dir: Comparison) -> Result<HostArray> {
    let args = ctx.args(2)?;
    let b = args[1];
    let result = match args[0] {
        HostArray::Pred(a) => compare_as(a, b, dir),
        HostArray::U8(a) => compare_as(a, b, dir),
        HostArray::U32(a) => compare_as(a, b, dir),
        HostArray::U64(a) => compare_as(a, b, dir),
        HostArray::I8(a) => compare_as(a, b, dir),
        HostArray::I32(a) => compare_as(a, b, dir),
        HostArray::I64(a) => compare_as(a, b, dir),
        HostArray::F16(a) => compare_narrow(a, b, dir, f16::to_f32),
        HostArray::BF16(a) => compare_narrow(a, b, dir, bf16::to_f32),
        HostArray::F32(a) => compare_as(a, b, dir),
        HostArray::F64(a) => compare_as(a, b, dir),
    };
    result
        .map(HostArray::from)
        .ok_or_else(|| ctx.err("operand dtypes differ"))
}

fn select_as<T: HostElement>(
    pred: &ArrayD<bool>,
    on_true: &ArrayD<T>,
    on_false: &HostArray,
) -> Option<HostArray> {
    let on_false = T::peek(on_false)?;
    Some(T::wrap(zip3(pred, on_true, on_false, |p, t, f| {
        if p {
            t
        } else {
            f
        }
    })))
}

/// `Select`: a `Pred` of the output's shape picks between two arrays of the output type.
pub(super) fn select(ctx: &Ctx) -> Result<HostArray> {
    let args = ctx.args(3)?;
    let HostArray::Pred(pred) = args[0] else {
        return Err(ctx.err("the predicate is not pred"));
    };
    with_host_array!(args[1], a => select_as(pred, a, args[2]))
        .ok_or_else(|| ctx.err("branch dtypes differ"))
}

fn clamp_num<T: Num>(lo: &ArrayD<T>, x: &HostArray, hi: &HostArray) -> Option<HostArray> {
    let (x, hi) = (T::peek(x)?, T::peek(hi)?);
    Some(T::wrap(zip3(lo, x, hi, |l, v, h| v.larger(l).smaller(h))))
}

fn clamp_narrow<T: HostElement>(
    lo: &ArrayD<T>,
    x: &HostArray,
    hi: &HostArray,
    widen: fn(T) -> f32,
    narrow: fn(f32) -> T,
) -> Option<HostArray> {
    let (x, hi) = (T::peek(x)?, T::peek(hi)?);
    Some(T::wrap(zip3(lo, x, hi, |l, v, h| {
        narrow(widen(v).larger(widen(l)).smaller(widen(h)))
    })))
}

/// `Clamp`: `min(max(x, lo), hi)` with the NaN-propagating max and min of `Binary`.
pub(super) fn clamp(ctx: &Ctx) -> Result<HostArray> {
    let args = ctx.args(3)?;
    let (x, hi) = (args[1], args[2]);
    let result = match args[0] {
        HostArray::Pred(_) => None,
        HostArray::U8(lo) => clamp_num(lo, x, hi),
        HostArray::U32(lo) => clamp_num(lo, x, hi),
        HostArray::U64(lo) => clamp_num(lo, x, hi),
        HostArray::I8(lo) => clamp_num(lo, x, hi),
        HostArray::I32(lo) => clamp_num(lo, x, hi),
        HostArray::I64(lo) => clamp_num(lo, x, hi),
        HostArray::F16(lo) => clamp_narrow(lo, x, hi, f16::to_f32, f16::from_f32),
        HostArray::BF16(lo) => clamp_narrow(lo, x, hi, bf16::to_f32, bf16::from_f32),
        HostArray::F32(lo) => clamp_num(lo, x, hi),
        HostArray::F64(lo) => clamp_num(lo, x, hi),
    };
    result.ok_or_else(|| ctx.err("operand dtypes differ"))
}

/// Converts every element of `x` to `to` (see [`FromScalar::from_scalar`] for the rules).
pub(super) fn convert_array(x: &HostArray, to: DType) -> HostArray {
    fn to_type<T: FromScalar>(x: &HostArray) -> HostArray {
        with_host_array!(x, a => T::wrap(a.mapv(|v| T::from_scalar(v.to_scalar()))))
    }
    match to {
        DType::Pred => to_type::<bool>(x),
        DType::U8 => to_type::<u8>(x),
        DType::U32 => to_type::<u32>(x),
        DType::U64 => to_type::<u64>(x),
        DType::I8 => to_type::<i8>(x),
        DType::I32 => to_type::<i32>(x),
        DType::I64 => to_type::<i64>(x),
        DType::F16 => to_type::<f16>(x),
        DType::BF16 => to_type::<bf16>(x),
        DType::F32 => to_type::<f32>(x),
        DType::F64 => to_type::<f64>(x),
    }
}

/// `Convert`: any dtype to any dtype, same shape.
pub(super) fn convert(ctx: &Ctx) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    Ok(convert_array(x, ctx.out()?.dtype))
}

/// `BitcastConvert`: reinterprets little-endian element bytes as another dtype of the same size
/// (never `Pred`).
pub(super) fn bitcast_convert(ctx: &Ctx) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    HostArray::from_bytes(ctx.out()?, &x.to_bytes()).map_err(|e| ctx.err(e))
}

#[cfg(test)]
mod tests {
    use std::slice::from_ref;

    use super::super::test_util::*;
    use crate::array::HostArray;
    use crate::dtype::DType;
    use crate::error::Error;
    use crate::ops::{BinaryOp, Comparison, Op, UnaryOp};
    use half::{bf16, f16};

    fn unary(op: UnaryOp, x: HostArray) -> HostArray {
        let t = x.ty();
        eval1(Op::Unary(op), &[x], t).unwrap()
    }

    fn binary(op: BinaryOp, a: HostArray, b: HostArray) -> HostArray {
        let t = a.ty();
        eval1(Op::Binary(op), &[a, b], t).unwrap()
    }

    #[test]
    fn unary_float_functions() {
        let x = vec1(vec![0.0f64, 1.0, 4.0]);
        assert_eq!(
            values::<f64>(&unary(UnaryOp::Sqrt, x.clone())),
            vec![0.0, 1.0, 2.0]
        );
        assert_eq!(
            values::<f64>(&unary(UnaryOp::Rsqrt, x.clone())),
            vec![f64::INFINITY, 1.0, 0.5]
        );
        assert_eq!(
            values::<f64>(&unary(UnaryOp::Exp, x.clone()))[1],
            1f64.exp()
        );
        assert_eq!(values::<f64>(&unary(UnaryOp::Expm1, x.clone()))[0], 0.0);
        assert_eq!(values::<f64>(&unary(UnaryOp::Log, x.clone()))[2], 4f64.ln());
        assert_eq!(
            values::<f64>(&unary(UnaryOp::Log1p, x.clone()))[1],
            2f64.ln()
        );
        assert_eq!(
            values::<f64>(&unary(UnaryOp::Tanh, x.clone()))[1],
            1f64.tanh()
        );
        assert_eq!(values::<f64>(&unary(UnaryOp::Logistic, x.clone()))[0], 0.5);
        assert_eq!(
            values::<f64>(&unary(UnaryOp::Sin, x.clone()))[1],
            1f64.sin()
        );
        assert_eq!(values::<f64>(&unary(UnaryOp::Cos, x))[0], 1.0);
        let y = vec1(vec![-1.5f32, 2.5, -0.0]);
        assert_eq!(
            values::<f32>(&unary(UnaryOp::Floor, y.clone())),
            vec![-2.0, 2.0, -0.0]
        );
        assert_eq!(
            values::<f32>(&unary(UnaryOp::Ceil, y.clone())),
            vec![-1.0, 3.0, -0.0]
        );
        assert_eq!(
            values::<f32>(&unary(UnaryOp::Abs, y.clone())),
            vec![1.5, 2.5, 0.0]
        );
        assert_eq!(
            f32_bits(&unary(UnaryOp::Neg, y)),
            [1.5f32, -2.5, 0.0].map(f32::to_bits).to_vec()
        );
    }

    #[test]
    fn sign_keeps_nan_and_signed_zero() {
        let x = vec1(vec![-3.0f32, 0.0, -0.0, f32::NAN, 7.0]);
        let s = values::<f32>(&unary(UnaryOp::Sign, x));
        assert_eq!(s[0], -1.0);
        assert_eq!(s[1].to_bits(), 0.0f32.to_bits());
        assert_eq!(s[2].to_bits(), (-0.0f32).to_bits());
        assert!(s[3].is_nan());
        assert_eq!(s[4], 1.0);
        let i = unary(UnaryOp::Sign, vec1(vec![-5i64, 0, 9]));
        assert_eq!(values::<i64>(&i), vec![-1, 0, 1]);
        let u = unary(UnaryOp::Sign, vec1(vec![0u8, 200]));
        assert_eq!(values::<u8>(&u), vec![0, 1]);
    }

    #[test]
    fn integer_unary_wraps() {
        let x = vec1(vec![i32::MIN, -3, 0, 5]);
        assert_eq!(
            values::<i32>(&unary(UnaryOp::Neg, x.clone())),
            vec![i32::MIN, 3, 0, -5]
        );
        assert_eq!(
            values::<i32>(&unary(UnaryOp::Abs, x.clone())),
            vec![i32::MIN, 3, 0, 5]
        );
        assert_eq!(
            values::<i32>(&unary(UnaryOp::Not, x)),
            vec![i32::MAX, 2, -1, -6]
        );
        assert_eq!(
            values::<u32>(&unary(UnaryOp::Neg, vec1(vec![1u32]))),
            vec![u32::MAX]
        );
        let p = unary(UnaryOp::Not, vec1(vec![true, false]));
        assert_eq!(values::<bool>(&p), vec![false, true]);
    }

    #[test]
    fn unary_undefined_for_dtype_is_an_error() {
        let r = eval1(
            Op::Unary(UnaryOp::Exp),
            &[vec1(vec![1i32])],
            ty(DType::I32, &[1]),
        );
        assert!(matches!(r, Err(Error::Interp(m)) if m.contains("exp is not defined for i32[1]")));
        let r = eval1(
            Op::Unary(UnaryOp::Not),
            &[vec1(vec![1.0f32])],
            ty(DType::F32, &[1]),
        );
        assert!(matches!(r, Err(Error::Interp(_))));
        let r = eval1(
            Op::Unary(UnaryOp::Neg),
            &[vec1(vec![true])],
            ty(DType::Pred, &[1]),
        );
        assert!(matches!(r, Err(Error::Interp(_))));
    }

    #[test]
    fn integer_binary_edge_cases() {
        let a = vec1(vec![7i32, -7, 5, i32::MIN, i32::MAX]);
        let b = vec1(vec![-2i32, 2, 0, -1, 1]);
        assert_eq!(
            values::<i32>(&binary(BinaryOp::Div, a.clone(), b.clone())),
            vec![-3, -3, -1, i32::MIN, i32::MAX]
        );
        assert_eq!(
            values::<i32>(&binary(BinaryOp::Rem, a.clone(), b.clone())),
            vec![1, -1, 5, 0, 0]
        );
        assert_eq!(
            values::<i32>(&binary(BinaryOp::Add, a.clone(), b.clone())),
            vec![5, -5, 5, i32::MAX, i32::MIN]
        );
        assert_eq!(
            values::<i32>(&binary(BinaryOp::Sub, a.clone(), b.clone())),
            vec![9, -9, 5, i32::MIN + 1, i32::MAX - 1]
        );
        assert_eq!(
            values::<i32>(&binary(BinaryOp::Mul, a.clone(), b.clone())),
            vec![-14, -14, 0, i32::MIN, i32::MAX]
        );
        assert_eq!(
            values::<i32>(&binary(BinaryOp::Max, a.clone(), b.clone())),
            vec![7, 2, 5, -1, i32::MAX]
        );
        assert_eq!(
            values::<i32>(&binary(BinaryOp::Min, a, b)),
            vec![-2, -7, 0, i32::MIN, 1]
        );
        let u = binary(
            BinaryOp::Div,
            vec1(vec![9u64, 9, 0]),
            vec1(vec![0u64, 4, 0]),
        );
        assert_eq!(values::<u64>(&u), vec![u64::MAX, 2, u64::MAX]);
        let u = binary(BinaryOp::Rem, vec1(vec![9u32, 9]), vec1(vec![0u32, 4]));
        assert_eq!(values::<u32>(&u), vec![9, 1]);
        let w = binary(BinaryOp::Add, vec1(vec![250u8]), vec1(vec![10u8]));
        assert_eq!(values::<u8>(&w), vec![4]);
    }

    #[test]
    fn integer_pow_and_shifts() {
        let p = binary(
            BinaryOp::Pow,
            vec1(vec![2i32, 2, 1, -1, -1, 0, 3, 2]),
            vec1(vec![10i32, -1, -7, -3, -2, -1, 0, 40]),
        );
        assert_eq!(values::<i32>(&p), vec![1024, 0, 1, -1, 1, 0, 1, 0]);
        let p = binary(BinaryOp::Pow, vec1(vec![3u8, 2]), vec1(vec![5u8, 9]));
        assert_eq!(values::<u8>(&p), vec![243, 0]);
        let s = binary(
            BinaryOp::ShiftLeft,
            vec1(vec![1i64, 1, 1, 3]),
            vec1(vec![63i64, 64, -1, 1]),
        );
        assert_eq!(values::<i64>(&s), vec![i64::MIN, 0, 0, 6]);
        let s = binary(
            BinaryOp::ShiftRightLogical,
            vec1(vec![-8i32, -8, -8, 8]),
            vec1(vec![1i32, 32, -1, 3]),
        );
        assert_eq!(values::<i32>(&s), vec![0x7FFF_FFFC, 0, 0, 1]);
        let s = binary(
            BinaryOp::ShiftLeft,
            vec1(vec![0xFFu8, 1]),
            vec1(vec![4u8, 8]),
        );
        assert_eq!(values::<u8>(&s), vec![0xF0, 0]);
    }

    #[test]
    fn bitwise_and_logical() {
        let a = vec1(vec![0b1100u8]);
        let b = vec1(vec![0b1010u8]);
        assert_eq!(
            values::<u8>(&binary(BinaryOp::And, a.clone(), b.clone())),
            vec![0b1000]
        );
        assert_eq!(
            values::<u8>(&binary(BinaryOp::Or, a.clone(), b.clone())),
            vec![0b1110]
        );
        assert_eq!(values::<u8>(&binary(BinaryOp::Xor, a, b)), vec![0b0110]);
        let p = vec1(vec![true, true, false, false]);
        let q = vec1(vec![true, false, true, false]);
        assert_eq!(
            values::<bool>(&binary(BinaryOp::And, p.clone(), q.clone())),
            vec![true, false, false, false]
        );
        assert_eq!(
            values::<bool>(&binary(BinaryOp::Or, p.clone(), q.clone())),
            vec![true, true, true, false]
        );
        assert_eq!(
            values::<bool>(&binary(BinaryOp::Xor, p.clone(), q.clone())),
            vec![false, true, true, false]
        );
        // Arithmetic, max and min included, is not defined for pred (the rule rejects it).
        for op in [BinaryOp::Add, BinaryOp::Max, BinaryOp::Min] {
            let r = eval1(
                Op::Binary(op),
                &[p.clone(), q.clone()],
                ty(DType::Pred, &[4]),
            );
            assert!(matches!(r, Err(Error::Interp(m)) if m.contains("not defined for pred[4]")));
        }
        let f = vec1(vec![1.0f32]);
        let r = eval1(
            Op::Binary(BinaryOp::ShiftLeft),
            &[f.clone(), f],
            ty(DType::F32, &[1]),
        );
        assert!(
            matches!(r, Err(Error::Interp(m)) if m.contains("shift_left is not defined for f32[1]"))
        );
    }

    #[test]
    fn float_binary_ieee() {
        let nan = f32::NAN;
        let a = vec1(vec![1.0f32, nan, -0.0, 5.5, -5.5, 1.0]);
        let b = vec1(vec![nan, 2.0, 0.0, 2.0, 2.0, 0.0]);
        let max = values::<f32>(&binary(BinaryOp::Max, a.clone(), b.clone()));
        assert!(max[0].is_nan() && max[1].is_nan());
        assert_eq!(max[2].to_bits(), 0.0f32.to_bits());
        let min = values::<f32>(&binary(BinaryOp::Min, a.clone(), b.clone()));
        assert!(min[0].is_nan() && min[1].is_nan());
        assert_eq!(min[2].to_bits(), (-0.0f32).to_bits());
        let rem = values::<f32>(&binary(BinaryOp::Rem, a.clone(), b.clone()));
        assert_eq!(&rem[3..5], &[1.5, -1.5]);
        assert!(rem[5].is_nan());
        let div = values::<f32>(&binary(BinaryOp::Div, a.clone(), b.clone()));
        assert_eq!(div[5], f32::INFINITY);
        let pow = binary(
            BinaryOp::Pow,
            vec1(vec![2.0f64, 4.0]),
            vec1(vec![-1.0f64, 0.5]),
        );
        assert_eq!(values::<f64>(&pow), vec![0.5, 2.0]);
        let sub = binary(BinaryOp::Sub, vec1(vec![1.0f64]), vec1(vec![0.25f64]));
        assert_eq!(values::<f64>(&sub), vec![0.75]);
    }

    #[test]
    fn half_precision_computes_in_f32_and_rounds() {
        // 2048 + 1 = 2049 is not an f16; it rounds to even (2048).
        let s = binary(BinaryOp::Add, f16s(&[2048.0, 2048.0]), f16s(&[1.0, 3.0]));
        assert_eq!(
            values::<f16>(&s),
            vec![f16::from_f32(2048.0), f16::from_f32(2052.0)]
        );
        // bf16 has 8 significant bits: 256 + 1 rounds to 256, 256 + 3 to 260.
        let s = binary(BinaryOp::Add, bf16s(&[256.0, 256.0]), bf16s(&[1.0, 3.0]));
        assert_eq!(
            values::<bf16>(&s),
            vec![bf16::from_f32(256.0), bf16::from_f32(260.0)]
        );
        // Overflow to infinity.
        let s = binary(BinaryOp::Mul, f16s(&[300.0]), f16s(&[300.0]));
        assert!(values::<f16>(&s)[0].is_infinite());
        // 1/3 rounded to f16.
        let d = binary(BinaryOp::Div, f16s(&[1.0]), f16s(&[3.0]));
        assert_eq!(values::<f16>(&d), vec![f16::from_f32(1.0 / 3.0)]);
        let e = unary(UnaryOp::Exp, bf16s(&[1.0]));
        assert_eq!(values::<bf16>(&e), vec![bf16::from_f32(1f32.exp())]);
        let m = binary(BinaryOp::Max, f16s(&[f32::NAN]), f16s(&[1.0]));
        assert!(values::<f16>(&m)[0].is_nan());
        let c = eval1(
            Op::Compare(Comparison::Lt),
            &[bf16s(&[1.0, f32::NAN]), bf16s(&[2.0, 2.0])],
            ty(DType::Pred, &[2]),
        )
        .unwrap();
        assert_eq!(values::<bool>(&c), vec![true, false]);
    }

    #[test]
    fn compare_with_nan_and_signed_zero() {
        let nan = f64::NAN;
        let a = vec1(vec![1.0f64, nan, nan, -0.0]);
        let b = vec1(vec![2.0f64, 1.0, nan, 0.0]);
        let cmp = |dir| {
            let r = eval1(
                Op::Compare(dir),
                &[a.clone(), b.clone()],
                ty(DType::Pred, &[4]),
            );
            values::<bool>(&r.unwrap())
        };
        assert_eq!(cmp(Comparison::Eq), vec![false, false, false, true]);
        assert_eq!(cmp(Comparison::Ne), vec![true, true, true, false]);
        assert_eq!(cmp(Comparison::Lt), vec![true, false, false, false]);
        assert_eq!(cmp(Comparison::Le), vec![true, false, false, true]);
        assert_eq!(cmp(Comparison::Gt), vec![false, false, false, false]);
        assert_eq!(cmp(Comparison::Ge), vec![false, false, false, true]);
        let r = eval1(
            Op::Compare(Comparison::Gt),
            &[vec1(vec![true, false]), vec1(vec![false, false])],
            ty(DType::Pred, &[2]),
        );
        assert_eq!(values::<bool>(&r.unwrap()), vec![true, false]);
        let r = eval1(
            Op::Compare(Comparison::Lt),
            &[vec1(vec![u64::MAX]), vec1(vec![1u64])],
            ty(DType::Pred, &[1]),
        );
        assert_eq!(values::<bool>(&r.unwrap()), vec![false]);
        // The output must be pred.
        let r = eval1(
            Op::Compare(Comparison::Lt),
            &[a.clone(), b.clone()],
            ty(DType::F64, &[4]),
        );
        assert!(matches!(r, Err(Error::Interp(_))));
    }

    #[test]
    fn select_and_clamp() {
        let p = arr(&[2, 2], vec![true, false, false, true]);
        let t = arr(&[2, 2], vec![1i64, 2, 3, 4]);
        let f = arr(&[2, 2], vec![-1i64, -2, -3, -4]);
        let s = eval1(Op::Select, &[p, t, f], ty(DType::I64, &[2, 2])).unwrap();
        assert_eq!(values::<i64>(&s), vec![1, -2, -3, 4]);

        let lo = vec1(vec![0.0f32, 0.0, 0.0, 0.0]);
        let x = vec1(vec![-1.0f32, 0.5, 2.0, f32::NAN]);
        let hi = vec1(vec![1.0f32, 1.0, 1.0, 1.0]);
        let c = eval1(Op::Clamp, &[lo, x, hi], ty(DType::F32, &[4])).unwrap();
        let c = values::<f32>(&c);
        assert_eq!(&c[..3], &[0.0, 0.5, 1.0]);
        assert!(c[3].is_nan());
        let c = eval1(
            Op::Clamp,
            &[
                vec1(vec![-2i32, -2]),
                vec1(vec![-5i32, 5]),
                vec1(vec![2i32, 2]),
            ],
            ty(DType::I32, &[2]),
        )
        .unwrap();
        assert_eq!(values::<i32>(&c), vec![-2, 2]);
        let c = eval1(
            Op::Clamp,
            &[f16s(&[0.0]), f16s(&[7.0]), f16s(&[3.0])],
            ty(DType::F16, &[1]),
        )
        .unwrap();
        assert_eq!(values::<f16>(&c), vec![f16::from_f32(3.0)]);
    }

    #[test]
    fn convert_rules() {
        let x = vec1(vec![-2.7f32, 2.7, f32::NAN, 1e10, -1e10, -0.0]);
        let to = |d: DType| eval1(Op::Convert, from_ref(&x), ty(d, &[6])).unwrap();
        assert_eq!(
            values::<i32>(&to(DType::I32)),
            vec![-2, 2, 0, i32::MAX, i32::MIN, 0]
        );
        assert_eq!(values::<u8>(&to(DType::U8)), vec![0, 2, 0, 255, 0, 0]);
        assert_eq!(
            values::<bool>(&to(DType::Pred)),
            vec![true, true, true, true, true, false]
        );
        let h = values::<f16>(&to(DType::F16));
        assert!(h[2].is_nan() && h[3].is_infinite() && h[4].is_infinite());
        assert_eq!(h[1], f16::from_f32(2.7));
        let p = eval1(
            Op::Convert,
            &[vec1(vec![true, false])],
            ty(DType::F64, &[2]),
        )
        .unwrap();
        assert_eq!(values::<f64>(&p), vec![1.0, 0.0]);
        let i = eval1(
            Op::Convert,
            &[vec1(vec![-1i64, 300, 16_777_217])],
            ty(DType::F32, &[3]),
        )
        .unwrap();
        assert_eq!(values::<f32>(&i), vec![-1.0, 300.0, 16_777_216.0]);
        let w = eval1(Op::Convert, &[vec1(vec![-1i64, 300])], ty(DType::U8, &[2])).unwrap();
        assert_eq!(values::<u8>(&w), vec![255, 44]);
        // bf16 rounds through f32 (as XLA does): 2^30 + 2^22 + 1 becomes the f32 2^30 + 2^22,
        // an exact bf16 tie, which rounds to the even 2^30 (a single rounding would give
        // 2^30 + 2^23).
        let v: i64 = (1 << 30) + (1 << 22) + 1;
        let b = eval1(Op::Convert, &[vec1(vec![v])], ty(DType::BF16, &[1])).unwrap();
        assert_eq!(values::<bf16>(&b)[0].to_f64(), f64::from(1u32 << 30));
        // f64 to f16 rounds through f32 too: 1 + 2^-11 + 2^-40 becomes the f32 1 + 2^-11, an
        // f16 tie, which rounds to the even 1 (a single rounding would give 1 + 2^-10).
        let v = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        let h = eval1(Op::Convert, &[vec1(vec![v])], ty(DType::F16, &[1])).unwrap();
        assert_eq!(values::<f16>(&h)[0].to_bits(), 0x3C00);
        // Shape must be kept.
        let r = eval1(Op::Convert, from_ref(&x), ty(DType::I32, &[3]));
        assert!(matches!(r, Err(Error::Interp(_))));
    }

    #[test]
    fn bitcast_convert_reinterprets_bytes() {
        let x = vec1(vec![1.0f32, -0.0]);
        let b = eval1(Op::BitcastConvert, &[x], ty(DType::U32, &[2])).unwrap();
        assert_eq!(values::<u32>(&b), vec![0x3F80_0000, 0x8000_0000]);
        let h = eval1(
            Op::BitcastConvert,
            &[HostArray::scalar(f16::from_f32(1.0))],
            ty(DType::BF16, &[]),
        )
        .unwrap();
        assert_eq!(values::<bf16>(&h)[0].to_bits(), 0x3C00);
        let r = eval1(
            Op::BitcastConvert,
            &[vec1(vec![1i32])],
            ty(DType::I64, &[1]),
        );
        assert!(
            matches!(r, Err(Error::Interp(m)) if m.contains("cannot reinterpret i32[1] as i64[1]"))
        );
        let r = eval1(
            Op::BitcastConvert,
            &[vec1(vec![1u8])],
            ty(DType::Pred, &[1]),
        );
        assert!(matches!(r, Err(Error::Interp(_))));
    }

    #[test]
    fn zero_size_and_rank_zero_elementwise() {
        let e = arr::<f32>(&[0, 3], vec![]);
        let r = eval1(Op::Binary(BinaryOp::Add), &[e.clone(), e.clone()], e.ty()).unwrap();
        assert_eq!(r, e);
        let s = eval1(
            Op::Binary(BinaryOp::Mul),
            &[HostArray::scalar(3i32), HostArray::scalar(-4i32)],
            ty(DType::I32, &[]),
        )
        .unwrap();
        assert_eq!(s, HostArray::scalar(-12i32));
    }
}
