//! Reverse-mode differentiation as a graph transformation: [`Tensor::grad`] and
//! [`Graph::vjp`] add the nodes that compute the gradient to the same graph, so the gradient
//! is lowered, compiled and interpreted like any other value (JAX's `vjp`, built at graph
//! construction time).
//!
//! The transformation walks the nodes of the current region (the program, or the loop body
//! being built) from the outputs back to the requested values, and asks each primitive's
//! **VJP rule** for the cotangents of its operands: a straight-line primitive's sits beside its
//! type rule, in its family's file of `ops/rules/` (dispatched by `rules::vjp`); `while`'s is
//! `loops.rs`. Only float values carry cotangents: integer, pred and index
//! values stop the flow (their contribution is zero, as JAX's `float0`), and asking for the
//! gradient with respect to one is an error. Values defined outside the current region are
//! constants of it.
//!
//! Conventions at non-smooth points, all JAX's: `abs` and `sign` use `sign(x)` (0 at 0);
//! `max`/`min` of two values split the cotangent evenly between equal operands, and a `max`
//! or `min` reduction evenly between the tied elements; `clamp` passes the cotangent to `x`
//! strictly inside `(lo, hi)` and to the bound it is clamped to otherwise; `floor`, `ceil`,
//! `sign` and `round`-like ops have zero derivative; `sqrt`, `rsqrt`, `log` at 0 give
//! infinities. `take` (a gather) and `index_add` (a scatter-add, `ScatterAdd`) are each
//! other's transpose: the table's cotangent is the rows' cotangents added where they were
//! picked, and the updates' cotangent is the output's rows at the indices.
//! Not differentiable (an error when a cotangent reaches them): `bitcast_convert` between
//! floats, `shard_map` and the collectives, and a `while` loop that is not a `fori_loop`
//! with constant bounds.

mod cond;
mod custom;
mod forward;
mod loops;
mod remat;

use std::collections::HashMap;
use std::panic::Location;

pub(crate) use custom::{CustomRule, SpanCopies};

use super::graph::{graph_error, Checkpointed, Graph};
use super::ir::{Node, Region, ValueId};
use super::op::Op;
use super::tensor::Tensor;
use super::util::{same_graph, Loc};
use crate::error::Result;

/// The name errors of the transformation carry.
const OP: &str = "grad";

impl Tensor {
    /// The gradient of this rank-0 float value with respect to each of `wrt` (float values
    /// of the same graph, usually parameters, or a loop body's state): new values of the
    /// graph, with the types of `wrt`, in the current region. A value `self` does not depend
    /// on gets zeros.
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F64, &[3])?;
    /// let loss = x.mul(&x)?.sum_all()?; // sum x^2
    /// let dx = loss.grad(&[&x])?.remove(0); // 2 x
    /// g.set_outputs(&[&loss, &dx])?;
    /// let out = g.evaluate(&[HostArray::from_vec(&[3], vec![1.0f64, -2.0, 0.5])?])?;
    /// assert_eq!(out[1].to_f64_vec(), [2.0, -4.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn grad(&self, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        if self.rank() != 0 || !self.dtype().is_float() {
            return Err(graph_error(
                OP,
                format!(
                    "the value differentiated must be a rank-0 float, got {} (use Graph::vjp \
                     with a cotangent for other values)",
                    self.ty()
                ),
                loc,
            ));
        }
        let one = self.graph().full_at(1.0, self.dtype(), &[], loc)?;
        vjp_at(self.graph(), &[self], &[&one], wrt, loc)
    }
}

impl Graph {
    /// Reverse-mode product: for `outputs` and a cotangent of each (same types), the sum over
    /// the outputs of `cotangent · d output / d wrt[i]` for each of `wrt`, as new values of
    /// the graph in the current region (zeros for a value no output depends on). `outputs`
    /// and `wrt` must be float values of this graph; see the module docs for the rules at
    /// non-smooth points and what is not differentiable.
    #[track_caller]
    pub fn vjp(
        &self,
        outputs: &[&Tensor],
        cotangents: &[&Tensor],
        wrt: &[&Tensor],
    ) -> Result<Vec<Tensor>> {
        vjp_at(self, outputs, cotangents, wrt, Location::caller())
    }
}

/// The transformation behind [`Tensor::grad`] and [`Graph::vjp`].
pub(crate) fn vjp_at(
    g: &Graph,
    outputs: &[&Tensor],
    cotangents: &[&Tensor],
    wrt: &[&Tensor],
    loc: Loc,
) -> Result<Vec<Tensor>> {
    same_graph(g, outputs, OP, loc)?;
    same_graph(g, cotangents, OP, loc)?;
    same_graph(g, wrt, OP, loc)?;
    if outputs.len() != cotangents.len() {
        return Err(graph_error(
            OP,
            format!(
                "{} outputs but {} cotangents",
                outputs.len(),
                cotangents.len()
            ),
            loc,
        ));
    }
    for (k, (o, c)) in outputs.iter().zip(cotangents).enumerate() {
        if !o.dtype().is_float() {
            return Err(graph_error(
                OP,
                format!("output {k} is {}, not a float value", o.ty()),
                loc,
            ));
        }
        if o.ty() != c.ty() {
            return Err(graph_error(
                OP,
                format!("the cotangent of output {k} ({}) is {}", o.ty(), c.ty()),
                loc,
            ));
        }
    }
    for (k, w) in wrt.iter().enumerate() {
        if !w.dtype().is_float() {
            return Err(graph_error(
                OP,
                format!(
                    "cannot differentiate with respect to {} (argument {k}): only float values \
                     have gradients",
                    w.ty()
                ),
                loc,
            ));
        }
    }
    let resolve = |t: &Tensor| -> Result<Tensor> {
        let id = g.resolve(t.id(), OP, loc)?;
        g.tensor(id)
            .ok_or_else(|| graph_error(OP, "internal: lost a value", loc))
    };
    let outputs: Vec<Tensor> = outputs.iter().map(|t| resolve(t)).collect::<Result<_>>()?;
    let cotangents: Vec<Tensor> = cotangents
        .iter()
        .map(|t| resolve(t))
        .collect::<Result<_>>()?;
    let wrt: Vec<Tensor> = wrt.iter().map(|t| resolve(t)).collect::<Result<_>>()?;
    let adjoints = backprop(g, &outputs, &cotangents, &wrt, loc)?;
    wrt.iter()
        .map(|w| match adjoints.get(&w.id()) {
            Some(ct) => Ok(ct.clone()),
            None => g.full_at(0.0, w.dtype(), w.dims(), loc),
        })
        .collect()
}

/// Runs the reverse sweep over the nodes of the current region between `wrt` and `outputs`:
/// returns the accumulated cotangent of every value reached (those of `wrt` among them).
/// Every value is already in the current region.
pub(crate) fn backprop(
    g: &Graph,
    outputs: &[Tensor],
    cotangents: &[Tensor],
    wrt: &[Tensor],
    loc: Loc,
) -> Result<HashMap<ValueId, Tensor>> {
    // The nodes as they are now, not copied; the nodes this adds are not in the snapshot.
    g.with_structure(|nodes, regions| sweep(g, nodes, regions, outputs, cotangents, wrt, loc))
}

/// [`backprop`] over a snapshot of the graph's nodes and regions.
fn sweep(
    g: &Graph,
    nodes: &[Node],
    regions: &[Region],
    outputs: &[Tensor],
    cotangents: &[Tensor],
    wrt: &[Tensor],
    loc: Loc,
) -> Result<HashMap<ValueId, Tensor>> {
    let region = g.current_region();
    let last = outputs.iter().map(|o| o.id().node).max().unwrap_or(0);
    let active = active_values(nodes, region, wrt, last);
    let mut adjoints: HashMap<ValueId, Tensor> = HashMap::new();
    for (o, c) in outputs.iter().zip(cotangents) {
        if active.contains(&o.id()) {
            accumulate(&mut adjoints, o.id(), c.clone())?;
        }
    }
    let mut spans = Spans::new(g, region);
    for index in (0..=last).rev() {
        if spans.take(g, nodes, regions, index, &mut adjoints, loc)? {
            continue;
        }
        let node = &nodes[index];
        if node.region != region || node.inputs.is_empty() {
            continue;
        }
        let cts: Vec<Option<Tensor>> = (0..node.outputs.len())
            .map(|output| {
                adjoints
                    .get(&ValueId {
                        node: index,
                        output,
                    })
                    .cloned()
            })
            .collect();
        if cts.iter().all(Option::is_none) {
            continue;
        }
        let want: Vec<bool> = node
            .inputs
            .iter()
            .map(|i| active.contains(i) && nodes[i.node].outputs[i.output].dtype.is_float())
            .collect();
        if !want.iter().any(|&w| w) {
            continue;
        }
        let handle = |id: ValueId| {
            g.tensor(id)
                .ok_or_else(|| graph_error(OP, "internal: lost a value", loc))
        };
        let inputs: Vec<Tensor> = node
            .inputs
            .iter()
            .map(|&i| handle(i))
            .collect::<Result<_>>()?;
        let outs: Vec<Tensor> = (0..node.outputs.len())
            .map(|output| {
                handle(ValueId {
                    node: index,
                    output,
                })
            })
            .collect::<Result<_>>()?;
        let step = Step {
            node,
            inputs: &inputs,
            outputs: &outs,
            cts: &cts,
            want: &want,
            loc,
        };
        let grads = match &node.op {
            Op::While { cond, body } => loops::while_vjp(g, &step, nodes, regions, *cond, *body)?,
            Op::Case { branches } => cond::case_vjp(g, &step, nodes, regions, branches)?,
            _ => super::rules::vjp(&step)?,
        };
        for ((id, grad), want) in node.inputs.iter().zip(grads).zip(&want) {
            if let (Some(grad), true) = (grad, want) {
                accumulate(&mut adjoints, *id, grad)?;
            }
        }
    }
    Ok(adjoints)
}

/// The spans of a region differentiated as a whole: checkpointed ones and those with rules of
/// their own, each taken once.
struct Spans {
    checkpoints: Vec<Checkpointed>,
    recomputed: Vec<bool>,
    customs: Vec<CustomRule>,
    applied: Vec<bool>,
}

impl Spans {
    fn new(g: &Graph, region: usize) -> Spans {
        let (checkpoints, customs) = (g.checkpoints_in(region), g.customs_in(region));
        Spans {
            recomputed: vec![false; checkpoints.len()],
            applied: vec![false; customs.len()],
            checkpoints,
            customs,
        }
    }

    /// Whether node `index` lies in such a span. The outermost span holding it is pulled
    /// through as a whole at the first of its nodes the sweep reaches: by its rule, or
    /// recomputed if checkpointed (a rule inside a checkpointed span is kept by the copy).
    fn take(
        &mut self,
        g: &Graph,
        nodes: &[Node],
        regions: &[Region],
        index: usize,
        adjoints: &mut HashMap<ValueId, Tensor>,
        loc: Loc,
    ) -> Result<bool> {
        let custom = custom::outermost(&self.customs, index);
        let checkpoint = self
            .checkpoints
            .iter()
            .position(|c| (c.first..=c.last).contains(&index));
        // Where both hold the node, the one that starts first (or ends last) is the outer.
        let outer_is_custom = match (custom, checkpoint) {
            (None, None) => return Ok(false),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(k), Some(c)) => {
                let (r, s) = (&self.customs[k], &self.checkpoints[c]);
                (r.first, std::cmp::Reverse(r.last)) <= (s.first, std::cmp::Reverse(s.last))
            }
        };
        match (outer_is_custom, custom, checkpoint) {
            (true, Some(k), _) if !self.applied[k] => {
                self.applied[k] = true;
                custom::apply(g, &self.customs[k], adjoints, loc)?;
            }
            (false, _, Some(c)) if !self.recomputed[c] => {
                self.recomputed[c] = true;
                remat::recompute(g, nodes, regions, &self.checkpoints[c], adjoints, loc)?;
            }
            _ => {}
        }
        Ok(true)
    }
}

/// The values of `region` up to node `last` that depend on `wrt`: only their cotangents are
/// needed.
fn active_values(
    nodes: &[Node],
    region: usize,
    wrt: &[Tensor],
    last: usize,
) -> std::collections::HashSet<ValueId> {
    let mut active: std::collections::HashSet<ValueId> = wrt.iter().map(|w| w.id()).collect();
    for (index, node) in nodes.iter().enumerate().take(last + 1) {
        if node.region == region && node.inputs.iter().any(|i| active.contains(i)) {
            for output in 0..node.outputs.len() {
                active.insert(ValueId {
                    node: index,
                    output,
                });
            }
        }
    }
    active
}

/// The cotangents of a node's operands, one per operand: `None` where zero or not asked for.
pub(crate) type Cotangents = Vec<Option<Tensor>>;

/// One node's reverse step: the node, handles on its operands and results, the cotangents of
/// its results (`None` for zero) and which operands need one.
pub(crate) struct Step<'a> {
    pub(crate) node: &'a Node,
    pub(crate) inputs: &'a [Tensor],
    pub(crate) outputs: &'a [Tensor],
    pub(crate) cts: &'a [Option<Tensor>],
    pub(crate) want: &'a [bool],
    pub(crate) loc: Loc,
}

impl Step<'_> {
    /// The cotangent of result `k`, zeros when none reached it.
    pub(crate) fn ct(&self, k: usize) -> Result<Tensor> {
        match &self.cts[k] {
            Some(ct) => Ok(ct.clone()),
            None => {
                let o = &self.outputs[k];
                o.graph().full_at(0.0, o.dtype(), o.dims(), self.loc)
            }
        }
    }

    /// No cotangent for any operand (the start of every VJP rule's answer).
    pub(crate) fn none(&self) -> Cotangents {
        vec![None; self.inputs.len()]
    }

    /// An error of this step: `what` is not differentiable.
    pub(crate) fn not_differentiable(&self, what: &str) -> crate::error::Error {
        graph_error(
            OP,
            format!("{what} ({}) is not differentiable", self.node.op.name()),
            self.loc,
        )
    }
}

/// A rank-0 constant of `like`'s dtype, for VJP rules.
pub(crate) fn scalar(like: &Tensor, value: f64, s: &Step) -> Result<Tensor> {
    like.graph().full_at(value, like.dtype(), &[], s.loc)
}

/// Zeros of `t`'s type, for VJP rules.
pub(crate) fn zeros_like(t: &Tensor) -> Result<Tensor> {
    t.graph().zeros(t.dtype(), t.dims())
}

/// Adds `ct` to the cotangent of `id`.
fn accumulate(adjoints: &mut HashMap<ValueId, Tensor>, id: ValueId, ct: Tensor) -> Result<()> {
    let sum = match adjoints.remove(&id) {
        Some(old) => old.add(&ct)?,
        None => ct,
    };
    adjoints.insert(id, sum);
    Ok(())
}
