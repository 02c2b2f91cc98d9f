//! Rules of the primitives about devices: `ShardingConstraint` (a layout hint), the
//! collectives (`AllReduce`, `AllGather`, `ReduceScatter`, `AllToAll`, `AxisIndex`) and the
//! region op they live in, `ShardMap` ([`check_shard_map`]). Their type rules first, then
//! their VJP rules, then their batching rules.

use super::batching::{BatchStep, Batched};
use super::{arity, value_type, Rule};
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::autodiff::{Cotangents, Step};
use crate::ops::ir::{Node, Region};
use crate::ops::op::Op;
use crate::sharding::{Mesh, PartitionSpec, Sharding};

/// `ShardingConstraint`: one operand, whose type it keeps.
pub(super) fn sharding_constraint(operands: &[&TensorType]) -> Rule<TensorType> {
    match operands {
        [x] => Ok((*x).clone()),
        _ => Err(format!("takes one operand, got {}", operands.len())),
    }
}

/// The size of mesh axis `axis`, or a message naming the mesh's axes.
fn axis_size(mesh: &Mesh, axis: &str) -> Rule<usize> {
    mesh.axis_size(axis).ok_or_else(|| {
        let names: Vec<&str> = mesh.axes().map(|(n, _)| n).collect();
        format!("the mesh has no axis {axis:?} (its axes: {names:?})")
    })
}

/// A numeric (not pred) operand.
fn number(x: &TensorType) -> Rule<()> {
    if x.dtype == DType::Pred {
        return Err(format!("needs numbers, got {x}"));
    }
    Ok(())
}

/// `dim` is a dimension of `x`.
fn dimension(x: &TensorType, dim: usize, what: &str) -> Rule<()> {
    if dim >= x.rank() {
        return Err(format!("{what} {dim} is out of range for {x}"));
    }
    Ok(())
}

/// Dimension `dim` of `x` splits into `n` equal parts.
fn divisible(x: &TensorType, dim: usize, n: usize, axis: &str) -> Rule<()> {
    if !x.dims[dim].is_multiple_of(n) {
        return Err(format!(
            "dimension {dim} of {x} has size {}, which the {n} devices of axis {axis:?} do not \
             divide",
            x.dims[dim]
        ));
    }
    Ok(())
}

/// `AllReduce`: a numeric operand, distinct axes of the mesh (at least one); the operand's type.
pub(super) fn all_reduce(
    operands: &[&TensorType],
    axes: &[String],
    mesh: &Mesh,
) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    number(x)?;
    if axes.is_empty() {
        return Err("needs at least one mesh axis".to_string());
    }
    for (i, a) in axes.iter().enumerate() {
        axis_size(mesh, a)?;
        if axes[..i].contains(a) {
            return Err(format!("axis {a:?} is given twice in {axes:?}"));
        }
    }
    Ok(x.clone())
}

/// `AllGather`: dimension `dim` grows by the axis size (`tiled`), or a new dimension `dim` of
/// the axis size is inserted.
pub(super) fn all_gather(
    operands: &[&TensorType],
    axis: &str,
    dim: usize,
    tiled: bool,
    mesh: &Mesh,
) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    let n = axis_size(mesh, axis)?;
    let mut dims = x.dims.clone();
    if tiled {
        dimension(x, dim, "dimension")?;
        dims[dim] *= n;
    } else {
        if dim > x.rank() {
            return Err(format!("dimension {dim} is out of range for stacking {x}"));
        }
        dims.insert(dim, n);
    }
    Ok(TensorType::new(x.dtype, &dims))
}

/// `ReduceScatter`: a numeric operand whose dimension `dim` the axis size divides; that
/// dimension shrinks by it.
pub(super) fn reduce_scatter(
    operands: &[&TensorType],
    axis: &str,
    dim: usize,
    mesh: &Mesh,
) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    number(x)?;
    let n = axis_size(mesh, axis)?;
    dimension(x, dim, "dimension")?;
    divisible(x, dim, n, axis)?;
    let mut dims = x.dims.clone();
    dims[dim] /= n;
    Ok(TensorType::new(x.dtype, &dims))
}

/// `AllToAll`: `split_dim` (divisible by the axis size) shrinks by it and `concat_dim` grows
/// by it.
pub(super) fn all_to_all(
    operands: &[&TensorType],
    axis: &str,
    split_dim: usize,
    concat_dim: usize,
    mesh: &Mesh,
) -> Rule<TensorType> {
    let [x] = arity(operands)?;
    let n = axis_size(mesh, axis)?;
    dimension(x, split_dim, "split dimension")?;
    dimension(x, concat_dim, "concat dimension")?;
    divisible(x, split_dim, n, axis)?;
    let mut dims = x.dims.clone();
    dims[split_dim] /= n;
    dims[concat_dim] *= n;
    Ok(TensorType::new(x.dtype, &dims))
}

/// `AxisIndex`: no operands, an axis of the mesh; `i32[]`.
pub(super) fn axis_index(operands: &[&TensorType], axis: &str, mesh: &Mesh) -> Rule<TensorType> {
    arity::<0>(operands)?;
    axis_size(mesh, axis)?;
    Ok(TensorType::new(DType::I32, &[]))
}

/// The block of a value of type `ty` laid out as `spec` over `mesh` (checked to fit).
pub(crate) fn block_type(mesh: &Mesh, spec: &PartitionSpec, ty: &TensorType) -> Rule<TensorType> {
    let sharding = Sharding::new(mesh, spec).map_err(crate::ops::sharding::message)?;
    sharding
        .check(ty, &ty.to_string())
        .map_err(crate::ops::sharding::message)?;
    Ok(TensorType::new(ty.dtype, &sharding.shard_dims(&ty.dims)))
}

/// The global type made of blocks of type `block` laid out as `spec` over `mesh`.
pub(crate) fn global_type(
    mesh: &Mesh,
    spec: &PartitionSpec,
    block: &TensorType,
) -> Rule<TensorType> {
    Sharding::new(mesh, spec).map_err(crate::ops::sharding::message)?;
    if spec.dims().len() > block.rank() {
        return Err(format!(
            "partition spec {spec} has {} dimensions but the block is {block}",
            spec.dims().len()
        ));
    }
    let mut dims = block.dims.clone();
    for (d, size) in dims.iter_mut().enumerate() {
        for a in spec.axes_of(d) {
            *size = size
                .checked_mul(mesh.axis_size(a).unwrap_or(1))
                .ok_or_else(|| format!("the global value of {block} under {spec} is too large"))?;
        }
    }
    Ok(TensorType::new(block.dtype, &dims))
}

/// Checks the `ShardMap` node `index` against its body region and returns the region: one spec
/// per input and per output; the body is nested directly in the node's region and takes one
/// distinct block argument of that region per input, of the input's block type; it returns one
/// value of the region per output, whose global type is the output's.
pub(crate) fn check_shard_map(nodes: &[Node], regions: &[Region], index: usize) -> Rule<usize> {
    let node = nodes
        .get(index)
        .ok_or_else(|| format!("node {index} does not exist"))?;
    let Op::ShardMap {
        body,
        mesh,
        in_specs,
        out_specs,
    } = &node.op
    else {
        return Err(format!(
            "node {index} is a {}, not a shard_map",
            node.op.name()
        ));
    };
    let body = *body;
    if in_specs.len() != node.inputs.len() || out_specs.len() != node.outputs.len() {
        return Err(format!(
            "{} inputs and {} outputs but {} in_specs and {} out_specs",
            node.inputs.len(),
            node.outputs.len(),
            in_specs.len(),
            out_specs.len()
        ));
    }
    let region = regions
        .get(body)
        .ok_or_else(|| format!("the body region {body} does not exist"))?;
    if region.parent != Some(node.region) {
        return Err(format!(
            "the body region {body} is not nested in region {}, where the shard_map is",
            node.region
        ));
    }
    check_block_args(nodes, node, region, body, mesh, in_specs)?;
    check_block_results(nodes, node, region, body, mesh, out_specs)?;
    Ok(body)
}

/// The arguments of a shard_map's body region `body`: one distinct `BlockArg` of the region per
/// input of `node`, of the type of that input's block under its spec.
fn check_block_args(
    nodes: &[Node],
    node: &Node,
    region: &Region,
    body: usize,
    mesh: &Mesh,
    in_specs: &[PartitionSpec],
) -> Rule<()> {
    if region.args.len() != node.inputs.len() {
        return Err(format!(
            "the body region {body} takes {} arguments, the shard_map has {} inputs",
            region.args.len(),
            node.inputs.len()
        ));
    }
    for (k, ((&v, &a), spec)) in node
        .inputs
        .iter()
        .zip(&region.args)
        .zip(in_specs)
        .enumerate()
    {
        let want =
            block_type(mesh, spec, value_type(nodes, v)?).map_err(|m| format!("input {k}: {m}"))?;
        let arg = nodes.get(a.node).filter(|n| {
            matches!(n.op, Op::BlockArg)
                && n.region == body
                && a.output == 0
                && n.outputs.len() == 1
        });
        if arg.is_none() || region.args[..k].contains(&a) {
            return Err(format!(
                "argument {k} of the body region {body} is {}#{}, not a distinct block argument \
                 of that region",
                a.node, a.output
            ));
        }
        let got = value_type(nodes, a)?;
        if *got != want {
            return Err(format!(
                "argument {k} of the body region {body} is {got}, the block of input {k} is {want}"
            ));
        }
    }
    Ok(())
}

/// The results of a shard_map's body region `body`: one value of the region per output of
/// `node`, whose block makes up that output under its spec.
fn check_block_results(
    nodes: &[Node],
    node: &Node,
    region: &Region,
    body: usize,
    mesh: &Mesh,
    out_specs: &[PartitionSpec],
) -> Rule<()> {
    if region.results.len() != node.outputs.len() {
        return Err(format!(
            "the body returns {} values, the shard_map has {} outputs",
            region.results.len(),
            node.outputs.len()
        ));
    }
    for (k, ((&v, out), spec)) in region
        .results
        .iter()
        .zip(&node.outputs)
        .zip(out_specs)
        .enumerate()
    {
        let block = value_type(nodes, v)?;
        if nodes[v.node].region != body {
            return Err(format!(
                "result {k} of the body region {body} is {}#{}, which is defined in region {}",
                v.node, v.output, nodes[v.node].region
            ));
        }
        let want = global_type(mesh, spec, block).map_err(|m| format!("output {k}: {m}"))?;
        if *out != want {
            return Err(format!(
                "output {k} is declared {out}, but the body's block {block} under {spec} makes {want}"
            ));
        }
    }
    Ok(())
}

// VJP rules.

/// `ShardingConstraint`: the identity, without constraining the cotangent too (as JAX does):
/// XLA's partitioner computed wrong values for a program with such a constraint on a constant
/// cotangent feeding a pad with interior padding (found by the sharded_graph fuzz target; see
/// `docs/devices.md`).
pub(super) fn sharding_constraint_vjp(s: &Step) -> Result<Cotangents> {
    let mut out = s.none();
    out[0] = Some(s.ct(0)?);
    Ok(out)
}

/// `ShardMap` and the collectives: not differentiable (yet), an error naming the op.
pub(super) fn collective_vjp(s: &Step) -> Result<Cotangents> {
    Err(s.not_differentiable("a shard_map or collective"))
}

// Batching rules.

/// `ShardingConstraint`: the same spec with the batch axis in front, not split.
pub(super) fn sharding_constraint_batch(
    s: &BatchStep,
    spec: &PartitionSpec,
) -> Result<Vec<Batched>> {
    s.leading(Op::ShardingConstraint {
        spec: spec.with_leading_axis(),
    })
}

/// `ShardMap`: refused under `vmap` (even over unbatched operands), an error naming it.
pub(super) fn shard_map_batch(s: &BatchStep) -> Result<Vec<Batched>> {
    Err(s.error(format!(
        "{} inside vmap is not supported yet",
        s.node.op.name()
    )))
}

/// The collectives over a batched operand: no rule yet, an error naming the op (over unbatched
/// operands they are copied as they are, as every primitive is).
pub(super) fn collective_batch(s: &BatchStep) -> Result<Vec<Batched>> {
    Err(s.no_rule())
}
