//! Host arrays for tests: built from values, indexed by coordinates, gathered and printed.

use half::{bf16, f16};
use stablegraph::array::HostElement;
use stablegraph::{DType, HostArray, TensorType};

use super::random::Sample;

/// An array of `dtype` from drawn samples: values converted as `as` / `from_f64` would, raw bits
/// truncated to the dtype's width.
pub fn from_samples(dtype: DType, dims: &[usize], s: &[Sample]) -> HostArray {
    fn conv<T: HostElement>(
        dims: &[usize],
        s: &[Sample],
        f: impl Fn(f64) -> T,
        b: impl Fn(u64) -> T,
    ) -> HostArray {
        let v = s
            .iter()
            .map(|x| match *x {
                Sample::F(v) => f(v),
                Sample::B(bits) => b(bits),
            })
            .collect();
        HostArray::from_vec(dims, v).unwrap()
    }
    match dtype {
        DType::Pred => conv(dims, s, |v| v != 0.0, |b| b & 1 == 1),
        DType::U8 => conv(dims, s, |v| v as u8, |b| b as u8),
        DType::U32 => conv(dims, s, |v| v as u32, |b| b as u32),
        DType::U64 => conv(dims, s, |v| v as u64, |b| b),
        DType::I8 => conv(dims, s, |v| v as i8, |b| b as u8 as i8),
        DType::I32 => conv(dims, s, |v| v as i32, |b| b as u32 as i32),
        DType::I64 => conv(dims, s, |v| v as i64, |b| b as i64),
        DType::F16 => conv(dims, s, f16::from_f64, |b| f16::from_bits(b as u16)),
        DType::BF16 => conv(dims, s, bf16::from_f64, |b| bf16::from_bits(b as u16)),
        DType::F32 => conv(dims, s, |v| v as f32, |b| f32::from_bits(b as u32)),
        DType::F64 => conv(dims, s, |v| v, f64::from_bits),
    }
}

/// An array of `dtype` holding `values` (converted as `as` / `from_f64` would).
pub fn array_of(dtype: DType, dims: &[usize], values: &[f64]) -> HostArray {
    let s: Vec<Sample> = values.iter().map(|&v| Sample::F(v)).collect();
    from_samples(dtype, dims, &s)
}

/// An f64 array (a formula's result).
pub fn f64_array(dims: &[usize], values: Vec<f64>) -> HostArray {
    HostArray::from_vec(dims, values).unwrap()
}

/// An array of any element type from row-major `data`.
pub fn arr<T: HostElement>(dims: &[usize], data: Vec<T>) -> HostArray {
    HostArray::from_vec(dims, data).unwrap()
}

/// The elements of an array of `T`, row-major.
pub fn vals<T: HostElement>(a: &HostArray) -> Vec<T> {
    a.as_array::<T>().unwrap().iter().copied().collect()
}

/// The largest finite magnitude in `a` (0 for none).
pub fn largest_abs(a: &HostArray) -> f64 {
    a.to_f64_vec()
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(0.0, |m, v| m.max(v.abs()))
}

/// Row-major strides, in elements.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The coordinates of flat index `i` in an array of `dims`.
pub fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for (k, &d) in dims.iter().enumerate().rev() {
        if d > 0 {
            idx[k] = i % d;
            i /= d;
        }
    }
    idx
}

/// The flat index of coordinates `idx` in an array of `dims`.
pub fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(strides(dims)).map(|(i, s)| i * s).sum()
}

/// A new array of `a`'s dtype with the elements of `a` at the flat indices `flat`.
pub fn gather(a: &HostArray, out_dims: &[usize], flat: &[usize]) -> HostArray {
    let sz = a.dtype().size_in_bytes();
    let b = a.to_bytes();
    let mut out = Vec::with_capacity(flat.len() * sz);
    for &i in flat {
        out.extend_from_slice(&b[i * sz..(i + 1) * sz]);
    }
    HostArray::from_bytes(&TensorType::new(a.dtype(), out_dims), &out).unwrap()
}

/// `a`'s type and, if small, its values.
pub fn show(a: &HostArray) -> String {
    if a.dims().iter().product::<usize>() > 64 {
        format!("{} (too large to print)", a.ty())
    } else {
        format!("{} {:?}", a.ty(), a.to_f64_vec())
    }
}
