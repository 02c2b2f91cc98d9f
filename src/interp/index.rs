//! Indexing by runtime values: `DynamicSlice`, `DynamicUpdateSlice`, `Take`, `ScatterAdd`.

use ndarray::{ArrayD, Dimension, IxDyn};

use super::shape::remap;
use super::Ctx;
use crate::array::{HostArray, HostElement};

use super::scalar::Num;
use crate::error::Result;
use crate::with_host_array;
use half::{bf16, f16};

/// The elements of an integer array widened to `i128` (exact for every integer dtype), or `None`
/// for `Pred` and floats.
fn int_array(h: &HostArray) -> Option<ArrayD<i128>> {
    match h {
        HostArray::U8(a) => Some(a.mapv(i128::from)),
        HostArray::U32(a) => Some(a.mapv(i128::from)),
        HostArray::U64(a) => Some(a.mapv(i128::from)),
        HostArray::I8(a) => Some(a.mapv(i128::from)),
        HostArray::I32(a) => Some(a.mapv(i128::from)),
        HostArray::I64(a) => Some(a.mapv(i128::from)),
        _ => None,
    }
}

/// Reads the start indices `starts` (rank-0 integers, one per dimension) and clamps start `d` to
/// `[0, shape[d] - window[d]]` (`window[d] <= shape[d]`, as the rule checked).
fn clamped_starts(
    ctx: &Ctx,
    starts: &[&HostArray],
    shape: &[usize],
    window: &[usize],
) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(starts.len());
    for (i, s) in starts.iter().enumerate() {
        let value = int_array(s).and_then(|a| a.iter().next().copied());
        let Some(value) = value else {
            return Err(ctx.err(format!("start index {i} is {}, not an integer", s.ty())));
        };
        let max = (shape[i] - window[i]) as i128;
        out.push(value.clamp(0, max) as usize);
    }
    Ok(out)
}

/// `DynamicSlice`: a window of `sizes` at runtime start indices, clamped into the operand.
pub(super) fn dynamic_slice(ctx: &Ctx, sizes: &[usize]) -> Result<HostArray> {
    let Some((&x, starts)) = ctx.all_args().split_first() else {
        return Err(ctx.err("has no operands"));
    };
    let starts = clamped_starts(ctx, starts, x.dims(), sizes)?;
    let source =
        |o: &[usize]| -> Vec<usize> { o.iter().zip(&starts).map(|(i, s)| i + s).collect() };
    Ok(with_host_array!(x, a => HostArray::from(remap(a, sizes, source))))
}

fn update_as<T: HostElement>(
    a: &ArrayD<T>,
    update: &HostArray,
    starts: &[usize],
) -> Option<HostArray> {
    let update = T::peek(update)?;
    let mut out = a.clone();
    for (index, &v) in update.indexed_iter() {
        let target: Vec<usize> = index
            .slice()
            .iter()
            .zip(starts)
            .map(|(i, s)| i + s)
            .collect();
        out[IxDyn(&target)] = v;
    }
    Some(T::wrap(out))
}

/// `DynamicUpdateSlice`: the operand with `inputs[1]` written at runtime start indices, clamped
/// so that the update fits.
pub(super) fn dynamic_update_slice(ctx: &Ctx) -> Result<HostArray> {
    let args = ctx.all_args();
    let [x, update, starts @ ..] = args else {
        return Err(ctx.err(format!("has {} operands", args.len())));
    };
    let starts = clamped_starts(ctx, starts, x.dims(), update.dims())?;
    with_host_array!(x, a => update_as(a, update, &starts))
        .ok_or_else(|| ctx.err("the update's dtype differs"))
}

/// `Take`: rows of the table `inputs[0]` picked by the integer indices `inputs[1]`, clamped to
/// `[0, n - 1]`; output shape `indices ++ table[1..]`.
pub(super) fn take(ctx: &Ctx) -> Result<HostArray> {
    let args = ctx.args(2)?;
    let (table, indices) = (args[0], args[1]);
    let (Some((&n, rest)), Some(rows)) = (table.dims().split_first(), int_array(indices)) else {
        return Err(ctx.err(format!("cannot take {} from {}", indices.ty(), table.ty())));
    };
    let dims = &ctx.out()?.dims;
    let last = (n as i128 - 1).max(0);
    let rows = rows.mapv(|r| r.clamp(0, last) as usize);
    let k = indices.dims().len();
    let source = |o: &[usize]| -> Vec<usize> {
        let mut src = Vec::with_capacity(1 + rest.len());
        src.push(rows[IxDyn(&o[..k])]);
        src.extend_from_slice(&o[k..]);
        src
    };
    Ok(with_host_array!(table, a => HostArray::from(remap(a, dims, source))))
}

/// `table` with each element of `updates` added (by `add`, in row-major order of the updates)
/// at row `rows[i]` of the table, `i` the update's position in the indices' shape.
fn scatter_rows<T: Copy>(
    table: &ArrayD<T>,
    rows: &ArrayD<usize>,
    updates: &ArrayD<T>,
    add: impl Fn(T, T) -> T,
) -> ArrayD<T> {
    let mut out = table.clone();
    let k = rows.ndim();
    for (index, &u) in updates.indexed_iter() {
        let at = index.slice();
        let mut target = Vec::with_capacity(out.ndim());
        target.push(rows[IxDyn(&at[..k])]);
        target.extend_from_slice(&at[k..]);
        let t = &mut out[IxDyn(&target)];
        *t = add(*t, u);
    }
    out
}

/// `ScatterAdd`: the table `inputs[0]` with the rows `inputs[2]` added at the integer indices
/// `inputs[1]`, clamped to `[0, n - 1]`; integers wrap, f16 and bf16 round after each addition.
pub(super) fn scatter_add(ctx: &Ctx) -> Result<HostArray> {
    let args = ctx.args(3)?;
    let (table, indices, updates) = (args[0], args[1], args[2]);
    let (Some(&n), Some(rows)) = (table.dims().first(), int_array(indices)) else {
        return Err(ctx.err(format!(
            "cannot add {} at {} into {}",
            updates.ty(),
            indices.ty(),
            table.ty()
        )));
    };
    let last = (n as i128 - 1).max(0);
    let rows = rows.mapv(|r| r.clamp(0, last) as usize);
    // Integers and f32/f64 add with `Num::plus`; f16 and bf16 in f32, rounded after each add.
    macro_rules! scatter_each {
        ($($v:ident),*) => {
            match (table, updates) {
                $((HostArray::$v(t), HostArray::$v(u)) => {
                    Some(HostArray::from(scatter_rows(t, &rows, u, Num::plus)))
                })*
                (HostArray::F16(t), HostArray::F16(u)) => Some(HostArray::from(scatter_rows(
                    t,
                    &rows,
                    u,
                    |a, b| f16::from_f32(a.to_f32() + b.to_f32()),
                ))),
                (HostArray::BF16(t), HostArray::BF16(u)) => Some(HostArray::from(scatter_rows(
                    t,
                    &rows,
                    u,
                    |a, b| bf16::from_f32(a.to_f32() + b.to_f32()),
                ))),
                _ => None,
            }
        };
    }
    let out = scatter_each!(U8, U32, U64, I8, I32, I64, F32, F64);
    out.ok_or_else(|| ctx.err(format!("cannot add {} into {}", updates.ty(), table.ty())))
}

/// `ScatterSet`: the table `inputs[0]` with the rows at the integer indices `inputs[1]`
/// (clamped to `[0, n - 1]`) replaced by the rows of `inputs[2]`; of repeated indices the last
/// in row-major order is kept.
pub(super) fn scatter_set(ctx: &Ctx) -> Result<HostArray> {
    let args = ctx.args(3)?;
    let (table, indices, updates) = (args[0], args[1], args[2]);
    let mismatch = || {
        ctx.err(format!(
            "cannot set {} at {} in {}",
            updates.ty(),
            indices.ty(),
            table.ty()
        ))
    };
    let (Some(&n), Some(rows)) = (table.dims().first(), int_array(indices)) else {
        return Err(mismatch());
    };
    let last = (n as i128 - 1).max(0);
    let rows = rows.mapv(|r| r.clamp(0, last) as usize);
    with_host_array!(table, t => HostElement::peek(updates)
        .map(|u| HostArray::from(scatter_rows(t, &rows, u, |_, new| new))))
    .ok_or_else(mismatch)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::array::HostArray;
    use crate::dtype::DType;
    use crate::error::Error;
    use crate::ops::Op;

    fn is_err<T: std::fmt::Debug>(r: crate::Result<T>) {
        assert!(matches!(r, Err(Error::Interp(_))), "{r:?}");
    }

    #[test]
    fn dynamic_slice_clamps_starts() {
        let x = arr(&[3, 4], (0..12).collect::<Vec<i32>>());
        let ds = |r: HostArray, c: HostArray| {
            eval1(
                Op::DynamicSlice { sizes: vec![2, 2] },
                &[x.clone(), r, c],
                ty(DType::I32, &[2, 2]),
            )
        };
        let s = ds(HostArray::scalar(1i32), HostArray::scalar(1i32)).unwrap();
        assert_eq!(s, arr(&[2, 2], vec![5i32, 6, 9, 10]));
        let s = ds(HostArray::scalar(-5i64), HostArray::scalar(100i64)).unwrap();
        assert_eq!(s, arr(&[2, 2], vec![2i32, 3, 6, 7]));
        let s = ds(HostArray::scalar(u64::MAX), HostArray::scalar(0u64)).unwrap();
        assert_eq!(s, arr(&[2, 2], vec![4i32, 5, 8, 9]));
        let s = ds(HostArray::scalar(7u8), HostArray::scalar(2u8)).unwrap();
        assert_eq!(s, arr(&[2, 2], vec![6i32, 7, 10, 11]));
        // Mixed index dtypes, float indices, vector indices, wrong counts.
        is_err(ds(HostArray::scalar(1i32), HostArray::scalar(1i64)));
        is_err(ds(HostArray::scalar(1.0f32), HostArray::scalar(1.0f32)));
        is_err(ds(vec1(vec![1i32]), HostArray::scalar(1i32)));
        is_err(eval1(
            Op::DynamicSlice { sizes: vec![2, 2] },
            &[x.clone(), HostArray::scalar(0i32)],
            ty(DType::I32, &[2, 2]),
        ));
        is_err(eval1(
            Op::DynamicSlice { sizes: vec![4, 2] },
            &[x.clone(), HostArray::scalar(0i32), HostArray::scalar(0i32)],
            ty(DType::I32, &[4, 2]),
        ));
        is_err(eval1(
            Op::DynamicSlice { sizes: vec![] },
            &[],
            ty(DType::I32, &[]),
        ));
        // Rank 0: no start indices.
        let s = eval1(
            Op::DynamicSlice { sizes: vec![] },
            &[HostArray::scalar(3u8)],
            ty(DType::U8, &[]),
        )
        .unwrap();
        assert_eq!(s, HostArray::scalar(3u8));
    }

    #[test]
    fn dynamic_update_slice_clamps_starts() {
        let x = arr(&[2, 3], vec![0.0f32; 6]);
        let u = arr(&[1, 2], vec![1.0f32, 2.0]);
        let dus = |r: i32, c: i32| {
            eval1(
                Op::DynamicUpdateSlice,
                &[
                    x.clone(),
                    u.clone(),
                    HostArray::scalar(r),
                    HostArray::scalar(c),
                ],
                ty(DType::F32, &[2, 3]),
            )
            .map(|r| values::<f32>(&r))
        };
        assert_eq!(dus(0, 0).unwrap(), vec![1.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(dus(1, 1).unwrap(), vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
        assert_eq!(dus(9, 9).unwrap(), vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
        assert_eq!(dus(-1, -1).unwrap(), vec![1.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
        is_err(eval1(
            Op::DynamicUpdateSlice,
            &[
                x.clone(),
                arr(&[3, 1], vec![1.0f32; 3]),
                HostArray::scalar(0i32),
                HostArray::scalar(0i32),
            ],
            ty(DType::F32, &[2, 3]),
        ));
        is_err(eval1(
            Op::DynamicUpdateSlice,
            &[
                x.clone(),
                arr(&[1, 1], vec![1i32]),
                HostArray::scalar(0i32),
                HostArray::scalar(0i32),
            ],
            ty(DType::F32, &[2, 3]),
        ));
        is_err(eval1(Op::DynamicUpdateSlice, &[x], ty(DType::F32, &[2, 3])));
    }

    #[test]
    fn take_rows_with_clamping() {
        let table = arr(&[3, 2], vec![10i64, 11, 20, 21, 30, 31]);
        let idx = arr(&[2, 2], vec![2i32, 0, -7, 99]);
        let t = eval1(Op::Take, &[table.clone(), idx], ty(DType::I64, &[2, 2, 2])).unwrap();
        assert_eq!(values::<i64>(&t), vec![30, 31, 10, 11, 10, 11, 30, 31]);
        let t = eval1(
            Op::Take,
            &[vec1(vec![1.5f32, 2.5]), HostArray::scalar(1u8)],
            ty(DType::F32, &[]),
        )
        .unwrap();
        assert_eq!(t, HostArray::scalar(2.5f32));
        let t = eval1(
            Op::Take,
            &[table.clone(), arr::<u64>(&[0], vec![])],
            ty(DType::I64, &[0, 2]),
        )
        .unwrap();
        assert_eq!(t.dims(), &[0, 2]);
        // An empty table is an error (the rule wants rows), even when nothing is taken.
        let empty = arr::<i64>(&[0, 2], vec![]);
        is_err(eval1(
            Op::Take,
            &[empty.clone(), arr::<i32>(&[0], vec![])],
            ty(DType::I64, &[0, 2]),
        ));
        is_err(eval1(
            Op::Take,
            &[empty, vec1(vec![0i32])],
            ty(DType::I64, &[1, 2]),
        ));
        is_err(eval1(
            Op::Take,
            &[table.clone(), vec1(vec![0.0f32])],
            ty(DType::I64, &[1, 2]),
        ));
        is_err(eval1(
            Op::Take,
            &[HostArray::scalar(1i64), vec1(vec![0i32])],
            ty(DType::I64, &[1]),
        ));
        is_err(eval1(
            Op::Take,
            &[table, vec1(vec![0i32])],
            ty(DType::I64, &[2]),
        ));
    }
}
