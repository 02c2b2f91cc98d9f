//! Sliding-window layers' caches as rings: a row's position `p` is kept at column `p mod R`,
//! where `R` (the cache's width) is the window, or the capacity when that is smaller (then no
//! position wraps). Memory stays flat past the window, and a decode step reads `R` columns, not
//! the whole context. A row's positions are 0, 1, ... with no gaps (only real tokens take
//! one), so which position each column holds follows from the row's newest position alone:
//! column `j` holds the largest `p <= newest` with `p mod R = j`, if that is not negative.

use super::{materialized, per_row, Positions, Read};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::Tensor;

/// Sliding-window attention of the queries of `read` whose caches `k` (`[b, g, d, R]`) and `v`
/// (`[b, g, R, d]`) are rings, with the new keys `kn` (`[b, g, d, L]`) and values `vn`
/// (`[b, g, L, d]`): the output `[b, L, g, r, d]` and the rings with the new tokens in. A
/// decode step writes first and reads the ring; a prompt reads the ring before it and its own
/// keys, then writes the last `R` of its positions.
pub(super) fn attend(
    read: &Read<'_>,
    at: &Positions<'_>,
    k: &Tensor,
    v: &Tensor,
    kn: &Tensor,
    vn: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (len, width) = (vn.dims()[2], v.dims()[2]);
    let fresh = new_valid(at, len)?;
    let before = newest_before(at)?;
    let after = before.maximum(&fresh.sub(1.0)?.max(&[1])?.convert(DType::I32)?)?;
    if len == 1 {
        let (k, v) = write_step(k, v, kn, vn, &fresh, width)?;
        // Materialized for the reason the whole cache's decode step is (see `attention`).
        let (k, v) = (materialized(&k)?, materialized(&v)?);
        let out = read.attend(&k, &v, &held(&after, width)?)?;
        return Ok((out, k, v));
    }
    let keys = Tensor::concat(&[k, kn], 3)?;
    let values = Tensor::concat(&[v, vn], 2)?;
    let valid = Tensor::concat(&[&held(&before, width)?, &fresh], 1)?;
    let out = read.attend(&keys, &values, &valid)?;
    let (k, v) = write_prompt(k, v, (kn, vn), &fresh, (&before, &after))?;
    Ok((out, k, v))
}

/// The new tokens' positions plus one (`[b, L]` f32, 0 for padding): their columns of
/// `at.valid`.
fn new_valid(at: &Positions<'_>, len: usize) -> Result<Tensor> {
    let valid = at.valid;
    let g = valid.graph();
    let (b, cap) = (valid.dims()[0], valid.dims()[1]);
    if at.column.rank() == 0 {
        let zero = g.scalar(0.0, DType::I32)?;
        return valid.dynamic_slice(&[&zero, at.column], &[b, len]);
    }
    // One column per row (a served decode step: one token each).
    let hot = g
        .iota(DType::I32, &[b, cap], 1)?
        .eq(&per_row(at.column, 2)?)?;
    hot.select(valid, 0.0)?.sum(&[1])?.reshape(&[b as isize, 1])
}

/// Each row's newest position before the new tokens (`[b]` i32, -1 for none): the largest
/// that `at.valid` marks left of the new tokens' column.
fn newest_before(at: &Positions<'_>) -> Result<Tensor> {
    let valid = at.valid;
    let (b, cap) = (valid.dims()[0], valid.dims()[1]);
    let left = valid
        .graph()
        .iota(DType::I32, &[1, cap], 1)?
        .lt(&per_row(at.column, 2)?)?
        .broadcast_to(&[b, cap])?;
    left.select(valid, 0.0)?
        .max(&[1])?
        .sub(1.0)?
        .convert(DType::I32)
}

/// Which position each column of a ring of `width` holds after a row's `newest` (`[b]` i32):
/// `[b, width]` f32, that position plus one, 0 for none.
fn held(newest: &Tensor, width: usize) -> Result<Tensor> {
    let b = newest.dims()[0];
    let j = newest.graph().iota(DType::I32, &[1, width], 1)?;
    let p = newest.reshape(&[b as isize, 1])?;
    // (p - j + width) is not negative: p >= -1 and j < width.
    let back = p.sub(&j)?.add(width as f64)?.rem(width as f64)?;
    let pos = p.sub(&back)?;
    pos.ge(0.0)?.select(&pos.astype(DType::F32)?.add(1.0)?, 0.0)
}

/// The rings with one new token per row written at its position's column, in place (rows
/// whose token is padding keep what the column held).
fn write_step(
    k: &Tensor,
    v: &Tensor,
    kn: &Tensor,
    vn: &Tensor,
    fresh: &Tensor,
    width: usize,
) -> Result<(Tensor, Tensor)> {
    let g = k.graph();
    let b = k.dims()[0];
    let zero = g.scalar(0.0, DType::I32)?;
    let column = fresh
        .sub(1.0)?
        .maximum(0.0)?
        .convert(DType::I32)?
        .rem(width as f64)?; // [b, 1]
    let (mut k, mut v) = (k.clone(), v.clone());
    for r in 0..b {
        let row = g.scalar(r as f64, DType::I32)?;
        let c = column.narrow(0, r, 1)?.reshape(&[])?;
        let real = fresh.narrow(0, r, 1)?.reshape(&[])?.gt(0.5)?;
        let put = |cache: &Tensor, new: &Tensor, starts: [&Tensor; 4]| -> Result<Tensor> {
            let new = new.narrow(0, r, 1)?;
            let old = cache.dynamic_slice(&starts, new.dims())?;
            let new = real.broadcast_to(new.dims())?.select(&new, &old)?;
            cache.dynamic_update_slice(&new, &starts)
        };
        k = put(&k, kn, [&row, &zero, &zero, &c])?;
        v = put(&v, vn, [&row, &zero, &c, &zero])?;
    }
    Ok((k, v))
}

/// The rings with a prompt's tokens written: each column takes the prompt's token of the
/// newest position that maps to it, if the prompt has one (its last `R` positions: those after
/// `before`); the other columns keep what they held.
fn write_prompt(
    k: &Tensor,
    v: &Tensor,
    (kn, vn): (&Tensor, &Tensor),
    fresh: &Tensor,
    (before, after): (&Tensor, &Tensor),
) -> Result<(Tensor, Tensor)> {
    let g = k.graph();
    let (b, width, len) = (k.dims()[0], v.dims()[2], vn.dims()[2]);
    let pos = fresh.sub(1.0)?.convert(DType::I32)?.expand_dims(-1)?; // [b, L, 1]; -1: padding
    let oldest = after.sub(width as f64)?.reshape(&[b as isize, 1, 1])?;
    let column = g.iota(DType::I32, &[1, 1, width], 2)?;
    let hot = pos
        .ge(0.0)?
        .and(&pos.gt(&oldest)?)?
        .and(&pos.rem(width as f64)?.eq(&column)?)?; // [b, L, R]: token t goes to column j
    let dims = [b, len, width];
    let t = g.iota(DType::I32, &dims, 1)?;
    let from = hot.select(&t, 0.0)?.sum(&[1])?; // [b, R]
                                                // A column is the prompt's when the position it ends up holding came after `before`.
    let newest = before
        .astype(DType::F32)?
        .add(1.0)?
        .reshape(&[b as isize, 1])?;
    let taken = held(after, width)?.gt(&newest)?; // [b, R]
    let (b, width) = (b as isize, width as isize);
    let keys = kn.take_along_axis(&from.reshape(&[b, 1, 1, width])?, 3)?;
    let values = vn.take_along_axis(&from.reshape(&[b, 1, width, 1])?, 2)?;
    let k = taken
        .reshape(&[b, 1, 1, width])?
        .broadcast_to(k.dims())?
        .select(&keys, k)?;
    let v = taken
        .reshape(&[b, 1, width, 1])?
        .broadcast_to(v.dims())?
        .select(&values, v)?;
    Ok((k, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::HostArray;
    use crate::ops::Graph;

    #[test]
    fn a_ring_holds_the_newest_position_of_each_column() {
        let g = Graph::new();
        let newest = g.parameter("newest", DType::I32, &[4]).unwrap();
        g.set_outputs(&[&held(&newest, 4).unwrap()]).unwrap();
        let input = HostArray::from_vec(&[4], vec![-1i32, 2, 3, 9]).unwrap();
        let got = crate::interp::evaluate(&g, &[input]).unwrap()[0].to_f64_vec();
        // Position p + 1 at column p mod 4, for the newest four positions that exist.
        let want = [
            [0.0, 0.0, 0.0, 0.0],
            [1.0, 2.0, 3.0, 0.0],
            [1.0, 2.0, 3.0, 4.0],
            [9.0, 10.0, 7.0, 8.0],
        ];
        assert_eq!(got, want.concat());
    }
}
