//! MLIR spellings of tensor types and `dense<...>` constants.
//!
//! Small constants are written element by element so that people can read them: integers in
//! decimal, `Pred` as `true`/`false`, floats in the shortest decimal that parses back to the exact
//! bits (non-finite floats as their bit pattern, `0x7FC00000`). Large constants are written as one
//! hex string of their little-endian bytes, which MLIR reads as raw element data (one element's
//! bytes being a splat). `Pred` is never written in hex: MLIR's raw storage of `i1` differs between
//! versions.

use std::fmt::Write;

use half::{bf16, f16};

use crate::dtype::{DType, TensorType};

/// Constants with more elements than this (and not splats) are written as one hex string.
const MAX_LISTED_ELEMENTS: usize = 32;

/// `tensor<2x3xf32>`, or `tensor<f32>` for rank 0.
pub(super) fn tensor_type(ty: &TensorType) -> String {
    scalar_or_shaped(ty.dtype, &ty.dims)
}

/// `tensor<...>` of `dtype` with shape `dims`.
pub(super) fn scalar_or_shaped(dtype: DType, dims: &[usize]) -> String {
    let mut s = String::from("tensor<");
    for d in dims {
        let _ = write!(s, "{d}x");
    }
    s.push_str(dtype.mlir_name());
    s.push('>');
    s
}

/// `[1, 2, 3]`.
pub(super) fn int_list<T: std::fmt::Display>(values: &[T]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// `array<i64: 1, 2, 3>` (`array<i64>` when empty).
pub(super) fn i64_array<T: std::fmt::Display>(values: &[T]) -> String {
    if values.is_empty() {
        return "array<i64>".to_string();
    }
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("array<i64: {}>", items.join(", "))
}

/// `(a, b) -> c`: the functional type of an op.
pub(super) fn signature(operands: &[&TensorType], result: &TensorType) -> String {
    let ins: Vec<String> = operands.iter().map(|t| tensor_type(t)).collect();
    format!("({}) -> {}", ins.join(", "), tensor_type(result))
}

/// The comparison type StableHLO needs for `dtype`.
pub(super) fn compare_type(dtype: DType) -> &'static str {
    if dtype.is_float() {
        "FLOAT"
    } else if dtype.is_int() && !dtype.is_unsigned() {
        "SIGNED"
    } else {
        "UNSIGNED"
    }
}

/// The `dense<...>` attribute for constant `data` of type `ty` (every element's bytes, or one
/// element's bytes for a splat, as the constant's rule checked).
pub(super) fn dense(ty: &TensorType, data: &[u8]) -> String {
    let dtype = ty.dtype;
    let size = dtype.size_in_bytes();
    let count: usize = ty.dims.iter().product();
    if count == 0 {
        return "dense<>".to_string();
    }
    if data.len() == size {
        return format!("dense<{}>", element(dtype, data));
    }
    if data.chunks_exact(size).all(|e| e == &data[..size]) {
        return format!("dense<{}>", element(dtype, &data[..size]));
    }
    if count > MAX_LISTED_ELEMENTS && dtype != DType::Pred {
        let mut s = String::with_capacity(data.len() * 2 + 12);
        s.push_str("dense<\"0x");
        for b in data {
            let _ = write!(s, "{b:02X}");
        }
        s.push_str("\">");
        return s;
    }
    let elements: Vec<String> = data.chunks(size).map(|e| element(dtype, e)).collect();
    let mut s = String::from("dense<");
    nested(&mut s, &ty.dims, &elements);
    s.push('>');
    s
}

/// Writes `elements` (row-major, `dims` shape, non-empty) as nested bracketed lists.
fn nested(out: &mut String, dims: &[usize], elements: &[String]) {
    match dims.split_first() {
        None => out.push_str(elements.first().map_or("", |e| e.as_str())),
        Some((&n, rest)) => {
            let stride: usize = rest.iter().product();
            out.push('[');
            for i in 0..n {
                if i > 0 {
                    out.push_str(", ");
                }
                let from = (i * stride).min(elements.len());
                let to = ((i + 1) * stride).min(elements.len());
                nested(out, rest, &elements[from..to]);
            }
            out.push(']');
        }
    }
}

/// One element of `dtype` given its little-endian bytes (exactly `dtype.size_in_bytes()`).
pub(super) fn element(dtype: DType, bytes: &[u8]) -> String {
    let mut b = [0u8; 8];
    let n = bytes.len().min(8);
    b[..n].copy_from_slice(&bytes[..n]);
    let raw = u64::from_le_bytes(b);
    match dtype {
        DType::Pred => (raw != 0).to_string(),
        DType::U8 | DType::U32 | DType::U64 => raw.to_string(),
        DType::I8 => (raw as u8 as i8).to_string(),
        DType::I32 => (raw as u32 as i32).to_string(),
        DType::I64 => (raw as i64).to_string(),
        DType::F16 => float(
            f16::from_bits(raw as u16).to_f64(),
            raw,
            4,
            Some(|d| u64::from(f16::from_f64(d).to_bits())),
        ),
        DType::BF16 => float(
            bf16::from_bits(raw as u16).to_f64(),
            raw,
            4,
            Some(|d| u64::from(bf16::from_f64(d).to_bits())),
        ),
        DType::F32 => float(
            f64::from(f32::from_bits(raw as u32)),
            raw,
            8,
            Some(|d| u64::from((d as f32).to_bits())),
        ),
        DType::F64 => float(f64::from_bits(raw), raw, 16, None),
    }
}

/// The literal of the float whose exact value is `value` and whose bits are `bits`: the shortest
/// decimal that reads back as exactly these bits whichever way MLIR rounds it (straight to the
/// target type, or to `f64` first), else the bit pattern as hex with `hex_digits` digits.
///
/// `round` rounds an `f64` to the target type (to nearest, ties to even) and returns its bits;
/// `None` means the target is `f64` itself. A decimal `s` whose nearest `f64` is `d` lies between
/// `d`'s neighbours; when both neighbours and `d` round to `bits`, so does `s` itself (rounding is
/// monotonic).
fn float(value: f64, bits: u64, hex_digits: usize, round: Option<fn(f64) -> u64>) -> String {
    if value == 0.0 {
        // "0.0" and "-0.0" are exact whichever way they are read.
        return pretty_decimal(value);
    }
    if value.is_finite() {
        for precision in 0..=17 {
            let s = format!("{value:.precision$e}");
            let Ok(d) = s.parse::<f64>() else { continue };
            let exact = match round {
                None => d.to_bits() == bits,
                Some(round) => {
                    round(d) == bits
                        && round(next_toward(d, f64::NEG_INFINITY)) == bits
                        && round(next_toward(d, f64::INFINITY)) == bits
                }
            };
            if exact {
                return pretty_decimal(d);
            }
        }
    }
    format!("0x{bits:0hex_digits$X}")
}

/// The adjacent `f64` in the direction of `toward` (infinite); `d` is finite.
fn next_toward(d: f64, toward: f64) -> f64 {
    if d == 0.0 {
        let tiny = f64::from_bits(1);
        return if toward > 0.0 { tiny } else { -tiny };
    }
    let bits = d.to_bits();
    // Moving away from zero increments the magnitude bits; toward zero decrements them.
    let away = (toward > 0.0) == (d > 0.0);
    f64::from_bits(if away { bits + 1 } else { bits - 1 })
}

/// `d` in MLIR's float literal syntax (`1.5`, `-0.0`, `1.0e-07`), with the shortest digits that
/// read back as `d`.
fn pretty_decimal(d: f64) -> String {
    let magnitude = d.abs();
    if d == 0.0 || (1e-4..1e7).contains(&magnitude) {
        let mut s = format!("{d}");
        if !s.contains('.') {
            s.push_str(".0");
        }
        s
    } else {
        let s = format!("{d:e}");
        match s.split_once('e') {
            Some((mantissa, exponent)) if !mantissa.contains('.') => {
                format!("{mantissa}.0e{exponent}")
            }
            _ => s,
        }
    }
}

/// The element bytes of the identity or extreme values that reductions start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Special {
    /// 0 (`false`).
    Zero,
    /// 1 (`true`).
    One,
    /// -inf for floats, the minimum for integers, `false` for `Pred`.
    Lowest,
    /// +inf for floats, the maximum for integers, `true` for `Pred`.
    Highest,
}

/// The literal (as for one element of a `dense<...>`) of a special value of `dtype`.
pub(super) fn special(dtype: DType, which: Special) -> String {
    let bytes: Vec<u8> = match (dtype, which) {
        (DType::Pred, Special::Zero | Special::Lowest) => vec![0],
        (DType::Pred, Special::One | Special::Highest) => vec![1],
        (DType::U8, Special::Highest) => vec![u8::MAX],
        (DType::U32, Special::Highest) => u32::MAX.to_le_bytes().to_vec(),
        (DType::U64, Special::Highest) => u64::MAX.to_le_bytes().to_vec(),
        (DType::I8, Special::Lowest) => i8::MIN.to_le_bytes().to_vec(),
        (DType::I8, Special::Highest) => i8::MAX.to_le_bytes().to_vec(),
        (DType::I32, Special::Lowest) => i32::MIN.to_le_bytes().to_vec(),
        (DType::I32, Special::Highest) => i32::MAX.to_le_bytes().to_vec(),
        (DType::I64, Special::Lowest) => i64::MIN.to_le_bytes().to_vec(),
        (DType::I64, Special::Highest) => i64::MAX.to_le_bytes().to_vec(),
        (DType::F16, Special::Lowest) => f16::NEG_INFINITY.to_le_bytes().to_vec(),
        (DType::F16, Special::Highest) => f16::INFINITY.to_le_bytes().to_vec(),
        (DType::BF16, Special::Lowest) => bf16::NEG_INFINITY.to_le_bytes().to_vec(),
        (DType::BF16, Special::Highest) => bf16::INFINITY.to_le_bytes().to_vec(),
        (DType::F32, Special::Lowest) => f32::NEG_INFINITY.to_le_bytes().to_vec(),
        (DType::F32, Special::Highest) => f32::INFINITY.to_le_bytes().to_vec(),
        (DType::F64, Special::Lowest) => f64::NEG_INFINITY.to_le_bytes().to_vec(),
        (DType::F64, Special::Highest) => f64::INFINITY.to_le_bytes().to_vec(),
        (DType::F16, Special::One) => f16::ONE.to_le_bytes().to_vec(),
        (DType::BF16, Special::One) => bf16::ONE.to_le_bytes().to_vec(),
        (DType::F32, Special::One) => 1f32.to_le_bytes().to_vec(),
        (DType::F64, Special::One) => 1f64.to_le_bytes().to_vec(),
        // Integer one: the least significant byte is 1.
        (_, Special::One) => {
            let mut b = vec![0; dtype.size_in_bytes()];
            b[0] = 1;
            b
        }
        // Zero everywhere, and the unsigned minimum.
        (_, Special::Zero | Special::Lowest) => vec![0; dtype.size_in_bytes()],
    };
    element(dtype, &bytes)
}

/// A quiet NaN of a float `dtype`, as an element literal.
pub(super) fn nan(dtype: DType) -> String {
    match dtype {
        DType::F16 => element(dtype, &f16::NAN.to_le_bytes()),
        DType::BF16 => element(dtype, &bf16::NAN.to_le_bytes()),
        DType::F64 => element(dtype, &f64::NAN.to_le_bytes()),
        _ => element(dtype, &f32::NAN.to_le_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_lit(v: f32) -> String {
        element(DType::F32, &v.to_le_bytes())
    }

    #[test]
    fn floats_are_short_and_exact() {
        assert_eq!(f32_lit(1.0), "1.0");
        assert_eq!(f32_lit(-0.0), "-0.0");
        assert_eq!(f32_lit(0.1), "0.1");
        assert_eq!(f32_lit(1e-5), "1.0e-5");
        assert_eq!(f32_lit(2.5e10), "2.5e10");
        assert_eq!(f32_lit(f32::NAN), "0x7FC00000");
        assert_eq!(f32_lit(f32::NEG_INFINITY), "0xFF800000");
        assert_eq!(f32_lit(f32::MAX), "3.4028235e38");
        assert_eq!(f32_lit(f32::from_bits(1)), "1.0e-45");
        assert_eq!(element(DType::F64, &0.1f64.to_le_bytes()), "0.1");
        assert_eq!(
            element(DType::BF16, &bf16::from_f32(0.1).to_le_bytes()),
            "0.1"
        );
        assert_eq!(
            element(DType::F16, &f16::from_f32(-2.5).to_le_bytes()),
            "-2.5"
        );
        assert_eq!(element(DType::F16, &f16::INFINITY.to_le_bytes()), "0x7C00");
        assert_eq!(
            element(DType::F64, &f64::NEG_INFINITY.to_le_bytes()),
            "0xFFF0000000000000"
        );
        // Every f32 literal reads back as its own bits, through f64 or not.
        for bits in (0..u32::MAX).step_by(9_999_991) {
            let v = f32::from_bits(bits);
            let s = f32_lit(v);
            if v.is_finite() {
                assert_eq!(s.parse::<f32>().map(f32::to_bits), Ok(bits), "{s}");
                assert_eq!(s.parse::<f64>().map(|d| (d as f32).to_bits()), Ok(bits));
            }
        }
    }

    #[test]
    fn integers_and_preds() {
        assert_eq!(element(DType::I32, &(-7i32).to_le_bytes()), "-7");
        assert_eq!(
            element(DType::U64, &u64::MAX.to_le_bytes()),
            u64::MAX.to_string()
        );
        assert_eq!(element(DType::Pred, &[2]), "true");
        assert_eq!(special(DType::I64, Special::Lowest), i64::MIN.to_string());
        assert_eq!(special(DType::U32, Special::One), "1");
        assert_eq!(special(DType::BF16, Special::Lowest), "0xFF80");
    }

    #[test]
    fn dense_forms() {
        let t = TensorType::new(DType::I32, &[2, 2]);
        let data: Vec<u8> = [1i32, 2, 3, 4]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(dense(&t, &data), "dense<[[1, 2], [3, 4]]>");
        assert_eq!(dense(&t, &5i32.to_le_bytes()), "dense<5>");
        let same: Vec<u8> = [9i32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(dense(&t, &same), "dense<9>");
        let big = TensorType::new(DType::U8, &[40]);
        let bytes: Vec<u8> = (0..40).collect();
        assert!(dense(&big, &bytes).starts_with("dense<\"0x000102"));
        assert_eq!(dense(&TensorType::new(DType::F32, &[0, 3]), &[]), "dense<>");
        assert_eq!(
            tensor_type(&TensorType::new(DType::F32, &[])),
            "tensor<f32>"
        );
    }
}
