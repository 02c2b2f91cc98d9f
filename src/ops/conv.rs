//! Depthwise causal 1-D convolution over time, as Mamba's short convolution uses.

use std::panic::Location;

use super::graph::graph_error;
use super::tensor::Tensor;
use super::util::same_graph;
use crate::error::Result;

/// The largest kernel [`Tensor::causal_conv1d`] builds (a static slice per tap).
const MAX_TAPS: usize = 1 << 12;

impl Tensor {
    /// Depthwise causal convolution of `self` (`[batch, time, channels]`) with `weight`
    /// (`[channels, k]`) and an optional `bias` (`[channels]`):
    /// `out[b, t, c] = bias[c] + sum_j weight[c, j] * x[b, t - (k - 1) + j, c]`, with `x` zero
    /// before the first step. Every channel is its own group (feature groups = channels).
    ///
    /// Built from a pad, `k` static slices, multiplies and adds, which XLA fuses into one loop;
    /// `k` is at most 4,096.
    #[track_caller]
    pub fn causal_conv1d(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let loc = Location::caller();
        same_graph(self.graph(), &[weight], "causal_conv1d", loc)?;
        if let Some(b) = bias {
            same_graph(self.graph(), &[b], "causal_conv1d", loc)?;
        }
        let ok = self.rank() == 3
            && weight.rank() == 2
            && weight.dims()[0] == self.dims()[2]
            && weight.dims()[1] >= 1
            && weight.dtype() == self.dtype()
            && self.dtype().is_float()
            && bias.is_none_or(|b| b.dims() == [self.dims()[2]] && b.dtype() == self.dtype());
        if !ok {
            return Err(graph_error(
                "causal_conv1d",
                format!(
                    "needs x [batch, time, channels], weight [channels, k] and bias [channels] of one float dtype, got x {}, weight {}{}",
                    self.ty(),
                    weight.ty(),
                    bias.map(|b| format!(", bias {}", b.ty())).unwrap_or_default()
                ),
                loc,
            ));
        }
        let (time, k) = (self.dims()[1], weight.dims()[1]);
        if k > MAX_TAPS {
            return Err(graph_error(
                "causal_conv1d",
                format!(
                    "the kernel of weight {} has {k} taps, more than the {MAX_TAPS} that \
                     causal_conv1d unrolls",
                    weight.ty()
                ),
                loc,
            ));
        }
        let padded = self.pad(&[0, k as isize - 1, 0], &[0, 0, 0], &[0, 0, 0], 0.0)?;
        let wt = weight.matrix_transpose()?; // [k, channels]
        let mut acc: Option<Tensor> = None;
        for j in 0..k {
            let xs = padded.narrow(1, j, time)?;
            let wj = wt.narrow(0, j, 1)?; // [1, channels], broadcasts over [batch, time, channels]
            let term = xs.mul(&wj)?;
            acc = Some(match acc {
                None => term,
                Some(a) => a.add(&term)?,
            });
        }
        let out = acc.ok_or_else(|| graph_error("causal_conv1d", "kernel size is 0", loc))?;
        match bias {
            Some(b) => out.add(b),
            None => Ok(out),
        }
    }
}
