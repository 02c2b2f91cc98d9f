//! Reductions over any axes (with keepdims), arg-reductions, logsumexp, and cumulative sums.

use std::panic::Location;

use super::graph::{graph_error, ArgKind, Op, ReduceKind, Tensor};
use super::util::{axes, axis, check, node, Loc};
use crate::error::Result;

impl Tensor {
    fn reduce_at(
        &self,
        kind: ReduceKind,
        axes_: &[isize],
        keepdims: bool,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let a = axes(name, self, axes_, loc)?;
        let op = Op::Reduce {
            kind,
            axes: a.clone(),
        };
        let reduced = if a.is_empty() {
            // Nothing to reduce, and no node; the operand must still fit the rule.
            check(&op, &[self], name, loc)?;
            self.clone()
        } else {
            node(self.graph(), op, &[self], name, loc)?
        };
        if keepdims {
            let dims: Vec<usize> = (0..self.rank())
                .map(|i| if a.contains(&i) { 1 } else { self.dims()[i] })
                .collect();
            reduced.reshape_at(&dims, loc)
        } else {
            Ok(reduced)
        }
    }

    /// Sum over `axes`; `keepdims` keeps them as size-1 dimensions. An empty `axes` reduces
    /// nothing ([`Tensor::sum_all`] reduces everything).
    #[track_caller]
    pub fn sum(&self, axes: &[isize], keepdims: bool) -> Result<Tensor> {
        self.reduce_at(ReduceKind::Sum, axes, keepdims, "sum", Location::caller())
    }

    /// Product over `axes`.
    #[track_caller]
    pub fn prod(&self, axes: &[isize], keepdims: bool) -> Result<Tensor> {
        self.reduce_at(ReduceKind::Prod, axes, keepdims, "prod", Location::caller())
    }

    /// Maximum over `axes` (NaN propagates).
    #[track_caller]
    pub fn max(&self, axes: &[isize], keepdims: bool) -> Result<Tensor> {
        self.reduce_at(ReduceKind::Max, axes, keepdims, "max", Location::caller())
    }

    /// Minimum over `axes` (NaN propagates).
    #[track_caller]
    pub fn min(&self, axes: &[isize], keepdims: bool) -> Result<Tensor> {
        self.reduce_at(ReduceKind::Min, axes, keepdims, "min", Location::caller())
    }

    /// Mean over `axes` (floats).
    #[track_caller]
    pub fn mean(&self, axes_: &[isize], keepdims: bool) -> Result<Tensor> {
        let loc = Location::caller();
        if !self.dtype().is_float() {
            return Err(graph_error(
                "mean",
                format!("mean needs a float tensor, got {}", self.ty()),
                loc,
            ));
        }
        let a = axes("mean", self, axes_, loc)?;
        // In f64: a product of some dimensions of an empty tensor may overflow a usize.
        let count: f64 = a.iter().map(|&i| self.dims()[i] as f64).product();
        let s = self.reduce_at(ReduceKind::Sum, axes_, keepdims, "mean", loc)?;
        let n = self.graph().full_at(count, self.dtype(), &[], loc)?;
        s.div(&n)
    }

    /// Sum over every axis, as a scalar.
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.reduce_at(ReduceKind::Sum, &all, false, "sum_all", Location::caller())
    }

    /// `log(sum(exp(x)))` over `axes`, computed stably as `m + log(sum(exp(x - m)))` with `m`
    /// the maximum (replaced by 0 where it is infinite, so all `-inf` rows give `-inf`).
    #[track_caller]
    pub fn logsumexp(&self, axes_: &[isize], keepdims: bool) -> Result<Tensor> {
        let loc = Location::caller();
        if !self.dtype().is_float() {
            return Err(graph_error(
                "logsumexp",
                format!("logsumexp needs a float tensor, got {}", self.ty()),
                loc,
            ));
        }
        let m = self.reduce_at(ReduceKind::Max, axes_, true, "logsumexp", loc)?;
        let inf = m.abs()?.eq(f64::INFINITY)?;
        let m = m.where_(&inf.not()?, 0.0)?;
        let s = self
            .sub(&m)?
            .exp()?
            .reduce_at(ReduceKind::Sum, axes_, true, "logsumexp", loc)?;
        let out = s.log()?.add(&m)?;
        if keepdims {
            Ok(out)
        } else {
            let a = axes("logsumexp", self, axes_, loc)?;
            let dims: Vec<usize> = (0..self.rank())
                .filter(|i| !a.contains(i))
                .map(|i| self.dims()[i])
                .collect();
            out.reshape_at(&dims, loc)
        }
    }

    fn arg_at(
        &self,
        kind: ArgKind,
        axis_: isize,
        keepdims: bool,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let a = axis(name, self, axis_, loc)?;
        let out = node(
            self.graph(),
            Op::ArgReduce { kind, axis: a },
            &[self],
            name,
            loc,
        )?;
        if keepdims {
            let mut dims = out.dims().to_vec();
            dims.insert(a, 1);
            out.reshape_at(&dims, loc)
        } else {
            Ok(out)
        }
    }

    /// Index (`i64`) of the first maximum along `axis`.
    #[track_caller]
    pub fn argmax(&self, axis: isize, keepdims: bool) -> Result<Tensor> {
        self.arg_at(ArgKind::Max, axis, keepdims, "argmax", Location::caller())
    }

    /// Index (`i64`) of the first minimum along `axis`.
    #[track_caller]
    pub fn argmin(&self, axis: isize, keepdims: bool) -> Result<Tensor> {
        self.arg_at(ArgKind::Min, axis, keepdims, "argmin", Location::caller())
    }

    /// Cumulative sum along `axis`: inclusive (`out[i] = x[0] + ... + x[i]`) or exclusive
    /// (`out[i] = x[0] + ... + x[i-1]`), forward or `reverse` (summing from the end).
    #[track_caller]
    pub fn cumsum(&self, axis_: isize, exclusive: bool, reverse: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let a = axis("cumsum", self, axis_, loc)?;
        let x = if reverse {
            self.reverse_at(&[a], loc)?
        } else {
            self.clone()
        };
        let n = x.dims()[a];
        let x = if exclusive && n > 0 {
            // Shift right by one along the axis, filling with zero.
            let mut low = vec![0; x.rank()];
            let mut high = vec![0; x.rank()];
            low[a] = 1;
            high[a] = -1;
            let zero = x.graph().full_at(0.0, x.dtype(), &[], loc)?;
            x.pad_with_at(&zero, &low, &high, &vec![0; x.rank()], loc)?
        } else {
            x
        };
        let c = node(self.graph(), Op::Cumsum { axis: a }, &[&x], "cumsum", loc)?;
        if reverse {
            c.reverse_at(&[a], loc)
        } else {
            Ok(c)
        }
    }
}
