//! Rules of the primitives that index by runtime values: `DynamicSlice`,
//! `DynamicUpdateSlice`, `Take`, `ScatterAdd`, `ScatterSet`. Their type rules first, then their VJP rules,
//! then their batching rules.

use super::batching::{front, BatchStep, Batched};
use super::{arity, list, Rule};
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::autodiff::{zeros_like, Cotangents, Step};
use crate::ops::{Op, Tensor};

/// The start indices of a dynamic slice of `x`: one rank-0 integer per dimension, all of one
/// dtype.
fn check_starts(op: &str, x: &TensorType, starts: &[&TensorType]) -> Rule<()> {
    let int_scalars = starts
        .iter()
        .all(|s| s.rank() == 0 && s.dtype.is_int() && s.dtype == starts[0].dtype);
    if starts.len() != x.rank() || !int_scalars {
        return Err(format!(
            "{op} on {x} needs {} rank-0 integer start indices of one dtype, got [{}]",
            x.rank(),
            list(starts.iter())
        ));
    }
    Ok(())
}

/// `DynamicSlice`: the operand, then its start indices; a window of `sizes` (each at most the
/// operand's size) of the operand's dtype.
pub(super) fn dynamic_slice(operands: &[&TensorType], sizes: &[usize]) -> Rule<TensorType> {
    let Some((x, starts)) = operands.split_first() else {
        return Err("takes an operand and its start indices, got no operands".to_string());
    };
    check_starts("dynamic_slice", x, starts)?;
    if sizes.len() != x.rank() || sizes.iter().zip(&x.dims).any(|(s, d)| s > d) {
        return Err(format!("sizes {sizes:?} do not fit {x}"));
    }
    Ok(TensorType::new(x.dtype, sizes))
}

/// `DynamicUpdateSlice`: the operand, an update of its dtype and rank no larger than it, then
/// the start indices; the operand's type.
pub(super) fn dynamic_update_slice(operands: &[&TensorType]) -> Rule<TensorType> {
    let [x, update, starts @ ..] = operands else {
        return Err(format!(
            "takes an operand, an update and start indices, got {} operands",
            operands.len()
        ));
    };
    check_starts("dynamic_update_slice", x, starts)?;
    let fits = update.dtype == x.dtype
        && update.rank() == x.rank()
        && update.dims.iter().zip(&x.dims).all(|(u, d)| u <= d);
    if !fits {
        return Err(format!("update {update} does not fit into {x}"));
    }
    Ok((*x).clone())
}

/// `ScatterAdd` and `ScatterSet` (`name`): a table of rank 1 or more with at least one row
/// (numbers, for an add), integer indices of any shape `I`, and updates of the table's dtype and
/// shape `I ++ table[1..]`; the table's type.
pub(super) fn scatter(operands: &[&TensorType], name: &str) -> Rule<TensorType> {
    let [table, indices, updates] = arity(operands)?;
    if table.rank() == 0 || table.dims[0] == 0 || !indices.dtype.is_int() {
        return Err(format!(
            "{name} needs a table of rank >= 1 with rows and integer indices, got table \
             {table} and indices {indices}"
        ));
    }
    if table.dtype == DType::Pred && name == "scatter_add" {
        return Err(format!("scatter_add adds numbers, not {table}"));
    }
    let mut dims = indices.dims.clone();
    dims.extend_from_slice(&table.dims[1..]);
    if updates.dtype != table.dtype || updates.dims != dims {
        return Err(format!(
            "the updates must be {} (the indices' shape, then the table's rows), got {updates}",
            TensorType::new(table.dtype, &dims)
        ));
    }
    Ok(table.clone())
}

/// `Take`: a table of rank 1 or more with at least one row, and integer indices of any shape
/// `I`; the table's dtype, shape `I ++ table[1..]`.
pub(super) fn take(operands: &[&TensorType]) -> Rule<TensorType> {
    let [table, indices] = arity(operands)?;
    if table.rank() == 0 || table.dims[0] == 0 || !indices.dtype.is_int() {
        return Err(format!(
            "take needs a table of rank >= 1 with rows and integer indices, got table {table} \
             and indices {indices}"
        ));
    }
    let mut dims = indices.dims.clone();
    dims.extend_from_slice(&table.dims[1..]);
    Ok(TensorType::new(table.dtype, &dims))
}

// VJP rules: each is the transpose of the indexing, at the same (clamped) indices; the
// indices themselves get none.

/// `DynamicSlice`: the cotangent written into zeros at the window.
pub(super) fn dynamic_slice_vjp(s: &Step) -> Result<Cotangents> {
    let starts: Vec<&Tensor> = s.inputs[1..].iter().collect();
    let zero = zeros_like(&s.inputs[0])?;
    let mut out = s.none();
    out[0] = Some(zero.dynamic_update_slice(&s.ct(0)?, &starts)?);
    Ok(out)
}

/// `DynamicUpdateSlice`: the operand's cotangent with the window zeroed; the update's, the
/// window of the cotangent.
pub(super) fn dynamic_update_slice_vjp(s: &Step) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let starts: Vec<&Tensor> = s.inputs[2..].iter().collect();
    let mut out = s.none();
    if s.want[0] {
        out[0] = Some(ct.dynamic_update_slice(&zeros_like(&s.inputs[1])?, &starts)?);
    }
    if s.want[1] {
        out[1] = Some(ct.dynamic_slice(&starts, s.inputs[1].dims())?);
    }
    Ok(out)
}

/// `Take`: the transpose of a gather, the cotangent rows added where they were picked.
pub(super) fn take_vjp(s: &Step) -> Result<Cotangents> {
    let zero = zeros_like(&s.inputs[0])?;
    let mut out = s.none();
    out[0] = Some(zero.index_add(&s.inputs[1], &s.ct(0)?)?);
    Ok(out)
}

/// `ScatterAdd`: the table's cotangent passes through; the updates', its rows at the indices.
pub(super) fn scatter_add_vjp(s: &Step) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let mut out = s.none();
    if s.want[2] {
        out[2] = Some(ct.take(&s.inputs[1])?);
    }
    out[0] = Some(ct);
    Ok(out)
}

/// `ScatterSet`: the table's cotangent with the replaced rows zeroed; the updates', its rows at
/// the indices (exact for distinct indices; of repeated ones, as the kept update is unspecified,
/// so is which update's cotangent is nonzero).
pub(super) fn scatter_set_vjp(s: &Step) -> Result<Cotangents> {
    let ct = s.ct(0)?;
    let mut out = s.none();
    if s.want[2] {
        out[2] = Some(ct.take(&s.inputs[1])?);
    }
    if s.want[0] {
        out[0] = Some(ct.index_set(&s.inputs[1], &zeros_like(&s.inputs[2])?)?);
    }
    Ok(out)
}

// Batching rules: at unbatched positions the same primitive over the whole batch axis; at
// batched positions (or with a batched table) flat indices into the batched operand, one
// example's elements after another's.

/// `DynamicSlice`: see [`dynamic_slices_batch`].
pub(super) fn dynamic_slice_batch(s: &BatchStep, sizes: &[usize]) -> Result<Vec<Batched>> {
    dynamic_slices_batch(s, 1, Some(sizes))
}

/// `DynamicUpdateSlice`: see [`dynamic_slices_batch`].
pub(super) fn dynamic_update_slice_batch(s: &BatchStep) -> Result<Vec<Batched>> {
    dynamic_slices_batch(s, 2, None)
}

/// `dynamic_slice` (`sizes` given) / `dynamic_update_slice` (the start indices from operand
/// `first_index` on) of a batched operand or update: at unbatched positions, the same primitive
/// over the whole batch axis, from 0; at batched ones, [`gathered_slices`].
fn dynamic_slices_batch(
    s: &BatchStep,
    first_index: usize,
    sizes: Option<&[usize]>,
) -> Result<Vec<Batched>> {
    if s.ins[first_index..].iter().any(|(_, batched)| *batched) {
        return gathered_slices(s, first_index, sizes);
    }
    let zero = match s.ins.get(first_index) {
        Some((i, _)) => s.g.scalar(0.0, i.dtype())?,
        None => s.g.scalar(0.0, DType::I64)?,
    };
    let mut operands = (0..first_index)
        .map(|k| s.widened(k))
        .collect::<Result<Vec<_>>>()?;
    operands.push(zero);
    operands.extend(s.ins[first_index..].iter().map(|(t, _)| t.clone()));
    let op = match sizes {
        Some(sizes) => Op::DynamicSlice {
            sizes: front(s.b, sizes),
        },
        None => Op::DynamicUpdateSlice,
    };
    s.make(op, &operands.iter().collect::<Vec<_>>(), true)
}

/// `dynamic_slice` / `dynamic_update_slice` at batched positions: each example's start
/// indices clamped as the primitive clamps them (so the window fits), turned into flat indices
/// of the batched operand, then a `take` of those elements (the slice) or, for an update, the
/// update's elements placed there (`index_add` into zeros, picked by a mask of the positions).
fn gathered_slices(
    s: &BatchStep,
    first_index: usize,
    sizes: Option<&[usize]>,
) -> Result<Vec<Batched>> {
    let (g, b) = (s.g, s.b);
    let x = s.widened(0)?;
    let update = match sizes {
        Some(_) => None,
        None => Some(s.widened(1)?),
    };
    let window: Vec<usize> = match (sizes, &update) {
        (Some(sizes), _) => sizes.to_vec(),
        (None, Some(u)) => u.dims()[1..].to_vec(),
        (None, None) => return Err(s.error("internal: not a dynamic slice")),
    };
    let dims = &x.dims()[1..];
    // The flat index of every element of the window, per example: [B, window...].
    let shape = front(b, &window);
    let per_example: usize = dims.iter().product();
    let mut idx = g.iota(DType::I64, &shape, 0)?.mul(per_example as f64)?;
    let mut stride = per_example;
    for (k, &d) in dims.iter().enumerate() {
        stride /= d.max(1);
        let first = s
            .widened(first_index + k)?
            .astype(DType::I64)?
            .clamp(0.0, d.saturating_sub(window[k]) as f64)?;
        let mut at = vec![1isize; shape.len()];
        at[0] = b as isize;
        let first = first.reshape(&at)?.broadcast_to(&shape)?;
        let along = g.iota(DType::I64, &shape, k as isize + 1)?;
        idx = idx.add(&first.add(&along)?.mul(stride as f64)?)?;
    }
    let flat = x.reshape(&[-1])?;
    let out = match update {
        None => flat.take(&idx)?,
        Some(u) => {
            if u.dtype() == DType::Pred {
                return Err(s.error(
                    "dynamic_update_slice of booleans at batched positions has no rule yet",
                ));
            }
            let placed = g.zeros(flat.dtype(), flat.dims())?.index_add(&idx, &u)?;
            let ones = g.ones(DType::I32, &shape)?;
            let mask = g
                .zeros(DType::I32, flat.dims())?
                .index_add(&idx, &ones)?
                .gt(0.0)?;
            let full: Vec<isize> = x.dims().iter().map(|&d| d as isize).collect();
            mask.select(&placed, &flat)?.reshape(&full)?
        }
    };
    Ok(vec![(out, true)])
}

/// `Take`: rows of an unbatched table at batched indices are the same `take` (the batch is the
/// indices' axis 0); a batched table is [`batched_table`]'s.
pub(super) fn take_batch(s: &BatchStep) -> Result<Vec<Batched>> {
    if !s.ins[0].1 {
        return s.make(Op::Take, &[&s.ins[0].0, &s.ins[1].0], true);
    }
    batched_table(s)
}

/// `ScatterAdd` and `ScatterSet`: [`batched_table`]'s.
pub(super) fn scatter_batch(s: &BatchStep) -> Result<Vec<Batched>> {
    batched_table(s)
}

/// `take` from, or `scatter_add` or `scatter_set` into, a batched table `[B, n, rest...]`: the batch folded into
/// the rows (`[B * n, rest...]`) and each example's indices, clamped to its own `n` rows as the
/// primitive clamps, offset by `example * n`.
fn batched_table(s: &BatchStep) -> Result<Vec<Batched>> {
    let all = (0..s.ins.len())
        .map(|k| s.widened(k))
        .collect::<Result<Vec<_>>>()?;
    let (table, idx) = (&all[0], &all[1]);
    let n = table.dims()[1];
    if n == 0 {
        return Err(s.error(format!("{} from an empty table", s.node.op.name())));
    }
    let mut flat_dims: Vec<isize> = vec![(s.b * n) as isize];
    flat_dims.extend(table.dims()[2..].iter().map(|&d| d as isize));
    let flat = table.reshape(&flat_dims)?;
    let example = s.g.iota(idx.dtype(), idx.dims(), 0)?;
    let rows = idx
        .clamp(0.0, (n - 1) as f64)?
        .add(&example.mul(n as f64)?)?;
    let table_dims: Vec<isize> = table.dims().iter().map(|&d| d as isize).collect();
    let out = match s.node.op {
        Op::Take => flat.take(&rows)?,
        Op::ScatterSet => flat.index_set(&rows, &all[2])?.reshape(&table_dims)?,
        _ => flat.index_add(&rows, &all[2])?.reshape(&table_dims)?,
    };
    Ok(vec![(out, true)])
}
