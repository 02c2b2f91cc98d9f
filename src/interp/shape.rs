//! Data movement: `Constant`, `Iota`, `BroadcastInDim`, `Reshape`, `Transpose`, `Slice`,
//! `Concatenate`, `Pad`, `Reverse`.

use ndarray::{ArrayD, ArrayViewD, Axis, Dimension, IxDyn};

use super::elementwise::convert_array;
use super::{element_count, Ctx};
use crate::array::{HostArray, HostElement};
use crate::dtype::TensorType;
use crate::error::Result;
use crate::with_host_array;

/// An array of shape `out_dims` whose element at index `o` is `a[source(o)]`; `source` must
/// return a valid index of `a` for every index of the output.
pub(super) fn remap<T: Copy>(
    a: &ArrayD<T>,
    out_dims: &[usize],
    source: impl Fn(&[usize]) -> Vec<usize>,
) -> ArrayD<T> {
    ArrayD::from_shape_fn(IxDyn(out_dims), |o| a[IxDyn(&source(o.slice()))])
}

/// `Constant`: every element's bytes, or one element's bytes repeated (a splat).
pub(super) fn constant(ctx: &Ctx, data: &[u8]) -> Result<HostArray> {
    let out = ctx.out()?;
    let full = element_count(&out.dims).and_then(|n| n.checked_mul(out.dtype.size_in_bytes()));
    if full == Some(data.len()) {
        return HostArray::from_bytes(out, data).map_err(|e| ctx.err(e));
    }
    let one =
        HostArray::from_bytes(&TensorType::new(out.dtype, &[]), data).map_err(|e| ctx.err(e))?;
    with_host_array!(&one, a => a.iter().next().map(|&v| {
        HostArray::from(ArrayD::from_elem(IxDyn(&out.dims), v))
    }))
    .ok_or_else(|| ctx.err("empty splat"))
}

/// `Iota`: the index along `dim`, converted to the output dtype.
pub(super) fn iota(ctx: &Ctx, dim: usize) -> Result<HostArray> {
    let out = ctx.out()?;
    let index = ArrayD::from_shape_fn(IxDyn(&out.dims), |o| o[dim] as i64);
    Ok(convert_array(&HostArray::I64(index), out.dtype))
}

/// `BroadcastInDim`: operand dimension `i` becomes output dimension `dims[i]`.
pub(super) fn broadcast_in_dim(ctx: &Ctx, dims: &[usize]) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    let out = ctx.out()?;
    let shape = x.dims();
    let source = |o: &[usize]| -> Vec<usize> {
        dims.iter()
            .zip(shape)
            .map(|(&d, &n)| if n == 1 { 0 } else { o[d] })
            .collect()
    };
    Ok(with_host_array!(x, a => HostArray::from(remap(a, &out.dims, source))))
}

/// `Reshape`: row-major, same element count.
pub(super) fn reshape(ctx: &Ctx) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    let out = ctx.out()?;
    with_host_array!(x, a => {
        ArrayD::from_shape_vec(IxDyn(&out.dims), a.iter().copied().collect()).map(HostArray::from)
    })
    .map_err(|e| ctx.err(e))
}

/// `Transpose`: output dimension `i` is operand dimension `perm[i]`.
pub(super) fn transpose(ctx: &Ctx, perm: &[usize]) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    let dims = &ctx.out()?.dims;
    let source = |o: &[usize]| -> Vec<usize> {
        let mut src = vec![0; o.len()];
        for (&p, &i) in perm.iter().zip(o) {
            src[p] = i;
        }
        src
    };
    Ok(with_host_array!(x, a => HostArray::from(remap(a, dims, source))))
}

/// `Slice`: `out[i] = x[start + i * stride]` for `start <= index < limit` (the output type
/// holds the extent).
pub(super) fn slice(ctx: &Ctx, start: &[usize], stride: &[usize]) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    let dims = &ctx.out()?.dims;
    let source =
        |o: &[usize]| -> Vec<usize> { (0..o.len()).map(|d| start[d] + o[d] * stride[d]).collect() };
    Ok(with_host_array!(x, a => HostArray::from(remap(a, dims, source))))
}

fn concatenate_as<T: HostElement>(
    _first: &ArrayD<T>,
    args: &[&HostArray],
    axis: usize,
) -> Option<HostArray> {
    let views: Option<Vec<ArrayViewD<T>>> = args.iter().map(|h| Some(T::peek(h)?.view())).collect();
    ndarray::concatenate(Axis(axis), &views?).ok().map(T::wrap)
}

/// `Concatenate`: one or more operands of one dtype, equal shapes except along `axis`.
pub(super) fn concatenate(ctx: &Ctx, axis: usize) -> Result<HostArray> {
    let args = ctx.all_args();
    let Some(&first) = args.first() else {
        return Err(ctx.err("has no operands"));
    };
    with_host_array!(first, a => concatenate_as(a, args, axis))
        .ok_or_else(|| ctx.err("cannot concatenate the inputs"))
}

fn pad_as<T: HostElement>(
    a: &ArrayD<T>,
    value: &HostArray,
    low: &[i64],
    interior: &[usize],
    out_dims: &[usize],
) -> Option<HostArray> {
    let fill = *T::peek(value)?.iter().next()?;
    let shape = a.shape();
    let result = ArrayD::from_shape_fn(IxDyn(out_dims), |o| {
        let mut src = Vec::with_capacity(shape.len());
        for d in 0..shape.len() {
            // Position in the interior-padded operand, then in the operand itself.
            let p = o[d] as i128 - i128::from(low[d]);
            let step = interior[d] as i128 + 1;
            if p < 0 || p % step != 0 || p / step >= shape[d] as i128 {
                return fill;
            }
            src.push((p / step) as usize);
        }
        a[IxDyn(&src)]
    });
    Some(T::wrap(result))
}

/// `Pad`: `low`/`high` elements before/after each dimension (negative values crop), `interior`
/// elements between neighbours, all equal to the rank-0 `inputs[1]` (the output type holds the
/// extent, so `high` is not needed).
pub(super) fn pad(ctx: &Ctx, low: &[i64], interior: &[usize]) -> Result<HostArray> {
    let args = ctx.args(2)?;
    let (x, value) = (args[0], args[1]);
    let dims = &ctx.out()?.dims;
    with_host_array!(x, a => pad_as(a, value, low, interior, dims))
        .ok_or_else(|| ctx.err("the padding value's dtype differs"))
}

/// `Reverse`: reverses each of `axes` (distinct, in range).
pub(super) fn reverse(ctx: &Ctx, axes: &[usize]) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    let out = ctx.out()?;
    let shape = x.dims();
    let source = |o: &[usize]| -> Vec<usize> {
        o.iter()
            .enumerate()
            .map(|(d, &i)| {
                if axes.contains(&d) {
                    shape[d] - 1 - i
                } else {
                    i
                }
            })
            .collect()
    };
    Ok(with_host_array!(x, a => HostArray::from(remap(a, &out.dims, source))))
}

#[cfg(test)]
mod tests {
    use std::slice::from_ref;

    use super::super::test_util::*;
    use crate::array::HostArray;
    use crate::dtype::DType;
    use crate::error::Error;
    use crate::ops::Op;
    use half::bf16;

    fn is_err<T: std::fmt::Debug>(r: crate::Result<T>) {
        assert!(matches!(r, Err(Error::Interp(_))), "{r:?}");
    }

    #[test]
    fn constants_full_and_splat() {
        let data: Vec<u8> = [1i32, -2, 3, 4]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let c = eval1(Op::Constant { data }, &[], ty(DType::I32, &[2, 2])).unwrap();
        assert_eq!(c, arr(&[2, 2], vec![1i32, -2, 3, 4]));
        let data = 2.5f64.to_le_bytes().to_vec();
        let c = eval1(
            Op::Constant { data: data.clone() },
            &[],
            ty(DType::F64, &[2, 3]),
        )
        .unwrap();
        assert_eq!(values::<f64>(&c), vec![2.5; 6]);
        let c = eval1(
            Op::Constant { data: data.clone() },
            &[],
            ty(DType::F64, &[]),
        )
        .unwrap();
        assert_eq!(c, HostArray::scalar(2.5f64));
        let c = eval1(Op::Constant { data }, &[], ty(DType::F64, &[0, 4])).unwrap();
        assert_eq!(c.dims(), &[0, 4]);
        let c = eval1(Op::Constant { data: vec![] }, &[], ty(DType::F64, &[0])).unwrap();
        assert_eq!(c.dims(), &[0]);
        let c = eval1(Op::Constant { data: vec![1] }, &[], ty(DType::Pred, &[3])).unwrap();
        assert_eq!(values::<bool>(&c), vec![true; 3]);
        let c = eval1(
            Op::Constant {
                data: bf16::from_f32(-1.0).to_le_bytes().to_vec(),
            },
            &[],
            ty(DType::BF16, &[2]),
        )
        .unwrap();
        assert_eq!(values::<bf16>(&c), vec![bf16::from_f32(-1.0); 2]);
        is_err(eval1(
            Op::Constant { data: vec![0; 5] },
            &[],
            ty(DType::F32, &[2]),
        ));
        is_err(eval1(
            Op::Constant { data: vec![] },
            &[],
            ty(DType::F32, &[2]),
        ));
    }

    #[test]
    fn iota_in_several_dtypes() {
        let i = eval1(Op::Iota { dim: 1 }, &[], ty(DType::I32, &[2, 3])).unwrap();
        assert_eq!(i, arr(&[2, 3], vec![0i32, 1, 2, 0, 1, 2]));
        let i = eval1(Op::Iota { dim: 0 }, &[], ty(DType::F32, &[2, 2])).unwrap();
        assert_eq!(values::<f32>(&i), vec![0.0, 0.0, 1.0, 1.0]);
        let i = eval1(Op::Iota { dim: 0 }, &[], ty(DType::U8, &[258])).unwrap();
        assert_eq!(values::<u8>(&i)[256..], [0, 1]);
        is_err(eval1(Op::Iota { dim: 0 }, &[], ty(DType::I32, &[])));
        is_err(eval1(Op::Iota { dim: 2 }, &[], ty(DType::I32, &[2, 2])));
    }

    #[test]
    fn broadcast_in_dim() {
        let x = vec1(vec![1i32, 2, 3]);
        let b = eval1(
            Op::BroadcastInDim { dims: vec![1] },
            from_ref(&x),
            ty(DType::I32, &[2, 3]),
        )
        .unwrap();
        assert_eq!(b, arr(&[2, 3], vec![1, 2, 3, 1, 2, 3]));
        let b = eval1(
            Op::BroadcastInDim { dims: vec![0] },
            from_ref(&x),
            ty(DType::I32, &[3, 2]),
        )
        .unwrap();
        assert_eq!(b, arr(&[3, 2], vec![1, 1, 2, 2, 3, 3]));
        // Size-1 dimensions stretch; scalars splat.
        let col = arr(&[2, 1], vec![5u8, 6]);
        let b = eval1(
            Op::BroadcastInDim { dims: vec![0, 1] },
            &[col],
            ty(DType::U8, &[2, 2]),
        )
        .unwrap();
        assert_eq!(b, arr(&[2, 2], vec![5u8, 5, 6, 6]));
        let b = eval1(
            Op::BroadcastInDim { dims: vec![] },
            &[HostArray::scalar(true)],
            ty(DType::Pred, &[2]),
        )
        .unwrap();
        assert_eq!(values::<bool>(&b), vec![true, true]);
        is_err(eval1(
            Op::BroadcastInDim { dims: vec![0] },
            from_ref(&x),
            ty(DType::I32, &[2, 3]),
        ));
        is_err(eval1(
            Op::BroadcastInDim { dims: vec![2] },
            from_ref(&x),
            ty(DType::I32, &[2, 3]),
        ));
        is_err(eval1(
            Op::BroadcastInDim { dims: vec![1] },
            &[x],
            ty(DType::I64, &[2, 3]),
        ));
    }

    #[test]
    fn reshape_and_transpose() {
        let x = arr(&[2, 3], vec![1i32, 2, 3, 4, 5, 6]);
        let r = eval1(Op::Reshape, from_ref(&x), ty(DType::I32, &[3, 2])).unwrap();
        assert_eq!(r, arr(&[3, 2], vec![1i32, 2, 3, 4, 5, 6]));
        let r = eval1(
            Op::Reshape,
            &[HostArray::scalar(7i32)],
            ty(DType::I32, &[1, 1]),
        )
        .unwrap();
        assert_eq!(r, arr(&[1, 1], vec![7i32]));
        is_err(eval1(Op::Reshape, from_ref(&x), ty(DType::I32, &[4])));
        let t = eval1(
            Op::Transpose { perm: vec![1, 0] },
            from_ref(&x),
            ty(DType::I32, &[3, 2]),
        )
        .unwrap();
        assert_eq!(t, arr(&[3, 2], vec![1i32, 4, 2, 5, 3, 6]));
        let y = arr(&[1, 2, 3], (0..6).collect::<Vec<i64>>());
        let t = eval1(
            Op::Transpose {
                perm: vec![2, 0, 1],
            },
            &[y],
            ty(DType::I64, &[3, 1, 2]),
        )
        .unwrap();
        assert_eq!(values::<i64>(&t), vec![0, 3, 1, 4, 2, 5]);
        is_err(eval1(
            Op::Transpose { perm: vec![0, 0] },
            from_ref(&x),
            ty(DType::I32, &[2, 2]),
        ));
        is_err(eval1(
            Op::Transpose { perm: vec![1, 0] },
            &[x],
            ty(DType::I32, &[2, 3]),
        ));
    }

    #[test]
    fn slice_with_strides() {
        let x = arr(&[3, 5], (0..15).collect::<Vec<i32>>());
        let s = eval1(
            Op::Slice {
                start: vec![1, 0],
                limit: vec![3, 5],
                stride: vec![1, 2],
            },
            from_ref(&x),
            ty(DType::I32, &[2, 3]),
        )
        .unwrap();
        assert_eq!(s, arr(&[2, 3], vec![5i32, 7, 9, 10, 12, 14]));
        let s = eval1(
            Op::Slice {
                start: vec![2, 5],
                limit: vec![2, 5],
                stride: vec![1, 1],
            },
            from_ref(&x),
            ty(DType::I32, &[0, 0]),
        )
        .unwrap();
        assert_eq!(s.dims(), &[0, 0]);
        let bad = |start: Vec<usize>, limit: Vec<usize>, stride: Vec<usize>| {
            is_err(eval1(
                Op::Slice {
                    start,
                    limit,
                    stride,
                },
                from_ref(&x),
                ty(DType::I32, &[1, 1]),
            ))
        };
        bad(vec![0, 0], vec![1, 1], vec![0, 1]);
        bad(vec![2, 0], vec![1, 1], vec![1, 1]);
        bad(vec![0, 0], vec![1, 6], vec![1, 1]);
        bad(vec![0], vec![1], vec![1]);
        // A huge stride takes just the first element.
        let s = eval1(
            Op::Slice {
                start: vec![1, 2],
                limit: vec![2, 5],
                stride: vec![1, usize::MAX],
            },
            from_ref(&x),
            ty(DType::I32, &[1, 1]),
        )
        .unwrap();
        assert_eq!(s, arr(&[1, 1], vec![7i32]));
    }

    #[test]
    fn concatenate_along_axes() {
        let a = arr(&[2, 1], vec![1.0f32, 2.0]);
        let b = arr(&[2, 2], vec![3.0f32, 4.0, 5.0, 6.0]);
        let c = eval1(
            Op::Concatenate { axis: 1 },
            &[a.clone(), b.clone()],
            ty(DType::F32, &[2, 3]),
        )
        .unwrap();
        assert_eq!(c, arr(&[2, 3], vec![1.0f32, 3.0, 4.0, 2.0, 5.0, 6.0]));
        let e = arr::<f32>(&[0, 2], vec![]);
        let c = eval1(
            Op::Concatenate { axis: 0 },
            &[e, b.clone()],
            ty(DType::F32, &[2, 2]),
        )
        .unwrap();
        assert_eq!(c, b);
        is_err(eval1(
            Op::Concatenate { axis: 0 },
            &[a.clone(), b.clone()],
            ty(DType::F32, &[4, 1]),
        ));
        is_err(eval1(
            Op::Concatenate { axis: 2 },
            from_ref(&a),
            ty(DType::F32, &[2, 1]),
        ));
        is_err(eval1(
            Op::Concatenate { axis: 0 },
            &[a.clone(), arr(&[1, 1], vec![1.0f64])],
            ty(DType::F32, &[3, 1]),
        ));
        is_err(eval1(
            Op::Concatenate { axis: 0 },
            &[],
            ty(DType::F32, &[0]),
        ));
    }

    #[test]
    fn pad_low_high_interior_and_negative() {
        let x = vec1(vec![1i32, 2, 3]);
        let pad = |low: i64, high: i64, interior: usize, n: usize| {
            eval1(
                Op::Pad {
                    low: vec![low],
                    high: vec![high],
                    interior: vec![interior],
                },
                &[x.clone(), HostArray::scalar(0i32)],
                ty(DType::I32, &[n]),
            )
            .map(|r| values::<i32>(&r))
        };
        assert_eq!(pad(2, 1, 0, 6).unwrap(), vec![0, 0, 1, 2, 3, 0]);
        assert_eq!(pad(1, 1, 1, 7).unwrap(), vec![0, 1, 0, 2, 0, 3, 0]);
        assert_eq!(pad(-1, 0, 0, 2).unwrap(), vec![2, 3]);
        assert_eq!(pad(-1, -1, 2, 5).unwrap(), vec![0, 0, 2, 0, 0]);
        assert_eq!(pad(-3, 0, 0, 0).unwrap(), Vec::<i32>::new());
        assert!(matches!(pad(-4, 0, 0, 0), Err(Error::Interp(_))));
        assert!(matches!(pad(0, 0, 0, 4), Err(Error::Interp(_))));
        assert!(matches!(
            pad(i64::MIN, i64::MIN, usize::MAX, 0),
            Err(Error::Interp(_))
        ));
        // Two dimensions, a non-zero padding value.
        let m = arr(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]);
        let p = eval1(
            Op::Pad {
                low: vec![1, 0],
                high: vec![0, -1],
                interior: vec![0, 1],
            },
            &[m.clone(), HostArray::scalar(9.0f32)],
            ty(DType::F32, &[3, 2]),
        )
        .unwrap();
        assert_eq!(p, arr(&[3, 2], vec![9.0f32, 9.0, 1.0, 9.0, 3.0, 9.0]));
        // The padding value must be a scalar of the operand's dtype.
        is_err(eval1(
            Op::Pad {
                low: vec![0, 0],
                high: vec![0, 0],
                interior: vec![0, 0],
            },
            &[m, HostArray::scalar(9.0f64)],
            ty(DType::F32, &[2, 2]),
        ));
    }

    #[test]
    fn reverse_axes() {
        let x = arr(&[2, 3], (0..6).collect::<Vec<u32>>());
        let r = eval1(
            Op::Reverse { axes: vec![1] },
            from_ref(&x),
            ty(DType::U32, &[2, 3]),
        )
        .unwrap();
        assert_eq!(r, arr(&[2, 3], vec![2u32, 1, 0, 5, 4, 3]));
        let r = eval1(
            Op::Reverse { axes: vec![0, 1] },
            from_ref(&x),
            ty(DType::U32, &[2, 3]),
        )
        .unwrap();
        assert_eq!(values::<u32>(&r), vec![5, 4, 3, 2, 1, 0]);
        let e = arr::<u32>(&[0, 3], vec![]);
        let r = eval1(Op::Reverse { axes: vec![0] }, from_ref(&e), e.ty()).unwrap();
        assert_eq!(r, e);
        is_err(eval1(
            Op::Reverse { axes: vec![1, 1] },
            from_ref(&x),
            ty(DType::U32, &[2, 3]),
        ));
        is_err(eval1(
            Op::Reverse { axes: vec![2] },
            &[x],
            ty(DType::U32, &[2, 3]),
        ));
    }
}
