//! [`HostArray`]: an ndarray of any supported dtype, the host-side value of a tensor.

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

use crate::dtype::{DType, Element, TensorType};
use crate::error::{Error, Result};

/// A host array of one of the supported element types.
#[derive(Debug, Clone, PartialEq)]
pub enum HostArray {
    /// `Pred`
    Pred(ArrayD<bool>),
    /// `U8`
    U8(ArrayD<u8>),
    /// `U32`
    U32(ArrayD<u32>),
    /// `U64`
    U64(ArrayD<u64>),
    /// `I8`
    I8(ArrayD<i8>),
    /// `I32`
    I32(ArrayD<i32>),
    /// `I64`
    I64(ArrayD<i64>),
    /// `F16`
    F16(ArrayD<f16>),
    /// `BF16`
    BF16(ArrayD<bf16>),
    /// `F32`
    F32(ArrayD<f32>),
    /// `F64`
    F64(ArrayD<f64>),
}

/// Applies `$body` to the inner array of a [`HostArray`], binding it as `$a`.
#[macro_export]
#[doc(hidden)]
macro_rules! with_host_array {
    ($value:expr, $a:ident => $body:expr) => {
        match $value {
            $crate::array::HostArray::Pred($a) => $body,
            $crate::array::HostArray::U8($a) => $body,
            $crate::array::HostArray::U32($a) => $body,
            $crate::array::HostArray::U64($a) => $body,
            $crate::array::HostArray::I8($a) => $body,
            $crate::array::HostArray::I32($a) => $body,
            $crate::array::HostArray::I64($a) => $body,
            $crate::array::HostArray::F16($a) => $body,
            $crate::array::HostArray::BF16($a) => $body,
            $crate::array::HostArray::F32($a) => $body,
            $crate::array::HostArray::F64($a) => $body,
        }
    };
}

/// Element types that have a [`HostArray`] variant.
pub trait HostElement: Element {
    /// Wraps an array.
    fn wrap(a: ArrayD<Self>) -> HostArray;
    /// Borrows the array if `h` holds this type.
    fn peek(h: &HostArray) -> Option<&ArrayD<Self>>;
}

macro_rules! host_element {
    ($t:ty, $v:ident) => {
        impl HostElement for $t {
            fn wrap(a: ArrayD<Self>) -> HostArray {
                HostArray::$v(a)
            }
            fn peek(h: &HostArray) -> Option<&ArrayD<Self>> {
                match h {
                    HostArray::$v(a) => Some(a),
                    _ => None,
                }
            }
        }

        impl From<ArrayD<$t>> for HostArray {
            fn from(a: ArrayD<$t>) -> Self {
                HostArray::$v(a)
            }
        }
    };
}

host_element!(bool, Pred);
host_element!(u8, U8);
host_element!(u32, U32);
host_element!(u64, U64);
host_element!(i8, I8);
host_element!(i32, I32);
host_element!(i64, I64);
host_element!(f16, F16);
host_element!(bf16, BF16);
host_element!(f32, F32);
host_element!(f64, F64);

impl HostArray {
    /// The element type.
    pub fn dtype(&self) -> DType {
        fn of<T: Element>(_: &ArrayD<T>) -> DType {
            T::DTYPE
        }
        with_host_array!(self, a => of(a))
    }

    /// The shape.
    pub fn dims(&self) -> &[usize] {
        with_host_array!(self, a => a.shape())
    }

    /// The element type and shape.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), self.dims())
    }

    /// A scalar (rank-0) array.
    pub fn scalar<T: HostElement>(v: T) -> HostArray {
        T::wrap(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// Builds an array from row-major data; `data` must hold exactly the shape's element count
    /// (an error says how many it needs and got).
    pub fn from_vec<T: HostElement>(dims: &[usize], data: Vec<T>) -> Result<HostArray> {
        let ty = TensorType::new(T::DTYPE, dims);
        let needed = ty.byte_size().map(|_| ty.element_count()).ok_or_else(|| {
            Error::InvalidArgument(format!("shape {dims:?} is too large to allocate"))
        })?;
        if data.len() != needed {
            let values = if needed == 1 { "value" } else { "values" };
            return Err(Error::InvalidArgument(format!(
                "shape {dims:?} needs {needed} {values}, got {}",
                data.len()
            )));
        }
        ArrayD::from_shape_vec(IxDyn(dims), data)
            .map(T::wrap)
            .map_err(|e| Error::InvalidArgument(format!("shape {dims:?}: {e}")))
    }

    /// An array of `ty` filled with zeros (`false` for booleans).
    pub fn zeros(ty: &TensorType) -> HostArray {
        let bytes = vec![0u8; ty.element_count() * ty.dtype.size_in_bytes()];
        // The byte count is the one from_bytes checks for, so this cannot fail.
        HostArray::from_bytes(ty, &bytes).unwrap_or_else(|_| unreachable!("zeros of {ty}"))
    }

    /// Decodes row-major little-endian element bytes (as in a constant or a device buffer).
    pub fn from_bytes(ty: &TensorType, bytes: &[u8]) -> Result<HostArray> {
        fn make<T: HostElement>(dims: &[usize], bytes: &[u8]) -> Result<HostArray> {
            HostArray::from_vec(dims, T::from_bytes(bytes))
        }
        let expected = ty.element_count() * ty.dtype.size_in_bytes();
        if bytes.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "{ty} needs {expected} bytes, got {}",
                bytes.len()
            )));
        }
        let d = &ty.dims;
        match ty.dtype {
            DType::Pred => make::<bool>(d, bytes),
            DType::U8 => make::<u8>(d, bytes),
            DType::U32 => make::<u32>(d, bytes),
            DType::U64 => make::<u64>(d, bytes),
            DType::I8 => make::<i8>(d, bytes),
            DType::I32 => make::<i32>(d, bytes),
            DType::I64 => make::<i64>(d, bytes),
            DType::F16 => make::<f16>(d, bytes),
            DType::BF16 => make::<bf16>(d, bytes),
            DType::F32 => make::<f32>(d, bytes),
            DType::F64 => make::<f64>(d, bytes),
        }
    }

    /// Row-major little-endian element bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        with_host_array!(self, a => {
            let v: Vec<_> = a.iter().copied().collect();
            crate::dtype::as_bytes(&v).to_vec()
        })
    }

    /// Borrows the inner array as `T`, or fails naming both types.
    pub fn as_array<T: HostElement>(&self) -> Result<&ArrayD<T>> {
        T::peek(self).ok_or_else(|| {
            Error::InvalidArgument(format!("the array is {}, not {}", self.ty(), T::DTYPE))
        })
    }

    /// Every element converted to `f64` (`Pred` as 0 or 1), row-major. For comparisons in tests
    /// and reports.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            HostArray::Pred(a) => a.iter().map(|&x| f64::from(u8::from(x))).collect(),
            HostArray::U8(a) => a.iter().map(|&x| f64::from(x)).collect(),
            HostArray::U32(a) => a.iter().map(|&x| f64::from(x)).collect(),
            HostArray::U64(a) => a.iter().map(|&x| x as f64).collect(),
            HostArray::I8(a) => a.iter().map(|&x| f64::from(x)).collect(),
            HostArray::I32(a) => a.iter().map(|&x| f64::from(x)).collect(),
            HostArray::I64(a) => a.iter().map(|&x| x as f64).collect(),
            HostArray::F16(a) => a.iter().map(|&x| x.to_f64()).collect(),
            HostArray::BF16(a) => a.iter().map(|&x| x.to_f64()).collect(),
            HostArray::F32(a) => a.iter().map(|&x| f64::from(x)).collect(),
            HostArray::F64(a) => a.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_vec_with_the_wrong_number_of_values_says_how_many() {
        let err = HostArray::from_vec(&[3, 2], vec![1.0f32; 5]).unwrap_err();
        assert_eq!(
            err.to_string(),
            Error::InvalidArgument("shape [3, 2] needs 6 values, got 5".into()).to_string()
        );
        let err = HostArray::from_vec::<i32>(&[], vec![]).unwrap_err();
        assert!(
            err.to_string().contains("shape [] needs 1 value, got 0"),
            "{err}"
        );
        let err = HostArray::from_vec(&[usize::MAX, 2], vec![0u8]).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    #[test]
    fn each_variant_reports_its_dtype() {
        let scalars = [
            (HostArray::scalar(true), DType::Pred),
            (HostArray::scalar(1u8), DType::U8),
            (HostArray::scalar(1u32), DType::U32),
            (HostArray::scalar(1u64), DType::U64),
            (HostArray::scalar(1i8), DType::I8),
            (HostArray::scalar(1i32), DType::I32),
            (HostArray::scalar(1i64), DType::I64),
            (HostArray::scalar(f16::ONE), DType::F16),
            (HostArray::scalar(bf16::ONE), DType::BF16),
            (HostArray::scalar(1f32), DType::F32),
            (HostArray::scalar(1f64), DType::F64),
        ];
        for (a, d) in scalars {
            assert_eq!(a.dtype(), d);
            assert_eq!(a.ty(), TensorType::new(d, &[]));
        }
    }

    #[test]
    fn from_vec_keeps_shape_and_order() {
        let a = HostArray::from_vec(&[2, 3], (0..6).collect::<Vec<i64>>()).unwrap();
        assert_eq!(a.ty(), TensorType::new(DType::I64, &[2, 3]));
        assert_eq!(a.to_f64_vec(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let empty = HostArray::from_vec::<f32>(&[0, 4], vec![]).unwrap();
        assert_eq!(empty.dims(), &[0, 4]);
    }
}
