//! Neural-network building blocks over the primitives: softmax and log-softmax, layer and RMS
//! normalisation, the error function and the exact GELU.
//!
//! Reductions inside them run in `f32` for `f16`/`bf16` inputs, whose results are converted
//! back (as PyTorch does on every backend and flax does by default).

use std::panic::Location;

use super::graph::graph_error;
use super::stats::{compute_dtype, need_float};
use super::tensor::Tensor;
use super::util::{axis, same_graph, Loc};
use crate::dtype::DType;
use crate::error::Result;

/// Horner's rule: `c[0] x^n + c[1] x^(n-1) + ... + c[n]` (`c` has at least two entries).
fn polynomial(x: &Tensor, c: &[f64]) -> Result<Tensor> {
    let mut p = x.mul(c[0])?.add(c[1])?;
    for &k in &c[2..] {
        p = p.mul(x)?.add(k)?;
    }
    Ok(p)
}

/// As [`polynomial`] with a leading coefficient 1 not written: `x^n + c[0] x^(n-1) + ... + c[n-1]`.
fn monic_polynomial(x: &Tensor, c: &[f64]) -> Result<Tensor> {
    let mut p = x.add(c[0])?;
    for &k in &c[1..] {
        p = p.mul(x)?.add(k)?;
    }
    Ok(p)
}

/// erf for `f32`: the rational approximation XLA and Eigen use, `x P(x^2) / Q(x^2)` on `x`
/// clamped to `[-4, 4]` (beyond which erf is ±1 in single precision).
fn erf_f32(x: &Tensor) -> Result<Tensor> {
    const ALPHA: [f64; 7] = [
        -2.726_142_258_013_06e-10,
        2.770_681_424_959_02e-8,
        -2.101_024_020_825_08e-6,
        -5.692_506_394_623_46e-5,
        -7.349_906_303_268_55e-4,
        -2.954_599_808_540_25e-3,
        -1.609_603_332_624_15e-2,
    ];
    const BETA: [f64; 5] = [
        -1.456_607_184_649_96e-5,
        -2.133_740_552_789_05e-4,
        -1.682_826_974_382_03e-3,
        -7.373_329_167_204_68e-3,
        -1.426_473_905_141_89e-2,
    ];
    let x = x.clamp(-4.0, 4.0)?;
    let x2 = x.square()?;
    x.mul(&polynomial(&x2, &ALPHA)?)?
        .div(&polynomial(&x2, &BETA)?)
}

/// erf for `f64`: Cephes' `ndtr.c` rational approximations, `x T(x^2) / U(x^2)` for `|x| <= 1`
/// and `1 - e^(-x^2) P(|x|) / Q(|x|)` (with the sign of `x`) beyond, where `|x|` is clamped to 6
/// (erfc(6) < 2^-53, so erf is ±1 in double precision there).
#[allow(clippy::excessive_precision)]
fn erf_f64(x: &Tensor) -> Result<Tensor> {
    // Cephes' coefficients as published.
    const T: [f64; 5] = [
        9.60497373987051638749E0,
        9.00260197203842689217E1,
        2.23200534594684319226E3,
        7.00332514112805075473E3,
        5.55923013010394962768E4,
    ];
    const U: [f64; 5] = [
        3.35617141647503099647E1,
        5.21357949780152679795E2,
        4.59432382970980127987E3,
        2.26290000613890934246E4,
        4.92673942608635921086E4,
    ];
    const P: [f64; 9] = [
        2.46196981473530512524E-10,
        5.64189564831068821977E-1,
        7.46321056442269912687E0,
        4.86371970985681366614E1,
        1.96520832956077098242E2,
        5.26445194995477358631E2,
        9.34528527171957607540E2,
        1.02755188689515710272E3,
        5.57535335369399327526E2,
    ];
    const Q: [f64; 8] = [
        1.32281951154744992508E1,
        8.67072140885989742329E1,
        3.54937778887819891062E2,
        9.75708501743205489753E2,
        1.82390916687909736289E3,
        2.24633760818710981792E3,
        1.65666309194161350182E3,
        5.57535340817727675546E2,
    ];
    let x2 = x.square()?;
    let small = x
        .mul(&polynomial(&x2, &T)?)?
        .div(&monic_polynomial(&x2, &U)?)?;
    let a = x.abs()?.clamp(1.0, 6.0)?;
    let erfc = a
        .square()?
        .neg()?
        .exp()?
        .mul(&polynomial(&a, &P)?)?
        .div(&monic_polynomial(&a, &Q)?)?;
    let large = erfc.neg()?.add(1.0)?.mul(&x.sign()?)?;
    small.where_(&x.abs()?.le(1.0)?, &large)
}

impl Tensor {
    /// `x - m` with `m` the maximum over `axis` (kept), or 0 where that maximum is infinite (so
    /// that a row of `-inf` stays `-inf` instead of becoming NaN), in the compute dtype.
    fn shift_by_max(&self, op: &'static str, axis_: isize, loc: Loc) -> Result<(Tensor, isize)> {
        need_float(self, op, loc)?;
        let a = axis(op, self, axis_, loc)? as isize;
        let x = self.convert_at(compute_dtype(self.dtype()), loc)?;
        let m = x.finite_max_keepdims(&[a], op, loc)?;
        Ok((x.sub(&m)?, a))
    }

    /// `softmax(x)_i = exp(x_i) / sum_j exp(x_j)` along `axis`, computed as
    /// `exp(x - max) / sum(exp(x - max))` so that large logits do not overflow. A row whose
    /// entries are all `-inf` gives NaN (0 / 0), as in JAX and PyTorch.
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let (s, a) = self.shift_by_max("softmax", axis, loc)?;
        let e = s.exp()?;
        e.div(&e.sum_keepdims(&[a])?)?.convert_at(self.dtype(), loc)
    }

    /// `log_softmax(x)_i = x_i - log(sum_j exp(x_j))` along `axis`, computed as
    /// `(x - max) - log(sum(exp(x - max)))`: exact for large logits, and `-inf` (not NaN) where
    /// `x_i = -inf` in a row with a finite entry.
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let (s, a) = self.shift_by_max("log_softmax", axis, loc)?;
        let lse = s.exp()?.sum_keepdims(&[a])?.log()?;
        s.sub(&lse)?.convert_at(self.dtype(), loc)
    }

    /// Checks a norm's `eps` and an affine parameter, which must broadcast to `self`'s shape
    /// without changing it; returns the parameter in the compute dtype.
    fn affine_param(
        &self,
        p: Option<&Tensor>,
        what: &str,
        op: &'static str,
        loc: Loc,
    ) -> Result<Option<Tensor>> {
        let Some(p) = p else { return Ok(None) };
        same_graph(self.graph(), &[p], op, loc)?;
        let fits = p.dtype() == self.dtype()
            && super::elementwise::broadcast_shape(p.dims(), self.dims()).as_deref()
                == Some(self.dims());
        if !fits {
            return Err(graph_error(
                op,
                format!(
                    "the {what} {} must have the input's dtype and broadcast to its shape {}",
                    p.ty(),
                    self.ty()
                ),
                loc,
            ));
        }
        Ok(Some(p.convert_at(compute_dtype(p.dtype()), loc)?))
    }

    /// Layer normalisation over `axes` (as PyTorch's `F.layer_norm` or flax's `LayerNorm` with
    /// `reduction_axes`): `y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias`, with the
    /// population variance. `weight` and `bias` are optional; each must have `x`'s dtype and
    /// broadcast to `x`'s shape (usually the normalised dimensions, e.g. `[d]` for `&[-1]`).
    ///
    /// ```
    /// # use stablegraph::{ops::Graph, DType};
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F32, &[2, 5, 16])?;
    /// let (w, b) = (g.ones(DType::F32, &[16])?, g.zeros(DType::F32, &[16])?);
    /// let y = x.layer_norm(&[-1], Some(&w), Some(&b), 1e-5)?;
    /// assert_eq!(y.dims(), &[2, 5, 16]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn layer_norm(
        &self,
        axes: &[isize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let op = "layer_norm";
        self.check_norm(axes, eps, op, loc)?;
        let weight = self.affine_param(weight, "weight", op, loc)?;
        let bias = self.affine_param(bias, "bias", op, loc)?;
        let c = self.centred_at(axes, op, loc)?;
        let inv = c.sum_sq.div(c.count)?.add(eps)?.rsqrt()?;
        let mut y = c.centred.mul(&inv)?;
        if let Some(w) = weight {
            y = y.mul(&w)?;
        }
        if let Some(b) = bias {
            y = y.add(&b)?;
        }
        y.convert_at(self.dtype(), loc)
    }

    /// RMS normalisation over `axes` (as PyTorch's `F.rms_norm`): `y = x / sqrt(mean(x^2) + eps)
    /// * weight`. `weight` is optional; it must have `x`'s dtype and broadcast to `x`'s shape.
    #[track_caller]
    pub fn rms_norm(&self, axes: &[isize], weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let op = "rms_norm";
        self.check_norm(axes, eps, op, loc)?;
        let weight = self.affine_param(weight, "weight", op, loc)?;
        let x = self.convert_at(compute_dtype(self.dtype()), loc)?;
        let inv = x.square()?.mean_keepdims(axes)?.add(eps)?.rsqrt()?;
        let mut y = x.mul(&inv)?;
        if let Some(w) = weight {
            y = y.mul(&w)?;
        }
        y.convert_at(self.dtype(), loc)
    }

    fn check_norm(&self, axes_: &[isize], eps: f64, op: &'static str, loc: Loc) -> Result<()> {
        need_float(self, op, loc)?;
        super::util::axes(op, self, axes_, loc)?;
        if axes_.is_empty() {
            return Err(graph_error(
                op,
                format!(
                    "{op} needs at least one axis to normalise {} over",
                    self.ty()
                ),
                loc,
            ));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(graph_error(
                op,
                format!("eps must be a finite number >= 0, got {eps}"),
                loc,
            ));
        }
        Ok(())
    }

    /// The error function `erf(x) = 2/sqrt(pi) * integral_0^x e^(-t^2) dt` (floats), from
    /// rational approximations: for `f64` Cephes' (about 1e-16 relative), for `f32` XLA's
    /// (a few ulp), and `f16`/`bf16` through `f32`. `erf(±inf) = ±1`; NaN stays NaN.
    #[track_caller]
    pub fn erf(&self) -> Result<Tensor> {
        let loc = Location::caller();
        need_float(self, "erf", loc)?;
        if self.dtype() == DType::F64 {
            erf_f64(self)
        } else {
            erf_f32(&self.convert_at(DType::F32, loc)?)?.convert_at(self.dtype(), loc)
        }
    }

    /// GELU in its exact form, `0.5 x (1 + erf(x / sqrt(2)))` (PyTorch's default
    /// `approximate='none'`, JAX's `approximate=False`). [`Tensor::gelu`] is the tanh
    /// approximation (GPT-2's, and JAX's default).
    #[track_caller]
    pub fn gelu_exact(&self) -> Result<Tensor> {
        let loc = Location::caller();
        need_float(self, "gelu_exact", loc)?;
        let e = self.mul(std::f64::consts::FRAC_1_SQRT_2)?.erf()?;
        self.mul(0.5)?.mul(&e.add(1.0)?)
    }
}
