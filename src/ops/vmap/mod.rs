//! `vmap` (JAX's `jax.vmap`): a function written for one example, applied to a batch.
//!
//! The function is built once on per-example placeholders, in a region of its own (so it may
//! use any value from outside, and take gradients, as a loop body can); then its nodes are
//! copied into the caller's region by a batching rule per primitive: the batch is axis 0 of
//! every batched value, an operand that is not batched is broadcast where an elementwise
//! operation meets a batched one, and each rule shifts the primitive's axes past the batch.
//! Dynamic slices at per-example positions become gathers (and a masked scatter for updates).
//! A primitive without a rule (`shard_map`, collectives, boolean updates at batched positions,
//! a batched padding value) is an error naming it. A sharding constraint keeps its spec, the
//! batch axis not split.
//!
//! This module is the driver: [`Graph::vmap`], the example region, and `Batcher::region`,
//! which walks a region's nodes and hands each to its batching rule. The rules live beside the
//! type and VJP rules, in `super::rules::<family>`, reached through the exhaustive
//! `super::rules::batch`; what they share (the node to batch, `move_axis`,
//! `batch_broadcast`, ...) is `super::rules::batching`. Control flow is batched here, in
//! `control.rs`, since it needs the regions: a conditional whose index is the same for every
//! example stays a conditional over the batched branches; with a batched index every branch
//! runs and each example's result is picked by its index (`select`), as JAX does. A loop
//! becomes a loop over the batched state: with an unbatched predicate (a `fori_loop`'s
//! counter) one trip count for all, still differentiable; with a batched one, it runs while
//! any example goes on and freezes the others.

mod control;

use std::collections::HashMap;
use std::panic::Location;

use super::autodiff::SpanCopies;
use super::control::RegionGuard;
use super::graph::{graph_error, Graph};
use super::ir::{Node, Region, ValueId};
use super::op::Op;
use super::rules::batch;
use super::rules::batching::{batch_broadcast, move_axis, BatchStep, Batched, OP};
use super::tensor::Tensor;
use super::util::{same_graph, Loc};
use crate::dtype::TensorType;
use crate::error::Result;

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
            let ins = lookup(env, &node.inputs, self.loc)?;
            let outs = match &node.op {
                Op::Case { branches } => self.case(branches, &ins, env)?,
                Op::While { cond, body } => self.while_loop(*cond, *body, &ins, env)?,
                _ => batch(&BatchStep {
                    g: self.g,
                    node,
                    ins,
                    b: self.b,
                    loc: self.loc,
                })?,
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
