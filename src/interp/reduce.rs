//! Reductions and scans along axes: `Reduce`, `ArgReduce`, `Cumsum`, `Sort`.
//!
//! Sums and products accumulate in `f32` for `f16`/`bf16` and in `f64` for `f32`/`f64`, then
//! round once per output element.

use std::cmp::Ordering;

use half::{bf16, f16};
use ndarray::{ArrayD, Axis, Dimension, IxDyn, Zip};

use super::scalar::{Key, Num};
use super::shape::remap;
use super::{row_major_index, Ctx};
use crate::array::HostArray;
use crate::error::Result;
use crate::ops::{ArgKind, ReduceKind};
use crate::with_host_array;

/// The product of `dims`, which are dimensions of an existing array (so the product of the
/// nonzero ones fits in `usize`).
fn size(dims: impl Iterator<Item = usize> + Clone) -> usize {
    if dims.clone().any(|d| d == 0) {
        0
    } else {
        dims.product()
    }
}

/// Folds `a` over `axes` (sorted, distinct, in range) with `f` from `identity`, in row-major
/// order of the reduced elements.
fn fold_axes<T: Copy>(
    a: &ArrayD<T>,
    axes: &[usize],
    identity: T,
    f: impl Fn(T, T) -> T,
) -> ArrayD<T> {
    let shape = a.shape();
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let out_dims: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let group = size(axes.iter().map(|&d| shape[d]));
    // Kept dimensions first, reduced ones last: each output element's inputs are contiguous.
    let order: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let data: Vec<T> = a
        .view()
        .permuted_axes(IxDyn(&order))
        .iter()
        .copied()
        .collect();
    ArrayD::from_shape_fn(IxDyn(&out_dims), |o| {
        let row = row_major_index(o.slice(), &out_dims);
        data[row * group..(row + 1) * group]
            .iter()
            .fold(identity, |acc, &v| f(acc, v))
    })
}

fn reduce_num<T: Num>(a: &ArrayD<T>, kind: ReduceKind, axes: &[usize]) -> ArrayD<T> {
    let (identity, f): (T, fn(T, T) -> T) = match kind {
        ReduceKind::Sum => (T::ZERO, T::plus),
        ReduceKind::Prod => (T::ONE, T::times),
        ReduceKind::Max => (T::LOWEST, T::larger),
        ReduceKind::Min => (T::HIGHEST, T::smaller),
    };
    fold_axes(a, axes, identity, f)
}

/// `Reduce`: folds `axes` (sorted, distinct) away.
pub(super) fn reduce(ctx: &Ctx, kind: ReduceKind, axes: &[usize]) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    reduce_array(x, kind, axes).ok_or_else(|| ctx.err("reductions are not defined for pred"))
}

/// Folds `axes` (sorted, distinct, in range) of `x` away; `None` for pred.
pub(super) fn reduce_array(x: &HostArray, kind: ReduceKind, axes: &[usize]) -> Option<HostArray> {
    Some(match x {
        HostArray::Pred(_) => return None,
        HostArray::U8(a) => reduce_num(a, kind, axes).into(),
        HostArray::U32(a) => reduce_num(a, kind, axes).into(),
        HostArray::U64(a) => reduce_num(a, kind, axes).into(),
        HostArray::I8(a) => reduce_num(a, kind, axes).into(),
        HostArray::I32(a) => reduce_num(a, kind, axes).into(),
        HostArray::I64(a) => reduce_num(a, kind, axes).into(),
        HostArray::F16(a) => reduce_num(&a.mapv(f16::to_f32), kind, axes)
            .mapv(f16::from_f32)
            .into(),
        HostArray::BF16(a) => reduce_num(&a.mapv(bf16::to_f32), kind, axes)
            .mapv(bf16::from_f32)
            .into(),
        HostArray::F32(a) => reduce_num(&a.mapv(f64::from), kind, axes)
            .mapv(|v| v as f32)
            .into(),
        HostArray::F64(a) => reduce_num(a, kind, axes).into(),
    })
}

/// The index of the first extreme of each lane along `axis` in the [`Key`] order (NaN above
/// every number); 0 for an empty lane.
fn arg_extreme<T: Key>(a: &ArrayD<T>, axis: usize, kind: ArgKind) -> ArrayD<i64> {
    let wanted = match kind {
        ArgKind::Max => Ordering::Greater,
        ArgKind::Min => Ordering::Less,
    };
    a.map_axis(Axis(axis), |lane| {
        let mut best: Option<(usize, T)> = None;
        for (i, &v) in lane.iter().enumerate() {
            match best {
                Some((_, b)) if v.key_cmp(b) != wanted => {}
                _ => best = Some((i, v)),
            }
        }
        best.map_or(0, |(i, _)| i as i64)
    })
}

/// `ArgReduce`: the index of the first maximum or minimum along `axis`, in the integer dtype the
/// node declares for its output. NaN is above every number: `Max` picks the first NaN if there
/// is one; `Min` ignores NaNs unless the lane is all NaN (then 0). `-0.0` and `+0.0` tie (the
/// first wins).
pub(super) fn arg_reduce(ctx: &Ctx, kind: ArgKind, axis: usize) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    // The rule checked the node's integer index dtype.
    let index = ctx.out()?.dtype;
    let indices = with_host_array!(x, a => HostArray::I64(arg_extreme(a, axis, kind)));
    Ok(super::elementwise::convert_array(&indices, index))
}

fn running_sum<T: Num>(a: &ArrayD<T>, axis: usize) -> ArrayD<T> {
    let mut out = a.clone();
    for mut lane in out.lanes_mut(Axis(axis)) {
        let mut acc = T::ZERO;
        for v in lane.iter_mut() {
            acc = acc.plus(*v);
            *v = acc;
        }
    }
    out
}

/// `Cumsum`: inclusive running sum along `axis`, first to last.
pub(super) fn cumsum(ctx: &Ctx, axis: usize) -> Result<HostArray> {
    let x = ctx.args(1)?[0];
    Ok(match x {
        HostArray::Pred(_) => return Err(ctx.err("cumsum is not defined for pred")),
        HostArray::U8(a) => running_sum(a, axis).into(),
        HostArray::U32(a) => running_sum(a, axis).into(),
        HostArray::U64(a) => running_sum(a, axis).into(),
        HostArray::I8(a) => running_sum(a, axis).into(),
        HostArray::I32(a) => running_sum(a, axis).into(),
        HostArray::I64(a) => running_sum(a, axis).into(),
        HostArray::F16(a) => running_sum(&a.mapv(f16::to_f32), axis)
            .mapv(f16::from_f32)
            .into(),
        HostArray::BF16(a) => running_sum(&a.mapv(bf16::to_f32), axis)
            .mapv(bf16::from_f32)
            .into(),
        HostArray::F32(a) => running_sum(&a.mapv(f64::from), axis)
            .mapv(|v| v as f32)
            .into(),
        HostArray::F64(a) => running_sum(a, axis).into(),
    })
}

/// For each lane along `axis`, the source positions of the stably sorted keys.
fn sort_permutation<T: Key>(keys: &ArrayD<T>, axis: usize, descending: bool) -> ArrayD<usize> {
    let mut perm = ArrayD::from_elem(keys.raw_dim(), 0usize);
    Zip::from(keys.lanes(Axis(axis)))
        .and(perm.lanes_mut(Axis(axis)))
        .for_each(|lane, mut slots| {
            let mut order: Vec<usize> = (0..lane.len()).collect();
            // `sort_by` is stable; reversing the comparison keeps equal keys in input order.
            order.sort_by(|&i, &j| {
                let o = lane[i].key_cmp(lane[j]);
                if descending {
                    o.reverse()
                } else {
                    o
                }
            });
            for (slot, i) in slots.iter_mut().zip(order) {
                *slot = i;
            }
        });
    perm
}

/// `Sort`: stable along `axis` in the [`Key`] order (NaN last ascending, first descending;
/// `-0.0` and `+0.0` tie); a second operand is permuted along with the keys.
pub(super) fn sort(ctx: &Ctx, axis: usize, descending: bool) -> Result<Vec<HostArray>> {
    let args = ctx.all_args();
    let Some(&keys) = args.first() else {
        return Err(ctx.err("has no operands"));
    };
    let shape = keys.dims();
    let perm = with_host_array!(keys, a => sort_permutation(a, axis, descending));
    let source = |o: &[usize]| -> Vec<usize> {
        let mut src = o.to_vec();
        src[axis] = perm[IxDyn(o)];
        src
    };
    Ok(args
        .iter()
        .map(|x| with_host_array!(x, a => HostArray::from(remap(a, shape, source))))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::slice::from_ref;

    use super::super::test_util::*;
    use crate::array::HostArray;
    use crate::dtype::DType;
    use crate::error::Error;
    use crate::ops::{ArgKind, Op, ReduceKind};
    use half::{bf16, f16};

    fn is_err<T: std::fmt::Debug>(r: crate::Result<T>) {
        assert!(matches!(r, Err(Error::Interp(_))), "{r:?}");
    }

    fn reduce(kind: ReduceKind, axes: Vec<usize>, x: &HostArray, dims: &[usize]) -> HostArray {
        eval1(Op::Reduce { kind, axes }, from_ref(x), ty(x.dtype(), dims)).unwrap()
    }

    #[test]
    fn reduce_over_axes() {
        let x = arr(&[2, 3], vec![1i32, 2, 3, 4, 5, 6]);
        assert_eq!(
            values::<i32>(&reduce(ReduceKind::Sum, vec![1], &x, &[2])),
            vec![6, 15]
        );
        assert_eq!(
            values::<i32>(&reduce(ReduceKind::Sum, vec![0], &x, &[3])),
            vec![5, 7, 9]
        );
        assert_eq!(
            reduce(ReduceKind::Prod, vec![0, 1], &x, &[]),
            HostArray::scalar(720i32)
        );
        assert_eq!(
            values::<i32>(&reduce(ReduceKind::Max, vec![1], &x, &[2])),
            vec![3, 6]
        );
        assert_eq!(
            values::<i32>(&reduce(ReduceKind::Min, vec![0], &x, &[3])),
            vec![1, 2, 3]
        );
        // No axes: identity op.
        assert_eq!(reduce(ReduceKind::Sum, vec![], &x, &[2, 3]), x);
        // Wrapping.
        let w = vec1(vec![u8::MAX, 2]);
        assert_eq!(
            reduce(ReduceKind::Sum, vec![0], &w, &[]),
            HostArray::scalar(1u8)
        );
        // Three dimensions, reducing the outer and inner ones.
        let y = arr(&[2, 2, 2], (0..8).collect::<Vec<i64>>());
        assert_eq!(
            values::<i64>(&reduce(ReduceKind::Sum, vec![0, 2], &y, &[2])),
            vec![1 + 4 + 5, 2 + 3 + 6 + 7]
        );
    }

    #[test]
    fn reduce_identities_on_empty_axes() {
        let e = arr::<f32>(&[2, 0], vec![]);
        let r = |kind| values::<f32>(&reduce(kind, vec![1], &e, &[2]));
        assert_eq!(r(ReduceKind::Sum), vec![0.0, 0.0]);
        assert_eq!(r(ReduceKind::Prod), vec![1.0, 1.0]);
        assert_eq!(r(ReduceKind::Max), vec![f32::NEG_INFINITY; 2]);
        assert_eq!(r(ReduceKind::Min), vec![f32::INFINITY; 2]);
        let e = arr::<i32>(&[0], vec![]);
        assert_eq!(
            reduce(ReduceKind::Max, vec![0], &e, &[]),
            HostArray::scalar(i32::MIN)
        );
        assert_eq!(
            reduce(ReduceKind::Min, vec![0], &e, &[]),
            HostArray::scalar(i32::MAX)
        );
        let e = arr::<u64>(&[0, 5], vec![]);
        assert_eq!(
            reduce(ReduceKind::Sum, vec![0], &e, &[5]),
            vec1(vec![0u64; 5])
        );
    }

    #[test]
    fn reduce_floats_nan_and_pred() {
        let x = vec1(vec![1.0f64, f64::NAN, 3.0]);
        let m = values::<f64>(&reduce(ReduceKind::Max, vec![0], &x, &[]));
        assert!(m[0].is_nan());
        let m = values::<f64>(&reduce(ReduceKind::Min, vec![0], &x, &[]));
        assert!(m[0].is_nan());
        let z = vec1(vec![-0.0f32, 0.0]);
        assert_eq!(
            f32_bits(&reduce(ReduceKind::Max, vec![0], &z, &[])),
            vec![0.0f32.to_bits()]
        );
        // No reduction is defined for pred (the rule rejects it).
        let p = arr(&[2, 2], vec![true, false, false, false]);
        for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min] {
            is_err(eval1(
                Op::Reduce {
                    kind,
                    axes: vec![0],
                },
                from_ref(&p),
                ty(DType::Pred, &[2]),
            ));
        }
        // Unsorted, duplicate or out-of-range axes; wrong output shape.
        let n = arr(&[2, 2], vec![1i32, 0, 0, 0]);
        for axes in [vec![1, 0], vec![0, 0], vec![2]] {
            is_err(eval1(
                Op::Reduce {
                    kind: ReduceKind::Max,
                    axes,
                },
                from_ref(&n),
                ty(DType::I32, &[]),
            ));
        }
        is_err(eval1(
            Op::Reduce {
                kind: ReduceKind::Max,
                axes: vec![0],
            },
            &[n],
            ty(DType::I32, &[]),
        ));
    }

    #[test]
    fn reductions_accumulate_wide_and_round_once() {
        // In f16, 2048 + 1 + 1 + ... would stay at 2048; accumulating in f32 gives 2052.
        let x = f16s(&[2048.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(
            values::<f16>(&reduce(ReduceKind::Sum, vec![0], &x, &[])),
            vec![f16::from_f32(2052.0)]
        );
        let x = bf16s(&[256.0, 1.0, 1.0]);
        assert_eq!(
            values::<bf16>(&reduce(ReduceKind::Sum, vec![0], &x, &[])),
            vec![bf16::from_f32(258.0)]
        );
        // In f32, 2^24 + 1 + 1 would stay at 2^24; in f64 it is 2^24 + 2.
        let x = vec1(vec![16_777_216.0f32, 1.0, 1.0]);
        assert_eq!(
            values::<f32>(&reduce(ReduceKind::Sum, vec![0], &x, &[])),
            vec![16_777_218.0]
        );
        let c = eval1(Op::Cumsum { axis: 0 }, from_ref(&x), x.ty()).unwrap();
        assert_eq!(
            values::<f32>(&c),
            vec![16_777_216.0, 16_777_216.0, 16_777_218.0]
        );
    }

    #[test]
    fn arg_reduce_first_index_and_nan() {
        let arg = |kind, axis, x: &HostArray, dims: &[usize]| {
            values::<i64>(
                &eval1(
                    Op::ArgReduce { kind, axis },
                    from_ref(x),
                    ty(DType::I64, dims),
                )
                .unwrap(),
            )
        };
        let x = arr(&[2, 3], vec![3i32, 1, 3, 0, 0, -1]);
        assert_eq!(arg(ArgKind::Max, 1, &x, &[2]), vec![0, 0]);
        assert_eq!(arg(ArgKind::Min, 1, &x, &[2]), vec![1, 2]);
        assert_eq!(arg(ArgKind::Max, 0, &x, &[3]), vec![0, 0, 0]);
        let nan = f32::NAN;
        let y = vec1(vec![1.0f32, nan, 5.0, nan]);
        assert_eq!(arg(ArgKind::Max, 0, &y, &[]), vec![1]);
        assert_eq!(arg(ArgKind::Min, 0, &y, &[]), vec![0]);
        let all_nan = vec1(vec![nan, nan]);
        assert_eq!(arg(ArgKind::Max, 0, &all_nan, &[]), vec![0]);
        assert_eq!(arg(ArgKind::Min, 0, &all_nan, &[]), vec![0]);
        let z = vec1(vec![0.0f64, -0.0, f64::NEG_INFINITY]);
        assert_eq!(arg(ArgKind::Max, 0, &z, &[]), vec![0]);
        assert_eq!(arg(ArgKind::Min, 0, &z, &[]), vec![2]);
        let h = f16s(&[1.0, 4.0, -2.0]);
        assert_eq!(arg(ArgKind::Min, 0, &h, &[]), vec![2]);
        // Zero lanes give an empty result; empty lanes and pred are errors (the rule's).
        let e = arr::<f32>(&[2, 0], vec![]);
        assert_eq!(arg(ArgKind::Max, 0, &e, &[0]), Vec::<i64>::new());
        let arg_op = |axis| Op::ArgReduce {
            kind: ArgKind::Max,
            axis,
        };
        is_err(eval1(arg_op(1), from_ref(&e), ty(DType::I64, &[2])));
        let p = vec1(vec![false, true, true]);
        is_err(eval1(arg_op(0), from_ref(&p), ty(DType::I64, &[])));
        // The node's integer output dtype is the index dtype; a non-integer one is rejected.
        let narrow = eval1(
            Op::ArgReduce {
                kind: ArgKind::Min,
                axis: 1,
            },
            from_ref(&x),
            ty(DType::U8, &[2]),
        )
        .unwrap();
        assert_eq!(values::<u8>(&narrow), vec![1, 2]);
        for bad in [DType::F32, DType::Pred] {
            is_err(eval1(
                Op::ArgReduce {
                    kind: ArgKind::Max,
                    axis: 0,
                },
                from_ref(&x),
                ty(bad, &[3]),
            ));
        }
        is_err(eval1(
            Op::ArgReduce {
                kind: ArgKind::Max,
                axis: 2,
            },
            &[x],
            ty(DType::I64, &[2]),
        ));
    }

    #[test]
    fn cumsum_along_axes() {
        let x = arr(&[2, 3], vec![1i32, 2, 3, 4, 5, 6]);
        let c = eval1(Op::Cumsum { axis: 1 }, from_ref(&x), x.ty()).unwrap();
        assert_eq!(values::<i32>(&c), vec![1, 3, 6, 4, 9, 15]);
        let c = eval1(Op::Cumsum { axis: 0 }, from_ref(&x), x.ty()).unwrap();
        assert_eq!(values::<i32>(&c), vec![1, 2, 3, 5, 7, 9]);
        let w = vec1(vec![i64::MAX, 1]);
        let c = eval1(Op::Cumsum { axis: 0 }, from_ref(&w), w.ty()).unwrap();
        assert_eq!(values::<i64>(&c), vec![i64::MAX, i64::MIN]);
        let h = f16s(&[2048.0, 1.0, 1.0]);
        let c = eval1(Op::Cumsum { axis: 0 }, from_ref(&h), h.ty()).unwrap();
        assert_eq!(
            values::<f16>(&c),
            vec![
                f16::from_f32(2048.0),
                f16::from_f32(2048.0),
                f16::from_f32(2050.0)
            ]
        );
        is_err(eval1(Op::Cumsum { axis: 2 }, from_ref(&x), x.ty()));
        let p = vec1(vec![true]);
        is_err(eval1(Op::Cumsum { axis: 0 }, from_ref(&p), p.ty()));
    }

    #[test]
    fn sort_is_stable_with_nan_placement() {
        let nan = f32::NAN;
        let keys = vec1(vec![2.0f32, nan, -0.0, 1.0, 0.0, 2.0, f32::NEG_INFINITY]);
        let idx = vec1((0..7).collect::<Vec<i32>>());
        let sort = |descending| {
            let out = eval_op(
                Op::Sort {
                    axis: 0,
                    descending,
                },
                &[keys.clone(), idx.clone()],
                &[keys.ty(), idx.ty()],
            )
            .unwrap();
            values::<i32>(&out[1])
        };
        // Ascending: -inf, -0 and 0 tie (input order), 1, the two 2s in input order, NaN.
        assert_eq!(sort(false), vec![6, 2, 4, 3, 0, 5, 1]);
        // Descending: NaN, the 2s in input order, 1, the zeros in input order, -inf.
        assert_eq!(sort(true), vec![1, 0, 5, 3, 2, 4, 6]);
        let out = eval_op(
            Op::Sort {
                axis: 0,
                descending: false,
            },
            from_ref(&keys),
            &[keys.ty()],
        )
        .unwrap();
        let sorted = values::<f32>(&out[0]);
        assert_eq!(sorted[0], f32::NEG_INFINITY);
        assert_eq!(sorted[1].to_bits(), (-0.0f32).to_bits());
        assert!(sorted[6].is_nan());
    }

    #[test]
    fn sort_along_inner_and_outer_axes() {
        let x = arr(&[2, 3], vec![3u32, 1, 2, 0, 5, 4]);
        let out = eval_op(
            Op::Sort {
                axis: 1,
                descending: false,
            },
            from_ref(&x),
            &[x.ty()],
        )
        .unwrap();
        assert_eq!(values::<u32>(&out[0]), vec![1, 2, 3, 0, 4, 5]);
        let payload = arr(&[2, 3], vec![true, true, false, false, false, true]);
        let out = eval_op(
            Op::Sort {
                axis: 0,
                descending: true,
            },
            &[x.clone(), payload.clone()],
            &[x.ty(), payload.ty()],
        )
        .unwrap();
        assert_eq!(values::<u32>(&out[0]), vec![3, 5, 4, 0, 1, 2]);
        assert_eq!(
            values::<bool>(&out[1]),
            vec![true, false, true, false, true, false]
        );
        let e = arr::<i64>(&[0, 3], vec![]);
        let out = eval_op(
            Op::Sort {
                axis: 1,
                descending: false,
            },
            from_ref(&e),
            &[e.ty()],
        )
        .unwrap();
        assert_eq!(out[0], e);
        // Errors: outputs not matching inputs, mismatched shapes, bad axis.
        is_err(eval_op(
            Op::Sort {
                axis: 0,
                descending: false,
            },
            &[x.clone(), payload.clone()],
            &[x.ty()],
        ));
        is_err(eval_op(
            Op::Sort {
                axis: 0,
                descending: false,
            },
            &[x.clone(), vec1(vec![1i32])],
            &[x.ty(), ty(DType::I32, &[1])],
        ));
        is_err(eval_op(
            Op::Sort {
                axis: 2,
                descending: false,
            },
            from_ref(&x),
            &[x.ty()],
        ));
        is_err(eval_op(
            Op::Sort {
                axis: 0,
                descending: false,
            },
            &[],
            &[ty(DType::I32, &[1])],
        ));
    }
}
