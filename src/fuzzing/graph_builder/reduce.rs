//! Reduction families: reductions over axes, argmax and argmin, cumulative sums, and moments
//! (`mean_all`, variance and standard deviation).

use super::GraphBuilder;
use crate::dtype::DType;
use crate::ops::{CumsumOptions, Tensor, VarOptions};

impl GraphBuilder<'_, '_, '_> {
    /// A reduction over random axes (kept or not), an argmax or argmin, a total sum or a
    /// cumulative sum.
    pub(super) fn reduction(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let rank = x.rank();
        let axes = self.axes(rank);
        let keep = self.b.bool();
        match (self.b.u8() % 10, keep) {
            (0, false) => x.sum(&axes),
            (0, true) => x.sum_keepdims(&axes),
            (1, false) => x.prod(&axes),
            (1, true) => x.prod_keepdims(&axes),
            (2, false) => x.max(&axes),
            (2, true) => x.max_keepdims(&axes),
            (3, false) => x.min(&axes),
            (3, true) => x.min_keepdims(&axes),
            (4, false) => x.mean(&axes),
            (4, true) => x.mean_keepdims(&axes),
            (5, false) => x.logsumexp(&axes),
            (5, true) => x.logsumexp_keepdims(&axes),
            (k @ (6 | 7), _) => self.arg_reduction(x, k == 6, keep),
            (8, _) => x.sum_all(),
            _ => {
                let axis = self.axis(rank);
                let options = CumsumOptions {
                    exclusive: self.b.bool(),
                    reverse: self.b.bool(),
                };
                if options == CumsumOptions::default() && self.b.bool() {
                    x.cumsum(axis)
                } else {
                    x.cumsum_with(axis, options)
                }
            }
        }
    }

    /// An argmax (`max`) or argmin, with the axis kept or not, and sometimes an index dtype.
    fn arg_reduction(&mut self, x: &Tensor, max: bool, keep: bool) -> crate::Result<Tensor> {
        let axis = self.axis(x.rank());
        match (max, keep, self.b.bool()) {
            (true, true, _) => x.argmax_keepdims(axis),
            (true, false, false) => x.argmax(axis),
            (true, false, true) => x.argmax_as(axis, self.dtype()),
            (false, true, _) => x.argmin_keepdims(axis),
            (false, false, false) => x.argmin(axis),
            (false, false, true) => x.argmin_as(axis, self.dtype()),
        }
    }

    /// `mean_all`, or a variance or standard deviation over random axes: plain, keeping the
    /// axes, or with options (a `ddof` of 0 to 2, or one larger than any axis).
    ///
    /// Only `f64` moments with `ddof = 0` count as robust: in `f32` the residue that the
    /// backend's summation order leaves in a constant row's deviations is large enough to show
    /// (a square root, or a later division, magnifies it), and a divisor `N - ddof` of 0 turns a
    /// residue into infinity where an exact 0 gives NaN.
    pub(super) fn moments(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let axes = self.axes(x.rank());
        let sqrt = self.b.bool();
        let options = match self.b.u8() % 4 {
            0 => return x.mean_all(),
            1 if sqrt => return self.robust_moment(x, 0, x.std(&axes)),
            1 => return self.robust_moment(x, 0, x.var(&axes)),
            2 if sqrt => return self.robust_moment(x, 0, x.std_keepdims(&axes)),
            2 => return self.robust_moment(x, 0, x.var_keepdims(&axes)),
            _ => VarOptions {
                ddof: match self.b.u8() % 8 {
                    0 => usize::MAX,
                    k => usize::from(k % 3),
                },
                keepdims: self.b.bool(),
            },
        };
        let y = if sqrt {
            x.std_with(&axes, options)
        } else {
            x.var_with(&axes, options)
        };
        self.robust_moment(x, options.ddof, y)
    }

    /// `y`, a moment of `x` with `ddof`, after noting whether it is robust (see `moments`).
    fn robust_moment(
        &mut self,
        x: &Tensor,
        ddof: usize,
        y: crate::Result<Tensor>,
    ) -> crate::Result<Tensor> {
        if y.is_ok() && (x.dtype() != DType::F64 || ddof != 0) {
            self.robust = false;
        }
        y
    }
}
