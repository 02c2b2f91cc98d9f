//! The candidates of a large vocabulary: the few blocks of tokens that can hold a small top-k.
//!
//! The vocabulary is cut into blocks of [`BLOCK`] tokens. A token at least as likely as the
//! k-th most likely lies in a block whose best token is too, so with `k <= TOP_K_MAX` the
//! [`TOP_K_MAX`] blocks with the best maxima hold every token top-k keeps, unless ties at the
//! cut spread over more blocks than that. [`pool`] gathers those blocks (in vocabulary order,
//! so the draw's order is the vocabulary's), and [`cover`] checks, with one count over the
//! vocabulary, that the pool holds every token at or above the top-k cut found in it: then the
//! cuts and the draw over the pool are the ones over the vocabulary (up to the rounding of sums
//! in another order), and [`super::sample`] runs them over the pool's `TOP_K_MAX * BLOCK`
//! entries instead of the whole vocabulary: each of their ~80 rounds reads 4,096 entries
//! instead of, say, 50,288.

use super::{order_keys, Pool, SampleSettings};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{SortOrder, Tensor};

/// The largest top-k that the pool serves; other settings (top-k off, or larger) sample over
/// the whole vocabulary.
pub(super) const TOP_K_MAX: usize = 64;

/// Tokens per block.
const BLOCK: usize = 64;

/// The smallest vocabulary worth a pool: below it the pool would hold a quarter of the
/// vocabulary or more.
const MIN_VOCAB: usize = 4 * TOP_K_MAX * BLOCK;

/// The [`TOP_K_MAX`] blocks of each row of `logits` `[batch, vocab]` with the largest keys
/// (after `settings`' temperatures), in vocabulary order, or `None` when the vocabulary is below
/// [`MIN_VOCAB`]. The last block may be short; the entries past the vocabulary's end are
/// `-inf`. Nothing of the vocabulary's size is written: the block maxima and the gather read
/// `logits` directly.
pub(super) fn pool(logits: &Tensor, settings: &SampleSettings) -> Result<Option<Pool>> {
    let g = logits.graph();
    let (batch, vocab) = (logits.dims()[0], logits.dims()[1]);
    if vocab < MIN_VOCAB {
        return Ok(None);
    }
    let keys = |part: &Tensor| order_keys(&settings.scaled(part)?);
    // The blocks' largest keys: the whole blocks, then the short one at the end, if any.
    let whole = vocab / BLOCK;
    let mut best = vec![keys(&logits.narrow(1, 0, whole * BLOCK)?)?
        .reshape(&[batch as isize, whole as isize, BLOCK as isize])?
        .max(&[2])?];
    if whole * BLOCK < vocab {
        let tail = logits.narrow(1, whole * BLOCK, vocab - whole * BLOCK)?;
        best.push(keys(&tail)?.max_keepdims(&[1])?);
    }
    let best = Tensor::concat(&best.iter().collect::<Vec<_>>(), 1)?;
    let (_, order) = best.sort_with_indices(1, SortOrder::Descending)?;
    let chosen = order
        .narrow(1, 0, TOP_K_MAX)?
        .sort(1, SortOrder::Ascending)?;
    let n = TOP_K_MAX * BLOCK;
    let within = g.iota(DType::I64, &[batch, TOP_K_MAX, BLOCK], 2)?;
    let tokens = chosen
        .mul(BLOCK as f64)?
        .expand_dims(2)?
        .add(&within)?
        .reshape(&[batch as isize, n as isize])?;
    // Gathered from the logits (indices past the end are clamped, then masked), scaled as the
    // whole vocabulary is, so that equal tokens have equal keys in both.
    let past = tokens.ge(vocab as f64)?;
    let x = settings.scaled(&logits.take_along_axis(&tokens, 1)?)?;
    let x = past.select(&g.scalar(f64::NEG_INFINITY, DType::F32)?, &x)?;
    Ok(Some(Pool {
        keys: order_keys(&x)?,
        x,
        tokens: Some(tokens),
    }))
}

/// Whether, in every row, top-k is on with `k <= TOP_K_MAX` (`k_on`) and `few` holds every
/// token of `logits` whose key is at least `k_cut` (the cut found in `few`): a rank-0 pred.
pub(super) fn cover(
    logits: &Tensor,
    settings: &SampleSettings,
    few: &Pool,
    k_cut: &Tensor,
    k_on: &Tensor,
) -> Result<Tensor> {
    let cut = k_cut.expand_dims(1)?;
    let count = |keys: &Tensor| keys.ge(&cut)?.astype(DType::I32)?.sum(&[1]);
    let held = count(&order_keys(&settings.scaled(logits)?)?)?.eq(&count(&few.keys)?)?;
    k_on.and(&held)?.astype(DType::I32)?.min(&[0])?.eq(1.0)
}
