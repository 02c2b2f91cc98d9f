//! Three rules per primitive, side by side in the file of its family: its **type rule** (from
//! an [`Op`] and its operands' types, the types of its results, or a message saying what does
//! not fit), its **VJP rule** (from the cotangents of its results, those of its operands, built
//! with the ordinary builders; see `super::autodiff`) and its **batching rule** (from its
//! operands with or without a leading batch axis, the batched results; see `super::vmap`,
//! which drives them, and [`batching`], what the rules share). [`dispatch`], [`vjp`] and
//! [`batch`] each match every primitive, with no wildcard arm, so a new [`Op`] does not compile
//! without all three. `While` and `Case` are the exceptions, their arms saying so: their
//! regions are checked by [`check_while`] and [`check_case`] (`super::regions`), they are
//! differentiated by `super::autodiff::loops` and `super::autodiff::cond`, and batched by
//! `super::vmap`'s driver (`vmap/control.rs`).
//!
//! The type rules are the only place that knows which operands a primitive accepts and what it
//! gives. The builders call them through [`super::util::node`] and record the result in
//! [`Node::outputs`]; the lowering and the interpreter read those recorded types, and reach
//! the rules again only through [`check_node`] (from [`super::walk::live_nodes`]) to reject a
//! node built below the DSL whose recorded types disagree with its rule.
//!
//! A few primitives take their result type from the builder rather than computing it (a
//! parameter, a constant, an iota, a block argument, a conversion, a bitcast, a broadcast, a
//! reshape and an arg-reduction's index dtype: their attributes do not say it): [`takes_target`] names them, and their rule checks
//! the requested type instead. A `While`'s results are its state's types; its regions are
//! checked by [`check_while`].
//!
//! Messages do not name the op: each caller prefixes what the user called (a builder) or the
//! node (the walk). A message names the operands by the primitive's words for them
//! ([`operand_words`]), which a builder of another name replaces by its own roles
//! ([`super::util::Call`]), and says [`ONE_DTYPE`] when operands that must share a dtype do
//! not, so that the builder can say which to convert.

pub(crate) mod batching;
mod collectives;
mod conv;
mod elementwise;
mod index;
mod linalg;
mod reduce;
mod shape;

use super::autodiff::{Cotangents, Step};
use super::ir::{Node, Region, ValueId};
use super::op::Op;
use super::regions::{check_case, check_while};
use crate::dtype::TensorType;
use crate::error::Result;
use batching::{BatchStep, Batched};
pub(crate) use collectives::{block_type, check_shard_map, global_type};

/// A rule's verdict: the result types, or why the operands do not fit.
pub(crate) type Rule<T = Vec<TensorType>> = Result<T, String>;

/// How a rule's message begins when operands that must share one dtype do not.
pub(crate) const ONE_DTYPE: &str = "operands need one dtype";

/// The words `op`'s rule names its operands by, in order, where its messages name them
/// (`lhs` and `rhs` of a `dot_general`); empty where they do not.
pub(crate) fn operand_words(op: &Op) -> &'static [&'static str] {
    match op {
        Op::DotGeneral { .. } => &["lhs", "rhs"],
        Op::Convolution(_) => &["input", "kernel"],
        _ => &[],
    }
}

/// Whether `op`'s result type is given by its builder (and checked by its rule) rather than
/// computed from its operands (for `DotGeneral`, optionally: a widening product's).
pub(crate) fn takes_target(op: &Op) -> bool {
    matches!(
        op,
        Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Iota { .. }
            | Op::BlockArg
            | Op::Convert
            | Op::BitcastConvert
            | Op::BroadcastInDim { .. }
            | Op::Reshape
            | Op::ArgReduce { .. }
            | Op::DotGeneral { .. }
    )
}

/// The result types of `op` on operands of types `operands`; `target` is the requested result
/// type of the ops that take one ([`takes_target`]) and is ignored by the others. Every result
/// must be small enough to address.
pub(crate) fn infer(op: &Op, operands: &[&TensorType], target: Option<&TensorType>) -> Rule {
    let outputs = dispatch(op, operands, target)?;
    if let Some(ty) = outputs.iter().find(|t| t.byte_size().is_none()) {
        return Err(format!("{ty} is too large to address"));
    }
    Ok(outputs)
}

/// The type rule of `op` (see [`infer`]): one arm per primitive, calling its family's rule.
fn dispatch(op: &Op, operands: &[&TensorType], target: Option<&TensorType>) -> Rule {
    let one = |r: Rule<TensorType>| r.map(|t| vec![t]);
    match op {
        Op::Parameter { .. } | Op::BlockArg => {
            arity::<0>(operands)?;
            one(given(target))
        }
        Op::Constant { data } => one(shape::constant(operands, data, given(target)?)),
        Op::Iota { dim } => one(shape::iota(operands, *dim, given(target)?)),
        Op::Unary(u) => one(elementwise::unary(operands, *u)),
        Op::Binary(b) => one(elementwise::binary(operands, *b)),
        Op::Compare(_) => one(elementwise::compare(operands)),
        Op::Select => one(elementwise::select(operands)),
        Op::Clamp => one(elementwise::clamp(operands)),
        Op::Convert => one(elementwise::convert(operands, given(target)?)),
        Op::BitcastConvert => one(elementwise::bitcast_convert(operands, given(target)?)),
        Op::BroadcastInDim { dims } => one(shape::broadcast_in_dim(operands, dims, given(target)?)),
        Op::Reshape => one(shape::reshape(operands, given(target)?)),
        Op::Transpose { perm } => one(shape::transpose(operands, perm)),
        Op::Slice {
            start,
            limit,
            stride,
        } => one(shape::slice(operands, start, limit, stride)),
        Op::DynamicSlice { sizes } => one(index::dynamic_slice(operands, sizes)),
        Op::DynamicUpdateSlice => one(index::dynamic_update_slice(operands)),
        Op::Concatenate { axis } => one(shape::concatenate(operands, *axis)),
        Op::Pad {
            low,
            high,
            interior,
        } => one(shape::pad(operands, low, high, interior)),
        Op::Reverse { axes } => one(shape::reverse(operands, axes)),
        Op::Reduce { kind, axes } => one(reduce::reduce(operands, *kind, axes)),
        Op::ArgReduce { axis, .. } => one(reduce::arg_reduce(operands, *axis, given(target)?)),
        Op::Cumsum { axis } => one(reduce::cumsum(operands, *axis)),
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => one(linalg::dot_general(
            operands,
            [lhs_batch, rhs_batch],
            [lhs_contract, rhs_contract],
            target,
        )),
        Op::Convolution(w) => one(conv::convolution(operands, w)),
        Op::Take => one(index::take(operands)),
        Op::ScatterAdd => one(index::scatter(operands, "scatter_add")),
        Op::ScatterSet => one(index::scatter(operands, "scatter_set")),
        Op::ShardingConstraint { .. } => one(collectives::sharding_constraint(operands)),
        Op::OptimizationBarrier => {
            if operands.is_empty() {
                return Err("needs at least one value".to_string());
            }
            Ok(operands.iter().map(|&t| t.clone()).collect())
        }
        Op::AllReduce { axes, mesh, .. } => one(collectives::all_reduce(operands, axes, mesh)),
        Op::AllGather {
            axis,
            dim,
            tiled,
            mesh,
        } => one(collectives::all_gather(operands, axis, *dim, *tiled, mesh)),
        Op::ReduceScatter { axis, dim, mesh } => {
            one(collectives::reduce_scatter(operands, axis, *dim, mesh))
        }
        Op::AllToAll {
            axis,
            split_dim,
            concat_dim,
            mesh,
        } => one(collectives::all_to_all(
            operands,
            axis,
            *split_dim,
            *concat_dim,
            mesh,
        )),
        Op::AxisIndex { axis, mesh } => one(collectives::axis_index(operands, axis, mesh)),
        // The body's blocks make the types; `check_shard_map` checks them.
        Op::ShardMap { .. } => Err("takes its types from its body region".to_string()),
        Op::Sort { axis, .. } => reduce::sort(operands, *axis),
        // The branches' results make the types; `check_case` checks them.
        Op::Case { .. } => Err("takes its types from its branch regions".to_string()),
        // The state's types; the regions are `check_while`'s.
        Op::While { .. } => {
            if operands.is_empty() {
                return Err("the loop has no state".to_string());
            }
            Ok(operands.iter().map(|&t| t.clone()).collect())
        }
    }
}

/// The VJP rule of the node of `s` (any primitive but `While`): its operands' cotangents from
/// its results', one arm per primitive, calling its family's rule.
pub(crate) fn vjp(s: &Step) -> Result<Cotangents> {
    match &s.node.op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::BlockArg => Ok(s.none()),
        Op::Unary(op) => elementwise::unary_vjp(s, *op),
        Op::Binary(op) => elementwise::binary_vjp(s, *op),
        // Pred and index results: no cotangent ever reaches them.
        Op::Compare(_) | Op::ArgReduce { .. } => Ok(s.none()),
        Op::Select => elementwise::select_vjp(s),
        Op::Clamp => elementwise::clamp_vjp(s),
        Op::Convert => elementwise::convert_vjp(s),
        Op::BitcastConvert => elementwise::bitcast_convert_vjp(s),
        Op::BroadcastInDim { dims } => shape::broadcast_in_dim_vjp(s, dims),
        Op::Reshape => shape::reshape_vjp(s),
        Op::Transpose { perm } => shape::transpose_vjp(s, perm),
        Op::Slice { start, stride, .. } => shape::slice_vjp(s, start, stride),
        Op::DynamicSlice { .. } => index::dynamic_slice_vjp(s),
        Op::DynamicUpdateSlice => index::dynamic_update_slice_vjp(s),
        Op::Concatenate { axis } => shape::concatenate_vjp(s, *axis),
        Op::Pad {
            low,
            high,
            interior,
        } => shape::pad_vjp(s, low, high, interior),
        Op::Reverse { axes } => shape::reverse_vjp(s, axes),
        Op::Reduce { kind, axes } => reduce::reduce_vjp(s, *kind, axes),
        Op::Cumsum { axis } => reduce::cumsum_vjp(s, *axis),
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => linalg::dot_general_vjp(s, [lhs_batch, rhs_batch], [lhs_contract, rhs_contract]),
        Op::Convolution(w) => conv::convolution_vjp(s, w),
        Op::Take => index::take_vjp(s),
        Op::ScatterAdd => index::scatter_add_vjp(s),
        Op::ScatterSet => index::scatter_set_vjp(s),
        Op::Sort { axis, descending } => reduce::sort_vjp(s, *axis, *descending),
        Op::ShardingConstraint { .. } => collectives::sharding_constraint_vjp(s),
        Op::OptimizationBarrier => shape::optimization_barrier_vjp(s),
        // `backprop` hands loops to `autodiff::loops::while_vjp`, which needs the regions.
        Op::While { .. } => Err(s.not_differentiable("this loop")),
        // `backprop` hands conditionals to `autodiff::cond::case_vjp`.
        Op::Case { .. } => Err(s.not_differentiable("this conditional")),
        Op::ShardMap { .. }
        | Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::AxisIndex { .. } => collectives::collective_vjp(s),
    }
}

/// The batching rule of the node of `s`: its results with or without the batch (axis 0), one
/// arm per primitive, calling its family's rule. A node none of whose operands carries the
/// batch is copied as it was, whatever its primitive, but for those with regions: `While` and
/// `Case` (and the `BlockArg`s of their regions) are batched by `vmap`'s driver
/// (`vmap/control.rs`), which never hands them here, so their arms are internal errors, and
/// `ShardMap` is refused.
pub(crate) fn batch(s: &BatchStep) -> Result<Vec<Batched>> {
    let op = &s.node.op;
    // A primitive with regions, or a region's argument: never copied (see their arms).
    let regional = matches!(
        op,
        Op::While { .. } | Op::Case { .. } | Op::ShardMap { .. } | Op::BlockArg
    );
    if !regional && !s.any_batched() {
        return s.unbatched();
    }
    match op {
        // No operands, so never batched: copied above.
        Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } => s.unbatched(),
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Clamp
        | Op::Convert
        | Op::BitcastConvert => elementwise::elementwise_batch(s),
        Op::BroadcastInDim { dims } => shape::broadcast_in_dim_batch(s, dims),
        Op::Reshape => shape::reshape_batch(s),
        Op::Transpose { perm } => shape::transpose_batch(s, perm),
        Op::Slice {
            start,
            limit,
            stride,
        } => shape::slice_batch(s, start, limit, stride),
        Op::DynamicSlice { sizes } => index::dynamic_slice_batch(s, sizes),
        Op::DynamicUpdateSlice => index::dynamic_update_slice_batch(s),
        Op::Concatenate { axis } => shape::concatenate_batch(s, *axis),
        Op::Pad {
            low,
            high,
            interior,
        } => shape::pad_batch(s, low, high, interior),
        Op::Reverse { axes } => shape::reverse_batch(s, axes),
        Op::Reduce { kind, axes } => reduce::reduce_batch(s, *kind, axes),
        Op::ArgReduce { kind, axis } => reduce::arg_reduce_batch(s, *kind, *axis),
        Op::Cumsum { axis } => reduce::cumsum_batch(s, *axis),
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => linalg::dot_general_batch(s, [lhs_batch, rhs_batch], [lhs_contract, rhs_contract]),
        Op::Convolution(w) => conv::convolution_batch(s, w),
        Op::Take => index::take_batch(s),
        Op::ScatterAdd | Op::ScatterSet => index::scatter_batch(s),
        Op::Sort { axis, descending } => reduce::sort_batch(s, *axis, *descending),
        Op::OptimizationBarrier => shape::optimization_barrier_batch(s),
        Op::ShardingConstraint { spec } => collectives::sharding_constraint_batch(s, spec),
        Op::ShardMap { .. } => collectives::shard_map_batch(s),
        Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::AxisIndex { .. } => collectives::collective_batch(s),
        // `vmap`'s driver batches loops and conditionals (`Batcher::while_loop`,
        // `Batcher::case`) and binds region arguments itself.
        Op::While { .. } | Op::Case { .. } | Op::BlockArg => Err(s.error(format!(
            "internal: {} is batched by the vmap driver, not by a rule",
            op.name()
        ))),
    }
}

/// Checks node `index` against its rule: its operands exist, and its recorded output types are
/// the ones its rule gives for them (for a `While`, its regions fit its state).
pub(crate) fn check_node(nodes: &[Node], regions: &[Region], index: usize) -> Rule<()> {
    let node = nodes
        .get(index)
        .ok_or_else(|| format!("node {index} does not exist"))?;
    if let Op::While { .. } = node.op {
        return check_while(nodes, regions, index).map(drop);
    }
    if let Op::ShardMap { .. } = node.op {
        return check_shard_map(nodes, regions, index).map(drop);
    }
    if let Op::Case { .. } = node.op {
        return check_case(nodes, regions, index).map(drop);
    }
    let operands = node
        .inputs
        .iter()
        .map(|&v| value_type(nodes, v))
        .collect::<Rule<Vec<_>>>()?;
    let target = if takes_target(&node.op) {
        node.outputs.first()
    } else {
        None
    };
    let want = infer(&node.op, &operands, target)?;
    if want != node.outputs {
        return Err(format!(
            "the outputs are declared ({}), but the op gives ({})",
            list(node.outputs.iter()),
            list(want.iter())
        ));
    }
    Ok(())
}

/// The type of value `v`, or a message saying it does not exist.
pub(crate) fn value_type(nodes: &[Node], v: ValueId) -> Rule<&TensorType> {
    nodes
        .get(v.node)
        .and_then(|n| n.outputs.get(v.output))
        .ok_or_else(|| format!("value {}#{} does not exist", v.node, v.output))
}

/// Exactly `N` operands.
fn arity<'a, const N: usize>(operands: &[&'a TensorType]) -> Rule<[&'a TensorType; N]> {
    operands.try_into().map_err(|_| {
        format!(
            "takes {N} operands, got {} ({})",
            operands.len(),
            list(operands.iter())
        )
    })
}

/// The requested result type of an op that takes one.
fn given(target: Option<&TensorType>) -> Rule<TensorType> {
    target
        .cloned()
        .ok_or_else(|| "needs its result type, and none was given".to_string())
}

/// `f32[2], i32[]`: types for messages.
fn list<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;
