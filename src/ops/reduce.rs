//! Reductions over any axes, arg-reductions, logsumexp, and cumulative sums.
//!
//! Each reduction drops the reduced axes (`sum`, `argmax`, ...) and has a `*_keepdims` twin that
//! keeps them as size-1 dimensions (NumPy's and JAX's `keepdims=True`); `argmax_as`/`argmin_as`
//! pick the index dtype and [`CumsumOptions`] the kind of running sum.

use std::panic::Location;

use super::op::{ArgKind, Op, ReduceKind};
use super::stats::need_float;
use super::tensor::Tensor;
use super::util::{axes, axis, check, node, typed_node, Loc};
use crate::dtype::{DType, TensorType};
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

    fn mean_at(
        &self,
        axes_: &[isize],
        keepdims: bool,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        need_float(self, name, loc)?;
        let a = axes(name, self, axes_, loc)?;
        // In f64: a product of some dimensions of an empty tensor may overflow a usize.
        let count: f64 = a.iter().map(|&i| self.dims()[i] as f64).product();
        let s = self.reduce_at(ReduceKind::Sum, axes_, keepdims, name, loc)?;
        let n = self.graph().full_at(count, self.dtype(), &[], loc)?;
        s.div(&n)
    }

    /// The maximum over `axes` (kept as size-1 dimensions), or 0 where it is infinite: the shift
    /// that keeps `exp(x - m)` from overflowing without turning a row of `-inf` into NaN.
    pub(crate) fn finite_max_keepdims(
        &self,
        axes_: &[isize],
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let m = self.reduce_at(ReduceKind::Max, axes_, true, name, loc)?;
        let inf = m.abs()?.eq(f64::INFINITY)?;
        inf.not()?.select(&m, 0.0)
    }

    /// `m + log(sum(exp(x - m)))` with `m` the maximum, or 0 where that is infinite.
    fn logsumexp_at(
        &self,
        axes_: &[isize],
        keepdims: bool,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        need_float(self, name, loc)?;
        let m = self.finite_max_keepdims(axes_, name, loc)?;
        let s = self
            .sub(&m)?
            .exp()?
            .reduce_at(ReduceKind::Sum, axes_, true, name, loc)?;
        let out = s.log()?.add(&m)?;
        if keepdims {
            Ok(out)
        } else {
            let a = axes(name, self, axes_, loc)?;
            let dims: Vec<usize> = (0..self.rank())
                .filter(|i| !a.contains(i))
                .map(|i| self.dims()[i])
                .collect();
            out.reshape_at(&dims, loc)
        }
    }

    /// Sum over every axis, as a scalar.
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.reduce_at(ReduceKind::Sum, &all, false, "sum_all", Location::caller())
    }

    fn arg_at(
        &self,
        kind: ArgKind,
        axis_: isize,
        keepdims: bool,
        index: DType,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let a = axis(name, self, axis_, loc)?;
        let mut dims = self.dims().to_vec();
        dims.remove(a);
        let out = typed_node(
            self.graph(),
            Op::ArgReduce { kind, axis: a },
            &[self],
            TensorType::new(index, &dims),
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

    fn cumsum_at(
        &self,
        axis_: isize,
        options: CumsumOptions,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let CumsumOptions { exclusive, reverse } = options;
        let a = axis(name, self, axis_, loc)?;
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
        let c = node(self.graph(), Op::Cumsum { axis: a }, &[&x], name, loc)?;
        if reverse {
            c.reverse_at(&[a], loc)
        } else {
            Ok(c)
        }
    }
}

/// Which running sum [`Tensor::cumsum_with`] computes; the default is [`Tensor::cumsum`]'s
/// inclusive forward sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CumsumOptions {
    /// Leave each element out of its own sum: `out[i] = x[0] + ... + x[i-1]`, so `out[0] = 0`.
    pub exclusive: bool,
    /// Sum from the end instead: `out[i] = x[i] + ... + x[n-1]` (with `exclusive`, from
    /// `x[i+1]`).
    pub reverse: bool,
}

/// Each reduction and its `*_keepdims` twin, built by `self.$at($($arg,)* axes, keepdims, name,
/// loc)`.
macro_rules! reductions {
    ($($name:ident, $keep:ident => $at:ident($($arg:expr),*), $doc:literal;)*) => {
        impl Tensor {
            $(
                #[doc = $doc]
                #[track_caller]
                pub fn $name(&self, axes: &[isize]) -> Result<Tensor> {
                    self.$at($($arg,)* axes, false, stringify!($name), Location::caller())
                }

                #[doc = concat!("As [`Tensor::", stringify!($name), "`], keeping the reduced axes as size-1 dimensions.")]
                #[track_caller]
                pub fn $keep(&self, axes: &[isize]) -> Result<Tensor> {
                    self.$at($($arg,)* axes, true, stringify!($keep), Location::caller())
                }
            )*
        }
    };
}

reductions! {
    sum, sum_keepdims => reduce_at(ReduceKind::Sum),
        "The sum over `axes`, which disappear from the shape. An empty `axes` reduces nothing.";
    prod, prod_keepdims => reduce_at(ReduceKind::Prod),
        "The product over `axes`, which disappear from the shape.";
    max, max_keepdims => reduce_at(ReduceKind::Max),
        "The maximum over `axes` (NaN propagates), which disappear from the shape.";
    min, min_keepdims => reduce_at(ReduceKind::Min),
        "The minimum over `axes` (NaN propagates), which disappear from the shape.";
    mean, mean_keepdims => mean_at(),
        "The mean over `axes` (float tensors), which disappear from the shape.";
    logsumexp, logsumexp_keepdims => logsumexp_at(),
        "`log(sum(exp(x)))` over `axes` (float tensors), which disappear from the shape; computed \
         stably as `m + log(sum(exp(x - m)))` with `m` the maximum (replaced by 0 where it is \
         infinite, so an all `-inf` lane gives `-inf`).";
}

macro_rules! arg_reductions {
    ($($name:ident, $keep:ident, $as:ident => $kind:ident, $what:literal;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("The index (`i64`) of the first ", $what, " along `axis`, which disappears from")]
                #[doc = "the shape. NaN counts as larger than every number."]
                #[track_caller]
                pub fn $name(&self, axis: isize) -> Result<Tensor> {
                    let loc = Location::caller();
                    self.arg_at(ArgKind::$kind, axis, false, DType::I64, stringify!($name), loc)
                }

                #[doc = concat!("As [`Tensor::", stringify!($name), "`], keeping `axis` as a size-1 dimension.")]
                #[track_caller]
                pub fn $keep(&self, axis: isize) -> Result<Tensor> {
                    let loc = Location::caller();
                    self.arg_at(ArgKind::$kind, axis, true, DType::I64, stringify!($keep), loc)
                }

                #[doc = concat!("As [`Tensor::", stringify!($name), "`], with the index in the integer dtype `index`")]
                #[doc = "(which must hold every index along `axis`)."]
                #[track_caller]
                pub fn $as(&self, axis: isize, index: DType) -> Result<Tensor> {
                    let loc = Location::caller();
                    self.arg_at(ArgKind::$kind, axis, false, index, stringify!($as), loc)
                }
            )*
        }
    };
}

arg_reductions! {
    argmax, argmax_keepdims, argmax_as => Max, "maximum";
    argmin, argmin_keepdims, argmin_as => Min, "minimum";
}

impl Tensor {
    /// The inclusive running sum along `axis`: `out[i] = x[0] + ... + x[i]` (numeric tensors).
    #[track_caller]
    pub fn cumsum(&self, axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        self.cumsum_at(axis, CumsumOptions::default(), "cumsum", loc)
    }

    /// A running sum along `axis`, exclusive and/or reversed as `options` says:
    /// `x.cumsum_with(-1, CumsumOptions { exclusive: true, ..Default::default() })`.
    #[track_caller]
    pub fn cumsum_with(&self, axis: isize, options: CumsumOptions) -> Result<Tensor> {
        self.cumsum_at(axis, options, "cumsum_with", Location::caller())
    }
}
