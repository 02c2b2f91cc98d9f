//! Scalar arithmetic: XLA's integer rules, IEEE float rules, conversions and the sort order.

use std::cmp::Ordering;

use half::{bf16, f16};

use crate::array::HostElement;
use crate::ops::{BinaryOp, UnaryOp};

/// Numbers that sums, products, maxima and minima combine (integers wrap; floats are IEEE with
/// NaN-propagating max/min). The additive identity is [`crate::dtype::Element::ZERO`].
pub(super) trait Num: HostElement + PartialOrd {
    /// Multiplicative identity.
    const ONE: Self;
    /// Identity of [`Num::larger`]: -inf, or the type's minimum.
    const LOWEST: Self;
    /// Identity of [`Num::smaller`]: +inf, or the type's maximum.
    const HIGHEST: Self;
    /// `a + b`.
    fn plus(self, other: Self) -> Self;
    /// `a * b`.
    fn times(self, other: Self) -> Self;
    /// The larger of two values; NaN if either is NaN; `+0.0` above `-0.0`.
    fn larger(self, other: Self) -> Self;
    /// The smaller of two values; NaN if either is NaN; `-0.0` below `+0.0`.
    fn smaller(self, other: Self) -> Self;
}

/// Integer elementwise functions with XLA's definitions.
pub(super) trait Int: Num {
    /// The function of a unary op, or `None` if the op is not defined on integers.
    fn unary_fn(op: UnaryOp) -> Option<fn(Self) -> Self>;
    /// The function of a binary op (all are defined on integers).
    fn binary_fn(op: BinaryOp) -> fn(Self, Self) -> Self;
}

/// Float elementwise functions (for `f32` and `f64`; narrower floats compute in `f32`).
pub(super) trait Float: Num {
    /// The function of a unary op, or `None` if the op is not defined on floats.
    fn unary_fn(op: UnaryOp) -> Option<fn(Self) -> Self>;
    /// The function of a binary op, or `None` if the op is not defined on floats.
    fn binary_fn(op: BinaryOp) -> Option<fn(Self, Self) -> Self>;
}

macro_rules! int_num {
    ($t:ty) => {
        impl Num for $t {
            const ONE: Self = 1;
            const LOWEST: Self = <$t>::MIN;
            const HIGHEST: Self = <$t>::MAX;
            fn plus(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn times(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            fn larger(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            fn smaller(self, other: Self) -> Self {
                Ord::min(self, other)
            }
        }
    };
}

/// `base ^ exp` with wrapping multiplication, by repeated squaring.
fn wrapping_power<T: Num>(base: T, mut exp: u64) -> T {
    let mut acc = T::ONE;
    let mut square = base;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.times(square);
        }
        square = square.times(square);
        exp >>= 1;
    }
    acc
}

macro_rules! signed_int {
    ($t:ty, $u:ty) => {
        int_num!($t);
        impl Int for $t {
            fn unary_fn(op: UnaryOp) -> Option<fn(Self) -> Self> {
                let f: fn(Self) -> Self = match op {
                    UnaryOp::Neg => <$t>::wrapping_neg,
                    UnaryOp::Abs => <$t>::wrapping_abs,
                    UnaryOp::Sign => <$t>::signum,
                    UnaryOp::Not => |x| !x,
                    _ => return None,
                };
                Some(f)
            }
            fn binary_fn(op: BinaryOp) -> fn(Self, Self) -> Self {
                match op {
                    BinaryOp::Add => <$t>::wrapping_add,
                    BinaryOp::Sub => <$t>::wrapping_sub,
                    BinaryOp::Mul => <$t>::wrapping_mul,
                    // x / 0 = -1; MIN / -1 = MIN (wrapping).
                    BinaryOp::Div => |a, b| if b == 0 { -1 } else { a.wrapping_div(b) },
                    // x % 0 = x; MIN % -1 = 0.
                    BinaryOp::Rem => |a, b| if b == 0 { a } else { a.wrapping_rem(b) },
                    BinaryOp::Pow => |a, b| {
                        if b >= 0 {
                            wrapping_power(a, b as u64)
                        } else {
                            match a {
                                1 => 1,
                                -1 if b & 1 == 1 => -1,
                                -1 => 1,
                                _ => 0,
                            }
                        }
                    },
                    BinaryOp::Max => Ord::max,
                    BinaryOp::Min => Ord::min,
                    BinaryOp::And => |a, b| a & b,
                    BinaryOp::Or => |a, b| a | b,
                    BinaryOp::Xor => |a, b| a ^ b,
                    BinaryOp::ShiftLeft => |a, b| {
                        if b < 0 || b as u64 >= u64::from(<$t>::BITS) {
                            0
                        } else {
                            a << b
                        }
                    },
                    BinaryOp::ShiftRightLogical => |a, b| {
                        if b < 0 || b as u64 >= u64::from(<$t>::BITS) {
                            0
                        } else {
                            ((a as $u) >> b) as $t
                        }
                    },
                }
            }
        }
    };
}

macro_rules! unsigned_int {
    ($t:ty) => {
        int_num!($t);
        impl Int for $t {
            fn unary_fn(op: UnaryOp) -> Option<fn(Self) -> Self> {
                let f: fn(Self) -> Self = match op {
                    UnaryOp::Neg => <$t>::wrapping_neg,
                    UnaryOp::Abs => |x| x,
                    UnaryOp::Sign => |x| if x == 0 { 0 } else { 1 },
                    UnaryOp::Not => |x| !x,
                    _ => return None,
                };
                Some(f)
            }
            fn binary_fn(op: BinaryOp) -> fn(Self, Self) -> Self {
                match op {
                    BinaryOp::Add => <$t>::wrapping_add,
                    BinaryOp::Sub => <$t>::wrapping_sub,
                    BinaryOp::Mul => <$t>::wrapping_mul,
                    // x / 0 = all bits set.
                    BinaryOp::Div => |a, b| if b == 0 { <$t>::MAX } else { a / b },
                    BinaryOp::Rem => |a, b| if b == 0 { a } else { a % b },
                    BinaryOp::Pow => |a, b| wrapping_power(a, u64::from(b)),
                    BinaryOp::Max => Ord::max,
                    BinaryOp::Min => Ord::min,
                    BinaryOp::And => |a, b| a & b,
                    BinaryOp::Or => |a, b| a | b,
                    BinaryOp::Xor => |a, b| a ^ b,
                    BinaryOp::ShiftLeft => |a, b| {
                        if u64::from(b) >= u64::from(<$t>::BITS) {
                            0
                        } else {
                            a << b
                        }
                    },
                    BinaryOp::ShiftRightLogical => |a, b| {
                        if u64::from(b) >= u64::from(<$t>::BITS) {
                            0
                        } else {
                            a >> b
                        }
                    },
                }
            }
        }
    };
}

signed_int!(i8, u8);
signed_int!(i32, u32);
signed_int!(i64, u64);
unsigned_int!(u8);
unsigned_int!(u32);
unsigned_int!(u64);

macro_rules! float {
    ($t:ty) => {
        impl Num for $t {
            const ONE: Self = 1.0;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;
            fn plus(self, other: Self) -> Self {
                self + other
            }
            fn times(self, other: Self) -> Self {
                self * other
            }
            fn larger(self, other: Self) -> Self {
                if self.is_nan() {
                    self
                } else if other.is_nan() {
                    other
                } else if self > other || (self == other && other.is_sign_negative()) {
                    self
                } else {
                    other
                }
            }
            fn smaller(self, other: Self) -> Self {
                if self.is_nan() {
                    self
                } else if other.is_nan() {
                    other
                } else if self < other || (self == other && self.is_sign_negative()) {
                    self
                } else {
                    other
                }
            }
        }

        impl Float for $t {
            fn unary_fn(op: UnaryOp) -> Option<fn(Self) -> Self> {
                let f: fn(Self) -> Self = match op {
                    UnaryOp::Neg => |x| -x,
                    UnaryOp::Abs => <$t>::abs,
                    UnaryOp::Exp => <$t>::exp,
                    UnaryOp::Expm1 => <$t>::exp_m1,
                    UnaryOp::Log => <$t>::ln,
                    UnaryOp::Log1p => <$t>::ln_1p,
                    UnaryOp::Sqrt => <$t>::sqrt,
                    UnaryOp::Rsqrt => |x| 1.0 / x.sqrt(),
                    UnaryOp::Tanh => <$t>::tanh,
                    UnaryOp::Logistic => |x| 1.0 / (1.0 + (-x).exp()),
                    UnaryOp::Floor => <$t>::floor,
                    UnaryOp::Ceil => <$t>::ceil,
                    // NaN stays NaN and ±0 stays ±0.
                    UnaryOp::Sign => |x| {
                        if x.is_nan() || x == 0.0 {
                            x
                        } else {
                            x.signum()
                        }
                    },
                    UnaryOp::Sin => <$t>::sin,
                    UnaryOp::Cos => <$t>::cos,
                    UnaryOp::Not => return None,
                };
                Some(f)
            }
            fn binary_fn(op: BinaryOp) -> Option<fn(Self, Self) -> Self> {
                let f: fn(Self, Self) -> Self = match op {
                    BinaryOp::Add => |a, b| a + b,
                    BinaryOp::Sub => |a, b| a - b,
                    BinaryOp::Mul => |a, b| a * b,
                    BinaryOp::Div => |a, b| a / b,
                    BinaryOp::Pow => <$t>::powf,
                    BinaryOp::Max => Num::larger,
                    BinaryOp::Min => Num::smaller,
                    // C fmod: the sign of the dividend.
                    BinaryOp::Rem => |a, b| a % b,
                    BinaryOp::And
                    | BinaryOp::Or
                    | BinaryOp::Xor
                    | BinaryOp::ShiftLeft
                    | BinaryOp::ShiftRightLogical => return None,
                };
                Some(f)
            }
        }
    };
}

float!(f32);
float!(f64);

/// A source element, widened exactly, for conversions.
#[derive(Debug, Clone, Copy)]
pub(super) enum Scalar {
    /// A `Pred`.
    Bool(bool),
    /// An unsigned integer.
    Unsigned(u64),
    /// A signed integer.
    Signed(i64),
    /// A float (every supported float widens exactly to `f64`).
    Float(f64),
}

/// Element types a conversion reads from.
pub(super) trait ToScalar: HostElement {
    /// The value, widened exactly.
    fn to_scalar(self) -> Scalar;
}

/// Element types a conversion writes to.
pub(super) trait FromScalar: HostElement {
    /// Converts: floats to integers truncate toward zero and saturate (NaN gives 0), integers
    /// wrap, anything to `Pred` is `x != 0`, `Pred` to a number is 0 or 1, and every conversion to
    /// a float rounds to nearest even (to `bf16` through `f32`, as XLA does).
    fn from_scalar(s: Scalar) -> Self;
}

impl ToScalar for bool {
    fn to_scalar(self) -> Scalar {
        Scalar::Bool(self)
    }
}

macro_rules! to_scalar {
    ($variant:ident, $wide:ty: $($t:ty),*) => {$(
        impl ToScalar for $t {
            fn to_scalar(self) -> Scalar {
                Scalar::$variant(<$wide>::from(self))
            }
        }
    )*};
}

to_scalar!(Unsigned, u64: u8, u32, u64);
to_scalar!(Signed, i64: i8, i32, i64);
to_scalar!(Float, f64: f16, bf16, f32, f64);

impl FromScalar for bool {
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Bool(b) => b,
            Scalar::Unsigned(v) => v != 0,
            Scalar::Signed(v) => v != 0,
            Scalar::Float(v) => v != 0.0,
        }
    }
}

macro_rules! int_from_scalar {
    ($($t:ty),*) => {$(
        impl FromScalar for $t {
            fn from_scalar(s: Scalar) -> Self {
                // `as` wraps between integers and truncates, saturating, from floats.
                match s {
                    Scalar::Bool(b) => <$t>::from(b),
                    Scalar::Unsigned(v) => v as $t,
                    Scalar::Signed(v) => v as $t,
                    Scalar::Float(v) => v as $t,
                }
            }
        }
    )*};
}

int_from_scalar!(u8, u32, u64, i8, i32, i64);

impl FromScalar for f64 {
    fn from_scalar(s: Scalar) -> Self {
        // Integer-to-float `as` rounds to nearest even.
        match s {
            Scalar::Bool(b) => f64::from(u8::from(b)),
            Scalar::Unsigned(v) => v as f64,
            Scalar::Signed(v) => v as f64,
            Scalar::Float(v) => v,
        }
    }
}

impl FromScalar for f32 {
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Bool(b) => f32::from(u8::from(b)),
            Scalar::Unsigned(v) => v as f32,
            Scalar::Signed(v) => v as f32,
            Scalar::Float(v) => v as f32,
        }
    }
}

impl FromScalar for f16 {
    /// Floats round to nearest `f32` first, then to `f16` (the lowering converts `f64` through
    /// `f32`, since XLA CPU does so on some processors and not on others); integers round once.
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Float(v) => f16::from_f32(v as f32),
            other => f16::from_f32(to_f32_round_to_odd(other)),
        }
    }
}

impl FromScalar for bf16 {
    /// Rounds to nearest `f32` first, then to `bf16`: XLA converts to `bf16` through `f32`, so a
    /// value within a hair of a `bf16` tie can round differently from a single rounding.
    fn from_scalar(s: Scalar) -> Self {
        bf16::from_f32(f32::from_scalar(s))
    }
}

/// The value rounded to `f32` by round-to-odd (truncate, then set the last bit if inexact).
/// Rounding that once more to nearest even, to a format at least two bits narrower (`f16`),
/// gives the correctly rounded result: no double-rounding error.
fn to_f32_round_to_odd(s: Scalar) -> f32 {
    match s {
        Scalar::Bool(b) => f32::from(u8::from(b)),
        Scalar::Unsigned(v) => f64_to_f32_round_to_odd(u64_to_f64_round_to_odd(v)),
        Scalar::Signed(v) => {
            let magnitude = f64_to_f32_round_to_odd(u64_to_f64_round_to_odd(v.unsigned_abs()));
            if v < 0 {
                -magnitude
            } else {
                magnitude
            }
        }
        Scalar::Float(v) => f64_to_f32_round_to_odd(v),
    }
}

/// `v` as `f64` by round-to-odd.
fn u64_to_f64_round_to_odd(v: u64) -> f64 {
    let bits = u64::BITS - v.leading_zeros();
    if bits <= f64::MANTISSA_DIGITS {
        return v as f64;
    }
    let shift = bits - f64::MANTISSA_DIGITS;
    let mut kept = v >> shift;
    if v & ((1u64 << shift) - 1) != 0 {
        kept |= 1;
    }
    // Exact: `kept` has at most 53 bits and the scale is a power of two.
    kept as f64 * (1u64 << shift) as f64
}

/// `x` as `f32` by round-to-odd (NaN stays NaN, infinities stay infinite, finite values beyond
/// the `f32` range become `±f32::MAX`, which rounds on to infinity in narrower formats).
fn f64_to_f32_round_to_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if x.is_nan() || f64::from(nearest) == x {
        return nearest;
    }
    let mut bits = nearest.to_bits();
    if f64::from(nearest).abs() > x.abs() {
        // Step toward zero (|nearest| > 0 here, so the magnitude bits are nonzero).
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// The order `Sort` and `ArgReduce` use: numbers by value with `-0.0 == +0.0`, NaN above every
/// number and equal to every NaN; `false < true`.
pub(super) trait Key: HostElement {
    /// Compares two elements.
    fn key_cmp(self, other: Self) -> Ordering;
}

macro_rules! ord_key {
    ($($t:ty),*) => {$(
        impl Key for $t {
            fn key_cmp(self, other: Self) -> Ordering {
                self.cmp(&other)
            }
        }
    )*};
}

ord_key!(bool, u8, u32, u64, i8, i32, i64);

macro_rules! float_key {
    ($($t:ty),*) => {$(
        impl Key for $t {
            fn key_cmp(self, other: Self) -> Ordering {
                float_key_cmp(f64::from(self), f64::from(other))
            }
        }
    )*};
}

float_key!(f16, bf16, f32, f64);

fn float_key_cmp(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_division_remainder_and_power_follow_xla() {
        let div = <i32 as Int>::binary_fn(BinaryOp::Div);
        let rem = <i32 as Int>::binary_fn(BinaryOp::Rem);
        let pow = <i64 as Int>::binary_fn(BinaryOp::Pow);
        assert_eq!(div(7, -2), -3);
        assert_eq!(div(-7, 2), -3);
        assert_eq!(div(5, 0), -1);
        assert_eq!(div(i32::MIN, -1), i32::MIN);
        assert_eq!(rem(-7, 2), -1);
        assert_eq!(rem(7, -2), 1);
        assert_eq!(rem(5, 0), 5);
        assert_eq!(rem(i32::MIN, -1), 0);
        assert_eq!(pow(3, 4), 81);
        assert_eq!(pow(2, 64), 0);
        assert_eq!(pow(3, 41), 3i64.wrapping_pow(41));
        assert_eq!(pow(2, -1), 0);
        assert_eq!(pow(0, -1), 0);
        assert_eq!(pow(1, -5), 1);
        assert_eq!(pow(-1, -5), -1);
        assert_eq!(pow(-1, -4), 1);
        assert_eq!(pow(7, 0), 1);
        assert_eq!(pow(0, 0), 1);
    }

    #[test]
    fn unsigned_division_and_shifts() {
        let div = <u8 as Int>::binary_fn(BinaryOp::Div);
        let shl = <u8 as Int>::binary_fn(BinaryOp::ShiftLeft);
        let shr = <u64 as Int>::binary_fn(BinaryOp::ShiftRightLogical);
        assert_eq!(div(9, 0), u8::MAX);
        assert_eq!(div(9, 2), 4);
        assert_eq!(shl(0b1000_0001, 1), 0b10);
        assert_eq!(shl(1, 7), 128);
        assert_eq!(shl(1, 8), 0);
        assert_eq!(shl(1, 255), 0);
        assert_eq!(shr(u64::MAX, 63), 1);
        assert_eq!(shr(u64::MAX, 64), 0);
        let shl = <i32 as Int>::binary_fn(BinaryOp::ShiftLeft);
        let shr = <i32 as Int>::binary_fn(BinaryOp::ShiftRightLogical);
        assert_eq!(shl(1, 31), i32::MIN);
        assert_eq!(shl(1, 32), 0);
        assert_eq!(shl(1, -1), 0);
        assert_eq!(shr(-1, 28), 0xF);
        assert_eq!(shr(-1, -3), 0);
        assert_eq!(shr(-1, 32), 0);
    }

    #[test]
    fn float_max_min_propagate_nan_and_order_signed_zeros() {
        let nan = f32::NAN;
        assert!(Num::larger(nan, 1.0f32).is_nan());
        assert!(Num::larger(1.0f32, nan).is_nan());
        assert!(Num::smaller(1.0f32, nan).is_nan());
        assert_eq!(Num::larger(-0.0f32, 0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(Num::larger(0.0f32, -0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(Num::smaller(0.0f32, -0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(Num::smaller(-0.0f32, 0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(Num::larger(2.0f64, -3.0), 2.0);
    }

    #[test]
    fn conversions_to_narrow_floats_round_as_xla_does() {
        // bf16 goes through f32: 2^30 + 2^22 + 1 becomes the f32 2^30 + 2^22, a bf16 midpoint,
        // which ties to the even 2^30 (one rounding would give 2^30 + 2^23).
        let v: i64 = (1 << 30) + (1 << 22) + 1;
        assert_eq!(
            bf16::from_scalar(Scalar::Signed(v)).to_f64(),
            f64::from(1u32 << 30)
        );
        assert_eq!(
            bf16::from_scalar(Scalar::Signed(-v)).to_f64(),
            -f64::from(1u32 << 30)
        );
        // Clearly above the midpoint, both roundings agree: up.
        let v: i64 = (1 << 30) + (1 << 22) + (1 << 8);
        assert_eq!(
            bf16::from_scalar(Scalar::Signed(v)).to_f64(),
            f64::from((1u32 << 30) + (1 << 23))
        );
        // Exactly the midpoint: ties to even (down).
        let v: u64 = (1 << 30) + (1 << 22);
        assert_eq!(
            bf16::from_scalar(Scalar::Unsigned(v)).to_f64(),
            f64::from(1u32 << 30)
        );
        // f16 from a float goes through f32: 1 + 2^-11 + 2^-40 becomes the f32 1 + 2^-11, a
        // midpoint, which ties to the even 1 (one rounding would give 1 + 2^-10).
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16::from_scalar(Scalar::Float(x)).to_f64(), 1.0);
        assert_eq!(
            f16::from_scalar(Scalar::Float(1.0 + 2f64.powi(-11))).to_f64(),
            1.0
        );
        // Overflow and extremes.
        assert!(f16::from_scalar(Scalar::Signed(70000)).is_infinite());
        assert!(bf16::from_scalar(Scalar::Float(1e300)).is_infinite());
        assert!(f16::from_scalar(Scalar::Float(f64::NAN)).is_nan());
        assert_eq!(f16::from_scalar(Scalar::Float(1e-300)).to_bits(), 0);
        assert_eq!(f16::from_scalar(Scalar::Float(-1e-300)).to_bits(), 0x8000);
        assert_eq!(
            bf16::from_scalar(Scalar::Unsigned(u64::MAX)).to_f64(),
            2f64.powi(64)
        );
    }

    #[test]
    fn float_to_int_truncates_and_saturates() {
        assert_eq!(i32::from_scalar(Scalar::Float(-2.9)), -2);
        assert_eq!(u8::from_scalar(Scalar::Float(-2.9)), 0);
        assert_eq!(u8::from_scalar(Scalar::Float(300.0)), 255);
        assert_eq!(i64::from_scalar(Scalar::Float(f64::NAN)), 0);
        assert_eq!(i32::from_scalar(Scalar::Float(f64::INFINITY)), i32::MAX);
        assert_eq!(u8::from_scalar(Scalar::Signed(-1)), 255);
        assert_eq!(i32::from_scalar(Scalar::Unsigned(u64::MAX)), -1);
        assert!(bool::from_scalar(Scalar::Float(f64::NAN)));
        assert!(!bool::from_scalar(Scalar::Float(-0.0)));
        assert_eq!(f32::from_scalar(Scalar::Bool(true)), 1.0);
    }

    #[test]
    fn key_order_puts_nan_last_and_equates_signed_zeros() {
        assert_eq!(f32::NAN.key_cmp(f32::INFINITY), Ordering::Greater);
        assert_eq!(f32::NEG_INFINITY.key_cmp(f32::NAN), Ordering::Less);
        assert_eq!(f32::NAN.key_cmp(-f32::NAN), Ordering::Equal);
        assert_eq!((-0.0f64).key_cmp(0.0), Ordering::Equal);
        assert_eq!(false.key_cmp(true), Ordering::Less);
        assert_eq!((-3i32).key_cmp(2), Ordering::Less);
    }
}
