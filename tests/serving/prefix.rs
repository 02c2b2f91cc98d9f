//! The prefix state cache and `n` choices on the tiny Mamba-2: a prompt that starts with a
//! cached prefix prefills only the rest and gives the tokens of a whole prefill (greedy, and
//! seeded as without the cache); the least recently used states go first within the budget;
//! `n` choices start from copies of one prefilled prompt: greedy ones are the prompt's greedy
//! tokens, seeded ones differ from each other and repeat; a first choice cancelled before its
//! prompt is in leaves the others to finish on their own.

use stablegraph::models::mamba2::Sampling;
use stablegraph::serving::{Event, Request, RequestId, Scheduler, SchedulerOptions, SlotModel};
use stablegraph::DType;

use crate::alone;
use crate::common::tiny_model;

/// A 16-token prefix (two pieces of 8) and a tail of `tail` tokens that `i` varies.
fn shared(i: usize, tail: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..16).map(|j| ((j * 11 + 3) % 64) as u32).collect();
    p.extend((0..tail).map(|j| ((i * 17 + j * 7 + 1) % 64) as u32));
    p
}

fn options(cache: usize) -> SchedulerOptions {
    SchedulerOptions {
        slots: 4,
        segment: 3,
        max_queue: 64,
        prefill_batch: 2,
        prompt_piece: 8,
        max_prompt: 32,
        max_tokens: 16,
        eos: None,
        max_context: None,
        prefix_cache_bytes: cache,
        mixed: false,
        kv_tokens: None,
    }
}

/// A greedy request for `prompt` and `max_tokens`.
pub(crate) fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        prompt,
        max_tokens,
        sampling: Sampling::Greedy,
        ..Default::default()
    }
}

fn seeded(prompt: Vec<u32>, seed: u64) -> Request {
    Request {
        prompt,
        max_tokens: 9,
        sampling: Sampling::Sample {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed,
        },
        ..Default::default()
    }
}

/// Steps until idle; each request's tokens, and the cached tokens each started with.
fn run<M: SlotModel>(s: &mut Scheduler<M>) -> Vec<(RequestId, Vec<u32>, usize)> {
    let mut out: std::collections::BTreeMap<RequestId, (Vec<u32>, usize)> = Default::default();
    while s.has_work() {
        for e in s.step().unwrap() {
            match e {
                Event::Started { id, cached } => out.entry(id).or_default().1 = cached,
                Event::Tokens { id, tokens, .. } => out.entry(id).or_default().0.extend(tokens),
                Event::Failed { id, error } => panic!("request {id} failed: {error}"),
                Event::Finished { .. } => {}
            }
        }
    }
    out.into_iter().map(|(id, (t, c))| (id, t, c)).collect()
}

#[test]
fn a_cached_prefix_gives_the_tokens_of_a_whole_prefill() {
    let reference = tiny_model(DType::F32);
    let mut s = Scheduler::new(tiny_model(DType::F32), options(64 << 20)).unwrap();
    s.warm_up().unwrap();
    let compiled = s.model().programs_compiled();
    s.submit(greedy(shared(0, 5), 6)).unwrap();
    let first = run(&mut s);
    assert_eq!(first[0].2, 0, "nothing cached yet");
    // Two states kept: after 8 and after 16 tokens.
    assert_eq!(s.stats().prefix_entries, 2);
    let before = s.stats().prompt_tokens;
    let asked: Vec<Request> = (1..5).map(|i| greedy(shared(i, 3 + i), 5 + i)).collect();
    for r in &asked {
        s.submit(r.clone()).unwrap();
    }
    let got = run(&mut s);
    for (r, (_, tokens, cached)) in asked.iter().zip(&got) {
        assert_eq!(*tokens, alone(&reference, &r.prompt, r.max_tokens));
        assert_eq!(*cached, 16);
    }
    let stats = s.stats();
    let tails: usize = asked.iter().map(|r| r.prompt.len() - 16).sum();
    assert_eq!(
        stats.prompt_tokens - before,
        tails as u64,
        "only the tails prefilled"
    );
    assert_eq!((stats.prefix_hits, stats.cached_tokens), (4, 64));
    assert_eq!(stats.prefix_misses, 1);
    assert_eq!(
        s.model().programs_compiled(),
        compiled,
        "compiled after the warm-up"
    );
    // A sampled request draws the same with the cache and without it.
    let mut plain = Scheduler::new(tiny_model(DType::F32), options(0)).unwrap();
    plain.submit(seeded(shared(7, 4), 42)).unwrap();
    s.submit(seeded(shared(7, 4), 42)).unwrap();
    let (without, with) = (run(&mut plain), run(&mut s));
    assert_eq!(with[0].2, 16);
    assert_eq!(with[0].1, without[0].1);
    assert_eq!(plain.stats().prefix_hits, 0);
}

#[test]
fn the_least_recently_used_state_is_evicted_within_the_budget() {
    let mut s = Scheduler::new(tiny_model(DType::F32), options(1)).unwrap();
    s.submit(greedy(shared(0, 2), 2)).unwrap();
    run(&mut s);
    // A budget of one byte holds no state.
    assert_eq!(s.stats().prefix_entries, 0);
    let probe = Scheduler::new(tiny_model(DType::F32), options(64 << 20));
    let mut probe = probe.unwrap();
    probe.submit(greedy(shared(0, 2), 2)).unwrap();
    run(&mut probe);
    let one = probe.stats().prefix_bytes / 2;
    // Room for three states: the third prompt's two evict the first prompt's older ones.
    let mut s = Scheduler::new(tiny_model(DType::F32), options(3 * one)).unwrap();
    for first in [1u32, 2] {
        let mut p = shared(0, 3);
        p[0] = first;
        s.submit(greedy(p, 2)).unwrap();
        run(&mut s);
    }
    let stats = s.stats();
    assert_eq!((stats.prefix_entries, stats.prefix_evictions), (3, 1));
    assert_eq!(stats.prefix_bytes, 3 * one);
}

#[test]
fn n_choices_start_from_one_prefill() {
    let reference = tiny_model(DType::F32);
    let mut s = Scheduler::new(tiny_model(DType::F32), options(0)).unwrap();
    let p = shared(3, 6);
    let ids = s.submit_n(greedy(p.clone(), 7), 3).unwrap();
    assert_eq!(ids.len(), 3);
    let got = run(&mut s);
    let want = alone(&reference, &p, 7);
    for (_, tokens, _) in &got {
        assert_eq!(*tokens, want);
    }
    assert_eq!(s.stats().prompt_tokens, p.len() as u64, "one prefill");
    // The later choices started from the first's state: all of the prompt was copied.
    let copied: Vec<usize> = got.iter().map(|g| g.2).collect();
    assert_eq!(copied, [0, p.len(), p.len()]);
    // Sampled: the choices differ, the first draws as the request alone, and all repeat.
    let choices = |s: &mut Scheduler<_>| {
        s.submit_n(seeded(p.clone(), 5), 4).unwrap();
        run(s).into_iter().map(|g| g.1).collect::<Vec<_>>()
    };
    let a = choices(&mut s);
    let b = choices(&mut s);
    assert_eq!(a, b);
    for i in 0..4 {
        for j in i + 1..4 {
            assert_ne!(a[i], a[j], "choices {i} and {j}");
        }
    }
    s.submit(seeded(p.clone(), 5)).unwrap();
    assert_eq!(run(&mut s)[0].1, a[0]);
    // More choices than slots: refused, naming n.
    let e = s.submit_n(greedy(p, 2), 5).unwrap_err().to_string();
    assert!(e.contains("n (5)"), "{e}");
}

#[test]
fn cancelling_the_first_choice_early_leaves_the_others_to_finish() {
    let reference = tiny_model(DType::F32);
    // Prompts in pieces of 8: the first choice's prompt takes three steps to go in.
    let mut s = Scheduler::new(tiny_model(DType::F32), options(0)).unwrap();
    let p = shared(5, 7);
    let ids = s.submit_n(greedy(p.clone(), 6), 3).unwrap();
    s.step().unwrap();
    assert!(s.cancel(ids[0]));
    let got = run(&mut s);
    let want = alone(&reference, &p, 6);
    let ids_left: Vec<RequestId> = got.iter().map(|g| g.0).collect();
    assert_eq!(ids_left, ids[1..]);
    for (_, tokens, _) in &got {
        assert_eq!(*tokens, want);
    }
    assert_eq!(s.stats().active, 0);
}
