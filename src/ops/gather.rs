//! Gathers: embedding lookup (take rows by index), NumPy's `take` along any axis and
//! `take_along_axis`, and one-hot encoding; and their scatters, rows added or replaced.
//!
//! `take_along_axis` is built on the `Take` primitive (one `stablehlo.gather`) over the
//! flattened table, with the flat index of every output element computed from its coordinates
//! (`iota`s times strides) and the clamped index along the axis: the work is proportional to the
//! output, where a one-hot product or a compare-select-reduce would read the whole axis for every
//! output element (a 50k-word vocabulary for each label of a cross-entropy).

use std::panic::Location;

use super::graph::graph_error;
use super::op::Op;
use super::tensor::Tensor;
use super::util::{axis, node, same_graph, Loc};
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

    /// `self` (a table `[n, rest...]`) with the rows of `updates` (shape `I ++ rest`) added at
    /// the rows `indices` (integers of shape `I`) names; repeated indices add up. Indices are
    /// clamped to `[0, n - 1]` as [`Tensor::take`]'s (whose gradient this is): JAX's
    /// `x.at[indices].add(updates)` for in-range indices, torch's `index_add` along dimension 0.
    ///
    /// ```
    /// # use stablegraph::{ops::Graph, DType, HostArray};
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let counts = g.zeros(DType::F32, &[4])?;
    /// let ids = g.parameter("ids", DType::I32, &[5])?;
    /// let hist = counts.index_add(&ids, &g.ones(DType::F32, &[5])?)?;
    /// g.set_outputs(&[&hist])?;
    /// let out = g.evaluate(&[HostArray::from_vec(&[5], vec![1i32, 3, 1, 0, 1])?])?;
    /// assert_eq!(out[0].to_f64_vec(), [1.0, 3.0, 0.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn index_add(&self, indices: &Tensor, updates: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        node(
            self.graph(),
            Op::ScatterAdd,
            &[self, indices, updates],
            "index_add",
            loc,
        )
    }

    /// `self` (a table `[n, rest...]`) with the rows `indices` (integers of shape `I`) names
    /// replaced by the rows of `updates` (shape `I ++ rest`): JAX's `x.at[indices].set(updates)`
    /// for in-range indices. Of repeated indices one update is kept (which one is unspecified);
    /// indices are clamped to `[0, n - 1]` as [`Tensor::take`]'s. On a donated table XLA writes
    /// the rows in place.
    ///
    /// ```
    /// # use stablegraph::{ops::Graph, DType, HostArray};
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let table = g.zeros(DType::F32, &[4, 2])?;
    /// let ids = g.parameter("ids", DType::I32, &[2])?;
    /// let rows = g.parameter("rows", DType::F32, &[2, 2])?;
    /// g.set_outputs(&[&table.index_set(&ids, &rows)?])?;
    /// let out = g.evaluate(&[
    ///     HostArray::from_vec(&[2], vec![3i32, 1])?,
    ///     HostArray::from_vec(&[2, 2], vec![1f32, 2.0, 3.0, 4.0])?,
    /// ])?;
    /// assert_eq!(out[0].to_f64_vec(), [0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn index_set(&self, indices: &Tensor, updates: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        node(
            self.graph(),
            Op::ScatterSet,
            &[self, indices, updates],
            "index_set",
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

    /// The index tensor clamped to `[0, n - 1]` and converted to `i64`.
    pub(crate) fn clamped_indices(&self, n: usize, loc: Loc) -> Result<Tensor> {
        // The largest index that fits the dtype and the axis, so that the clamp bound is a
        // value of the indices' own dtype.
        let dtype_max = match self.dtype() {
            DType::U8 => u8::MAX as usize,
            DType::I8 => i8::MAX as usize,
            DType::I32 => i32::MAX as usize,
            DType::U32 => u32::MAX as usize,
            _ => usize::MAX,
        };
        let hi = (n - 1).min(dtype_max);
        let hi = self.graph().full_at(hi as f64, self.dtype(), &[], loc)?;
        let lo = self.graph().full_at(0.0, self.dtype(), &[], loc)?;
        self.clamp(&lo, &hi)?.convert_at(DType::I64, loc)
    }

    /// NumPy's `take_along_axis`: `out[..., j, ...] = self[..., indices[..., j, ...], ...]`
    /// along `axis`, where `indices` is an integer tensor of the same rank as `self`. The other
    /// dimensions broadcast against each other (each pair equal, or one of them 1); along
    /// `axis` the output has `indices`' length. Indices are clamped to `[0, n - 1]` like
    /// [`Tensor::take`]'s: a negative index picks the first element, not one counted from the
    /// end as in NumPy, and an index past the end picks the last.
    ///
    /// ```
    /// # use stablegraph::{ops::Graph, DType};
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let logp = g.parameter("logp", DType::F32, &[8, 100])?; // log-probabilities
    /// let labels = g.parameter("labels", DType::I32, &[8, 1])?;
    /// let picked = logp.take_along_axis(&labels, -1)?; // logp[i, labels[i]]
    /// assert_eq!(picked.dims(), &[8, 1]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Tensor, axis_: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let op = "take_along_axis";
        same_graph(self.graph(), &[indices], op, loc)?;
        let a = axis(op, self, axis_, loc)?;
        let bad = |why: &str| {
            graph_error(
                op,
                format!("{why}: table {}, indices {}", self.ty(), indices.ty()),
                loc,
            )
        };
        if !indices.dtype().is_int() || indices.rank() != self.rank() {
            return Err(bad("the indices must be integers of the table's rank"));
        }
        let mut dims = Vec::with_capacity(self.rank());
        for (d, (&t, &i)) in self.dims().iter().zip(indices.dims()).enumerate() {
            dims.push(match (t, i) {
                _ if d == a => i,
                (t, i) if t == i || i == 1 => t,
                (1, i) => i,
                _ => return Err(bad(&format!("dimension {d} does not broadcast"))),
            });
        }
        if dims.contains(&0) {
            return self.graph().full_at(0.0, self.dtype(), &dims, loc);
        }
        let n = self.dims()[a];
        if n == 0 {
            return Err(bad(&format!("axis {a} is empty: there is nothing to take")));
        }
        // Row-major strides of the table, in i64 (its size in bytes fits an isize).
        let mut strides = vec![1i64; self.rank()];
        for d in (0..self.rank().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * self.dims()[d + 1] as i64;
        }
        let scaled = |t: Tensor, stride: i64| if stride == 1 { Ok(t) } else { t.mul(stride) };
        let mut flat = scaled(indices.clamped_indices(n, loc)?, strides[a])?;
        for d in (0..self.rank()).filter(|&d| d != a && self.dims()[d] != 1) {
            let coord = self.graph().iota(DType::I64, &dims, d as isize)?;
            flat = flat.add(&scaled(coord, strides[d])?)?;
        }
        let flat = flat.broadcast_to_at(&dims, loc)?;
        let table = self.reshape_at(&[self.ty().element_count()], loc)?;
        table.take(&flat)
    }

    /// NumPy's `take(x, indices, axis)`: the entries of `self` along `axis` picked by the
    /// integer tensor `indices` (any shape `I`); the output's shape is `self`'s with that axis
    /// replaced by `I`. Indices are clamped as in [`Tensor::take`] (which is `take_axis` with
    /// `axis = 0`).
    #[track_caller]
    pub fn take_axis(&self, indices: &Tensor, axis_: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let op = "take_axis";
        same_graph(self.graph(), &[indices], op, loc)?;
        let a = axis(op, self, axis_, loc)?;
        if !indices.dtype().is_int() {
            return Err(graph_error(
                op,
                format!("indices must be integers, got {}", indices.ty()),
                loc,
            ));
        }
        let mut dims = self.dims()[..a].to_vec();
        dims.extend_from_slice(indices.dims());
        dims.extend_from_slice(&self.dims()[a + 1..]);
        if dims.contains(&0) {
            return self.graph().full_at(0.0, self.dtype(), &dims, loc);
        }
        if self.dims()[a] == 0 {
            return Err(graph_error(
                op,
                format!(
                    "axis {a} of {} is empty: there is nothing to take",
                    self.ty()
                ),
                loc,
            ));
        }
        if a == 0 {
            return self.take(indices);
        }
        let outer: usize = self.dims()[..a].iter().product();
        let inner: usize = self.dims()[a + 1..].iter().product();
        let count = indices.ty().element_count();
        let table = self.reshape_at(&[outer, self.dims()[a], inner], loc)?;
        let picked = indices.reshape_at(&[1, count, 1], loc)?;
        table.take_along_axis(&picked, 1)?.reshape_at(&dims, loc)
    }
}
