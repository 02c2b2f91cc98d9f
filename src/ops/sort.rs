//! Sorting along an axis, with indices, and top-k.

use std::panic::Location;

use super::graph::graph_error;
use super::op::Op;
use super::tensor::Tensor;
use super::util::{axis, nodes, Loc};
use crate::dtype::DType;
use crate::error::Result;

/// The order [`Tensor::sort`] puts elements in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortOrder {
    /// Smallest first.
    #[default]
    Ascending,
    /// Largest first.
    Descending,
}

impl Tensor {
    fn sort_at(
        &self,
        axis_: isize,
        descending: bool,
        with_indices: bool,
        loc: Loc,
    ) -> Result<Vec<Tensor>> {
        let a = axis("sort", self, axis_, loc)?;
        let g = self.graph();
        // Captured (inside a loop) before the indices are made, as the node order has it.
        g.resolve(self.id(), "sort", loc)?;
        let idx = if with_indices {
            Some(g.iota(DType::I64, self.dims(), a as isize)?)
        } else {
            None
        };
        let mut operands = vec![self];
        operands.extend(idx.as_ref());
        let op = Op::Sort {
            axis: a,
            descending,
        };
        nodes(g, op, &operands, None, "sort", loc)
    }

    /// Sorts along `axis` in `order` (stable; NaN counts as larger than every number, so it
    /// comes last ascending and first descending).
    #[track_caller]
    pub fn sort(&self, axis: isize, order: SortOrder) -> Result<Tensor> {
        let descending = order == SortOrder::Descending;
        let mut v = self.sort_at(axis, descending, false, Location::caller())?;
        Ok(v.remove(0))
    }

    /// Sorts along `axis` in `order` as [`Tensor::sort`] does, and also returns, as `i64`, where
    /// each sorted element came from.
    #[track_caller]
    pub fn sort_with_indices(&self, axis: isize, order: SortOrder) -> Result<(Tensor, Tensor)> {
        let descending = order == SortOrder::Descending;
        let mut v = self.sort_at(axis, descending, true, Location::caller())?;
        let idx = v.remove(1);
        Ok((v.remove(0), idx))
    }

    /// The `k` largest elements along the last axis, largest first, with their indices (`i64`);
    /// ties keep the lower index first.
    #[track_caller]
    pub fn top_k(&self, k: usize) -> Result<(Tensor, Tensor)> {
        let loc = Location::caller();
        let r = self.rank();
        if r == 0 || k > self.dims()[r - 1] {
            return Err(graph_error(
                "top_k",
                format!("k = {k} does not fit the last axis of {}", self.ty()),
                loc,
            ));
        }
        let mut v = self.sort_at(-1, true, true, loc)?;
        let idx = v.remove(1).narrow(-1, 0, k)?;
        Ok((v.remove(0).narrow(-1, 0, k)?, idx))
    }
}
