//! Shape families: reshapes, transposes, broadcasts and flips, slices and pads, and joining or
//! splitting along an axis.

use super::{with_number, GraphBuilder};
use crate::ops::Tensor;

impl GraphBuilder<'_, '_, '_> {
    /// A reshape to `-1`, to the dims with a 1 inserted, to the dims reversed, or to random dims.
    pub(super) fn reshape(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let dims: Vec<isize> = match self.b.u8() % 4 {
            0 => vec![-1],
            1 => {
                let mut d: Vec<isize> = x.dims().iter().map(|&d| d as isize).collect();
                d.insert(self.b.below(d.len() + 1), 1);
                d
            }
            2 => x.dims().iter().rev().map(|&d| d as isize).collect(),
            _ => (0..self.b.below(4))
                .map(|_| self.b.below(6) as isize - 1)
                .collect(),
        };
        x.reshape(&dims)
    }

    /// A transpose by a random permutation (sometimes too long, or of negative axes), or a
    /// matrix transpose (by either name).
    pub(super) fn transposition(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let rank = x.rank();
        let mut perm: Vec<isize> = (0..rank as isize).collect();
        for k in (1..perm.len()).rev() {
            perm.swap(k, self.b.below(k + 1));
        }
        match self.b.u8() % 8 {
            0 => perm.push(0),
            1 => perm = perm.iter().map(|a| a - rank as isize).collect(),
            2 => return x.matrix_transpose(),
            3 => return x.t(),
            _ => {}
        }
        x.transpose(&perm)
    }

    /// A broadcast to more dims, an expand_dims, a squeeze or a flip.
    pub(super) fn layout(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let rank = x.rank();
        match self.b.u8() % 4 {
            0 => {
                let mut dims = x.dims().to_vec();
                dims.insert(0, self.dim());
                if self.b.one_in(4) && !dims.is_empty() {
                    let k = self.b.below(dims.len());
                    dims[k] = self.dim();
                }
                x.broadcast_to(&dims)
            }
            1 => x.expand_dims(self.axis(rank)),
            2 => {
                let axes = self.axes(rank);
                x.squeeze(&axes)
            }
            _ => x.flip(&self.axes(rank)),
        }
    }

    /// A slice along one axis, a narrow, a slice of every axis, or a pad (negative amounts crop)
    /// with a number of any type or a value from the pool.
    pub(super) fn slicing(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let axis = self.axis(x.rank());
        let dims = x.dims();
        match self.b.u8() % 4 {
            0 => {
                let start = self.b.below(6) as isize - 3;
                let stop = self.b.below(8) as isize - 3;
                x.slice(axis, start, stop, self.b.below(3))
            }
            1 => x.narrow(axis, self.b.below(4), self.b.below(4)),
            2 => {
                let start: Vec<usize> = dims.iter().map(|_| self.b.below(3)).collect();
                let limit: Vec<usize> = dims
                    .iter()
                    .map(|&d| d.saturating_sub(self.b.below(2)))
                    .collect();
                let stride: Vec<usize> = dims.iter().map(|_| self.b.below(3)).collect();
                x.slice_all(&start, &limit, &stride)
            }
            _ => {
                let low: Vec<isize> = dims.iter().map(|_| self.b.below(5) as isize - 2).collect();
                let high: Vec<isize> = dims.iter().map(|_| self.b.below(5) as isize - 2).collect();
                let interior: Vec<usize> = dims.iter().map(|_| self.b.below(3)).collect();
                if self.b.one_in(4) {
                    // Mostly a scalar of x's dtype; sometimes of another, or not a scalar.
                    let value = match self.pick(pool) {
                        Some(v) if self.b.bool() => v,
                        _ => self.parameter(x.dtype(), &[])?,
                    };
                    return x.pad(&low, &high, &interior, &value);
                }
                let n = self.number();
                with_number!(n, |v| x.pad(&low, &high, &interior, v))
            }
        }
    }

    /// `x` concatenated with a partner (and sometimes itself again), or split along an axis
    /// into pieces of given sizes (mostly adding up to the axis' length) or into equal chunks.
    pub(super) fn pieces(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Vec<Tensor>> {
        let axis = self.axis(x.rank());
        // The axis' length when it is in range, else 0.
        let a = if axis < 0 {
            x.rank().checked_sub(axis.unsigned_abs())
        } else {
            Some(axis as usize)
        };
        let len = a.and_then(|a| x.dims().get(a)).copied().unwrap_or(0);
        match self.b.u8() % 3 {
            0 => {
                let y = self.partner(pool, x)?;
                let mut parts = vec![x, &y];
                if self.b.bool() {
                    parts.push(x);
                }
                Ok(vec![Tensor::concat(&parts, axis)?])
            }
            1 => {
                let mut sizes = Vec::new();
                let mut left = len;
                for _ in 0..self.b.below(4) {
                    let s = self.b.below(left.min(255) + 1);
                    sizes.push(s);
                    left -= s;
                }
                match self.b.u8() % 8 {
                    0 => sizes.push(usize::MAX),
                    1 => sizes.push(left + 1),
                    2 => {}
                    _ => sizes.push(left),
                }
                x.split(axis, &sizes)
            }
            _ => {
                let n = match self.b.u8() % 8 {
                    0 => usize::MAX,
                    1 => len,
                    k => usize::from(k % 4),
                };
                x.chunk(axis, n)
            }
        }
    }
}
