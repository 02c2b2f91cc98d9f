//! The scheduler on the tiny Mamba-2: requests that join and leave a running batch give what
//! offline `generate` gives each prompt alone; a seeded request samples the same tokens alone
//! and under load; eos, cancelling, the queue limit and bad requests.

use std::collections::BTreeMap;

use stablegraph::models::mamba2::Sampling;
use stablegraph::models::GenerateOptions;
use stablegraph::serving::{
    Event, FinishReason, Request, Scheduler, SchedulerOptions, SlotModel, SubmitError,
};
use stablegraph::DType;

use crate::common::tiny_model;
use crate::{alone, drain};

/// Prompt `i` of a workload: lengths 1 to 23, tokens in the tiny vocabulary of 64.
fn prompt(i: usize) -> Vec<u32> {
    (0..1 + (i * 7) % 23)
        .map(|j| ((i * 13 + j * 5) % 64) as u32)
        .collect()
}

fn options(slots: usize, segment: usize) -> SchedulerOptions {
    SchedulerOptions {
        slots,
        segment,
        max_queue: 64,
        prefill_batch: 4,
        prompt_piece: 128,
        max_prompt: 64,
        max_tokens: 64,
        eos: None,
        max_context: None,
        prefix_cache_bytes: 0,
        mixed: false,
        kv_tokens: None,
    }
}

#[test]
fn greedy_requests_joining_and_leaving_equal_generate_alone() {
    let reference = tiny_model(DType::F32);
    // Prompts of up to 23 tokens fed in pieces of up to 8, the longer ones over three steps.
    let o = SchedulerOptions {
        max_prompt: 24,
        prompt_piece: 8,
        ..options(4, 5)
    };
    let mut s = Scheduler::new(tiny_model(DType::F32), o).unwrap();
    // One prompt bucket (8: the tiny model's SSD chunk) times prefill groups of 1, 2 and 4.
    assert_eq!(s.warm_up().unwrap(), 3);
    let compiled = s.model().programs_compiled();
    let mut asked = BTreeMap::new();
    for i in 0..11 {
        let r = Request {
            prompt: prompt(i),
            max_tokens: 3 + (i * 5) % 15,
            sampling: Sampling::Greedy,
            ..Default::default()
        };
        asked.insert(s.submit(r.clone()).unwrap(), r);
    }
    let got = drain(&mut s);
    assert_eq!(got.len(), asked.len());
    for (id, r) in &asked {
        let want = alone(&reference, &r.prompt, r.max_tokens);
        assert_eq!(got[id].0, want, "request {id} (prompt {:?})", r.prompt);
        assert_eq!(got[id].1, Some(FinishReason::Length));
    }
    let stats = s.stats();
    assert_eq!((stats.queued, stats.active), (0, 0));
    let made: usize = asked.values().map(|r| r.max_tokens).sum();
    assert_eq!(stats.generated_tokens, made as u64);
    // After the warm-up, the workload compiled nothing.
    assert_eq!(s.model().programs_compiled(), compiled);
}

/// Prefill riding with decode (one call: a group of prompt pieces and one step of the rows
/// decoding) gives the tokens that alternating prefill and segments gives, greedy and seeded,
/// for prompts fed in one piece and in several, with the prefix cache on.
#[test]
fn prefill_riding_with_decode_gives_the_tokens_of_alternation() {
    let run = |mixed: bool| {
        let o = SchedulerOptions {
            max_prompt: 24,
            prompt_piece: 8,
            prefix_cache_bytes: 1 << 20,
            mixed,
            ..options(4, 3)
        };
        let mut s = Scheduler::new(tiny_model(DType::F32), o).unwrap();
        s.warm_up().unwrap();
        let compiled = s.model().programs_compiled();
        let mut out = BTreeMap::new();
        // Requests arrive while others decode, so that pieces meet decoding rows.
        for wave in 0..3 {
            for i in 0..4 {
                let k = wave * 4 + i;
                let sampling = match k % 3 {
                    0 => Sampling::Greedy,
                    _ => Sampling::Sample {
                        temperature: 0.9,
                        top_k: 0,
                        top_p: 1.0,
                        seed: k as u64,
                    },
                };
                let r = Request {
                    prompt: prompt(k + 1),
                    max_tokens: 4 + k % 6,
                    sampling,
                    ..Default::default()
                };
                s.submit(r).unwrap();
            }
            for e in s.step().unwrap() {
                if let Event::Tokens { id, tokens, .. } = e {
                    out.entry(id).or_insert_with(Vec::new).extend(tokens);
                }
            }
        }
        for (id, (tokens, reason)) in drain(&mut s) {
            assert_eq!(reason, Some(FinishReason::Length), "request {id}");
            out.entry(id).or_insert_with(Vec::new).extend(tokens);
        }
        assert_eq!(s.model().programs_compiled(), compiled);
        (out, s.stats())
    };
    let (mixed, with) = run(true);
    let (alternating, without) = run(false);
    assert_eq!(mixed.len(), 12);
    assert_eq!(mixed, alternating);
    assert!(with.mixed > 0, "no call mixed prefill with decode");
    assert_eq!(without.mixed, 0);
    // Mixed calls are both: fewer calls for the same work.
    assert!(with.segments + with.prefills - with.mixed < without.segments + without.prefills);
}

#[test]
fn a_seeded_request_samples_the_same_alone_and_under_load() {
    let seeded = Request {
        prompt: prompt(3),
        max_tokens: 19,
        sampling: Sampling::Sample {
            temperature: 0.9,
            top_k: 20,
            top_p: 0.95,
            seed: 1234,
        },
        ..Default::default()
    };
    let mut s = Scheduler::new(tiny_model(DType::F32), options(4, 4)).unwrap();
    let id = s.submit(seeded.clone()).unwrap();
    let lonely = drain(&mut s).remove(&id).unwrap().0;
    assert_eq!(lonely.len(), 19);
    // What offline `generate` samples for the prompt alone with the same seed and settings.
    let offline = GenerateOptions {
        max_new_tokens: 19,
        sampling: seeded.sampling,
        ..GenerateOptions::default()
    };
    let want = tiny_model(DType::F32)
        .generate(std::slice::from_ref(&seeded.prompt), &offline)
        .unwrap()
        .remove(0);
    assert_eq!(lonely, want, "served seeded != offline generate");
    // Under load: other sampled and greedy requests before and after it, in other slots.
    for i in 0..3 {
        let sampling = Sampling::Sample {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: i as u64,
        };
        let max_tokens = 5 + i * 4;
        s.submit(Request {
            prompt: prompt(i),
            max_tokens,
            sampling,
            ..Default::default()
        })
        .unwrap();
    }
    let id = s.submit(seeded.clone()).unwrap();
    for i in 5..8 {
        let r = Request {
            prompt: prompt(i),
            max_tokens: 7,
            sampling: Sampling::Greedy,
            ..Default::default()
        };
        s.submit(r).unwrap();
    }
    let loaded = drain(&mut s).remove(&id).unwrap().0;
    assert_eq!(loaded, lonely);
    // Another seed gives other tokens (the seed is used).
    let other = Request {
        sampling: Sampling::Sample {
            temperature: 0.9,
            top_k: 20,
            top_p: 0.95,
            seed: 99,
        },
        ..seeded
    };
    let id = s.submit(other).unwrap();
    assert_ne!(drain(&mut s).remove(&id).unwrap().0, lonely);
}

#[test]
fn eos_ends_a_request_without_being_returned() {
    let reference = tiny_model(DType::F32);
    let p = prompt(4);
    let free = alone(&reference, &p, 12);
    let eos = free[5];
    let cut = free.iter().position(|&t| t == eos).unwrap();
    let mut s = Scheduler::new(
        tiny_model(DType::F32),
        SchedulerOptions {
            eos: Some(eos),
            ..options(2, 3)
        },
    )
    .unwrap();
    let id = s
        .submit(Request {
            prompt: p,
            max_tokens: 12,
            sampling: Sampling::Greedy,
            ..Default::default()
        })
        .unwrap();
    let (tokens, reason) = drain(&mut s).remove(&id).unwrap();
    assert_eq!(tokens, free[..cut]);
    assert_eq!(reason, Some(FinishReason::Eos));
}

#[test]
fn a_cancelled_request_frees_its_slot_for_the_next() {
    let reference = tiny_model(DType::F32);
    let mut s = Scheduler::new(tiny_model(DType::F32), options(1, 2)).unwrap();
    let long = Request {
        prompt: prompt(1),
        max_tokens: 40,
        sampling: Sampling::Greedy,
        ..Default::default()
    };
    let first = s.submit(long).unwrap();
    let next = Request {
        prompt: prompt(2),
        max_tokens: 6,
        sampling: Sampling::Greedy,
        ..Default::default()
    };
    let second = s.submit(next.clone()).unwrap();
    let events = s.step().unwrap();
    assert!(events.contains(&Event::Started {
        id: first,
        cached: 0
    }));
    assert!(
        !events.contains(&Event::Started {
            id: second,
            cached: 0
        }),
        "one slot only"
    );
    assert!(s.cancel(first));
    assert!(!s.cancel(first), "cancelled twice");
    let got = drain(&mut s);
    assert!(!got.contains_key(&first), "no events after cancelling");
    let want = alone(&reference, &next.prompt, 6);
    assert_eq!(got[&second].0, want);
    // A queued request can be cancelled too.
    let third = s.submit(next.clone()).unwrap();
    assert!(s.cancel(third));
    assert!(!s.has_work());
}

#[test]
fn a_full_queue_and_bad_requests_are_refused_with_the_reason() {
    let mut s = Scheduler::new(
        tiny_model(DType::F32),
        SchedulerOptions {
            max_queue: 2,
            ..options(2, 4)
        },
    )
    .unwrap();
    let ok = Request {
        prompt: vec![1, 2],
        max_tokens: 4,
        sampling: Sampling::Greedy,
        ..Default::default()
    };
    let bad = |change: &dyn Fn(&mut Request)| {
        let mut r = ok.clone();
        change(&mut r);
        r
    };
    let cases: Vec<(Request, &str)> = vec![
        (bad(&|r| r.prompt.clear()), "prompt is empty"),
        (
            bad(&|r| r.prompt = vec![1, 64]),
            "token 64 is outside the vocabulary",
        ),
        (
            bad(&|r| r.prompt = vec![1; 65]),
            "the most this server takes is 64",
        ),
        (bad(&|r| r.max_tokens = 0), "max_tokens (0)"),
        (bad(&|r| r.max_tokens = 65), "max_tokens (65)"),
        (
            bad(&|r| {
                r.sampling = Sampling::Sample {
                    temperature: f32::NAN,
                    top_k: 0,
                    top_p: 1.0,
                    seed: 0,
                }
            }),
            "temperature",
        ),
        (
            bad(&|r| {
                r.sampling = Sampling::Sample {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.5,
                    seed: 0,
                }
            }),
            "top_p",
        ),
    ];
    for (r, want) in cases {
        match s.submit(r) {
            Err(SubmitError::Invalid { message: why, .. }) => {
                assert!(why.contains(want), "{why:?} lacks {want:?}")
            }
            other => panic!("expected a refusal naming {want:?}, got {other:?}"),
        }
    }
    s.submit(ok.clone()).unwrap();
    s.submit(ok.clone()).unwrap();
    assert_eq!(s.submit(ok.clone()), Err(SubmitError::QueueFull));
    drain(&mut s);
    s.submit(ok).unwrap();
}

#[test]
fn bad_options_are_an_error() {
    for (o, want) in [
        (
            SchedulerOptions {
                slots: 0,
                ..options(2, 4)
            },
            "slots is 0",
        ),
        (
            SchedulerOptions {
                segment: 0,
                ..options(2, 4)
            },
            "segment is 0",
        ),
        (
            SchedulerOptions {
                eos: Some(64),
                ..options(2, 4)
            },
            "eos (64)",
        ),
    ] {
        let e = Scheduler::new(tiny_model(DType::F32), o)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
}
