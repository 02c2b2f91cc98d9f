//! Gradients and fine-tuning for every family, written once: a family supplies its logits as a
//! graph of its weights (`Trainable`) and where each weight lives in its checkpoint; the
//! loss, its gradient under the checkpoint's names ([`Gradients`]), the optimizer step over one
//! device or several ([`FineTuner`]) and the checkpoint written back are this module's.

mod grads;
mod tuner;

pub use grads::Gradients;
pub use tuner::FineTuner;

pub(crate) use grads::{loss_and_grads, pack, to_checkpoint, Packed};

use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::engine::Family;
use crate::models::mamba2::Remat;
use crate::ops::Tensor;
use crate::tree::Tree;

/// The checkpoint tensors one weight is made of, joined along its first axis: each one's name
/// and its shape on disk (one piece for most weights; a fused matrix or stacked experts have
/// several).
pub(crate) type Pieces = Vec<(String, Vec<usize>)>;

/// What a family's training graph returns: the logits and the loss terms its config adds.
pub(crate) struct Forward {
    /// `[b, L, vocab]` f32.
    pub(crate) logits: Tensor,
    /// A router load-balancing loss and its coefficient, when the config asks for one (added
    /// to the cross-entropy times the coefficient, as transformers adds it).
    pub(crate) aux: Option<(Tensor, f64)>,
}

/// What a family supplies to be differentiated and trained.
pub(crate) trait Trainable: Family {
    /// The weights' names and types, in the order [`Family::weight_buffers`] gives them.
    fn weight_types(&self) -> Vec<(String, TensorType)>;
    /// Where each weight (in [`Trainable::weight_types`]' order) lives in the checkpoint.
    fn checkpoint_pieces(&self) -> Result<Vec<Pieces>>;
    /// The largest chunk the model's prefill takes (positions are padded to a multiple of it, or
    /// of the power of two above a shorter length); 1 for a model without chunks.
    fn chunk(&self) -> usize;
    /// The model over `tokens` (`[b, L]` i32, left-padded where `mask` (`[b, L]` f32) is 0)
    /// from a zero state, with `weights` (graph tensors of [`Trainable::weight_types`]) and the
    /// prefill's `chunk` (a divisor of `L`), each layer recomputed in the backward pass as
    /// `remat` says.
    fn training_forward(
        &self,
        weights: Vec<Tensor>,
        tokens: &Tensor,
        mask: &Tensor,
        chunk: usize,
        remat: Remat,
    ) -> Result<Forward>;
}

/// The names and types of a weights tree, in order (what [`Trainable::weight_types`] returns).
pub(crate) fn named_types(types: &impl Tree<TensorType>) -> Vec<(String, TensorType)> {
    let named = types.named();
    named.into_iter().map(|(n, t)| (n, t.clone())).collect()
}

/// The positions `longest` tokens are padded to for a model whose prefill takes chunks of up
/// to `chunk`, and the chunk used.
pub(crate) fn padding(chunk: usize, longest: usize) -> (usize, usize) {
    let chunk = chunk.max(1).min(longest.max(1).next_power_of_two());
    (longest.max(1).next_multiple_of(chunk), chunk)
}

/// The mean next-token cross-entropy, in nats, of `logits` (`[b, L, vocab]` f32) against
/// `targets` (`[b, L]` integers), each position weighing `weights` (`[b, L]` f32):
/// `sum(ce * weights) / sum(weights)`. The log-softmax is the stable one; the target's entry
/// is picked with a one-hot product.
pub(crate) fn next_token_loss(
    logits: &Tensor,
    targets: &Tensor,
    weights: &Tensor,
    vocab: usize,
) -> Result<Tensor> {
    let logp = logits.log_softmax(-1)?;
    let picked = logp.mul(&targets.one_hot(vocab, DType::F32)?)?.sum(&[-1])?;
    let total = picked.mul(weights)?.sum_all()?.neg()?;
    total.div(&weights.sum_all()?)
}

/// Transformers' router load-balancing loss (`load_balancing_loss_func`) over the router
/// logits of every mixture of experts (`[tokens, experts]` each), the tokens weighing `mask`
/// (`[tokens]` f32, 0 for padding): with `p = softmax(logits)` and `f` the share of tokens
/// whose top `top_k` of `p` hold each expert (per rank of the choice), `experts * sum(f *
/// mean(p))` over all layers' tokens together. The choice carries no gradient.
pub(crate) fn router_balance_loss(
    router_logits: &[Tensor],
    mask: &Tensor,
    experts: usize,
    top_k: usize,
) -> Result<Tensor> {
    let refs: Vec<&Tensor> = router_logits.iter().collect();
    let logits = Tensor::concat(&refs, 0)?; // [layers * T, E]
    let masks: Vec<&Tensor> = router_logits.iter().map(|_| mask).collect();
    let m = Tensor::concat(&masks, 0)?.expand_dims(-1)?; // [layers * T, 1]
    let count = m.sum_all()?;
    let p = logits.softmax(-1)?;
    let (_, chosen) = p.top_k(top_k)?; // [N, k]
    let hits = chosen.one_hot(experts, DType::F32)?; // [N, k, E]
    let share = hits.mul(&m.expand_dims(-1)?)?.sum(&[0])?.div(&count)?; // [k, E]
    let prob = p.mul(&m)?.sum(&[0])?.div(&count)?; // [E]
    share
        .mul(&prob.expand_dims(0)?)?
        .sum_all()?
        .mul(experts as f64)
}

/// An error naming `family` unless every weight is f32 (gradients and training need f32
/// weights).
pub(crate) fn check_f32(family: &str, types: &[(String, TensorType)]) -> Result<()> {
    match types.iter().find(|(_, t)| t.dtype != DType::F32) {
        Some((name, t)) => Err(Error::InvalidArgument(format!(
            "{family}: differentiating needs f32 weights, and {name} is {t} (load the model \
             with f32 matrices)"
        ))),
        None => Ok(()),
    }
}

/// An error naming `op` unless every token of `tokens` is below `vocab`; it names the first
/// bad id and its position.
pub(crate) fn check_tokens(
    op: &str,
    tokens: impl Iterator<Item = u32>,
    vocab: usize,
) -> Result<()> {
    for (k, t) in tokens.enumerate() {
        if t as usize >= vocab {
            return Err(Error::InvalidArgument(format!(
                "{op}: token id {t} (at position {k}) is outside the vocabulary of {vocab}"
            )));
        }
    }
    Ok(())
}
