//! `checkpoint` (JAX's `jax.checkpoint`, rematerialisation): the values a checkpointed function
//! computes are not kept for the backward pass but computed again there.
//!
//! The forward pass builds the function as usual and records the span of nodes it made. When
//! the reverse sweep reaches the span, it copies the span's nodes from the values it read
//! (the function's inputs and anything it captured), passed together with the cotangents
//! through one `optimization_barrier`: XLA can neither merge the copy with the forward
//! computation (whose intermediates would then live on) nor move it ahead of the backward
//! pass. Constants are copied instead (they hold nothing live, and a `fori_loop`'s bounds must
//! stay constants for its VJP). A loop or a conditional in the span is copied whole, a new
//! `while` or `case` over copies of its regions (`loops::replay_node`). The cotangents are then
//! pulled through the copy by the ordinary sweep, so a copied `fori_loop` with constant bounds
//! is differentiated as any (`loops.rs`: it runs once more stacking its carries, then backward)
//! and any other loop is the same error there. Compute: the span's forward twice, plus what the
//! VJPs of its loops run.

use std::collections::HashMap;
use std::panic::Location;

use super::loops::replay_node;
use super::SpanCopies;
use super::{accumulate, backprop, OP};
use crate::error::Result;
use crate::ops::control::Carry;
use crate::ops::graph::{graph_error, Checkpointed, Graph};
use crate::ops::ir::{Node, Region, ValueId};
use crate::ops::op::Op;
use crate::ops::rules::takes_target;
use crate::ops::tensor::Tensor;
use crate::ops::util::{nodes as make_nodes, same_graph, Loc};

impl Graph {
    /// `f(inputs)`, with what `f` computes recomputed in the backward pass instead of kept
    /// (JAX's `jax.checkpoint`): a gradient through it holds only the span's inputs and
    /// results between the passes, at the price of running `f` twice. Values and gradients are
    /// the same as without it. `f` may use values from outside (they are read again, not
    /// recomputed) and hold loops (`fori_loop`, `scan`) and conditionals: they are recomputed
    /// whole, and differentiated as they would be without `checkpoint` (a loop whose VJP does
    /// not exist, a `while_loop` with a data-dependent exit, stays an error when a gradient
    /// reaches it).
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F64, &[3])?;
    /// // Loops and conditionals inside are recomputed too.
    /// let y = g.checkpoint(&x, |x| g.fori_loop(0, 3, x, |_, h| h.sin()?.mul(x)))?;
    /// let dx = y.sum_all()?.grad(&[&x])?.remove(0);
    /// g.set_outputs(&[&dx])?;
    /// assert!(g.to_stablehlo()?.contains("optimization_barrier"));
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn checkpoint<C: Carry, O: Carry>(
        &self,
        inputs: &C,
        f: impl FnOnce(&C) -> Result<O>,
    ) -> Result<O> {
        let loc = Location::caller();
        let mut flat = Vec::new();
        inputs.flatten(&mut flat);
        let refs: Vec<&Tensor> = flat.iter().collect();
        same_graph(self, &refs, "checkpoint", loc)?;
        let region = self.current_region();
        let first = self.with_nodes(|n| n.len());
        let out = f(inputs)?;
        let end = self.with_nodes(|n| n.len());
        if end == first {
            return Ok(out);
        }
        self.add_checkpoint(Checkpointed {
            region,
            first,
            last: end - 1,
        });
        Ok(out)
    }
}

/// The reverse step over the checkpointed `span` of region `region`: recomputes it behind a
/// barrier and adds the cotangents of the values it read to `adjoints`. Nothing to do when no
/// value of the span has a cotangent.
pub(super) fn recompute(
    g: &Graph,
    nodes: &[Node],
    regions: &[Region],
    span: &Checkpointed,
    adjoints: &mut HashMap<ValueId, Tensor>,
    loc: Loc,
) -> Result<()> {
    let region = span.region;
    // A block argument made inside the span (a value captured from an enclosing region while
    // the span was built) is read, not replayed: a copy would be an argument of nothing.
    let is_arg = |i: usize| matches!(nodes[i].op, Op::BlockArg);
    let in_span =
        |i: usize| (span.first..=span.last).contains(&i) && nodes[i].region == region && !is_arg(i);
    // Every value of the span with a cotangent: its results, and any value used after it.
    let mut seeds: Vec<(ValueId, Tensor)> = Vec::new();
    for i in (span.first..=span.last).filter(|&i| in_span(i)) {
        for output in 0..nodes[i].outputs.len() {
            let v = ValueId { node: i, output };
            if let Some(ct) = adjoints.get(&v) {
                seeds.push((v, ct.clone()));
            }
        }
    }
    if seeds.is_empty() {
        return Ok(());
    }
    // What the span reads from before it.
    let mut outside: Vec<ValueId> = Vec::new();
    for i in (span.first..=span.last).filter(|&i| in_span(i)) {
        for v in &nodes[i].inputs {
            if (v.node < span.first || is_arg(v.node)) && !outside.contains(v) {
                outside.push(*v);
            }
        }
    }
    let (read, cts) = behind_barrier(g, nodes, &outside, &seeds, loc)?;
    let lost = || graph_error(OP, "internal: lost a value", loc);
    let mut env: HashMap<ValueId, Tensor> = outside.iter().copied().zip(read.clone()).collect();
    // Spans with rules of their own inside keep them in the copy.
    let mut rules = SpanCopies::new(g, region, None);
    for i in (span.first..=span.last).filter(|&i| in_span(i)) {
        rules.step(g, i, &|v| env.get(&v).map(|t| (t.clone(), false)))?;
        replay_node(g, nodes, regions, i, &mut env, loc)?;
    }
    rules.finish(g, &|v| env.get(&v).map(|t| (t.clone(), false)))?;
    let again: Vec<Tensor> = seeds
        .iter()
        .map(|(v, _)| env.get(v).cloned().ok_or_else(lost))
        .collect::<Result<_>>()?;
    let wrt: Vec<(ValueId, Tensor)> = outside
        .iter()
        .zip(&read)
        .filter(|(_, t)| t.dtype().is_float())
        .map(|(v, t)| (*v, t.clone()))
        .collect();
    let wrt_values: Vec<Tensor> = wrt.iter().map(|(_, t)| t.clone()).collect();
    let found = backprop(g, &again, &cts, &wrt_values, loc)?;
    for (v, t) in &wrt {
        if let Some(ct) = found.get(&t.id()) {
            accumulate(adjoints, *v, ct.clone())?;
        }
    }
    Ok(())
}

/// The values `outside` the span reads and the `seeds`' cotangents, as the replay uses them:
/// all through one optimization barrier but the constants, which are copied (a new node, so
/// that the sweep through the replay stops there as it stops at the barrier).
fn behind_barrier(
    g: &Graph,
    nodes: &[Node],
    outside: &[ValueId],
    seeds: &[(ValueId, Tensor)],
    loc: Loc,
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let lost = || graph_error(OP, "internal: lost a value", loc);
    let constant = |v: &ValueId| matches!(nodes[v.node].op, Op::Constant { .. });
    let mut tied: Vec<Tensor> = outside
        .iter()
        .filter(|v| !constant(v))
        .map(|&v| g.tensor(v).ok_or_else(lost))
        .collect::<Result<_>>()?;
    let n_tied = tied.len();
    tied.extend(seeds.iter().map(|(_, ct)| ct.clone()));
    let refs: Vec<&Tensor> = tied.iter().collect();
    let mut tied = Tensor::optimization_barrier(&refs)?;
    let cts = tied.split_off(n_tied);
    let mut barred = tied.into_iter();
    let copy = |v: &ValueId| -> Result<Option<Tensor>> {
        let node = &nodes[v.node];
        let target = takes_target(&node.op).then(|| node.outputs[0].clone());
        Ok(make_nodes(g, node.op.clone(), &[], target, OP, loc)?
            .into_iter()
            .nth(v.output))
    };
    let read = outside
        .iter()
        .map(|v| match constant(v) {
            true => copy(v),
            false => Ok(barred.next()),
        })
        .map(|t| t?.ok_or_else(lost))
        .collect::<Result<_>>()?;
    Ok((read, cts))
}
