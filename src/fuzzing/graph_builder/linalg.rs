//! Linear algebra families: `matmul`, `dot_general`, `einsum`, and the causal convolution.

use super::GraphBuilder;
use crate::fuzzing::Bytes;
use crate::ops::Tensor;

impl GraphBuilder<'_, '_, '_> {
    /// `matmul`, `dot_general` with random batch and contracting pairs, or an `einsum` over
    /// both operands' letters.
    pub(super) fn linalg(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let y = self.partner(pool, x)?;
        match self.b.u8() % 4 {
            0 => x.matmul(&y),
            1 => {
                let (xr, yr) = (x.rank(), y.rank());
                let pairs = |b: &mut Bytes<'_>, n: usize| -> Vec<(isize, isize)> {
                    (0..n)
                        .map(|_| (b.below(xr + 1) as isize - 1, b.below(yr + 1) as isize - 1))
                        .collect()
                };
                let (nb, nc) = (self.b.below(2), self.b.below(3));
                let batch = pairs(self.b, nb);
                let contract = pairs(self.b, nc);
                x.dot_general(&y, &batch, &contract)
            }
            _ => {
                let letters = |t: &Tensor, shift: usize| -> String {
                    (0..t.rank())
                        .map(|k| (b'a' + ((k + shift) % 6) as u8) as char)
                        .collect()
                };
                let shift = self.b.below(3);
                let out: String = {
                    let mut s: Vec<char> = format!("{}{}", letters(x, 0), letters(&y, shift))
                        .chars()
                        .collect();
                    s.sort_unstable();
                    s.dedup();
                    s.into_iter().filter(|_| self.b.bool()).collect()
                };
                let spec = format!("{},{}->{out}", letters(x, 0), letters(&y, shift));
                Tensor::einsum(&spec, &[x, &y])
            }
        }
    }

    /// A causal depthwise convolution over `x`'s channels (its last axis), mostly with a kernel
    /// of 1 to 3 taps, sometimes of any size or a weight of random dims; sometimes a bias.
    pub(super) fn conv(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let channels = x.dims().last().copied().unwrap_or(1);
        let dims = match self.b.u8() % 8 {
            0 => vec![channels, self.dim()],
            1 => self.dims(),
            _ => vec![channels, 1 + self.b.below(3)],
        };
        let w = self.parameter(x.dtype(), &dims)?;
        let bias = if self.b.bool() {
            Some(self.parameter(x.dtype(), &[channels])?)
        } else {
            None
        };
        x.causal_conv1d(&w, bias.as_ref())
    }
}
