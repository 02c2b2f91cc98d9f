//! `vmap` (JAX's `jax.vmap`): a function written for one example, applied to a batch.
//!
//! The function is built once on per-example placeholders, in a region of its own (so it may
//! use any value from outside, and take gradients, as a loop body can); then its nodes are
//! copied into the caller's region by a batching rule per primitive: the batch is axis 0 of
//! every batched value, an operand that is not batched is broadcast where an elementwise
//! operation meets a batched one, and each rule shifts the primitive's axes past the batch.
//! A conditional whose index is the same for every example stays a conditional over the
//! batched branches; with a batched index every branch runs and each example's result is
//! picked by its index (`select`), as JAX does. A loop becomes a loop over the batched state: with an
//! unbatched predicate (a `fori_loop`'s counter) one trip count for all, still differentiable;
//! with a batched one, it runs while any example goes on and freezes the others. Dynamic slices
//! at per-example positions become gathers (and a masked scatter for updates). A primitive
//! without a rule (`shard_map`, collectives, boolean updates at batched positions, a batched
//! padding value) is an error naming it. A sharding constraint keeps its spec, the batch axis
//! not split.

mod control;

use std::collections::HashMap;
use std::panic::Location;

use super::autodiff::SpanCopies;
use super::control::RegionGuard;
use super::graph::{graph_error, Graph};
use super::ir::{Node, Region, ValueId};
use super::op::Op;
use super::rules::takes_target;
use super::tensor::Tensor;
use super::util::{nodes as make_nodes, same_graph, Loc};
use crate::dtype::TensorType;
use crate::error::Result;

const OP: &str = "vmap";

/// A value of the batched graph and whether it carries the batch (as axis 0).
pub(crate) type Batched = (Tensor, bool);

impl Graph {
    /// `f` applied to every example of a batch: `inputs[k]` is batched along `in_axes[k]`
    /// (`None`: the same value for every example), all batched inputs of one size `B`; `f`
    /// gets one example of each (and the unbatched inputs whole) and returns per-example
    /// values; the results stack them along `out_axes[k]` (empty: all 0). JAX's `vmap`,
    /// nested as it nests, `grad` inside it giving per-example gradients (embedding lookups
    /// included: takes and scatter-adds on batched tables have rules).
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let w = g.parameter("w", DType::F64, &[3])?;
    /// let xs = g.parameter("xs", DType::F64, &[4, 3])?;
    /// // Per-example gradients of (w . x)^2 with respect to w: 2 (w . x) x for each row x.
    /// let grads = g.vmap(&[&w, &xs], &[None, Some(0)], &[], |a| {
    ///     let loss = a[0].mul(&a[1])?.sum_all()?.square()?;
    ///     loss.grad(&[&a[0]])
    /// })?;
    /// g.set_outputs(&[&grads[0]])?; // [4, 3]
    /// let out = g.evaluate(&[
    ///     HostArray::from_vec(&[3], vec![1.0f64, 0.0, 2.0])?,
    ///     HostArray::from_vec(&[4, 3], vec![1.0f64, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])?,
    /// ])?;
    /// assert_eq!(out[0].to_f64_vec(), [2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 6.0, 6.0, 6.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn vmap(
        &self,
        inputs: &[&Tensor],
        in_axes: &[Option<usize>],
        out_axes: &[usize],
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let (outs, b) = self.vmap_batched(inputs, in_axes, f, loc)?;
        if !out_axes.is_empty() && out_axes.len() != outs.len() {
            return Err(graph_error(
                OP,
                format!("{} out_axes for {} results", out_axes.len(), outs.len()),
                loc,
            ));
        }
        outs.into_iter()
            .enumerate()
            .map(|(k, (t, batched))| {
                let t = if batched { t } else { batch_broadcast(&t, b)? };
                let axis = out_axes.get(k).copied().unwrap_or(0);
                if axis >= t.rank() {
                    return Err(graph_error(
                        OP,
                        format!("out_axes[{k}] = {axis} is out of range for {}", t.ty()),
                        loc,
                    ));
                }
                move_axis(&t, 0, axis)
            })
            .collect()
    }

    /// [`Graph::vmap`]'s results before `out_axes`: each with the batch as axis 0 when it
    /// carries one (`true`), as the one value for every example when not; and the batch size.
    pub(crate) fn vmap_batched(
        &self,
        inputs: &[&Tensor],
        in_axes: &[Option<usize>],
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
        loc: Loc,
    ) -> Result<(Vec<Batched>, usize)> {
        same_graph(self, inputs, OP, loc)?;
        let b = batch_size(inputs, in_axes, loc)?;
        let (region, outs) = self.example_region(inputs, in_axes, f, loc)?;
        let env = self.with_structure(|nodes, regions| {
            // Placeholders become the inputs with the batch first; captures the outer values.
            let mut env: HashMap<ValueId, Batched> = HashMap::new();
            let placeholders = inputs.iter().zip(in_axes).filter(|(_, a)| a.is_some());
            for (arg, (t, a)) in regions[region].args.iter().zip(placeholders) {
                env.insert(*arg, (move_axis(t, a.unwrap_or(0), 0)?, true));
            }
            for (outer_value, inner) in self.region_captures(region) {
                let t = self
                    .tensor(outer_value)
                    .ok_or_else(|| graph_error(OP, "lost a value", loc))?;
                env.insert(inner, (t, false));
            }
            let batcher = Batcher {
                g: self,
                nodes,
                regions,
                b,
                loc,
            };
            batcher.region(region, &mut env)?;
            Ok::<_, crate::error::Error>(env)
        })?;
        Ok((lookup(&env, &outs, loc)?, b))
    }

    /// Builds `f` on per-example placeholders (block arguments of a region of its own; the
    /// unbatched inputs passed whole, captured when used) and returns the region and the ids of
    /// its results.
    fn example_region(
        &self,
        inputs: &[&Tensor],
        in_axes: &[Option<usize>],
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
        loc: Loc,
    ) -> Result<(usize, Vec<ValueId>)> {
        let outer = self.current_region();
        let _guard = RegionGuard { graph: self, outer };
        let region = self.open_region();
        let mut args = Vec::with_capacity(inputs.len());
        for (t, axis) in inputs.iter().zip(in_axes) {
            args.push(match axis {
                Some(a) => {
                    let mut dims = t.dims().to_vec();
                    dims.remove(*a);
                    self.add_block_arg(region, TensorType::new(t.dtype(), &dims))
                }
                None => (*t).clone(),
            });
        }
        let outs = f(&args)?;
        let refs: Vec<&Tensor> = outs.iter().collect();
        same_graph(self, &refs, OP, loc)?;
        let ids = outs
            .iter()
            .map(|t| self.resolve(t.id(), OP, loc))
            .collect::<Result<Vec<_>>>()?;
        Ok((region, ids))
    }
}

/// What copying a region by the batching rules needs: the graph, a snapshot of its nodes and
/// regions (taken once; the copies added meanwhile are not in it), the batch size.
struct Batcher<'a> {
    g: &'a Graph,
    nodes: &'a [Node],
    regions: &'a [Region],
    b: usize,
    loc: Loc,
}

impl Batcher<'_> {
    /// Copies the nodes of `region` into the current one by their batching rules, reading and
    /// writing `env`.
    fn region(&self, region: usize, env: &mut HashMap<ValueId, Batched>) -> Result<()> {
        let mut spans = SpanCopies::new(self.g, region, Some(self.b));
        for (index, node) in self.nodes.iter().enumerate() {
            if node.region != region || matches!(node.op, Op::BlockArg) {
                continue;
            }
            spans.step(self.g, index, &|v| env.get(&v).cloned())?;
            if matches!(node.op, Op::ShardMap { .. }) {
                return Err(graph_error(
                    OP,
                    format!("{} inside vmap is not supported yet", node.op.name()),
                    self.loc,
                ));
            }
            let ins = lookup(env, &node.inputs, self.loc)?;
            let outs = match &node.op {
                Op::Case { branches } => self.case(branches, &ins, env)?,
                Op::While { cond, body } => self.while_loop(*cond, *body, &ins, env)?,
                _ => batch_node(self.g, node, ins, self.b, self.loc)?,
            };
            for (output, value) in outs.into_iter().enumerate() {
                env.insert(
                    ValueId {
                        node: index,
                        output,
                    },
                    value,
                );
            }
        }
        spans.finish(self.g, &|v| env.get(&v).cloned())
    }
}

/// The batched values of `ids`.
fn lookup(env: &HashMap<ValueId, Batched>, ids: &[ValueId], loc: Loc) -> Result<Vec<Batched>> {
    ids.iter()
        .map(|v| {
            env.get(v)
                .cloned()
                .ok_or_else(|| graph_error(OP, "internal: a value is missing", loc))
        })
        .collect()
}

/// The batch size: the size of every batched input's batch axis.
fn batch_size(inputs: &[&Tensor], in_axes: &[Option<usize>], loc: Loc) -> Result<usize> {
    if inputs.len() != in_axes.len() {
        return Err(graph_error(
            OP,
            format!("{} inputs but {} in_axes", inputs.len(), in_axes.len()),
            loc,
        ));
    }
    let mut size = None;
    for (k, (t, axis)) in inputs.iter().zip(in_axes).enumerate() {
        let Some(a) = axis else { continue };
        let n = *t.dims().get(*a).ok_or_else(|| {
            graph_error(
                OP,
                format!("in_axes[{k}] = {a} is out of range for {}", t.ty()),
                loc,
            )
        })?;
        match size {
            None => size = Some(n),
            Some(s) if s == n => {}
            Some(s) => {
                return Err(graph_error(
                    OP,
                    format!("input {k} has a batch of {n}, an earlier one {s}"),
                    loc,
                ))
            }
        }
    }
    size.ok_or_else(|| graph_error(OP, "no input is batched (every in_axes entry is None)", loc))
}

/// `t` with axis `from` moved to position `to`.
fn move_axis(t: &Tensor, from: usize, to: usize) -> Result<Tensor> {
    if from == to {
        return Ok(t.clone());
    }
    let mut perm: Vec<isize> = (0..t.rank() as isize)
        .filter(|&i| i != from as isize)
        .collect();
    perm.insert(to, from as isize);
    t.transpose(&perm)
}

/// `t` repeated along a new axis 0 of size `b`.
fn batch_broadcast(t: &Tensor, b: usize) -> Result<Tensor> {
    let mut dims = vec![b];
    dims.extend_from_slice(t.dims());
    t.expand_dims(0)?.broadcast_to(&dims)
}

/// `dims` with the batch in front.
fn batched_type(ty: &TensorType, b: usize) -> TensorType {
    let mut dims = vec![b];
    dims.extend_from_slice(&ty.dims);
    TensorType::new(ty.dtype, &dims)
}

/// Shifts axis numbers past the batch.
fn shift(axes: &[usize]) -> Vec<usize> {
    axes.iter().map(|a| a + 1).collect()
}

/// The batched copy of `node` given its batched operands.
fn batch_node(
    g: &Graph,
    node: &Node,
    ins: Vec<Batched>,
    b: usize,
    loc: Loc,
) -> Result<Vec<Batched>> {
    let refs: Vec<&Tensor> = ins.iter().map(|(t, _)| t).collect();
    let target = |batched: bool| {
        takes_target(&node.op).then(|| match batched {
            true => batched_type(&node.outputs[0], b),
            false => node.outputs[0].clone(),
        })
    };
    if !ins.iter().any(|(_, batched)| *batched) {
        let made = make_nodes(g, node.op.clone(), &refs, target(false), OP, loc)?;
        return Ok(made.into_iter().map(|t| (t, false)).collect());
    }
    let op = match &node.op {
        Op::DynamicSlice { .. } | Op::DynamicUpdateSlice => {
            return dynamic_slices(g, node, ins, b, loc)
        }
        Op::DotGeneral { .. } => return dot_general(node, &ins, loc),
        Op::Convolution(w) => return convolution(g, w, &ins, b, loc),
        Op::Take if !ins[0].1 => {
            // Rows of an unbatched table at batched indices: the batch is the indices' axis 0.
            let made = make_nodes(g, Op::Take, &refs, None, OP, loc)?;
            return Ok(made.into_iter().map(|t| (t, true)).collect());
        }
        Op::Take | Op::ScatterAdd => return batched_table(g, node, &ins, b, loc),
        Op::Pad { .. } if ins[1].1 => {
            return Err(graph_error(
                OP,
                "pad with a batched padding value has no batching rule yet",
                loc,
            ))
        }
        _ => batched_op(&node.op, b, loc)?,
    };
    // Every operand batched (broadcast where not), but a padding value, which stays a scalar.
    let operands = ins
        .iter()
        .enumerate()
        .map(|(k, (t, batched))| match (*batched, &op, k) {
            (true, _, _) | (_, Op::Pad { .. }, 1) => Ok(t.clone()),
            _ => batch_broadcast(t, b),
        })
        .collect::<Result<Vec<_>>>()?;
    let operand_refs: Vec<&Tensor> = operands.iter().collect();
    let made = make_nodes(g, op, &operand_refs, target(true), OP, loc)?;
    Ok(made.into_iter().map(|t| (t, true)).collect())
}

/// The primitive a batched operand turns `op` into: its axes shifted past the batch (axis 0).
fn batched_op(op: &Op, b: usize, loc: Loc) -> Result<Op> {
    let front = |first: usize, rest: &[usize]| -> Vec<usize> {
        [first].into_iter().chain(rest.iter().copied()).collect()
    };
    Ok(match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Clamp
        | Op::Convert
        | Op::BitcastConvert
        | Op::Reshape
        | Op::OptimizationBarrier => op.clone(),
        Op::BroadcastInDim { dims } => Op::BroadcastInDim {
            dims: front(0, &shift(dims)),
        },
        Op::Transpose { perm } => Op::Transpose {
            perm: front(0, &shift(perm)),
        },
        Op::Slice {
            start,
            limit,
            stride,
        } => Op::Slice {
            start: front(0, start),
            limit: front(b, limit),
            stride: front(1, stride),
        },
        Op::Concatenate { axis } => Op::Concatenate { axis: axis + 1 },
        Op::Pad {
            low,
            high,
            interior,
        } => Op::Pad {
            low: [0].into_iter().chain(low.iter().copied()).collect(),
            high: [0].into_iter().chain(high.iter().copied()).collect(),
            interior: front(0, interior),
        },
        Op::Reverse { axes } => Op::Reverse { axes: shift(axes) },
        Op::Reduce { kind, axes } => Op::Reduce {
            kind: *kind,
            axes: shift(axes),
        },
        Op::ArgReduce { kind, axis } => Op::ArgReduce {
            kind: *kind,
            axis: axis + 1,
        },
        Op::Cumsum { axis } => Op::Cumsum { axis: axis + 1 },
        Op::ShardingConstraint { spec } => Op::ShardingConstraint {
            spec: spec.with_leading_axis(),
        },
        Op::Sort { axis, descending } => Op::Sort {
            axis: axis + 1,
            descending: *descending,
        },
        other => {
            return Err(graph_error(
                OP,
                format!("{} has no batching rule yet", other.name()),
                loc,
            ))
        }
    })
}

/// `take` from, or `scatter_add` into, a batched table `[B, n, rest...]`: the batch folded into
/// the rows (`[B * n, rest...]`) and each example's indices, clamped to its own `n` rows as the
/// primitive clamps, offset by `example * n`.
fn batched_table(
    g: &Graph,
    node: &Node,
    ins: &[Batched],
    b: usize,
    loc: Loc,
) -> Result<Vec<Batched>> {
    let all: Vec<Tensor> = ins
        .iter()
        .map(|(t, batched)| match batched {
            true => Ok(t.clone()),
            false => batch_broadcast(t, b),
        })
        .collect::<Result<_>>()?;
    let (table, idx) = (&all[0], &all[1]);
    let n = table.dims()[1];
    if n == 0 {
        return Err(graph_error(
            OP,
            format!("{} from an empty table", node.op.name()),
            loc,
        ));
    }
    let mut flat_dims: Vec<isize> = vec![(b * n) as isize];
    flat_dims.extend(table.dims()[2..].iter().map(|&d| d as isize));
    let flat = table.reshape(&flat_dims)?;
    let example = g.iota(idx.dtype(), idx.dims(), 0)?;
    let rows = idx
        .clamp(0.0, (n - 1) as f64)?
        .add(&example.mul(n as f64)?)?;
    let out = match node.op {
        Op::Take => flat.take(&rows)?,
        _ => {
            let table_dims: Vec<isize> = table.dims().iter().map(|&d| d as isize).collect();
            flat.index_add(&rows, &all[2])?.reshape(&table_dims)?
        }
    };
    Ok(vec![(out, true)])
}

/// `dynamic_slice` / `dynamic_update_slice` of a batched operand (or update) at unbatched
/// positions: the whole batch axis, from 0.
fn dynamic_slices(
    g: &Graph,
    node: &Node,
    ins: Vec<Batched>,
    b: usize,
    loc: Loc,
) -> Result<Vec<Batched>> {
    let first_index = if matches!(node.op, Op::DynamicSlice { .. }) {
        1
    } else {
        2
    };
    if ins[first_index..].iter().any(|(_, batched)| *batched) {
        return gathered_slices(g, node, &ins, b, loc);
    }
    let zero = match ins.get(first_index) {
        Some((i, _)) => g.scalar(0.0, i.dtype())?,
        None => g.scalar(0.0, crate::dtype::DType::I64)?,
    };
    let mut operands: Vec<Tensor> = ins[..first_index]
        .iter()
        .map(|(t, batched)| {
            if *batched {
                Ok(t.clone())
            } else {
                batch_broadcast(t, b)
            }
        })
        .collect::<Result<_>>()?;
    operands.push(zero);
    operands.extend(ins[first_index..].iter().map(|(t, _)| t.clone()));
    let op = match &node.op {
        Op::DynamicSlice { sizes } => Op::DynamicSlice {
            sizes: [b].into_iter().chain(sizes.iter().copied()).collect(),
        },
        _ => Op::DynamicUpdateSlice,
    };
    let refs: Vec<&Tensor> = operands.iter().collect();
    let made = make_nodes(g, op, &refs, None, OP, loc)?;
    Ok(made.into_iter().map(|t| (t, true)).collect())
}

/// `dynamic_slice` / `dynamic_update_slice` at batched positions: each example's start
/// indices clamped as the primitive clamps them (so the window fits), turned into flat indices
/// of the batched operand, then a `take` of those elements (the slice) or, for an update, the
/// update's elements placed there (`index_add` into zeros, picked by a mask of the positions).
fn gathered_slices(
    g: &Graph,
    node: &Node,
    ins: &[Batched],
    b: usize,
    loc: Loc,
) -> Result<Vec<Batched>> {
    use crate::dtype::DType;
    let widen = |(t, batched): &Batched| match batched {
        true => Ok(t.clone()),
        false => batch_broadcast(t, b),
    };
    let x = widen(&ins[0])?;
    let (update, starts) = match node.op {
        Op::DynamicSlice { .. } => (None, &ins[1..]),
        _ => (Some(widen(&ins[1])?), &ins[2..]),
    };
    let window: Vec<usize> = match (&node.op, &update) {
        (Op::DynamicSlice { sizes }, _) => sizes.clone(),
        (_, Some(u)) => u.dims()[1..].to_vec(),
        _ => return Err(graph_error(OP, "internal: not a dynamic slice", loc)),
    };
    let dims = &x.dims()[1..];
    // The flat index of every element of the window, per example: [B, window...].
    let mut shape = vec![b];
    shape.extend(&window);
    let per_example: usize = dims.iter().product();
    let mut idx = g.iota(DType::I64, &shape, 0)?.mul(per_example as f64)?;
    let mut stride = per_example;
    for (k, (start, &d)) in starts.iter().zip(dims).enumerate() {
        stride /= d.max(1);
        let first = widen(start)?
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
                return Err(graph_error(
                    OP,
                    "dynamic_update_slice of booleans at batched positions has no rule yet",
                    loc,
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

/// A convolution with a batched operand: a batched input alone folds the batch into `N`; a
/// batched kernel makes each example's kernel a group of its own (the input's channels of all
/// examples side by side, `B x groups` groups), as JAX batches `conv_general_dilated`.
fn convolution(
    g: &Graph,
    w: &super::op::ConvWindow,
    ins: &[Batched],
    b: usize,
    loc: Loc,
) -> Result<Vec<Batched>> {
    let ((x, xb), (k, kb)) = (&ins[0], &ins[1]);
    let dims = |t: &Tensor| -> Vec<isize> { t.dims().iter().map(|&d| d as isize).collect() };
    let conv = |x: &Tensor, k: &Tensor, w: super::op::ConvWindow| {
        make_nodes(g, Op::Convolution(w), &[x, k], None, OP, loc)?
            .pop()
            .ok_or_else(|| graph_error(OP, "internal: a convolution without a result", loc))
    };
    if !kb {
        let mut folded = dims(x);
        folded.splice(0..2, [-1]);
        let y = conv(&x.reshape(&folded)?, k, w.clone())?;
        let mut out = dims(&y);
        out.splice(0..1, [b as isize, x.dims()[1] as isize]);
        return Ok(vec![(y.reshape(&out)?, true)]);
    }
    let x = if *xb {
        x.clone()
    } else {
        batch_broadcast(x, b)?
    };
    let d = x.rank() - 3;
    // [B, N, C, *s] -> [N, B * C, *s]; kernel [B, O, C/G, *k] -> [B * O, C/G, *k].
    let mut perm: Vec<isize> = vec![1, 0];
    perm.extend(2..3 + d as isize);
    let mut lhs = dims(&x.transpose(&perm)?);
    lhs.splice(1..3, [-1]);
    let mut rhs = dims(k);
    rhs.splice(0..2, [-1]);
    let wide = super::op::ConvWindow {
        feature_groups: w.feature_groups * b,
        ..w.clone()
    };
    let y = conv(&x.transpose(&perm)?.reshape(&lhs)?, &k.reshape(&rhs)?, wide)?;
    let mut split = dims(&y);
    split.splice(1..2, [b as isize, k.dims()[1] as isize]);
    Ok(vec![(y.reshape(&split)?.transpose(&perm)?, true)])
}

/// `dot_general` with a batched operand: a batch dimension of both when both are batched,
/// else a free dimension of the batched one, moved to the front of the result.
fn dot_general(node: &Node, ins: &[Batched], loc: Loc) -> Result<Vec<Batched>> {
    let Op::DotGeneral {
        lhs_batch,
        rhs_batch,
        lhs_contract,
        rhs_contract,
    } = &node.op
    else {
        return Err(graph_error(OP, "internal: not a dot_general", loc));
    };
    let ((lhs, lb), (rhs, rb)) = (&ins[0], &ins[1]);
    let shifted = |axes: &[usize], batched: bool| -> Vec<isize> {
        axes.iter()
            .map(|&a| (a + usize::from(batched)) as isize)
            .collect()
    };
    let pair = |l: &[usize], r: &[usize]| -> Vec<(isize, isize)> {
        shifted(l, *lb).into_iter().zip(shifted(r, *rb)).collect()
    };
    let mut batch = pair(lhs_batch, rhs_batch);
    let contract = pair(lhs_contract, rhs_contract);
    if *lb && *rb {
        batch.insert(0, (0, 0));
    }
    let out = lhs.dot_general_as(rhs, &batch, &contract, node.outputs[0].dtype)?;
    // Where the batch landed: first when shared; after the batch dimensions (lhs free axis 0),
    // or after the lhs's free dimensions (rhs free axis 0).
    let at = match (*lb, *rb) {
        (true, true) => 0,
        (true, false) => lhs_batch.len(),
        _ => lhs.rank() - lhs_contract.len(),
    };
    Ok(vec![(move_axis(&out, at, 0)?, true)])
}
