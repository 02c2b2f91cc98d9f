//! The face a service holds (`Box<dyn CausalLm>` of any family): shared between threads,
//! state continued in memory with one state type for every family, and a state of another
//! family refused by naming both.

use std::path::PathBuf;
use std::sync::Arc;

use crate::common;

use common::client;
use stablegraph::models::family::{self, CausalLm};
use stablegraph::models::{GenerateOptions, ModelState, Penalties, Sampling};
use stablegraph::DType;

/// One fixture of every family: Mamba-2, Mamba-1, Falcon-Mamba and the three hybrids.
fn one_of_each() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    vec![
        root.join("mamba2/tiny"),
        common::mamba1::fixture("tiny"),
        common::mamba1::fixture("falcon"),
        common::hybrid::fixture("bamba"),
        common::hybrid::fixture("granite"),
        common::hybrid::fixture("nemotron"),
    ]
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        eos: None,
        penalties: Penalties::NONE,
    }
}

#[test]
fn state_in_memory_continues_as_the_whole_prompt_does() {
    let first = vec![vec![5, 9, 14, 20, 33, 7], vec![40, 41, 42]];
    let rest = vec![vec![11, 12], vec![13, 14, 15]];
    let whole: Vec<Vec<u32>> = first
        .iter()
        .zip(&rest)
        .map(|(a, b)| a.iter().chain(b).copied().collect())
        .collect();
    for dir in one_of_each() {
        let model = family::load(&client(), &dir, DType::F32).unwrap();
        let name = format!("{} ({})", dir.display(), model.family());
        let (made, state) = model.generate_from(&first, None, &greedy(0)).unwrap();
        assert!(made.iter().all(Vec::is_empty), "{name}");
        assert_eq!(state.family(), model.family(), "{name}");
        assert_eq!(state.rows(), 2, "{name}");
        let (continued, state) = model.generate_from(&rest, Some(state), &greedy(6)).unwrap();
        assert_eq!(
            continued,
            model.generate(&whole, &greedy(6)).unwrap(),
            "{name}"
        );
        // The state after those tokens continues too, against the host loop.
        let (more, _) = model
            .generate_from(&[vec![3], vec![4]], Some(state), &greedy(3))
            .unwrap();
        let longer: Vec<Vec<u32>> = whole
            .iter()
            .zip(&continued)
            .zip([3, 4])
            .map(|((w, c), t)| w.iter().chain(c).chain(&[t]).copied().collect())
            .collect();
        assert_eq!(more, model.greedy(&longer, 3).unwrap(), "{name}");
    }
}

#[test]
fn a_state_of_another_family_is_refused_by_naming_both() {
    let models: Vec<Box<dyn CausalLm>> = one_of_each()
        .iter()
        .map(|d| family::load(&client(), d, DType::F32).unwrap())
        .collect();
    let prompt = vec![vec![1, 2, 3]];
    let states: Vec<ModelState> = models
        .iter()
        .map(|m| m.generate_from(&prompt, None, &greedy(0)).unwrap().1)
        .collect();
    for (i, m) in models.iter().enumerate() {
        for (j, s) in states.iter().enumerate() {
            let got = m.generate_from(&prompt, Some(s.clone()), &greedy(2));
            if s.family() == m.family() {
                assert!(
                    got.is_ok(),
                    "{} with its own state: {:?}",
                    m.family(),
                    got.err()
                );
                continue;
            }
            let e = got.unwrap_err().to_string();
            assert!(
                e.contains(m.family()) && e.contains(s.family()),
                "model {i} ({}) given state {j} ({}): {e}",
                m.family(),
                s.family()
            );
        }
    }
    // Through files too: the message names the file and both families.
    let dir = common::TempDir::new("other-family-state");
    let path = dir.join("mamba1.safetensors");
    states[1].save(&path).unwrap();
    let e = models[3]
        .generate_with_state_files(&prompt, &greedy(2), Some(&path), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mamba1.safetensors") && e.contains("Mamba-1") && e.contains("Bamba"),
        "{e}"
    );
}

#[test]
fn one_model_serves_two_threads() {
    for dir in one_of_each() {
        let model: Arc<dyn CausalLm> =
            Arc::from(family::load(&client(), &dir, DType::F32).unwrap());
        let prompts = [vec![vec![7u32, 8, 9]], vec![vec![20u32, 21]]];
        let alone: Vec<_> = prompts
            .iter()
            .map(|p| model.generate(p, &greedy(4)).unwrap())
            .collect();
        let threads: Vec<_> = prompts
            .iter()
            .cloned()
            .map(|p| {
                let m = Arc::clone(&model);
                std::thread::spawn(move || m.generate(&p, &greedy(4)).unwrap())
            })
            .collect();
        let shared: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(shared, alone, "{}", dir.display());
    }
}
