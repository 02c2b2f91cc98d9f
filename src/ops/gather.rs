//! Embedding lookup (take rows by index) and one-hot encoding.

use std::panic::Location;

use super::graph::{graph_error, Op, Tensor};
use super::util::node;
use crate::dtype::DType;
use crate::error::Result;

impl Tensor {
    /// Rows of this table (shape `[n, rest...]`) picked by the integer tensor `indices` (any
    /// shape `I`): the result has shape `I ++ rest`. Out-of-range indices are clamped.
    #[track_caller]
    pub fn take(&self, indices: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        node(self.graph(), Op::Take, &[self, indices], "take", loc)
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
