//! Moments: `mean_all`, variance and standard deviation over any axes (with a `ddof` option),
//! and the centring step that layer normalisation shares with them.

use std::panic::Location;

use super::graph::graph_error;
use super::tensor::Tensor;
use super::util::{axes, Loc};
use crate::dtype::DType;
use crate::error::Result;

/// Options of [`Tensor::var_with`] and [`Tensor::std_with`]. The default is the population
/// variance (`ddof = 0`) without kept dimensions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VarOptions {
    /// "Delta degrees of freedom": the sum of squares is divided by `N - ddof` (NumPy's `ddof`,
    /// PyTorch's `correction`); 1 gives the unbiased sample variance. A divisor of 0 or less
    /// gives infinity or NaN, as in NumPy.
    pub ddof: usize,
    /// Keep the reduced axes as size-1 dimensions.
    pub keepdims: bool,
}

/// The dtype that reductions inside a composite run in: `f32` for `f16`/`bf16` inputs (their
/// results are converted back), else the input's own.
pub(crate) fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// An error unless `x` is a float tensor.
pub(crate) fn need_float(x: &Tensor, op: &'static str, loc: Loc) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(graph_error(
            op,
            format!("{op} needs a float tensor, got {}", x.ty()),
            loc,
        ))
    }
}

/// Centred values and sum of squares over some axes, in the compute dtype, with kept dimensions.
pub(crate) struct Centred {
    /// `x - mean(x)`, shaped like `x`.
    pub(crate) centred: Tensor,
    /// `sum((x - mean(x))^2)` over the axes, kept as size-1 dimensions.
    pub(crate) sum_sq: Tensor,
    /// The number of elements each mean is taken over.
    pub(crate) count: f64,
    /// The normalised axes, sorted.
    pub(crate) axes: Vec<usize>,
}

impl Tensor {
    /// Centres a float tensor over `axes_` (two passes: the mean, then squared deviations, which
    /// is stable where `E[x^2] - E[x]^2` cancels).
    pub(crate) fn centred_at(
        &self,
        axes_: &[isize],
        op: &'static str,
        loc: Loc,
    ) -> Result<Centred> {
        need_float(self, op, loc)?;
        let a = axes(op, self, axes_, loc)?;
        // In f64: a product of some dimensions of an empty tensor may overflow a usize.
        let count: f64 = a.iter().map(|&i| self.dims()[i] as f64).product();
        let listed: Vec<isize> = a.iter().map(|&i| i as isize).collect();
        let x = self.convert_at(compute_dtype(self.dtype()), loc)?;
        let centred = x.sub(&x.mean_keepdims(&listed)?)?;
        let sum_sq = centred.square()?.sum_keepdims(&listed)?;
        Ok(Centred {
            centred,
            sum_sq,
            count,
            axes: a,
        })
    }

    fn var_at(
        &self,
        axes_: &[isize],
        o: VarOptions,
        sqrt: bool,
        op: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let c = self.centred_at(axes_, op, loc)?;
        let divisor = (c.count - o.ddof as f64).max(0.0);
        let mut v = c.sum_sq.div(divisor)?;
        if sqrt {
            v = v.sqrt()?;
        }
        if !o.keepdims {
            let dims: Vec<usize> = (0..self.rank())
                .filter(|i| !c.axes.contains(i))
                .map(|i| self.dims()[i])
                .collect();
            v = v.reshape_at(&dims, loc)?;
        }
        v.convert_at(self.dtype(), loc)
    }

    /// Mean over every axis, as a scalar (floats): `sum(x) / N`.
    #[track_caller]
    pub fn mean_all(&self) -> Result<Tensor> {
        let loc = Location::caller();
        need_float(self, "mean_all", loc)?;
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.mean(&all)
    }

    /// Population variance over `axes`: `mean((x - mean(x))^2)`, computed in two passes (in
    /// `f32` for `f16`/`bf16`). See [`Tensor::var_with`] for `ddof`.
    #[track_caller]
    pub fn var(&self, axes: &[isize]) -> Result<Tensor> {
        self.var_at(
            axes,
            VarOptions::default(),
            false,
            "var",
            Location::caller(),
        )
    }

    /// [`Tensor::var`] keeping the reduced axes as size-1 dimensions.
    #[track_caller]
    pub fn var_keepdims(&self, axes: &[isize]) -> Result<Tensor> {
        let o = VarOptions {
            keepdims: true,
            ..VarOptions::default()
        };
        self.var_at(axes, o, false, "var", Location::caller())
    }

    /// Variance over `axes`: `sum((x - mean(x))^2) / (N - ddof)` with `N` the number of elements
    /// reduced per output (see [`VarOptions`]).
    #[track_caller]
    pub fn var_with(&self, axes: &[isize], options: VarOptions) -> Result<Tensor> {
        self.var_at(axes, options, false, "var", Location::caller())
    }

    /// Population standard deviation over `axes`: `sqrt(var(x))`.
    #[track_caller]
    pub fn std(&self, axes: &[isize]) -> Result<Tensor> {
        self.var_at(axes, VarOptions::default(), true, "std", Location::caller())
    }

    /// [`Tensor::std`] keeping the reduced axes as size-1 dimensions.
    #[track_caller]
    pub fn std_keepdims(&self, axes: &[isize]) -> Result<Tensor> {
        let o = VarOptions {
            keepdims: true,
            ..VarOptions::default()
        };
        self.var_at(axes, o, true, "std", Location::caller())
    }

    /// Standard deviation over `axes`: `sqrt(sum((x - mean(x))^2) / (N - ddof))`.
    #[track_caller]
    pub fn std_with(&self, axes: &[isize], options: VarOptions) -> Result<Tensor> {
        self.var_at(axes, options, true, "std", Location::caller())
    }
}
