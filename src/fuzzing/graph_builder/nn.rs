//! The neural-network composites: softmax and log-softmax, layer and RMS normalisation, the
//! error function and the exact GELU.

use super::GraphBuilder;
use crate::dtype::DType;
use crate::ops::Tensor;

/// Epsilons for the norms: usual ones, 0, and invalid ones.
const EPSILONS: &[f64] = &[1e-5, 1e-6, 1e-3, 0.1, 0.0, -1e-5, f64::NAN, f64::INFINITY];

impl GraphBuilder<'_, '_, '_> {
    /// `softmax` or `log_softmax` along a random axis, `erf`, `gelu_exact`, or a norm.
    pub(super) fn nn(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let rank = x.rank();
        match self.b.u8() % 6 {
            0 => x.softmax(self.axis(rank)),
            1 => x.log_softmax(self.axis(rank)),
            2 => x.erf(),
            3 => x.gelu_exact(),
            _ => self.norm(pool, x),
        }
    }

    /// A `layer_norm` or `rms_norm` over the trailing axes or random ones, with a random
    /// epsilon and optional affine parameters.
    ///
    /// A layer norm counts as robust only in `f64` with a positive epsilon: its centred values
    /// hold the residue of the backend's summation order, which dividing by a standard
    /// deviation near 0 magnifies (to ±1 against NaN, with no epsilon, for a constant row).
    fn norm(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let rank = x.rank();
        let axes: Vec<isize> = if self.b.bool() {
            let k = self.b.below(rank + 1) as isize;
            (-k..0).collect()
        } else {
            self.axes(rank)
        };
        let eps = self.b.pick(EPSILONS);
        let weight = self.affine(pool, x)?;
        if self.b.bool() {
            return x.rms_norm(&axes, weight.as_ref(), eps);
        }
        let bias = self.affine(pool, x)?;
        let y = x.layer_norm(&axes, weight.as_ref(), bias.as_ref(), eps)?;
        if !(x.dtype() == DType::F64 && eps > 0.0) {
            self.robust = false;
        }
        Ok(y)
    }

    /// An optional weight or bias for a norm of `x`: mostly none or a parameter of `x`'s
    /// trailing dims and dtype; sometimes of another dtype, or a partner of `x`.
    fn affine(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Option<Tensor>> {
        match self.b.u8() % 4 {
            0 => Ok(None),
            1 => Ok(Some(self.partner(pool, x)?)),
            _ => {
                let k = self.b.below(x.rank() + 1);
                let dims = x.dims()[x.rank() - k..].to_vec();
                let dtype = if self.b.one_in(8) {
                    self.dtype()
                } else {
                    x.dtype()
                };
                Ok(Some(self.parameter(dtype, &dims)?))
            }
        }
    }
}
