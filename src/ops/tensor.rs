//! [`Tensor`]: the handle users build with (its graph, its value's id, its type). The builder
//! methods live beside their op families (`elementwise`, `shape`, `reduce`, ...).

use super::graph::Graph;
use super::ir::ValueId;
use crate::dtype::{DType, TensorType};

/// A value in a [`Graph`]: a handle holding the graph, the value's id and its type. Builder
/// methods on it add nodes to its graph.
#[derive(Clone)]
pub struct Tensor {
    graph: Graph,
    id: ValueId,
    ty: TensorType,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} @ node {}", self.ty, self.id.node)?;
        if self.id.output > 0 {
            write!(f, "#{}", self.id.output)?;
        }
        write!(f, ")")
    }
}

impl Tensor {
    /// The handle on value `id` of `graph`, of type `ty` (which the caller has checked).
    pub(super) fn new(graph: Graph, id: ValueId, ty: TensorType) -> Tensor {
        Tensor { graph, id, ty }
    }

    /// The graph this tensor belongs to.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The value's id in its graph.
    pub fn id(&self) -> ValueId {
        self.id
    }

    /// The element type and shape.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The shape.
    pub fn dims(&self) -> &[usize] {
        &self.ty.dims
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.ty.dims.len()
    }
}
