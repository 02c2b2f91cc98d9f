//! Paged key/value caches (`SchedulerOptions::kv_tokens`): the slots' full-attention caches
//! in one pool of pages that holds less than every slot's context. A request is admitted when
//! its prompt and `max_tokens` fit beside the running ones, and each gives what offline
//! `generate` gives it alone (long prompts fed in pieces, copies of one prefill, a cached
//! prefix restored); choices that could never fit fail, naming the caches.

use crate::common;
use crate::families::{options, served, tokens};
use crate::prefix::greedy;
use crate::{alone, drain};

use std::collections::BTreeMap;

use stablegraph::serving::{Event, RequestId, Scheduler, SchedulerOptions, SlotModel};

/// [`options`] (three slots of 36 tokens: 64 cache columns, four pages of 16) with caches for
/// `kv_tokens` tokens in all.
fn paged(kv_tokens: usize) -> SchedulerOptions {
    SchedulerOptions {
        kv_tokens: Some(kv_tokens),
        ..options()
    }
}

/// Steps `s` until it is idle: each request's tokens, or its error, and the most requests
/// that ran at once.
fn run<M: SlotModel>(
    s: &mut Scheduler<M>,
) -> (BTreeMap<RequestId, Result<Vec<u32>, String>>, usize) {
    let (mut out, mut most) = (BTreeMap::new(), 0);
    for _ in 0..1000 {
        if !s.has_work() {
            return (out, most);
        }
        for e in s.step().unwrap() {
            match e {
                Event::Tokens { id, tokens, .. } => {
                    let got = out.entry(id).or_insert(Ok(Vec::new()));
                    got.as_mut().unwrap().extend(tokens);
                }
                Event::Failed { id, error } => {
                    out.insert(id, Err(error));
                }
                Event::Started { .. } | Event::Finished { .. } => {}
            }
        }
        most = most.max(s.stats().active);
    }
    panic!("the scheduler does not finish");
}

#[test]
fn requests_wait_for_pages_and_give_what_generate_gives_alone() {
    // Caches for 64 tokens (four pages) behind three slots of 64 columns: every request
    // below takes two or three pages (its prompt and max_tokens over 16 tokens), so at most
    // two run at once and the others wait; the 20- and 24-token prompts are fed in pieces.
    let asks = [(20, 12), (5, 12), (13, 12), (9, 10), (24, 12), (6, 12)];
    let dirs = ["llama", "gemma2"].map(common::hybrid::transformer);
    for dir in dirs.into_iter().chain([common::hybrid::fixture("bamba")]) {
        let (reference, name, mut s, compiled) = served(&dir, paged(64));
        let mut asked = Vec::new();
        for (i, &(len, max_tokens)) in asks.iter().enumerate() {
            let r = greedy(tokens(len, i), max_tokens);
            asked.push((s.submit(r.clone()).unwrap(), r));
        }
        let (got, most) = run(&mut s);
        assert_eq!(most, 2, "{name}: requests running at once");
        for (id, r) in &asked {
            let want = alone(reference.as_ref(), &r.prompt, r.max_tokens);
            assert_eq!(got[id], Ok(want), "{name}: request {id}");
        }
        assert_eq!(s.model().programs_compiled(), compiled, "{name}");
    }
}

#[test]
fn copies_of_a_prefill_and_a_cached_prefix_take_pages_of_their_own() {
    // A 16-token prefix kept after the first request; then one request and three choices of
    // another start from it (the choices copied from the first's slot), each in its own pages.
    let shared = |tail: usize| -> Vec<u32> {
        let mut p = tokens(16, 7);
        p.extend(tokens(tail, tail));
        p
    };
    for dir in [
        common::hybrid::transformer("llama"),
        common::hybrid::fixture("bamba"),
    ] {
        let o = SchedulerOptions {
            prefix_cache_bytes: 64 << 20,
            ..paged(160)
        };
        let (reference, name, mut s, compiled) = served(&dir, o);
        s.submit(greedy(shared(3), 5)).unwrap();
        drain(&mut s);
        let hit = greedy(shared(6), 7);
        let one = s.submit(hit.clone()).unwrap();
        let three = s.submit_n(hit.clone(), 3).unwrap();
        let (got, _) = run(&mut s);
        let want = alone(reference.as_ref(), &hit.prompt, 7);
        for id in std::iter::once(one).chain(three) {
            assert_eq!(got[&id], Ok(want.clone()), "{name}: request {id}");
        }
        assert_eq!(s.stats().prefix_hits, 2, "{name}");
        assert_eq!(s.model().programs_compiled(), compiled, "{name}");
    }
}

#[test]
fn choices_that_could_never_fit_the_pages_fail_naming_them() {
    let dir = common::hybrid::transformer("llama");
    let (_, name, mut s, _) = served(&dir, paged(64));
    // Three choices of two pages each (5 + 12 tokens) against four pages.
    let ids = s.submit_n(greedy(tokens(5, 1), 12), 3).unwrap();
    let after = s.submit(greedy(tokens(5, 2), 12)).unwrap();
    let (got, _) = run(&mut s);
    for id in ids {
        let error = got[&id].clone().unwrap_err();
        assert!(
            error.contains("3 choices of 17 tokens") && error.contains("caches of 64 tokens"),
            "{name}: {error}"
        );
    }
    assert_eq!(
        got[&after].as_ref().map(Vec::len),
        Ok(12),
        "{name}: the next one runs"
    );
}
