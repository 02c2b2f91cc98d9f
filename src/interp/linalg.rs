//! `DotGeneral` and `Convolution`.

use half::{bf16, f16};
use ndarray::{ArrayD, Dimension, IxDyn};

use super::scalar::Num;
use super::{row_major_index, Ctx};
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::ops::ConvWindow;

use crate::error::Result;

/// The dimension numbers of a `DotGeneral`.
pub(super) struct DotDims<'a> {
    /// Batch dimensions of the lhs.
    pub(super) lhs_batch: &'a [usize],
    /// Batch dimensions of the rhs, paired with `lhs_batch`.
    pub(super) rhs_batch: &'a [usize],
    /// Contracting dimensions of the lhs.
    pub(super) lhs_contract: &'a [usize],
    /// Contracting dimensions of the rhs, paired with `lhs_contract`.
    pub(super) rhs_contract: &'a [usize],
}

/// How to view both operands as `[batch, free, contract]` matrices.
struct Plan {
    /// Lhs dimensions in batch, free, contract order.
    lhs_order: Vec<usize>,
    /// Rhs dimensions in batch, free, contract order.
    rhs_order: Vec<usize>,
    /// The number of batch dimensions and of lhs free dimensions.
    batch_rank: usize,
    lhs_free_rank: usize,
    /// Lhs free, rhs free and contracted element counts.
    m: usize,
    n: usize,
    k: usize,
    /// The output shape.
    dims: Vec<usize>,
}

/// The product of some dimensions of an existing array.
fn size(dims: &[usize], of: &[usize]) -> usize {
    if of.iter().any(|&d| dims[d] == 0) {
        0
    } else {
        of.iter().map(|&d| dims[d]).product()
    }
}

/// How to view operands of shapes `lhs` and `rhs` (which fit the dimension numbers, as the
/// rule checked) as matrices.
fn plan(d: &DotDims, lhs: &[usize], rhs: &[usize]) -> Plan {
    let free = |shape: &[usize], batch: &[usize], contract: &[usize]| -> Vec<usize> {
        (0..shape.len())
            .filter(|x| !batch.contains(x) && !contract.contains(x))
            .collect()
    };
    let lhs_free = free(lhs, d.lhs_batch, d.lhs_contract);
    let rhs_free = free(rhs, d.rhs_batch, d.rhs_contract);
    let order = |batch: &[usize], free: &[usize], contract: &[usize]| -> Vec<usize> {
        batch.iter().chain(free).chain(contract).copied().collect()
    };
    let dims = d
        .lhs_batch
        .iter()
        .chain(&lhs_free)
        .map(|&x| lhs[x])
        .chain(rhs_free.iter().map(|&x| rhs[x]))
        .collect();
    Plan {
        lhs_order: order(d.lhs_batch, &lhs_free, d.lhs_contract),
        rhs_order: order(d.rhs_batch, &rhs_free, d.rhs_contract),
        batch_rank: d.lhs_batch.len(),
        lhs_free_rank: lhs_free.len(),
        m: size(lhs, &lhs_free),
        n: size(rhs, &rhs_free),
        k: size(lhs, d.lhs_contract),
        dims,
    }
}

/// `out[b, i, j] = sum_k lhs[b, i, k] * rhs[b, j, k]` over the operands viewed through `plan`,
/// accumulating in `T` in increasing `k`.
fn dot<T: Num>(lhs: &ArrayD<T>, rhs: &ArrayD<T>, plan: &Plan) -> ArrayD<T> {
    let flat = |a: &ArrayD<T>, order: &[usize]| -> Vec<T> {
        a.view()
            .permuted_axes(IxDyn(order))
            .iter()
            .copied()
            .collect()
    };
    let (l, r) = (flat(lhs, &plan.lhs_order), flat(rhs, &plan.rhs_order));
    let (nb, nm) = (plan.batch_rank, plan.lhs_free_rank);
    let dims = &plan.dims;
    ArrayD::from_shape_fn(IxDyn(dims), |o| {
        let o = o.slice();
        // The output index is (batch index, lhs free index, rhs free index).
        let b = row_major_index(&o[..nb], &dims[..nb]);
        let i = row_major_index(&o[nb..nb + nm], &dims[nb..nb + nm]);
        let j = row_major_index(&o[nb + nm..], &dims[nb + nm..]);
        let k = plan.k;
        let lrow = &l[(b * plan.m + i) * k..][..k];
        let rrow = &r[(b * plan.n + j) * k..][..k];
        lrow.iter()
            .zip(rrow)
            .fold(T::ZERO, |acc, (&x, &y)| acc.plus(x.times(y)))
    })
}

/// `DotGeneral`: batch dimensions pair up, contracting dimensions are summed over; the output is
/// batch dimensions, then the lhs's free dimensions, then the rhs's, each in operand order.
/// Integers wrap; `f16`/`bf16` accumulate in `f32` and `f32`/`f64` in `f64`, rounded once.
/// Widening products (`i8 x i8` and `u8 x i8` into `i32`, `bf16 x bf16` into `f32`) sum in
/// the result's dtype.
pub(super) fn dot_general(ctx: &Ctx, dims: DotDims) -> Result<HostArray> {
    let args = ctx.args(2)?;
    let (lhs, rhs) = (args[0], args[1]);
    let plan = plan(&dims, lhs.dims(), rhs.dims());
    let out = ctx.out()?.dtype;
    let widening = match (lhs, rhs, out) {
        (HostArray::I8(a), HostArray::I8(b), DType::I32) => {
            Some(dot(&a.mapv(i32::from), &b.mapv(i32::from), &plan).into())
        }
        (HostArray::U8(a), HostArray::I8(b), DType::I32) => {
            Some(dot(&a.mapv(i32::from), &b.mapv(i32::from), &plan).into())
        }
        (HostArray::BF16(a), HostArray::BF16(b), DType::F32) => {
            Some(dot(&a.mapv(bf16::to_f32), &b.mapv(bf16::to_f32), &plan).into())
        }
        _ => None,
    };
    if let Some(result) = widening {
        return Ok(result);
    }
    let result = match (lhs, rhs) {
        (HostArray::U8(a), HostArray::U8(b)) => dot(a, b, &plan).into(),
        (HostArray::U32(a), HostArray::U32(b)) => dot(a, b, &plan).into(),
        (HostArray::U64(a), HostArray::U64(b)) => dot(a, b, &plan).into(),
        (HostArray::I8(a), HostArray::I8(b)) => dot(a, b, &plan).into(),
        (HostArray::I32(a), HostArray::I32(b)) => dot(a, b, &plan).into(),
        (HostArray::I64(a), HostArray::I64(b)) => dot(a, b, &plan).into(),
        (HostArray::F16(a), HostArray::F16(b)) => {
            dot(&a.mapv(f16::to_f32), &b.mapv(f16::to_f32), &plan)
                .mapv(f16::from_f32)
                .into()
        }
        (HostArray::BF16(a), HostArray::BF16(b)) => {
            dot(&a.mapv(bf16::to_f32), &b.mapv(bf16::to_f32), &plan)
                .mapv(bf16::from_f32)
                .into()
        }
        (HostArray::F32(a), HostArray::F32(b)) => {
            dot(&a.mapv(f64::from), &b.mapv(f64::from), &plan)
                .mapv(|v| v as f32)
                .into()
        }
        (HostArray::F64(a), HostArray::F64(b)) => dot(a, b, &plan).into(),
        _ => return Err(ctx.err("operand dtypes differ")),
    };
    Ok(result)
}

/// `Convolution` by its definition: each output element the sum, over its group's input
/// channels and the kernel's taps, of kernel value times the input element under the tap (zero
/// where the tap falls on padding or between dilated input elements). `f16`/`bf16` accumulate
/// in `f32` and `f32`/`f64` in `f64`, in row-major order of (channel, tap), rounded once.
pub(super) fn convolution(ctx: &Ctx, w: &ConvWindow) -> Result<HostArray> {
    let args = ctx.args(2)?;
    let (x, k) = (args[0], args[1]);
    let out = ctx.out()?;
    let (xv, kv) = (x.to_f64_vec(), k.to_f64_vec());
    let shapes = ConvShapes {
        x: x.dims(),
        k: k.dims(),
        out: &out.dims,
    };
    let values: Vec<f64> = match out.dtype {
        DType::F16 | DType::BF16 => {
            let narrow = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
            conv_sums(&narrow(&xv), &narrow(&kv), &shapes, w)
                .into_iter()
                .map(f64::from)
                .collect()
        }
        _ => conv_sums(&xv, &kv, &shapes, w),
    };
    float_values(out, values).ok_or_else(|| ctx.err(format!("convolution of {}", out.dtype)))
}

/// The operands' and the result's shapes.
struct ConvShapes<'a> {
    x: &'a [usize],
    k: &'a [usize],
    out: &'a [usize],
}

/// The convolution's output values (row-major), accumulated in `T`.
fn conv_sums<T: Num>(x: &[T], k: &[T], s: &ConvShapes, w: &ConvWindow) -> Vec<T> {
    let d = s.x.len() - 2;
    let (c, o) = (s.x[1], s.k[0]);
    let (cg, og) = (c / w.feature_groups, o / w.feature_groups);
    let x_space: usize = s.x[2..].iter().product();
    let taps: usize = s.k[2..].iter().product();
    let total: usize = s.out.iter().product();
    let mut values = Vec::with_capacity(total);
    let mut at = vec![0usize; s.out.len()];
    let mut tap = vec![0usize; d];
    for flat in 0..total {
        unravel(flat, s.out, &mut at);
        let (n, oc) = (at[0], at[1]);
        let group = oc / og;
        let mut acc = T::ZERO;
        for ci in 0..cg {
            let x_base = (n * c + group * cg + ci) * x_space;
            let k_base = (oc * cg + ci) * taps;
            for t in 0..taps {
                unravel(t, &s.k[2..], &mut tap);
                if let Some(pos) = input_position(&at[2..], &tap, s.x, w) {
                    acc = acc.plus(k[k_base + t].times(x[x_base + pos]));
                }
            }
        }
        values.push(acc);
    }
    values
}

/// The flat spatial index of the input element under kernel tap `tap` of the window at output
/// position `q`, or `None` on padding or between dilated elements.
fn input_position(q: &[usize], tap: &[usize], x: &[usize], w: &ConvWindow) -> Option<usize> {
    let mut pos = 0usize;
    for i in 0..q.len() {
        let p = (q[i] * w.strides[i] + tap[i] * w.rhs_dilation[i]) as i64;
        let u = p - w.padding[i].0;
        let ld = w.lhs_dilation[i] as i64;
        if u < 0 || u % ld != 0 || (u / ld) as usize >= x[2 + i] {
            return None;
        }
        pos = pos * x[2 + i] + (u / ld) as usize;
    }
    Some(pos)
}

/// The row-major multi-index of `flat` in `dims`, written into `out`.
fn unravel(mut flat: usize, dims: &[usize], out: &mut [usize]) {
    for (slot, &n) in out.iter_mut().zip(dims).rev() {
        *slot = flat % n.max(1);
        flat /= n.max(1);
    }
}

/// A float array of `ty` from `values`, each rounded once to its dtype; `None` for a dtype
/// that is not a float.
fn float_values(ty: &TensorType, values: Vec<f64>) -> Option<HostArray> {
    let dims = &ty.dims;
    let made = match ty.dtype {
        DType::F16 => HostArray::from_vec(dims, values.into_iter().map(f16::from_f64).collect()),
        DType::BF16 => HostArray::from_vec(dims, values.into_iter().map(bf16::from_f64).collect()),
        DType::F32 => HostArray::from_vec(dims, values.into_iter().map(|v| v as f32).collect()),
        DType::F64 => HostArray::from_vec(dims, values),
        _ => return None,
    };
    made.ok()
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::array::HostArray;
    use crate::dtype::DType;
    use crate::error::Error;
    use crate::ops::Op;
    use half::{bf16, f16};

    fn dot_op(lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> Op {
        Op::DotGeneral {
            lhs_batch: lb.to_vec(),
            rhs_batch: rb.to_vec(),
            lhs_contract: lc.to_vec(),
            rhs_contract: rc.to_vec(),
        }
    }

    #[test]
    fn matmul_and_matvec() {
        let a = arr(&[2, 3], vec![1i32, 2, 3, 4, 5, 6]);
        let b = arr(&[3, 2], vec![7i32, 8, 9, 10, 11, 12]);
        let c = eval1(
            dot_op(&[], &[], &[1], &[0]),
            &[a.clone(), b],
            ty(DType::I32, &[2, 2]),
        )
        .unwrap();
        assert_eq!(c, arr(&[2, 2], vec![58i32, 64, 139, 154]));
        let v = vec1(vec![1i32, 0, -1]);
        let c = eval1(
            dot_op(&[], &[], &[1], &[0]),
            &[a.clone(), v],
            ty(DType::I32, &[2]),
        )
        .unwrap();
        assert_eq!(values::<i32>(&c), vec![-2, -2]);
        // Contracting the lhs's first dimension: a^T a.
        let c = eval1(
            dot_op(&[], &[], &[0], &[0]),
            &[a.clone(), a],
            ty(DType::I32, &[3, 3]),
        )
        .unwrap();
        assert_eq!(values::<i32>(&c), vec![17, 22, 27, 22, 29, 36, 27, 36, 45]);
    }

    #[test]
    fn batch_dimensions_come_first_in_lhs_batch_order() {
        // lhs [k=2, b=2, m=1], rhs [n=1, b=2, k=2]: out [b, m, n].
        let lhs = arr(&[2, 2, 1], vec![1.0f64, 2.0, 3.0, 4.0]);
        let rhs = arr(&[1, 2, 2], vec![10.0f64, 100.0, 1000.0, 10000.0]);
        let c = eval1(
            dot_op(&[1], &[1], &[0], &[2]),
            &[lhs, rhs],
            ty(DType::F64, &[2, 1, 1]),
        )
        .unwrap();
        // b=0: lhs[:,0,0] = [1, 3], rhs[0,0,:] = [10, 100] -> 310.
        // b=1: lhs[:,1,0] = [2, 4], rhs[0,1,:] = [1000, 10000] -> 42000.
        assert_eq!(values::<f64>(&c), vec![310.0, 42000.0]);
    }

    #[test]
    fn outer_product_empty_contraction_and_wrapping() {
        let a = vec1(vec![1u8, 2]);
        let b = vec1(vec![3u8, 200]);
        let c = eval1(dot_op(&[], &[], &[], &[]), &[a, b], ty(DType::U8, &[2, 2])).unwrap();
        assert_eq!(values::<u8>(&c), vec![3, 200, 6, 144]);
        let e = arr::<f32>(&[2, 0], vec![]);
        let f = arr::<f32>(&[0, 3], vec![]);
        let c = eval1(
            dot_op(&[], &[], &[1], &[0]),
            &[e, f],
            ty(DType::F32, &[2, 3]),
        )
        .unwrap();
        assert_eq!(values::<f32>(&c), vec![0.0; 6]);
        let s = eval1(
            dot_op(&[], &[], &[], &[]),
            &[HostArray::scalar(3i64), HostArray::scalar(-2i64)],
            ty(DType::I64, &[]),
        )
        .unwrap();
        assert_eq!(s, HostArray::scalar(-6i64));
    }

    #[test]
    fn float_dots_accumulate_wide() {
        let a = f16s(&[2048.0, 1.0, 1.0]);
        let b = f16s(&[1.0, 1.0, 1.0]);
        let c = eval1(dot_op(&[], &[], &[0], &[0]), &[a, b], ty(DType::F16, &[])).unwrap();
        assert_eq!(values::<f16>(&c), vec![f16::from_f32(2050.0)]);
        let a = bf16s(&[256.0, 1.0]);
        let b = bf16s(&[1.0, 1.0]);
        let c = eval1(dot_op(&[], &[], &[0], &[0]), &[a, b], ty(DType::BF16, &[])).unwrap();
        assert_eq!(values::<bf16>(&c), vec![bf16::from_f32(256.0)]);
        // In f32, 2^24 + 1 + 1 would stay at 2^24; accumulating in f64 gives 2^24 + 2.
        let a = vec1(vec![16_777_216.0f32, 1.0, 1.0]);
        let b = vec1(vec![1.0f32; 3]);
        let c = eval1(dot_op(&[], &[], &[0], &[0]), &[a, b], ty(DType::F32, &[])).unwrap();
        assert_eq!(values::<f32>(&c), vec![16_777_218.0]);
    }

    #[test]
    fn malformed_dimension_numbers_are_errors() {
        let a = arr(&[2, 3], vec![0.0f32; 6]);
        let b = arr(&[3, 2], vec![0.0f32; 6]);
        let bad = |op: Op, out: &[usize]| {
            let r = eval1(op, &[a.clone(), b.clone()], ty(DType::F32, out));
            assert!(matches!(r, Err(Error::Interp(_))), "{r:?}");
        };
        bad(dot_op(&[], &[], &[0], &[0]), &[3, 2]); // sizes 2 vs 3
        bad(dot_op(&[], &[], &[1], &[]), &[2, 2]); // unpaired
        bad(dot_op(&[], &[], &[5], &[0]), &[2, 2]); // out of range
        bad(dot_op(&[1], &[0], &[1], &[0]), &[3, 2, 2]); // dimension used twice
        bad(dot_op(&[], &[], &[1], &[0]), &[2, 3]); // wrong output
        let r = eval1(
            dot_op(&[], &[], &[], &[]),
            &[HostArray::scalar(true), HostArray::scalar(true)],
            ty(DType::Pred, &[]),
        );
        assert!(matches!(r, Err(Error::Interp(_))));
        let r = eval1(
            dot_op(&[], &[], &[], &[]),
            &[HostArray::scalar(1.0f32), HostArray::scalar(1.0f64)],
            ty(DType::F32, &[]),
        );
        assert!(matches!(r, Err(Error::Interp(_))));
    }
}
