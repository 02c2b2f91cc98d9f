//! Element types shared by graphs, lowering and the runtime.

use std::fmt;

use half::{bf16, f16};

/// The element types stablegraph supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// Boolean (`i1` in StableHLO, one byte per element on the host).
    Pred,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

/// What kind of number a [`DType`] holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pred,
    Unsigned,
    Signed,
    Float,
}

/// The facts of one element type: one row of [`DType::facts`], the table every method reads.
struct Facts {
    /// Its name in stablegraph (`Display`): `pred`, `u8`, `bf16`, ...
    name: &'static str,
    /// Its name in MLIR: `i1`, `ui8`, `bf16`, ...
    mlir: &'static str,
    /// Bytes per element on the host.
    bytes: usize,
    kind: Kind,
    /// The `PJRT_Buffer_Type` value.
    pjrt: i32,
}

impl DType {
    /// Every supported element type.
    pub const ALL: [DType; 11] = [
        DType::Pred,
        DType::U8,
        DType::U32,
        DType::U64,
        DType::I8,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// The table of per-dtype facts: one row per element type.
    const fn facts(self) -> Facts {
        use Kind::*;
        let (name, mlir, bytes, kind, pjrt) = match self {
            DType::Pred => ("pred", "i1", 1, Pred, 1),
            DType::U8 => ("u8", "ui8", 1, Unsigned, 6),
            DType::U32 => ("u32", "ui32", 4, Unsigned, 8),
            DType::U64 => ("u64", "ui64", 8, Unsigned, 9),
            DType::I8 => ("i8", "i8", 1, Signed, 2),
            DType::I32 => ("i32", "i32", 4, Signed, 4),
            DType::I64 => ("i64", "i64", 8, Signed, 5),
            DType::F16 => ("f16", "f16", 2, Float, 10),
            DType::BF16 => ("bf16", "bf16", 2, Float, 13),
            DType::F32 => ("f32", "f32", 4, Float, 11),
            DType::F64 => ("f64", "f64", 8, Float, 12),
        };
        Facts {
            name,
            mlir,
            bytes,
            kind,
            pjrt,
        }
    }

    /// The element type's name in stablegraph (`pred`, `u8`, `bf16`, `f32`, ...), as
    /// `Display` writes it.
    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// Bytes per element on the host.
    pub fn size_in_bytes(self) -> usize {
        self.facts().bytes
    }

    /// The element type's name in MLIR (`f32`, `bf16`, `i1`, `ui8`, ...).
    pub fn mlir_name(self) -> &'static str {
        self.facts().mlir
    }

    /// Whether this is an integer type (signed or unsigned; not `Pred`).
    pub fn is_int(self) -> bool {
        matches!(self.facts().kind, Kind::Unsigned | Kind::Signed)
    }

    /// Whether this is an unsigned integer type.
    pub fn is_unsigned(self) -> bool {
        self.facts().kind == Kind::Unsigned
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        self.facts().kind == Kind::Float
    }

    /// The `PJRT_Buffer_Type` value.
    pub(crate) fn to_pjrt(self) -> i32 {
        self.facts().pjrt
    }

    /// The dtype of a `PJRT_Buffer_Type` value, or `None` for types stablegraph does not support.
    pub(crate) fn from_pjrt(raw: i32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.to_pjrt() == raw)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The element type and shape of a tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Shape (row-major; empty for a scalar).
    pub dims: Vec<usize>,
}

impl TensorType {
    /// A tensor type.
    pub fn new(dtype: DType, dims: &[usize]) -> Self {
        TensorType {
            dtype,
            dims: dims.to_vec(),
        }
    }

    /// The number of elements (saturating at `usize::MAX`; see [`TensorType::byte_size`]).
    pub fn element_count(&self) -> usize {
        self.dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or(usize::MAX)
    }

    /// The size in bytes, or `None` if it does not fit in an `isize` (no allocation could hold
    /// it).
    pub fn byte_size(&self) -> Option<usize> {
        self.dims
            .iter()
            .try_fold(self.dtype.size_in_bytes(), |n, &d| n.checked_mul(d))
            .filter(|&n| isize::try_from(n).is_ok())
    }

    /// The rank (number of dimensions).
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
}

impl fmt::Display for TensorType {
    /// Writes `f32[2, 3]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.dims)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that holds one element of a [`DType`]: `bool`, `u8`, `i32`, `i64`, `f16`, `bf16`,
/// `f32`, `f64`. Sealed: the runtime copies these to and from devices byte for byte.
pub trait Element: sealed::Sealed + Copy + Send + Sync + fmt::Debug + 'static {
    /// The element type this Rust type stores.
    const DTYPE: DType;
    /// The zero value (used to allocate host memory before a copy).
    const ZERO: Self;

    /// Decodes host bytes in the device's element encoding (`bytes.len()` is a multiple of the
    /// element size).
    #[doc(hidden)]
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        let n = bytes.len() / std::mem::size_of::<Self>();
        let mut out = vec![Self::ZERO; n];
        // SAFETY: every implementor except `bool` (which overrides this) is plain old data for
        // which any bit pattern is valid; the destination holds exactly `n` elements.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                out.as_mut_ptr().cast::<u8>(),
                n * std::mem::size_of::<Self>(),
            );
        }
        out
    }
}

macro_rules! element {
    ($t:ty, $d:expr, $zero:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            const ZERO: Self = $zero;
        }
    };
}

element!(u8, DType::U8, 0);
element!(i8, DType::I8, 0);
element!(u32, DType::U32, 0);
element!(u64, DType::U64, 0);
element!(i32, DType::I32, 0);
element!(i64, DType::I64, 0);
element!(f16, DType::F16, f16::ZERO);
element!(bf16, DType::BF16, bf16::ZERO);
element!(f32, DType::F32, 0.0);
element!(f64, DType::F64, 0.0);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Pred;
    const ZERO: Self = false;

    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

/// Views a slice of elements as its bytes (every [`Element`] is valid as bytes, `bool` included).
pub(crate) fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: `Element` is sealed to types without padding whose every byte is initialised.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::Pred.size_in_bytes(), std::mem::size_of::<bool>());
        assert_eq!(DType::U8.size_in_bytes(), std::mem::size_of::<u8>());
        assert_eq!(DType::U32.size_in_bytes(), std::mem::size_of::<u32>());
        assert_eq!(DType::U64.size_in_bytes(), std::mem::size_of::<u64>());
        assert_eq!(DType::I8.size_in_bytes(), std::mem::size_of::<i8>());
        assert_eq!(DType::I32.size_in_bytes(), std::mem::size_of::<i32>());
        assert_eq!(DType::I64.size_in_bytes(), std::mem::size_of::<i64>());
        assert_eq!(DType::F16.size_in_bytes(), std::mem::size_of::<f16>());
        assert_eq!(DType::BF16.size_in_bytes(), std::mem::size_of::<bf16>());
        assert_eq!(DType::F32.size_in_bytes(), std::mem::size_of::<f32>());
        assert_eq!(DType::F64.size_in_bytes(), std::mem::size_of::<f64>());
    }

    #[test]
    fn names_and_kinds_match_the_spelled_out_table() {
        // (dtype, name, MLIR name, integer, unsigned, float), written out independently.
        let want = [
            (DType::Pred, "pred", "i1", false, false, false),
            (DType::U8, "u8", "ui8", true, true, false),
            (DType::U32, "u32", "ui32", true, true, false),
            (DType::U64, "u64", "ui64", true, true, false),
            (DType::I8, "i8", "i8", true, false, false),
            (DType::I32, "i32", "i32", true, false, false),
            (DType::I64, "i64", "i64", true, false, false),
            (DType::F16, "f16", "f16", false, false, true),
            (DType::BF16, "bf16", "bf16", false, false, true),
            (DType::F32, "f32", "f32", false, false, true),
            (DType::F64, "f64", "f64", false, false, true),
        ];
        assert_eq!(want.map(|w| w.0), DType::ALL);
        for (d, name, mlir, int, unsigned, float) in want {
            assert_eq!(d.name(), name);
            assert_eq!(d.to_string(), name);
            assert_eq!(d.mlir_name(), mlir);
            assert_eq!(
                (d.is_int(), d.is_unsigned(), d.is_float()),
                (int, unsigned, float),
                "{d}"
            );
        }
    }

    #[test]
    fn pjrt_codes_match_the_header() {
        // `PJRT_Buffer_Type` in pjrt_c_api.h: PRED 1, S8 2, S32 4, S64 5, U8 6, U32 8, U64 9, F16 10,
        // F32 11, F64 12, BF16 13.
        let header = [
            (DType::Pred, 1),
            (DType::I8, 2),
            (DType::I32, 4),
            (DType::I64, 5),
            (DType::U8, 6),
            (DType::U32, 8),
            (DType::U64, 9),
            (DType::F16, 10),
            (DType::F32, 11),
            (DType::F64, 12),
            (DType::BF16, 13),
        ];
        for (d, code) in header {
            assert_eq!(d.to_pjrt(), code, "{d}");
        }
    }

    #[test]
    fn pjrt_codes_round_trip_and_are_distinct() {
        for d in DType::ALL {
            assert_eq!(DType::from_pjrt(d.to_pjrt()), Some(d));
        }
        // S16 (3) and C64 (14) are PJRT types we do not support.
        assert_eq!(DType::from_pjrt(3), None);
        assert_eq!(DType::from_pjrt(14), None);
    }

    #[test]
    fn bytes_round_trip() {
        let v = [1.5f32, -2.0, 0.0];
        assert_eq!(f32::from_bytes(as_bytes(&v)), v.to_vec());
        let b = [true, false, true];
        assert_eq!(bool::from_bytes(as_bytes(&b)), b.to_vec());
        assert_eq!(bool::from_bytes(&[0, 2, 255]), vec![false, true, true]);
    }
}
