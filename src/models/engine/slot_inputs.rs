//! The values the slot programs take and return besides the slots: a segment's controls, an
//! extras segment's penalties, history and bias, a mixed call's pieces, and the
//! log-probabilities an extras segment returns.

use super::host::host_input;
use super::programs::Named;
use super::{Family, SlotFamily, LOGPROB_TOP};
use crate::array::HostArray;
use crate::error::{Error, Result};
use crate::runtime::ShardedBuffer;
use crate::sampling::{PenaltySettings, SampleSettings, Sampling, TokenHistory};
use crate::serving::{check_segment, Extras, Piece, Segment, StepLogprobs};

/// Whether an active row of `segment` samples.
pub(super) fn sampled(segment: &Segment) -> bool {
    segment
        .active
        .iter()
        .zip(segment.sampling)
        .any(|(a, s)| *a && matches!(s, Sampling::Sample { .. }))
}

/// Checks a mixed call over `slots` slots (a one-step segment without extras; pieces of
/// distinct, idle slots, none empty, of one prompt bucket); returns the bucket.
pub(super) fn check_mixed<F: SlotFamily>(
    f: &F,
    pieces: &[Piece],
    segment: &Segment,
    slots: usize,
) -> Result<usize> {
    check_segment(segment, slots)?;
    let bad = |why: String| Err(Error::InvalidArgument(format!("run_mixed: {why}")));
    if segment.steps != 1 || segment.extras.is_some() {
        return bad("the segment must be of one step, without extras".into());
    }
    let Some(longest) = pieces.iter().map(|p| p.tokens.len()).max() else {
        return bad("no piece of prompt".into());
    };
    let bucket = f.slot_bucket(longest)?;
    for (k, p) in pieces.iter().enumerate() {
        if p.slot >= slots || segment.active[p.slot] {
            return bad(format!("piece {k}'s slot {} is not an idle slot", p.slot));
        }
        if pieces[..k].iter().any(|q| q.slot == p.slot) {
            return bad(format!("two pieces for slot {}", p.slot));
        }
        if p.tokens.is_empty() || f.slot_bucket(p.tokens.len())? != bucket {
            return bad(format!("piece {k} is empty or of another prompt bucket"));
        }
    }
    Ok(bucket)
}

/// The pieces of a mixed call as its inputs: `piece_tokens` and `piece_mask` left-padded to
/// `bucket`, `piece_rows` and `piece_fresh`.
pub(super) fn piece_inputs(pieces: &[Piece], bucket: usize) -> Result<Vec<Named>> {
    let g = pieces.len();
    let (mut tokens, mut mask) = (vec![0i32; g * bucket], vec![0f32; g * bucket]);
    for (r, p) in pieces.iter().enumerate() {
        let start = r * bucket + bucket - p.tokens.len();
        for (j, &t) in p.tokens.iter().enumerate() {
            // Fits an i32: the scheduler checked every token against the vocabulary.
            tokens[start + j] = t as i32;
            mask[start + j] = 1.0;
        }
    }
    // Fits an i32: slot indices are below the slots' count.
    let at: Vec<i32> = pieces.iter().map(|p| p.slot as i32).collect();
    let fresh: Vec<bool> = pieces.iter().map(|p| p.fresh).collect();
    Ok(vec![
        host_input("piece_tokens", HostArray::from_vec(&[g, bucket], tokens)?),
        host_input("piece_mask", HostArray::from_vec(&[g, bucket], mask)?),
        host_input("piece_rows", HostArray::from_vec(&[g], at)?),
        host_input("piece_fresh", HostArray::from_vec(&[g], fresh)?),
    ])
}

/// The inputs of a slot segment besides the slots, by name, for the slots `rows` (all slots,
/// or the `subset` of them the program decodes): `rows` (with a subset), `done`, `key`,
/// `max_steps`, `eos`, and when sampling the [`SampleSettings`].
pub(super) fn segment_controls<F: Family>(
    f: &F,
    segment: &Segment,
    rows: &[usize],
    subset: Option<usize>,
    sample: bool,
) -> Result<Vec<Named>> {
    let b = rows.len();
    let mut inputs = Vec::new();
    if let Some(m) = subset {
        // Fits an i32: slot indices are below the slots' count.
        let index: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        inputs.push(host_input("rows", HostArray::from_vec(&[m], index)?));
    }
    let done: Vec<bool> = rows.iter().map(|&r| !segment.active[r]).collect();
    let keys: Vec<u32> = rows.iter().flat_map(|&r| segment.keys[r]).collect();
    inputs.push(host_input("done", HostArray::from_vec(&[b], done)?));
    inputs.push(host_input("key", HostArray::from_vec(&[b, 2], keys)?));
    // Both fit an i32: steps <= capacity <= MAX_NEW_TOKENS, eos < vocab (checked).
    let max_steps = HostArray::scalar(segment.steps as i32);
    inputs.push(host_input("max_steps", max_steps));
    let eos = HostArray::scalar(segment.eos.map_or(-1, |e| e as i32));
    inputs.push(host_input("eos", eos));
    if sample {
        let sampling: Vec<Sampling> = rows.iter().map(|&r| segment.sampling[r]).collect();
        let values = SampleSettings::row_host_values(&sampling, f.vocab_size())?;
        let names = ["temperature", "top_k", "top_p"];
        inputs.extend(names.into_iter().zip(values).map(|(n, a)| host_input(n, a)));
    }
    Ok(inputs)
}

/// The inputs of an extras segment (every slot): the penalty settings, the penalty history of
/// `width` positions (each slot's context left-padded to `context`), and the dense logit bias.
pub(super) fn extras_inputs(
    vocab: usize,
    x: &Extras,
    context: usize,
    width: usize,
) -> Result<Vec<Named>> {
    let mut inputs: Vec<Named> = PenaltySettings::row_host_values(x.penalties)?
        .into_iter()
        .map(|(n, a)| host_input(n, a))
        .collect();
    let contexts: Vec<Vec<u32>> = x
        .context
        .iter()
        .map(|c| c[c.len().saturating_sub(context)..].to_vec())
        .collect();
    let history = TokenHistory::host_values(&contexts, context, width)?;
    inputs.extend(history.into_iter().map(|(n, a)| host_input(n, a)));
    let mut bias = vec![0f32; x.bias.len() * vocab];
    for (r, row) in x.bias.iter().enumerate() {
        for &(t, b) in row {
            if let Some(slot) = bias
                .get_mut(r * vocab + t as usize)
                .filter(|_| (t as usize) < vocab)
            {
                *slot += b;
            }
        }
    }
    let rows = x.bias.len();
    inputs.push(host_input(
        "logit_bias",
        HostArray::from_vec(&[rows, vocab], bias)?,
    ));
    Ok(inputs)
}

/// Each active slot's log-probabilities of its `segment.steps` steps, from the extras
/// program's outputs (chosen `[n, cap]`, top values and ids `[n, cap, LOGPROB_TOP]`).
pub(super) fn read_logprobs(
    outs: &[ShardedBuffer],
    segment: &Segment,
) -> Result<Vec<Vec<StepLogprobs>>> {
    let [chosen, top, ids] = outs else {
        return Err(Error::InvalidArgument(
            "an extras segment returned no log-probabilities".into(),
        ));
    };
    let (chosen, top, ids) = (
        chosen.to_vec::<f32>()?,
        top.to_vec::<f32>()?,
        ids.to_vec::<i32>()?,
    );
    let (cap, k) = (segment.capacity, LOGPROB_TOP);
    let rows = segment.active.len();
    Ok((0..rows)
        .map(|r| {
            if !segment.active[r] {
                return Vec::new();
            }
            (0..segment.steps)
                .map(|s| {
                    let at = (r * cap + s) * k;
                    let top = (0..k).map(|j| (ids[at + j] as u32, top[at + j])).collect();
                    StepLogprobs {
                        logprob: chosen[r * cap + s],
                        top,
                    }
                })
                .collect()
        })
        .collect())
}
