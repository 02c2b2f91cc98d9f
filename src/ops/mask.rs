//! Static causal masks, built from iota and compare so that XLA sees constants it can fold.

use std::panic::Location;

use super::elementwise::Operand;
use super::graph::{graph_error, Graph};
use super::tensor::Tensor;
use super::util::Loc;
use crate::dtype::DType;
use crate::error::Result;

impl Graph {
    /// A `rows x cols` pred mask, true where `col - row <= offset` (lower triangle; `offset` 0
    /// includes the diagonal, -1 excludes it).
    #[track_caller]
    pub fn tril_mask(&self, rows: usize, cols: usize, offset: isize) -> Result<Tensor> {
        self.tri_mask_at(rows, cols, offset, true, Location::caller())
    }

    /// A `rows x cols` pred mask, true where `col - row >= offset` (upper triangle).
    #[track_caller]
    pub fn triu_mask(&self, rows: usize, cols: usize, offset: isize) -> Result<Tensor> {
        self.tri_mask_at(rows, cols, offset, false, Location::caller())
    }

    fn tri_mask_at(
        &self,
        rows: usize,
        cols: usize,
        offset: isize,
        lower: bool,
        loc: Loc,
    ) -> Result<Tensor> {
        let r = self.iota(DType::I64, &[rows, cols], 0)?;
        let c = self.iota(DType::I64, &[rows, cols], 1)?;
        let diff = c.sub(&r)?;
        let off = self.full_at(offset as f64, DType::I64, &[], loc)?;
        if lower {
            diff.le(&off)
        } else {
            diff.ge(&off)
        }
    }
}

impl Tensor {
    fn tri_at(&self, offset: isize, lower: bool, name: &'static str, loc: Loc) -> Result<Tensor> {
        let r = self.rank();
        if r < 2 {
            return Err(graph_error(
                name,
                format!("{name} needs rank >= 2, got {}", self.ty()),
                loc,
            ));
        }
        let mask =
            self.graph()
                .tri_mask_at(self.dims()[r - 2], self.dims()[r - 1], offset, lower, loc)?;
        mask.select_operands(self, &0.0, name, loc)
    }

    /// Zeros the elements above diagonal `offset` of the last two dimensions.
    #[track_caller]
    pub fn tril(&self, offset: isize) -> Result<Tensor> {
        self.tri_at(offset, true, "tril", Location::caller())
    }

    /// Zeros the elements below diagonal `offset` of the last two dimensions.
    #[track_caller]
    pub fn triu(&self, offset: isize) -> Result<Tensor> {
        self.tri_at(offset, false, "triu", Location::caller())
    }

    /// `mask ? value : self`, elementwise (`mask` is pred and broadcasts; `value` is a number of
    /// `self`'s dtype or a tensor); torch's name for `mask.select(value, self)`.
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: impl Operand) -> Result<Tensor> {
        mask.select_operands(&value, self, "masked_fill", Location::caller())
    }
}
