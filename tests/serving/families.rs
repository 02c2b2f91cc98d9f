//! Every family served through one face (`Box<dyn CausalLm>` as the scheduler's model):
//! greedy requests joining and leaving a running batch, long prompts fed in pieces, give what
//! offline `generate` gives each prompt alone; a seeded request samples the same tokens alone,
//! under load, and as offline `generate` samples its prompt alone with that seed; after the
//! warm-up nothing compiles;
//! a prompt that starts with a cached prefix, and `n` choices copied from one prefill, give
//! the same tokens; a request beyond the context is refused, naming the limit.

use crate::common;
use crate::{alone, drain};

use common::client;
use std::path::Path;

use stablegraph::models::family::{self, CausalLm};
use stablegraph::models::{GenerateOptions, Sampling};
use stablegraph::serving::{
    FinishReason, Request, Scheduler, SchedulerOptions, SlotModel, SubmitError,
};
use stablegraph::DType;

/// Prompt `i`: 1 to 23 tokens of the fixtures' vocabulary.
fn prompt(i: usize) -> Vec<u32> {
    (0..1 + (i * 7) % 23)
        .map(|j| (3 + (i * 13 + j * 5) % 90) as u32)
        .collect()
}

/// A prompt of `len` tokens of the fixtures' vocabulary, varied by `seed`.
pub(crate) fn tokens(len: usize, seed: usize) -> Vec<u32> {
    (0..len)
        .map(|j| (3 + (seed * 13 + j * 5) % 90) as u32)
        .collect()
}

/// Three slots, prompts of up to 23 tokens fed in pieces of up to 8, no prefix cache.
pub(crate) fn options() -> SchedulerOptions {
    SchedulerOptions {
        slots: 3,
        segment: 4,
        max_queue: 64,
        prefill_batch: 2,
        prompt_piece: 8,
        max_prompt: 24,
        max_tokens: 12,
        eos: None,
        max_context: None,
        prefix_cache_bytes: 0,
        mixed: false,
        kv_tokens: None,
    }
}

/// What [`served`] returns.
pub(crate) type Served = (
    Box<dyn CausalLm>,
    String,
    Scheduler<Box<dyn CausalLm>>,
    usize,
);

/// The checkpoint in `dir` loaded twice: a reference for offline `generate`, and the model of
/// a warmed-up scheduler with options `o`; with a name for messages and the programs the
/// warm-up compiled.
pub(crate) fn served(dir: &Path, o: SchedulerOptions) -> Served {
    let reference = family::load(&client(), dir, DType::F32).unwrap();
    let name = format!("{} ({})", dir.display(), reference.family());
    let model = family::load(&client(), dir, DType::F32).unwrap();
    let mut s = Scheduler::new(model, o).unwrap();
    s.warm_up().unwrap();
    let compiled = s.model().programs_compiled();
    (reference, name, s, compiled)
}

/// Submits a greedy request of each `(prompt, max_tokens)` to `s`, runs them all, and checks
/// that each gives the tokens `reference` generates for its prompt alone, ending at its length.
fn greedy_as_alone(
    reference: &dyn CausalLm,
    name: &str,
    s: &mut Scheduler<Box<dyn CausalLm>>,
    asks: Vec<(Vec<u32>, usize)>,
) {
    let mut asked = Vec::new();
    for (prompt, max_tokens) in asks {
        let r = Request {
            prompt,
            max_tokens,
            sampling: Sampling::Greedy,
            ..Default::default()
        };
        asked.push((s.submit(r.clone()).unwrap(), r));
    }
    let got = drain(s);
    for (id, r) in &asked {
        let want = alone(reference, &r.prompt, r.max_tokens);
        assert_eq!(
            got[id].0, want,
            "{name}: request {id} (prompt {:?})",
            r.prompt
        );
        assert_eq!(got[id].1, Some(FinishReason::Length), "{name}");
    }
}

/// Serves the checkpoint in `dir` with options `o` a greedy request of each `(prompt length,
/// max_tokens)` ([`tokens`], seeded by its place), checking each against generate alone
/// ([`greedy_as_alone`]) and that nothing compiled after the warm-up.
fn lengths_as_alone(dir: &Path, o: SchedulerOptions, asks: &[(usize, usize)]) {
    let (reference, name, mut s, compiled) = served(dir, o);
    let asks = asks
        .iter()
        .enumerate()
        .map(|(i, &(len, max_tokens))| (tokens(len, i), max_tokens))
        .collect();
    greedy_as_alone(reference.as_ref(), &name, &mut s, asks);
    assert_eq!(
        s.model().programs_compiled(),
        compiled,
        "{name}: the workload compiled after the warm-up"
    );
}

#[test]
fn every_family_serves_what_generate_gives_alone() {
    for dir in common::one_fixture_per_family() {
        let (reference, name, mut s, compiled) = served(&dir, options());
        let asks = (0..7).map(|i| (prompt(i), 3 + (i * 5) % 10)).collect();
        greedy_as_alone(reference.as_ref(), &name, &mut s, asks);
        assert_eq!(
            s.model().programs_compiled(),
            compiled,
            "{name}: the workload compiled after the warm-up"
        );
        // A seeded request: the same draw alone and among others.
        let sampling = Sampling::Sample {
            temperature: 0.9,
            top_k: 20,
            top_p: 0.95,
            seed: 1234,
        };
        let seeded = Request {
            prompt: prompt(3),
            max_tokens: 11,
            sampling,
            ..Default::default()
        };
        let id = s.submit(seeded.clone()).unwrap();
        let want = drain(&mut s).remove(&id).unwrap().0;
        assert_eq!(want.len(), 11, "{name}");
        let offline = GenerateOptions {
            max_new_tokens: 11,
            sampling,
            ..GenerateOptions::default()
        };
        let offline = reference.generate(std::slice::from_ref(&seeded.prompt), &offline);
        assert_eq!(offline.unwrap()[0], want, "{name}: seeded, offline");
        for i in 0..2 {
            let r = Request {
                prompt: prompt(i + 8),
                max_tokens: 4 + i,
                sampling: Sampling::Sample {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    seed: i as u64,
                },
                ..Default::default()
            };
            s.submit(r).unwrap();
        }
        let id = s.submit(seeded).unwrap();
        assert_eq!(drain(&mut s)[&id].0, want, "{name}: seeded, under load");
    }
}

#[test]
fn a_request_beyond_the_context_is_refused_naming_it() {
    let dir = common::hybrid::fixture("bamba");
    let model = family::load(&client(), &dir, DType::F32).unwrap();
    let o = SchedulerOptions {
        max_context: Some(20),
        ..options()
    };
    let mut s = Scheduler::new(model, o).unwrap();
    let r = |len: usize, max_tokens: usize| Request {
        prompt: vec![5; len],
        max_tokens,
        sampling: Sampling::Greedy,
        ..Default::default()
    };
    match s.submit(r(15, 10)) {
        Err(SubmitError::Invalid { message: why, .. }) => assert!(
            why.contains("25 tokens of context") && why.contains("context is 20 tokens"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    let id = s.submit(r(15, 5)).unwrap();
    let got = drain(&mut s);
    assert_eq!(got[&id].0.len(), 5);
}

#[test]
fn every_family_reuses_a_cached_prefix_and_copies_n_choices() {
    // A 16-token prefix (two pieces of 8) with different tails.
    let shared = |tail: usize| -> Vec<u32> {
        let mut p: Vec<u32> = (0..16).map(|j| (3 + (j * 11) % 90) as u32).collect();
        p.extend((0..tail).map(|j| (5 + (tail * 13 + j * 7) % 90) as u32));
        p
    };
    for dir in common::one_fixture_per_family() {
        let o = SchedulerOptions {
            prefix_cache_bytes: 64 << 20,
            ..options()
        };
        let (reference, name, mut s, compiled) = served(&dir, o);
        let first = Request {
            prompt: shared(3),
            max_tokens: 5,
            sampling: Sampling::Greedy,
            ..Default::default()
        };
        s.submit(first).unwrap();
        drain(&mut s);
        let hit = Request {
            prompt: shared(6),
            max_tokens: 7,
            sampling: Sampling::Greedy,
            ..Default::default()
        };
        let one = s.submit(hit.clone()).unwrap();
        let three = s.submit_n(hit.clone(), 3).unwrap();
        let got = drain(&mut s);
        let want = alone(reference.as_ref(), &hit.prompt, 7);
        for id in std::iter::once(one).chain(three) {
            assert_eq!(got[&id].0, want, "{name}: request {id}");
        }
        let stats = s.stats();
        assert_eq!(stats.prefix_hits, 2, "{name}");
        assert_eq!(stats.cached_tokens, 32, "{name}");
        assert_eq!(s.model().programs_compiled(), compiled, "{name}");
    }
}

#[test]
fn a_request_filling_the_context_fits_its_slot_with_the_last_piece_padded() {
    // A context of 42 tokens fed in pieces of 8: a 41-token prompt's last piece, one token,
    // is written padded to 16 columns from column 40, past the context. A slot keeps only
    // real tokens' columns but has room for that: nothing compiles after the warm-up (a slot
    // too narrow would grow the continuing prefill's caches, a new program), and every
    // request gives what generate gives it alone.
    let dirs = ["llama", "mistral", "gemma2"].map(common::hybrid::transformer);
    for dir in dirs.into_iter().chain([common::hybrid::fixture("bamba")]) {
        let o = SchedulerOptions {
            max_prompt: 41,
            max_context: Some(42),
            ..options()
        };
        lengths_as_alone(&dir, o, &[(41, 1), (30, 12), (33, 9), (1, 12), (17, 11)]);
    }
}

#[test]
fn a_segment_over_fewer_columns_than_a_sliding_window_gives_what_generate_gives() {
    // A served segment decodes over the leading columns its rows' tokens need (16, 48 or all
    // 80 of a slot's columns here). A Gemma 2 whose sliding layers have a window of 24 (its
    // global layers' caches make the windows pay): over 16 columns its rings are cut below
    // the window, over 48 they are whole and wrap; requests growing through both give what
    // generate gives each alone, and nothing compiles after the warm-up.
    let dir = common::hybrid::copy_with(
        "gemma2",
        "decode-window",
        |c| c.replace("\"sliding_window\": 4,", "\"sliding_window\": 24,"),
        |_| true,
    );
    let o = SchedulerOptions {
        max_tokens: 30,
        max_context: Some(56),
        ..options()
    };
    lengths_as_alone(
        &dir,
        o,
        &[(3, 30), (2, 9), (5, 12), (20, 30), (1, 14), (6, 25)],
    );
}
