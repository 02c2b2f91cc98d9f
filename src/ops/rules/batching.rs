//! What the batching rules share (see [`super::batch`]; the driver is `crate::ops::vmap`): the
//! node being batched with its operands ([`BatchStep`]), and the moves the rules make, each
//! written once: an axis moved ([`move_axis`]), an unbatched value repeated over the batch
//! ([`batch_broadcast`]), a type or an axis list with the batch in front ([`batched_type`],
//! [`shift`], [`front`]). The batch is axis 0 of every batched value.

use super::takes_target;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::ops::graph::{graph_error, Graph};
use crate::ops::ir::Node;
use crate::ops::op::Op;
use crate::ops::util::{nodes, Loc};
use crate::ops::Tensor;

/// The name `vmap`'s errors carry.
pub(crate) const OP: &str = "vmap";

/// A value of the batched graph and whether it carries the batch (as axis 0).
pub(crate) type Batched = (Tensor, bool);

/// One node to batch, as a batching rule gets it: the graph the copies go to, the per-example
/// node, its operands' batched values (in the node's order), the batch size and where `vmap`
/// was called.
pub(crate) struct BatchStep<'a> {
    pub(crate) g: &'a Graph,
    pub(crate) node: &'a Node,
    pub(crate) ins: Vec<Batched>,
    pub(crate) b: usize,
    pub(crate) loc: Loc,
}

impl BatchStep<'_> {
    /// Whether any operand carries the batch.
    pub(crate) fn any_batched(&self) -> bool {
        self.ins.iter().any(|(_, batched)| *batched)
    }

    /// Operand `k` with the batch: itself when batched, else repeated over the batch.
    pub(crate) fn widened(&self, k: usize) -> Result<Tensor> {
        let (t, batched) = &self.ins[k];
        match batched {
            true => Ok(t.clone()),
            false => batch_broadcast(t, self.b),
        }
    }

    /// A node of `op` on `operands`, its results flagged `batched`; an op that takes its result
    /// type ([`takes_target`]) gets the node's, with the batch in front when `batched`.
    pub(crate) fn make(&self, op: Op, operands: &[&Tensor], batched: bool) -> Result<Vec<Batched>> {
        let target = takes_target(&op).then(|| match batched {
            true => batched_type(&self.node.outputs[0], self.b),
            false => self.node.outputs[0].clone(),
        });
        let made = nodes(self.g, op, operands, target, OP, self.loc)?;
        Ok(made.into_iter().map(|t| (t, batched)).collect())
    }

    /// The node as it was, on operands none of which carries the batch.
    pub(crate) fn unbatched(&self) -> Result<Vec<Batched>> {
        let refs: Vec<&Tensor> = self.ins.iter().map(|(t, _)| t).collect();
        self.make(self.node.op.clone(), &refs, false)
    }

    /// `op` (the node's primitive, its axes shifted past the batch) on every operand batched:
    /// the rule of each primitive that treats the batch as one more leading axis.
    pub(crate) fn leading(&self, op: Op) -> Result<Vec<Batched>> {
        let operands = (0..self.ins.len())
            .map(|k| self.widened(k))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = operands.iter().collect();
        self.make(op, &refs, true)
    }

    /// An error of `vmap` at this node.
    pub(crate) fn error(&self, message: impl Into<String>) -> Error {
        graph_error(OP, message, self.loc)
    }

    /// The error of a primitive that has no batching rule (yet), naming it.
    pub(crate) fn no_rule(&self) -> Error {
        self.error(format!("{} has no batching rule yet", self.node.op.name()))
    }
}

/// `t` with axis `from` moved to position `to`.
pub(crate) fn move_axis(t: &Tensor, from: usize, to: usize) -> Result<Tensor> {
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
pub(crate) fn batch_broadcast(t: &Tensor, b: usize) -> Result<Tensor> {
    let mut dims = vec![b];
    dims.extend_from_slice(t.dims());
    t.expand_dims(0)?.broadcast_to(&dims)
}

/// `ty` with a batch of `b` in front.
pub(crate) fn batched_type(ty: &TensorType, b: usize) -> TensorType {
    TensorType::new(ty.dtype, &front(b, &ty.dims))
}

/// Axis numbers shifted past the batch.
pub(crate) fn shift(axes: &[usize]) -> Vec<usize> {
    axes.iter().map(|a| a + 1).collect()
}

/// A per-axis list with `first` (the batch axis's entry) in front.
pub(crate) fn front<T: Copy>(first: T, rest: &[T]) -> Vec<T> {
    [first].into_iter().chain(rest.iter().copied()).collect()
}
