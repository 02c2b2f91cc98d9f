//! The graph's intermediate representation as readers see it: [`ValueId`] (one output of one
//! node), [`Node`] (a primitive, its operands and its output types) and [`Region`] (a loop's
//! condition or body, a `shard_map`'s body; region 0 is the program).

use super::op::Op;
use crate::dtype::TensorType;

/// One output of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId {
    /// The node's index in [`Graph::nodes`](crate::ops::Graph::nodes).
    pub node: usize,
    /// Which of the node's outputs.
    pub output: usize,
}

/// A node of the graph: a primitive, its operands and its output types.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The primitive.
    pub op: Op,
    /// Operands, all defined by earlier nodes.
    pub inputs: Vec<ValueId>,
    /// Output types (one for every op except a `Sort` with two inputs, and `While`).
    pub outputs: Vec<TensorType>,
    /// The region the node belongs to: 0 is the program itself, others are loop conditions and
    /// bodies (see [`Graph::regions`](crate::ops::Graph::regions)).
    pub region: usize,
}

/// A nested block of nodes: a loop's condition or body. Region 0 is the program itself.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Region {
    /// The enclosing region (`None` for region 0).
    pub parent: Option<usize>,
    /// The region's arguments, `BlockArg` nodes in order (empty for region 0, whose inputs are
    /// the parameters).
    pub args: Vec<ValueId>,
    /// What the region returns.
    pub results: Vec<ValueId>,
    /// Values of enclosing regions used inside this one: (the value in the parent region, the
    /// `BlockArg` that stands for it here).
    pub captures: Vec<(ValueId, ValueId)>,
}
