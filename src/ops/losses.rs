//! Losses and dropout with PyTorch's semantics: `cross_entropy` and `nll_loss` over integer
//! labels with an optional `ignore_index` (the mean over the labels not ignored), `mse_loss`,
//! `binary_cross_entropy_with_logits` (the stable form), and `dropout` with a random key.

use std::panic::Location;

use super::graph::graph_error;
use super::tensor::Tensor;
use super::util::{same_graph, Loc};
use crate::dtype::DType;
use crate::error::Result;

impl Tensor {
    /// The mean cross-entropy of these logits (`[..., classes]`, float) against integer
    /// `labels` (`[...]`), over the labels not equal to `ignore_index` (PyTorch's
    /// `F.cross_entropy` with `reduction="mean"`; NaN when every label is ignored, as there).
    /// A label outside `[0, classes)` other than `ignore_index` picks nothing: it adds 0 to the
    /// sum and 1 to the count (PyTorch raises an error); check labels on the host if such can
    /// occur.
    #[track_caller]
    pub fn cross_entropy(&self, labels: &Tensor, ignore_index: Option<i64>) -> Result<Tensor> {
        let loc = Location::caller();
        let logp = self.log_softmax(-1)?;
        nll_at(&logp, labels, ignore_index, "cross_entropy", loc)
    }

    /// The mean negative log-likelihood of these log-probabilities (`[..., classes]`, float)
    /// at integer `labels` (`[...]`), over the labels not equal to `ignore_index` (PyTorch's
    /// `F.nll_loss`).
    #[track_caller]
    pub fn nll_loss(&self, labels: &Tensor, ignore_index: Option<i64>) -> Result<Tensor> {
        nll_at(self, labels, ignore_index, "nll_loss", Location::caller())
    }

    /// The mean squared difference from `target` (same type): PyTorch's `F.mse_loss`.
    #[track_caller]
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        check_pair(self, target, "mse_loss", loc)?;
        self.sub(target)?.square()?.mean_all()
    }

    /// The mean binary cross-entropy of these logits against `targets` in `[0, 1]` (same
    /// type), as `max(x, 0) - x t + log(1 + exp(-|x|))`, which does not overflow: PyTorch's
    /// `F.binary_cross_entropy_with_logits`.
    #[track_caller]
    pub fn binary_cross_entropy_with_logits(&self, targets: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        check_pair(self, targets, "binary_cross_entropy_with_logits", loc)?;
        let positive = self.maximum(0.0)?;
        let soft = self.abs()?.neg()?.exp()?.log1p()?;
        positive.sub(&self.mul(targets)?)?.add(&soft)?.mean_all()
    }

    /// Inverted dropout: each element kept with probability `1 - rate` and scaled by
    /// `1 / (1 - rate)`, zeroed otherwise, the choice drawn from `key` (a `u32[2]` Threefry
    /// key, see [`Graph::random_uniform`](super::Graph::random_uniform)). `rate` in `[0, 1)`;
    /// 0 returns `self` unchanged.
    #[track_caller]
    pub fn dropout(&self, key: &Tensor, rate: f64) -> Result<Tensor> {
        let loc = Location::caller();
        if !(0.0..1.0).contains(&rate) || !self.dtype().is_float() {
            return Err(graph_error(
                "dropout",
                format!(
                    "takes a float value and a rate in [0, 1), got {} and {rate}",
                    self.ty()
                ),
                loc,
            ));
        }
        if rate == 0.0 {
            return Ok(self.clone());
        }
        let u = self.graph().random_uniform(key, DType::F32, self.dims())?;
        let kept = u.ge(rate)?;
        let scaled = self.div(1.0 - rate)?;
        kept.select(&scaled, 0.0)
    }
}

/// The mean of `-logp[label]` over the labels not equal to `ignore`.
fn nll_at(
    logp: &Tensor,
    labels: &Tensor,
    ignore: Option<i64>,
    op: &'static str,
    loc: Loc,
) -> Result<Tensor> {
    same_graph(logp.graph(), &[labels], op, loc)?;
    let classes = logp.dims().last().copied().unwrap_or(0);
    let fits = logp.rank() >= 1
        && logp.dtype().is_float()
        && labels.dtype().is_int()
        && labels.dims() == &logp.dims()[..logp.rank() - 1];
    if !fits {
        return Err(graph_error(
            op,
            format!(
                "takes float scores [..., classes] and integer labels [...] of the same leading \
                 shape, got {} and {}",
                logp.ty(),
                labels.ty()
            ),
            loc,
        ));
    }
    let picked = logp
        .mul(&labels.one_hot(classes, logp.dtype())?)?
        .sum(&[-1])?
        .neg()?;
    let counted = match ignore {
        Some(i) => labels.ne(i)?.convert(logp.dtype())?,
        None => labels.graph().full(1.0, logp.dtype(), labels.dims())?,
    };
    picked.mul(&counted)?.sum_all()?.div(&counted.sum_all()?)
}

/// Checks that a loss's two operands have one float type.
fn check_pair(a: &Tensor, b: &Tensor, op: &'static str, loc: Loc) -> Result<()> {
    same_graph(a.graph(), &[b], op, loc)?;
    if a.ty() != b.ty() || !a.dtype().is_float() {
        return Err(graph_error(
            op,
            format!(
                "takes two float values of one type, got {} and {}",
                a.ty(),
                b.ty()
            ),
            loc,
        ));
    }
    Ok(())
}
