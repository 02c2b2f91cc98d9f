//! Serving: the continuous-batching [`Scheduler`](stablegraph::serving::Scheduler) against
//! offline `generate` of each prompt alone, on the tiny Mamba-2 ([`scheduler`]) and for every
//! family through one face ([`families`]).

#[path = "../common/mod.rs"]
mod common;

mod extras;
mod families;
mod pages;
mod prefix;
mod scheduler;

use std::collections::BTreeMap;

use stablegraph::serving::{Event, FinishReason, RequestId, Scheduler, SlotModel};

/// Every request's tokens and finish reason, stepping until the scheduler is idle.
pub(crate) fn drain<M: SlotModel>(
    s: &mut Scheduler<M>,
) -> BTreeMap<RequestId, (Vec<u32>, Option<FinishReason>)> {
    let mut out: BTreeMap<RequestId, (Vec<u32>, Option<FinishReason>)> = BTreeMap::new();
    let mut steps = 0;
    while s.has_work() {
        steps += 1;
        assert!(steps < 1000, "the scheduler does not finish");
        for e in s.step().unwrap() {
            match e {
                Event::Started { id, .. } => {
                    out.entry(id).or_default();
                }
                Event::Tokens { id, tokens, .. } => out.entry(id).or_default().0.extend(tokens),
                Event::Finished { id, reason } => {
                    let entry = out.entry(id).or_default();
                    assert_eq!(entry.1, None, "request {id} finished twice");
                    entry.1 = Some(reason);
                }
                Event::Failed { id, error } => panic!("request {id} failed: {error}"),
            }
        }
    }
    out
}

/// The greedy tokens offline `generate` gives `prompt` alone, up to `max_tokens`.
pub(crate) fn alone(
    model: &dyn stablegraph::models::family::CausalLm,
    prompt: &[u32],
    max_tokens: usize,
) -> Vec<u32> {
    model
        .generate(&[prompt.to_vec()], &common::greedy(max_tokens))
        .unwrap()
        .remove(0)
}
