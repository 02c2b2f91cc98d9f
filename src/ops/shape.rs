//! Shape ops: reshape, transpose, expand_dims, squeeze, slice, dynamic slices, concatenate, pad,
//! flip.

use std::panic::Location;

use super::elementwise::Operand;
use super::graph::graph_error;
use super::op::Op;
use super::tensor::Tensor;
use super::util::{axes, axis, node, same_graph, typed_node, Loc};
use crate::dtype::TensorType;
use crate::error::Result;

impl Tensor {
    /// Row-major reshape; at most one dimension may be `-1` (inferred).
    #[track_caller]
    pub fn reshape(&self, dims: &[isize]) -> Result<Tensor> {
        let loc = Location::caller();
        let n = self.ty().element_count();
        // Saturating: no tensor of a graph has usize::MAX elements (its size in bytes fits an
        // isize), so an overflowing product matches none.
        let known: usize = dims
            .iter()
            .filter(|&&d| d >= 0)
            .try_fold(1usize, |n, &d| n.checked_mul(d as usize))
            .unwrap_or(usize::MAX);
        let inferred = dims.iter().filter(|&&d| d == -1).count();
        let bad = || {
            graph_error(
                "reshape",
                format!("cannot reshape {} ({n} elements) to {dims:?}", self.ty()),
                loc,
            )
        };
        if dims.iter().any(|&d| d < -1) || inferred > 1 {
            return Err(bad());
        }
        let out: Vec<usize> = if inferred == 1 {
            if known == 0 || !n.is_multiple_of(known) {
                return Err(bad());
            }
            dims.iter()
                .map(|&d| if d == -1 { n / known } else { d as usize })
                .collect()
        } else {
            if known != n {
                return Err(bad());
            }
            dims.iter().map(|&d| d as usize).collect()
        };
        self.reshape_at(&out, loc)
    }

    pub(crate) fn reshape_at(&self, dims: &[usize], loc: Loc) -> Result<Tensor> {
        if dims == self.dims() {
            return Ok(self.clone());
        }
        typed_node(
            self.graph(),
            Op::Reshape,
            &[self],
            TensorType::new(self.dtype(), dims),
            "reshape",
            loc,
        )
    }

    /// Permutes dimensions: output dimension `i` is input dimension `perm[i]`.
    #[track_caller]
    pub fn transpose(&self, perm: &[isize]) -> Result<Tensor> {
        let loc = Location::caller();
        if perm.len() != self.rank() {
            return Err(graph_error(
                "transpose",
                format!("permutation {perm:?} does not fit {}", self.ty()),
                loc,
            ));
        }
        // Validates range and distinctness; the caller's order is kept below.
        axes("transpose", self, perm, loc)?;
        let perm: Vec<usize> = perm
            .iter()
            .map(|&a| axis("transpose", self, a, loc))
            .collect::<Result<_>>()?;
        self.transpose_at(&perm, loc)
    }

    pub(crate) fn transpose_at(&self, perm: &[usize], loc: Loc) -> Result<Tensor> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(self.clone());
        }
        let op = Op::Transpose {
            perm: perm.to_vec(),
        };
        node(self.graph(), op, &[self], "transpose", loc)
    }

    /// Swaps the last two dimensions (NumPy's and JAX's `matrix_transpose`, `x.mT`).
    #[track_caller]
    pub fn matrix_transpose(&self) -> Result<Tensor> {
        self.matrix_transpose_at("matrix_transpose", Location::caller())
    }

    /// Alias of [`Tensor::matrix_transpose`], as torch names it.
    #[track_caller]
    pub fn t(&self) -> Result<Tensor> {
        self.matrix_transpose_at("t", Location::caller())
    }

    fn matrix_transpose_at(&self, name: &'static str, loc: Loc) -> Result<Tensor> {
        let r = self.rank();
        if r < 2 {
            return Err(graph_error(
                name,
                format!("{name} needs rank >= 2, got {}", self.ty()),
                loc,
            ));
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.transpose_at(&perm, loc)
    }

    /// Inserts a size-1 dimension at `axis` (in `-(rank+1)..=rank`).
    #[track_caller]
    pub fn expand_dims(&self, axis_: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let r = self.rank() as isize;
        let a = if axis_ < 0 { axis_ + r + 1 } else { axis_ };
        if a < 0 || a > r {
            return Err(graph_error(
                "expand_dims",
                format!("axis {axis_} is out of range for {}", self.ty()),
                loc,
            ));
        }
        let mut dims = self.dims().to_vec();
        dims.insert(a as usize, 1);
        self.reshape_at(&dims, loc)
    }

    /// Removes the given size-1 dimensions (all size-1 dimensions when `axes` is empty).
    #[track_caller]
    pub fn squeeze(&self, axes_: &[isize]) -> Result<Tensor> {
        let loc = Location::caller();
        let drop = if axes_.is_empty() {
            (0..self.rank()).filter(|&i| self.dims()[i] == 1).collect()
        } else {
            axes("squeeze", self, axes_, loc)?
        };
        if let Some(&bad) = drop.iter().find(|&&a| self.dims()[a] != 1) {
            return Err(graph_error(
                "squeeze",
                format!("dimension {bad} of {} is not 1", self.ty()),
                loc,
            ));
        }
        let dims: Vec<usize> = (0..self.rank())
            .filter(|i| !drop.contains(i))
            .map(|i| self.dims()[i])
            .collect();
        self.reshape_at(&dims, loc)
    }

    /// `x[start:stop:step]` along `axis`, with Python semantics for negative or out-of-range
    /// `start`/`stop` (counted from the end, then clipped); `step >= 1`. [`Tensor::narrow`]
    /// takes a window that must fit instead.
    #[track_caller]
    pub fn slice(&self, axis_: isize, start: isize, stop: isize, step: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let a = axis("slice", self, axis_, loc)?;
        if step == 0 {
            return Err(graph_error("slice", "step must be at least 1", loc));
        }
        let n = self.dims()[a] as isize;
        let clip = |i: isize| (if i < 0 { i + n } else { i }).clamp(0, n) as usize;
        let (lo, hi) = (clip(start), clip(stop));
        let hi = hi.max(lo);
        let mut start_v = vec![0; self.rank()];
        let mut limit_v = self.dims().to_vec();
        let mut stride_v = vec![1; self.rank()];
        start_v[a] = lo;
        limit_v[a] = hi;
        stride_v[a] = step;
        self.slice_all_at(&start_v, &limit_v, &stride_v, loc)
    }

    /// `len` elements from `start` along `axis`, under torch's name: unlike [`Tensor::slice`],
    /// which clips like Python, the window must lie inside the axis (an error otherwise).
    #[track_caller]
    pub fn narrow(&self, axis_: isize, start: usize, len: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let a = axis("narrow", self, axis_, loc)?;
        let end = start.checked_add(len).filter(|&e| e <= self.dims()[a]);
        let Some(end) = end else {
            return Err(graph_error(
                "narrow",
                format!(
                    "[{start}, {}) is out of range along axis {a} of {}",
                    start as u128 + len as u128,
                    self.ty()
                ),
                loc,
            ));
        };
        let mut s = vec![0; self.rank()];
        let mut l = self.dims().to_vec();
        s[a] = start;
        l[a] = end;
        self.slice_all_at(&s, &l, &vec![1; self.rank()], loc)
    }

    /// A strided slice over every dimension: `start <= i < limit` in steps of `stride`.
    #[track_caller]
    pub fn slice_all(&self, start: &[usize], limit: &[usize], stride: &[usize]) -> Result<Tensor> {
        self.slice_all_at(start, limit, stride, Location::caller())
    }

    pub(crate) fn slice_all_at(
        &self,
        start: &[usize],
        limit: &[usize],
        stride: &[usize],
        loc: Loc,
    ) -> Result<Tensor> {
        let whole = start.len() == self.rank()
            && stride.len() == self.rank()
            && start.iter().all(|&s| s == 0)
            && stride.iter().all(|&s| s == 1)
            && limit == self.dims();
        if whole {
            return Ok(self.clone());
        }
        let op = Op::Slice {
            start: start.to_vec(),
            limit: limit.to_vec(),
            stride: stride.to_vec(),
        };
        node(self.graph(), op, &[self], "slice", loc)
    }

    /// A window of `sizes` starting at the runtime indices `starts` (one rank-0 integer tensor
    /// per dimension), each clamped so that the window stays inside.
    #[track_caller]
    pub fn dynamic_slice(&self, starts: &[&Tensor], sizes: &[usize]) -> Result<Tensor> {
        let loc = Location::caller();
        let mut operands = vec![self];
        operands.extend_from_slice(starts);
        let op = Op::DynamicSlice {
            sizes: sizes.to_vec(),
        };
        node(self.graph(), op, &operands, "dynamic_slice", loc)
    }

    /// `self` with `update` written at the runtime indices `starts`, each clamped so that the
    /// update stays inside.
    #[track_caller]
    pub fn dynamic_update_slice(&self, update: &Tensor, starts: &[&Tensor]) -> Result<Tensor> {
        let loc = Location::caller();
        let mut operands = vec![self, update];
        operands.extend_from_slice(starts);
        let op = Op::DynamicUpdateSlice;
        node(self.graph(), op, &operands, "dynamic_update_slice", loc)
    }

    /// Joins tensors of one dtype and equal shapes except along `axis`.
    #[track_caller]
    pub fn concat(tensors: &[&Tensor], axis_: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let Some(first) = tensors.first() else {
            return Err(graph_error("concat", "needs at least one tensor", loc));
        };
        same_graph(first.graph(), tensors, "concat", loc)?;
        let a = axis("concat", first, axis_, loc)?;
        if tensors.len() == 1 {
            return Ok((*first).clone());
        }
        node(
            first.graph(),
            Op::Concatenate { axis: a },
            tensors,
            "concat",
            loc,
        )
    }

    /// Pads with `value` (a number of `self`'s dtype, or a rank-0 tensor of it): `low[i]` and
    /// `high[i]` elements before and after dimension `i` (negative amounts crop) and
    /// `interior[i]` between neighbours.
    #[track_caller]
    pub fn pad(
        &self,
        low: &[isize],
        high: &[isize],
        interior: &[usize],
        value: impl Operand,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let v = value.to_tensor(self, "pad", loc)?;
        // Lossless: isize has at most 64 bits.
        let low: Vec<i64> = low.iter().map(|&d| d as i64).collect();
        let high: Vec<i64> = high.iter().map(|&d| d as i64).collect();
        self.pad_with_at(&v, &low, &high, interior, loc)
    }

    pub(crate) fn pad_with_at(
        &self,
        value: &Tensor,
        low: &[i64],
        high: &[i64],
        interior: &[usize],
        loc: Loc,
    ) -> Result<Tensor> {
        let op = Op::Pad {
            low: low.to_vec(),
            high: high.to_vec(),
            interior: interior.to_vec(),
        };
        node(self.graph(), op, &[self, value], "pad", loc)
    }

    /// Reverses the order of elements along each of `axes` (NumPy's `flip`).
    #[track_caller]
    pub fn flip(&self, axes_: &[isize]) -> Result<Tensor> {
        let loc = Location::caller();
        let a = axes("flip", self, axes_, loc)?;
        self.reverse_at(&a, loc)
    }

    pub(crate) fn reverse_at(&self, axes_: &[usize], loc: Loc) -> Result<Tensor> {
        if axes_.is_empty() {
            return Ok(self.clone());
        }
        let op = Op::Reverse {
            axes: axes_.to_vec(),
        };
        node(self.graph(), op, &[self], "reverse", loc)
    }
}
