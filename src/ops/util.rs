//! Small helpers shared by the builders: axis normalisation, operand checks, scalar encoding.

use std::panic::Location;

use half::{bf16, f16};

use super::graph::{graph_error, Graph};
use super::op::Op;
use super::rules;
use super::tensor::Tensor;
use crate::dtype::{DType, TensorType};
use crate::error::Result;

/// Where a builder was called from.
pub(crate) type Loc = &'static Location<'static>;

/// Normalises a possibly negative axis for a tensor of rank `rank`.
pub(crate) fn axis(op: &'static str, t: &Tensor, axis: isize, loc: Loc) -> Result<usize> {
    axis_of(op, t.ty(), axis, loc)
}

/// Normalises a possibly negative axis for a type of rank `ty.rank()`.
pub(crate) fn axis_of(op: &'static str, ty: &TensorType, axis: isize, loc: Loc) -> Result<usize> {
    let rank = ty.rank() as isize;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank {
        return Err(graph_error(
            op,
            format!("axis {axis} is out of range for {ty} (rank {rank})"),
            loc,
        ));
    }
    Ok(a as usize)
}

/// Normalises a list of axes, rejecting duplicates; returns them sorted.
pub(crate) fn axes(op: &'static str, t: &Tensor, list: &[isize], loc: Loc) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(list.len());
    for &a in list {
        let a = axis(op, t, a, loc)?;
        if out.contains(&a) {
            return Err(graph_error(
                op,
                format!("axis {a} is given twice in {list:?} for {}", t.ty()),
                loc,
            ));
        }
        out.push(a);
    }
    out.sort_unstable();
    Ok(out)
}

/// Checks that every operand belongs to `g`.
pub(crate) fn same_graph(
    g: &Graph,
    operands: &[&Tensor],
    op: &'static str,
    loc: Loc,
) -> Result<()> {
    for t in operands {
        g.check_same(t, op, loc)?;
    }
    Ok(())
}

/// Appends a node of `op` on `operands` (which must belong to `g`) whose result types its rule
/// gives ([`super::rules::infer`]); returns its results. `target` is the requested result type
/// of the ops that take one ([`super::rules::takes_target`]). A rule's message becomes a graph
/// error naming `name` (what the user called) and `loc`.
pub(crate) fn nodes(
    g: &Graph,
    op: Op,
    operands: &[&Tensor],
    target: Option<TensorType>,
    name: &'static str,
    loc: Loc,
) -> Result<Vec<Tensor>> {
    same_graph(g, operands, name, loc)?;
    let types: Vec<&TensorType> = operands.iter().map(|t| t.ty()).collect();
    let outputs =
        rules::infer(&op, &types, target.as_ref()).map_err(|m| graph_error(name, m, loc))?;
    let inputs = operands
        .iter()
        .map(|t| g.resolve(t.id(), name, loc))
        .collect::<Result<Vec<_>>>()?;
    g.push(op, inputs, outputs)
}

/// Runs `op`'s rule on `operands` without adding a node, for a builder whose result is an
/// operand itself but must fit the rule all the same.
pub(crate) fn check(op: &Op, operands: &[&Tensor], name: &'static str, loc: Loc) -> Result<()> {
    let types: Vec<&TensorType> = operands.iter().map(|t| t.ty()).collect();
    rules::infer(op, &types, None).map_err(|m| graph_error(name, m, loc))?;
    Ok(())
}

/// [`nodes`] for an op with one result, computed by its rule.
pub(crate) fn node(
    g: &Graph,
    op: Op,
    operands: &[&Tensor],
    name: &'static str,
    loc: Loc,
) -> Result<Tensor> {
    one(nodes(g, op, operands, None, name, loc)?, name, loc)
}

/// [`nodes`] for an op whose one result has the requested type `ty` (checked by its rule).
pub(crate) fn typed_node(
    g: &Graph,
    op: Op,
    operands: &[&Tensor],
    ty: TensorType,
    name: &'static str,
    loc: Loc,
) -> Result<Tensor> {
    one(nodes(g, op, operands, Some(ty), name, loc)?, name, loc)
}

fn one(mut outputs: Vec<Tensor>, name: &'static str, loc: Loc) -> Result<Tensor> {
    match outputs.len() {
        1 => Ok(outputs.remove(0)),
        n => Err(graph_error(
            name,
            format!("internal: {n} results, expected 1"),
            loc,
        )),
    }
}

/// Formats operand types for messages: `f32[2, 3], f32[3]`.
pub(crate) fn types(operands: &[&Tensor]) -> String {
    operands
        .iter()
        .map(|t| t.ty().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The little-endian bytes of `value` as one element of `dtype`. Integer types need an integral
/// value in range; `Pred` is `value != 0`.
pub(crate) fn scalar_bytes(value: f64, dtype: DType) -> std::result::Result<Vec<u8>, String> {
    // `hi` is exclusive: 2^63 and 2^64 are exactly representable and must be rejected.
    let int = |lo: f64, hi: f64| -> std::result::Result<f64, String> {
        if value.fract() != 0.0 || !(lo <= value && value < hi) {
            Err(format!("{value} is not a {dtype} value"))
        } else {
            Ok(value)
        }
    };
    Ok(match dtype {
        DType::Pred => vec![u8::from(value != 0.0)],
        DType::U8 => vec![int(0.0, 256.0)? as u8],
        DType::U32 => (int(0.0, 2f64.powi(32))? as u32).to_le_bytes().to_vec(),
        DType::U64 => (int(0.0, 2f64.powi(64))? as u64).to_le_bytes().to_vec(),
        DType::I8 => vec![int(-128.0, 128.0)? as i8 as u8],
        DType::I32 => (int(-(2f64.powi(31)), 2f64.powi(31))? as i32)
            .to_le_bytes()
            .to_vec(),
        DType::I64 => (int(-(2f64.powi(63)), 2f64.powi(63))? as i64)
            .to_le_bytes()
            .to_vec(),
        DType::F16 => f16::from_f64(value).to_le_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(value).to_le_bytes().to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
    })
}

/// The little-endian bytes of the integer `value` as one element of `dtype`: exactly for integer
/// types (out of range is an error), rounded to the nearest value for floats (an error where that
/// is infinite), `value != 0` for `Pred`.
pub(crate) fn int_scalar_bytes(value: i128, dtype: DType) -> std::result::Result<Vec<u8>, String> {
    let bytes = match dtype {
        DType::U8 => u8::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::U32 => u32::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::U64 => u64::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::I8 => i8::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::I32 => i32::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::I64 => i64::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::F16 => Some(f16::from_f64(value as f64))
            .filter(|h| h.is_finite())
            .map(|h| h.to_le_bytes().to_vec()),
        // Every i128 is finite in these (bf16 and f32 reach 3.4e38; i128 ends at 1.7e38).
        DType::Pred | DType::BF16 | DType::F32 | DType::F64 => {
            return scalar_bytes(value as f64, dtype)
        }
    };
    bytes.ok_or_else(|| format!("{value} is not a {dtype} value"))
}
