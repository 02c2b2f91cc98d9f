//! Embedding lookup (take rows by index) and one-hot encoding.

use std::panic::Location;

use super::graph::{graph_error, Op, Tensor};
use super::util::{node, same_graph};
use crate::dtype::{DType, TensorType};
use crate::error::Result;

impl Tensor {
    /// Rows of this table (shape `[n, rest...]`) picked by the integer tensor `indices` (any
    /// shape `I`): the result has shape `I ++ rest`. Out-of-range indices are clamped.
    #[track_caller]
    pub fn take(&self, indices: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        same_graph(self.graph(), &[indices], "take", loc)?;
        if self.rank() == 0 || self.dims()[0] == 0 || !indices.dtype().is_int() {
            return Err(graph_error(
                "take",
                format!(
                    "take needs a table of rank >= 1 with rows and integer indices, got table {} and indices {}",
                    self.ty(),
                    indices.ty()
                ),
                loc,
            ));
        }
        let mut dims = indices.dims().to_vec();
        dims.extend_from_slice(&self.dims()[1..]);
        node(
            self.graph(),
            Op::Take,
            &[self, indices],
            TensorType::new(self.dtype(), &dims),
            "take",
            loc,
        )
    }

    /// One-hot encoding of integer indices: shape `I ++ [depth]`, 1 where the last coordinate
    /// equals the index, else 0 (indices outside `[0, depth)` give all zeros).
    #[track_caller]
    pub fn one_hot(&self, depth: usize, dtype: DType) -> Result<Tensor> {
        let loc = Location::caller();
        if !self.dtype().is_int() {
            return Err(graph_error(
                "one_hot",
                format!("one_hot needs integer indices, got {}", self.ty()),
                loc,
            ));
        }
        let mut dims = self.dims().to_vec();
        dims.push(depth);
        let classes = self.graph().iota(self.dtype(), &dims, -1)?;
        let idx = self.expand_dims(-1)?;
        classes.eq(&idx)?.convert_at(dtype, loc)
    }
}
