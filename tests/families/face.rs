//! The face a service holds (`Box<dyn CausalLm>` of any family): shared between threads,
//! state continued in memory with one state type for every family, and a state of another
//! family refused by naming both; the chosen tokens' log-probabilities (`Model::logprobs`).

use std::sync::Arc;

use crate::common;

use common::client;
use stablegraph::models::family::{self, CausalLm};
use stablegraph::models::ModelState;
use stablegraph::DType;

#[test]
fn state_in_memory_continues_as_the_whole_prompt_does() {
    let (first, rest, whole) = crate::conversation();
    for dir in common::one_fixture_per_family() {
        let model = family::load(&client(), &dir, DType::F32).unwrap();
        let name = format!("{} ({})", dir.display(), model.family());
        let (made, state) = model
            .generate_from(&first, None, &common::greedy(0))
            .unwrap();
        assert!(made.iter().all(Vec::is_empty), "{name}");
        assert_eq!(state.family(), model.family(), "{name}");
        assert_eq!(state.rows(), 2, "{name}");
        let (continued, state) = model
            .generate_from(&rest, Some(state), &common::greedy(6))
            .unwrap();
        assert_eq!(
            continued,
            model.generate(&whole, &common::greedy(6)).unwrap(),
            "{name}"
        );
        // The state after those tokens continues too, against the host loop.
        let (more, _) = model
            .generate_from(&[vec![3], vec![4]], Some(state), &common::greedy(3))
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
    let models: Vec<Box<dyn CausalLm>> = common::one_fixture_per_family()
        .iter()
        .map(|d| family::load(&client(), d, DType::F32).unwrap())
        .collect();
    let prompt = vec![vec![1, 2, 3]];
    let states: Vec<ModelState> = models
        .iter()
        .map(|m| {
            m.generate_from(&prompt, None, &common::greedy(0))
                .unwrap()
                .1
        })
        .collect();
    for (i, m) in models.iter().enumerate() {
        for (j, s) in states.iter().enumerate() {
            let got = m.generate_from(&prompt, Some(s.clone()), &common::greedy(2));
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
        .generate_with_state_files(&prompt, &common::greedy(2), Some(&path), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mamba1.safetensors") && e.contains("Mamba-1") && e.contains("Bamba"),
        "{e}"
    );
}

#[test]
fn one_model_serves_two_threads() {
    for dir in common::one_fixture_per_family() {
        let model: Arc<dyn CausalLm> =
            Arc::from(family::load(&client(), &dir, DType::F32).unwrap());
        let prompts = [vec![vec![7u32, 8, 9]], vec![vec![20u32, 21]]];
        let alone: Vec<_> = prompts
            .iter()
            .map(|p| model.generate(p, &common::greedy(4)).unwrap())
            .collect();
        let threads: Vec<_> = prompts
            .iter()
            .cloned()
            .map(|p| {
                let m = Arc::clone(&model);
                std::thread::spawn(move || m.generate(&p, &common::greedy(4)).unwrap())
            })
            .collect();
        let shared: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(shared, alone, "{}", dir.display());
    }
}

#[test]
fn logprobs_are_the_log_softmax_of_transformers_logits() {
    // Each prompt token after the ones before it, scored by Model::logprobs, against the
    // log-softmax of transformers' logits at the position before it (case 1's row 0).
    for dir in common::one_fixture_per_family() {
        let model = stablegraph::models::Model::load(&client(), &dir, DType::F32).unwrap();
        let cases = common::read_safetensors(&dir.join("cases.safetensors"));
        let prompt = &common::fixture_prompts(&cases, 1)[0];
        let logits = &cases["case1.logits"];
        let (len, vocab) = (logits.shape[1], logits.shape[2]);
        let scored = model.logprobs(&prompt[..1], &prompt[1..], 4).unwrap();
        assert_eq!(scored.len(), prompt.len() - 1);
        for (i, s) in scored.iter().enumerate() {
            // Row 0 fills the last positions of its padded length.
            let at = len - prompt.len() + i;
            let row = &logits.values[at * vocab..(at + 1) * vocab];
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            let want = row[s.token as usize] - lse;
            assert!(
                (s.logprob - want).abs() < 1e-4,
                "{}: {i}: {} against {want}",
                dir.display(),
                s.logprob
            );
            assert_eq!(s.top.len(), 4);
            let best = (0..vocab)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap();
            assert_eq!(s.top[0].0 as usize, best, "{}: {i}", dir.display());
            assert!(s.top.windows(2).all(|w| w[0].1 >= w[1].1));
        }
    }
}

#[test]
fn a_bad_checkpoint_of_any_family_is_a_checkpoint_error_naming_it() {
    use stablegraph::ErrorKind;
    // A tensor missing from each family's checkpoint: one error of the checkpoint kind naming
    // the directory and the tensor, in the loader's words for every family.
    for dir in common::one_fixture_per_family() {
        let scratch = common::TempDir::new("bad-checkpoint");
        std::fs::copy(dir.join("config.json"), scratch.join("config.json")).unwrap();
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names: Vec<String> = file.names().into_iter().map(String::from).collect();
        names.sort();
        let dropped = names.pop().unwrap();
        let kept: Vec<(String, safetensors::tensor::TensorView)> = names
            .iter()
            .map(|n| (n.clone(), file.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(kept, None, &scratch.join("model.safetensors")).unwrap();
        let e = family::load(&client(), &scratch, DType::F32).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Checkpoint, "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&dropped) && text.contains("missing"),
            "{text}"
        );
        assert!(text.contains(&scratch.display().to_string()), "{text}");
        // A request's bad input is an input error.
        let model = family::load(&client(), &dir, DType::F32).unwrap();
        let e = model.generate(&[vec![]], &common::greedy(2)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
    }
}
