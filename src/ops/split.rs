//! Splitting a tensor into consecutive pieces along an axis: `split` (given sizes) and `chunk`
//! (equal parts). Each piece is a static slice.

use std::panic::Location;

use super::graph::graph_error;
use super::tensor::Tensor;
use super::util::{axis, Loc};
use crate::error::Result;

/// The most pieces [`Tensor::chunk`] makes.
const MAX_CHUNKS: usize = 1 << 16;

impl Tensor {
    fn pieces_at(&self, a: usize, sizes: &[usize], loc: Loc) -> Result<Vec<Tensor>> {
        let mut start = vec![0; self.rank()];
        let mut limit = self.dims().to_vec();
        let stride = vec![1; self.rank()];
        let mut at = 0;
        sizes
            .iter()
            .map(|&n| {
                start[a] = at;
                limit[a] = at + n;
                at += n;
                self.slice_all_at(&start, &limit, &stride, loc)
            })
            .collect()
    }

    /// Consecutive pieces along `axis` with the given `sizes`, which must add up to the axis'
    /// length (as PyTorch's `torch.split(x, sizes, dim)`): piece `k` is
    /// `x[..., s_k : s_k + sizes[k], ...]` with `s_k = sizes[0] + ... + sizes[k-1]`.
    ///
    /// ```
    /// # use stablegraph::{ops::Graph, DType};
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let zxbcdt = g.parameter("zxbcdt", DType::F32, &[4, 10])?;
    /// let parts = zxbcdt.split(-1, &[4, 4, 2])?;
    /// assert_eq!(parts[2].dims(), &[4, 2]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn split(&self, axis_: isize, sizes: &[usize]) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let a = axis("split", self, axis_, loc)?;
        let total = sizes.iter().try_fold(0usize, |n, &s| n.checked_add(s));
        if total != Some(self.dims()[a]) {
            let shown = sizes.iter().map(|&s| s as u128).sum::<u128>();
            return Err(graph_error(
                "split",
                format!(
                    "sizes {sizes:?} add up to {shown}, but axis {a} of {} has length {}",
                    self.ty(),
                    self.dims()[a]
                ),
                loc,
            ));
        }
        self.pieces_at(a, sizes, loc)
    }

    /// `n` equal consecutive pieces along `axis`, whose length must be a multiple of `n` (as
    /// `jnp.split(x, n, axis)`; use [`Tensor::split`] for unequal sizes). An axis of length 0
    /// gives one empty piece. Each piece is a node of the graph, so `n` is at most 65,536; for
    /// more, reshape the axis to `[n, len / n]` and index that.
    #[track_caller]
    pub fn chunk(&self, axis_: isize, n: usize) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let a = axis("chunk", self, axis_, loc)?;
        let len = self.dims()[a];
        if n > MAX_CHUNKS {
            return Err(graph_error(
                "chunk",
                format!(
                    "{n} chunks of axis {a} of {} (length {len}) are more than the \
                     {MAX_CHUNKS} that chunk builds, one node each; reshape the axis instead",
                    self.ty()
                ),
                loc,
            ));
        }
        if n == 0 || n > len.max(1) || !len.is_multiple_of(n) {
            return Err(graph_error(
                "chunk",
                format!(
                    "axis {a} of {} (length {len}) does not split into {n} equal chunks; \
                     use split for unequal sizes",
                    self.ty()
                ),
                loc,
            ));
        }
        self.pieces_at(a, &vec![len / n; n], loc)
    }
}
