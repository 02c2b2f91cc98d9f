//! Training a tiny Mamba-2: the loss against a host cross-entropy of the inference prefill's
//! logits, its gradients against central finite differences, and the trainer (memorisation,
//! micro steps in one program equal to single steps, donation, errors).

use crate::common;

use stablegraph::models::mamba2::block;
use stablegraph::models::mamba2::train::{decays, lm_loss, loss_and_grads, TrainOptions, Trainer};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights, Remat};
use stablegraph::ops::Graph;
use stablegraph::optim::AdamW;
use stablegraph::tree::Tree;
use stablegraph::{CompiledGraph, DType, HostArray, TensorType};

/// The tiny shape with one layer, for the trainer's tests (half the compile time).
fn cfg1() -> Mamba2Config {
    Mamba2Config {
        num_layers: 1,
        ..common::tiny_mamba2()
    }
}

fn weights(cfg: &Mamba2Config, seed: u64) -> Mamba2Weights<HostArray> {
    Mamba2Weights::random(cfg, DType::F32, seed).unwrap()
}

fn random_tokens(rng: &mut common::Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

/// The mean next-token cross-entropy of left-padded prompts computed on the host in f64 from
/// logits `[b, L, vocab]` (row `r`'s prompt in its last `len` positions).
fn host_loss(logits: &HostArray, prompts: &[Vec<u32>]) -> f64 {
    let [_, l, vocab] = *logits.dims() else {
        panic!("logits {:?}", logits.dims())
    };
    let x = logits.to_f64_vec();
    let (mut total, mut count) = (0.0, 0usize);
    for (r, p) in prompts.iter().enumerate() {
        for k in 0..p.len().saturating_sub(1) {
            let pos = l - p.len() + k;
            let row = &x[(r * l + pos) * vocab..(r * l + pos + 1) * vocab];
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            total += lse - row[p[k + 1] as usize];
            count += 1;
        }
    }
    total / count as f64
}

/// A compiled [`lm_loss`] over left-padded prompts of `len` positions: parameters the weights,
/// then tokens, targets, mask and loss weights (as `loss_and_grads` builds them).
fn loss_program(cfg: &Mamba2Config, batch: usize, len: usize) -> CompiledGraph {
    let g = Graph::new();
    let types = Mamba2Weights::<TensorType>::types(cfg, DType::F32).unwrap();
    let w = block::weight_parameters(&g, &types).unwrap();
    let ids = g.parameter("tokens", DType::I32, &[batch, len]).unwrap();
    let targets = g.parameter("targets", DType::I32, &[batch, len]).unwrap();
    let mask = g.parameter("mask", DType::F32, &[batch, len]).unwrap();
    let lw = g.parameter("weights", DType::F32, &[batch, len]).unwrap();
    let loss = lm_loss(&ids, &targets, &lw, &mask, &w, cfg).unwrap();
    g.set_outputs(&[&loss]).unwrap();
    g.compile(&common::client()).unwrap()
}

/// The inputs of [`loss_program`] after the weights.
fn loss_inputs(prompts: &[Vec<u32>], len: usize) -> Vec<HostArray> {
    let b = prompts.len();
    let mut ids = vec![0i32; b * len];
    let mut targets = vec![0i32; b * len];
    let mut mask = vec![0f32; b * len];
    let mut lw = vec![0f32; b * len];
    for (r, p) in prompts.iter().enumerate() {
        let start = r * len + len - p.len();
        for (k, &t) in p.iter().enumerate() {
            ids[start + k] = t as i32;
            mask[start + k] = 1.0;
            if k + 1 < p.len() {
                targets[start + k] = p[k + 1] as i32;
                lw[start + k] = 1.0;
            }
        }
    }
    vec![
        HostArray::from_vec(&[b, len], ids).unwrap(),
        HostArray::from_vec(&[b, len], targets).unwrap(),
        HostArray::from_vec(&[b, len], mask).unwrap(),
        HostArray::from_vec(&[b, len], lw).unwrap(),
    ]
}

fn run_loss(program: &CompiledGraph, w: &Mamba2Weights<HostArray>, rest: &[HostArray]) -> f64 {
    let mut inputs: Vec<HostArray> = w.named().into_iter().map(|(_, a)| a.clone()).collect();
    inputs.extend_from_slice(rest);
    program.run(&inputs).unwrap()[0].to_f64_vec()[0]
}

#[test]
fn loss_equals_a_host_cross_entropy_of_the_prefill_logits() {
    let cfg = common::tiny_mamba2();
    let w = weights(&cfg, 1);
    let model = Mamba2::new(&common::client(), cfg.clone(), &w).unwrap();
    let mut rng = common::Rng::new(3);
    // Full rows, then ragged (left-padded) rows, one of a single token.
    let full = vec![
        random_tokens(&mut rng, 16, 64),
        random_tokens(&mut rng, 16, 64),
    ];
    let ragged = vec![
        random_tokens(&mut rng, 13, 64),
        random_tokens(&mut rng, 16, 64),
        random_tokens(&mut rng, 5, 64),
        random_tokens(&mut rng, 1, 64),
    ];
    for prompts in [full, ragged] {
        let pre = model.prefill_all_positions(&prompts).unwrap();
        let want = host_loss(&pre.logits, &prompts);
        let program = loss_program(&cfg, prompts.len(), 16);
        let got = run_loss(&program, &w, &loss_inputs(&prompts, 16));
        assert!((got - want).abs() < 1e-5, "lm_loss {got}, host {want}");
        let (loss, _) = loss_and_grads(&common::client(), &cfg, &w, &prompts).unwrap();
        let loss = f64::from(loss);
        assert!(
            (loss - want).abs() < 1e-5,
            "loss_and_grads {loss}, host {want}"
        );
    }
}

/// The gradient of every weight of the tiny model (tied and untied head, with biases) against
/// central differences of the f32 loss (whose value [`loss_and_grads`] also returns): each tensor along its own gradient's direction (the
/// derivative there is the gradient's norm), and its two largest entries alone, with a step
/// scaled to the tensor (the embedding is about 0.02) and Richardson's extrapolation over `h`
/// and `h / 2`, which cancels the `h^2` error.
#[test]
fn gradients_match_central_differences() {
    for tied in [false, true] {
        let cfg = Mamba2Config {
            tie_word_embeddings: tied,
            use_bias: true,
            ..common::tiny_mamba2()
        };
        let w = weights(&cfg, 5);
        let mut rng = common::Rng::new(11);
        let prompts = vec![
            random_tokens(&mut rng, 16, 64),
            random_tokens(&mut rng, 11, 64),
        ];
        let (loss, grads) = loss_and_grads(&common::client(), &cfg, &w, &prompts).unwrap();
        let program = loss_program(&cfg, 2, 16);
        let rest = loss_inputs(&prompts, 16);
        let base = run_loss(&program, &w, &rest);
        assert!((base - f64::from(loss)).abs() < 1e-5);
        assert_eq!(grads.named().len(), w.named().len());
        for ((name, g), (_, value)) in grads.named().into_iter().zip(w.named()) {
            assert_eq!(g.ty(), value.ty(), "{name}");
            let g = g.to_f64_vec();
            let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
            assert!(
                norm.is_finite() && norm > 0.0,
                "{name}: gradient norm {norm}"
            );
            let value = value.to_f64_vec();
            // The derivative of the loss at `w` along `d` over this tensor, from steps `h`.
            let derivative = |d: &[f64], h: f64| -> f64 {
                let at = |e: f64| {
                    let moved = w
                        .try_map(|n, a| {
                            if n != name {
                                return Ok(a.clone());
                            }
                            let v = value.iter().zip(d).map(|(x, d)| (x + e * d) as f32);
                            HostArray::from_vec(a.dims(), v.collect())
                        })
                        .unwrap();
                    run_loss(&program, &moved, &rest)
                };
                let central = |h: f64| (at(h) - at(-h)) / (2.0 * h);
                (4.0 * central(h / 2.0) - central(h)) / 3.0
            };
            // The loss's rounding error (about 1e-6) divided by the step bounds the noise.
            let tolerance = |g: f64, h: f64| 0.02 * g.abs() + 5e-6 / h;
            // A step that changes the loss by about 1e-3 to first order.
            let h = (1e-3 / norm).clamp(1e-2, 0.3);
            let dir: Vec<f64> = g.iter().map(|x| x / norm).collect();
            let fd = derivative(&dir, h);
            assert!(
                (fd - norm).abs() <= tolerance(norm, h),
                "tied {tied}, {name}: along the gradient {fd}, gradient norm {norm}"
            );
            let rms = (value.iter().map(|x| x * x).sum::<f64>() / value.len() as f64).sqrt();
            let h = (0.1 * rms).clamp(2e-3, 0.1);
            let mut order: Vec<usize> = (0..g.len()).collect();
            order.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
            for &k in order.iter().take(2) {
                let mut e = vec![0.0; g.len()];
                e[k] = 1.0;
                let fd = derivative(&e, h);
                assert!(
                    (fd - g[k]).abs() <= tolerance(g[k], h),
                    "tied {tied}, {name}[{k}]: finite difference {fd}, gradient {}",
                    g[k]
                );
            }
        }
    }
}

/// The HF name of one of our weights (`layers.0.mixer.in_proj` is
/// `backbone.layers.0.mixer.in_proj.weight`).
fn hf_name(name: &str) -> String {
    let renamed = match name {
        "embedding" => return "backbone.embeddings.weight".into(),
        "norm_f" => return "backbone.norm_f.weight".into(),
        "lm_head" => return "lm_head.weight".into(),
        _ => name
            .replace("in_proj_bias", "in_proj.bias")
            .replace("out_proj_bias", "out_proj.bias")
            .replace("conv1d_bias", "conv1d.bias"),
    };
    let plain = ["A_log", "D", "dt_bias"]
        .iter()
        .any(|p| renamed.ends_with(p));
    if plain || renamed.ends_with(".bias") {
        format!("backbone.{renamed}")
    } else {
        format!("backbone.{renamed}.weight")
    }
}

/// `loss_and_grads` against HF transformers' float32 autograd of
/// `Mamba2ForCausalLM(input_ids, labels=input_ids).loss` (fixtures made by
/// `tests/fixtures/mamba2/make_fixtures.py`, which checks them against float64 finite
/// differences and float64 autograd): two rows of two chunks for the tied `tiny` and the untied
/// two-group `groups2`, and one prompt of 13 ids (not a multiple of the chunk) for `tiny`. Every
/// gradient within 3e-5 of the largest entry of its tensor (5e-6 measured), the loss within 1e-5.
#[test]
fn gradients_match_transformers() {
    use safetensors::SafeTensors;
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mamba2");
    for (config, file) in [
        ("tiny", "grads.safetensors"),
        ("tiny", "grads_ragged.safetensors"),
        ("groups2", "grads.safetensors"),
    ] {
        let dir = root.join(config);
        let cfg = Mamba2Config::from_file(dir.join("config.json")).unwrap();
        let w = Mamba2Weights::load(&dir, &cfg, DType::F32).unwrap();
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let f32s = |name: &str| -> Vec<f64> {
            let t = st
                .tensor(name)
                .unwrap_or_else(|e| panic!("{config}/{file}: {name}: {e}"));
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            t.data()
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect()
        };
        let ids = st.tensor("input_ids").unwrap();
        let t = ids.shape()[1];
        let ids: Vec<u32> = ids
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect();
        let prompts: Vec<Vec<u32>> = ids.chunks(t).map(<[u32]>::to_vec).collect();
        let (loss, grads) = loss_and_grads(&common::client(), &cfg, &w, &prompts).unwrap();
        let want = f32s("loss")[0];
        let rel = (f64::from(loss) - want).abs() / want;
        assert!(
            rel < 1e-5,
            "{config}/{file}: loss {loss}, transformers {want}"
        );
        let mut worst = (0.0f64, String::new());
        for (name, g) in grads.named() {
            let theirs = f32s(&format!("grad.{}", hf_name(&name)));
            let ours = g.to_f64_vec();
            assert_eq!(ours.len(), theirs.len(), "{name}");
            let scale = theirs.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let err = common::max_abs(&ours, &theirs) / scale;
            if err > worst.0 {
                worst = (err, name.clone());
            }
            assert!(
                err < 3e-5,
                "{config}/{file}: {name} differs by {err} of {scale}"
            );
        }
        eprintln!("{config}/{file}: loss {loss} vs {want}; worst gradient {worst:?}");
    }
}

/// `seq_len + 1` tokens per row, `batch` rows, `n` batches.
fn batches(rng: &mut common::Rng, n: usize, batch: usize, seq_len: usize) -> Vec<u32> {
    random_tokens(rng, n * batch * (seq_len + 1), 64)
}

#[test]
fn the_trainer_memorises_a_repeated_batch() {
    let cfg = cfg1();
    let opt = AdamW {
        lr: 1e-2,
        clip_norm: Some(1.0),
        ..AdamW::default()
    };
    let mut trainer =
        Trainer::new(&common::client(), &cfg, weights(&cfg, 2), opt, 2, 16, 1).unwrap();
    let tokens = batches(&mut common::Rng::new(4), 1, 2, 16);
    let before = trainer.eval_loss(&tokens).unwrap();
    assert_eq!(trainer.last_grad_norm(), None);
    let start = std::time::Instant::now();
    let losses: Vec<f32> = (0..20)
        .map(|_| trainer.step(&tokens, 1e-2).unwrap())
        .collect();
    let seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "losses {losses:?}; compile {:.2} s; {:.0} tokens/s",
        trainer.compile_seconds(),
        20.0 * 32.0 / seconds
    );
    // The step's loss is measured before its update: the first equals the eval loss.
    assert!(
        (losses[0] - before).abs() < 1e-5,
        "{} vs {before}",
        losses[0]
    );
    assert!(
        losses[19] < 0.5 * losses[0],
        "the loss did not go down: {losses:?}"
    );
    let after = trainer.eval_loss(&tokens).unwrap();
    assert!(after < losses[19], "eval {after} after {losses:?}");
    assert_eq!(trainer.steps_done(), 20);
    let norm = trainer.last_grad_norm().unwrap();
    assert!(norm.is_finite() && norm > 0.0, "{norm}");
    // The weights come back in the structure and types they went in with.
    let w = trainer.weights().unwrap();
    let types = Mamba2Weights::<TensorType>::types(&cfg, DType::F32).unwrap();
    let got: Vec<TensorType> = w.named().into_iter().map(|(_, a)| a.ty()).collect();
    let want: Vec<TensorType> = types.named().into_iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(got, want);
    // A model made from them predicts the memorised batch as the trainer measures it.
    let model = Mamba2::new(&common::client(), cfg.clone(), &w).unwrap();
    let rows: Vec<Vec<u32>> = tokens.chunks(17).map(<[u32]>::to_vec).collect();
    let pre = model.prefill_all_positions(&rows).unwrap();
    let host = host_loss(&pre.logits, &rows);
    assert!((host - f64::from(after)).abs() < 1e-4, "{host} vs {after}");
}

#[test]
fn micro_steps_in_one_donating_program_equal_single_steps() {
    let cfg = cfg1();
    let client = common::client();
    let opt = AdamW {
        lr: 5e-3,
        clip_norm: Some(1.0),
        ..AdamW::default()
    };
    let tokens = batches(&mut common::Rng::new(9), 4, 2, 8);
    let mut single = Trainer::new(&client, &cfg, weights(&cfg, 6), opt.clone(), 2, 8, 1).unwrap();
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for batch in tokens.chunks(single.tokens_per_call()) {
        losses.push(single.step(batch, 3e-3).unwrap());
        norms.push(single.last_grad_norm().unwrap());
    }
    let mut looped = Trainer::new(&client, &cfg, weights(&cfg, 6), opt, 2, 8, 4).unwrap();
    assert_eq!(looped.tokens_per_call(), tokens.len());
    check_donation(&looped, &cfg);
    let mean = looped.step(&tokens, 3e-3).unwrap();
    let want = losses.iter().sum::<f32>() / 4.0;
    assert!((mean - want).abs() < 1e-5, "{mean} vs {want}");
    let norm = looped.last_grad_norm().unwrap();
    let want = norms.iter().sum::<f32>() / 4.0;
    assert!((norm - want).abs() < 1e-4 * want, "{norm} vs {want}");
    assert_eq!(looped.steps_done(), single.steps_done());
    let (a, b) = (single.weights().unwrap(), looped.weights().unwrap());
    for ((name, x), (_, y)) in a.named().into_iter().zip(b.named()) {
        let d = common::array_diff(x, y);
        assert!(d < 1e-5, "{name}: micro steps differ by {d}");
    }
    let (ma, va) = single.moments().unwrap();
    let (mb, vb) = looped.moments().unwrap();
    for (x, y) in [(ma, mb), (va, vb)] {
        for ((name, x), (_, y)) in x.named().into_iter().zip(y.named()) {
            let d = common::array_diff(x, y);
            assert!(d < 1e-5, "moment of {name}: micro steps differ by {d}");
        }
    }
}

#[test]
fn per_layer_remat_trains_the_same_in_fewer_temporaries() {
    let cfg = Mamba2Config {
        num_layers: 3,
        ..common::tiny_mamba2()
    };
    let client = common::client();
    let opt = AdamW {
        lr: 5e-3,
        ..AdamW::default()
    };
    let tokens = batches(&mut common::Rng::new(11), 3, 2, 8);
    let plain = Trainer::new(&client, &cfg, weights(&cfg, 5), opt.clone(), 2, 8, 1).unwrap();
    let options = TrainOptions {
        batch: 2,
        seq_len: 8,
        micro_steps: 1,
        remat: Remat::PerLayer,
    };
    let remat =
        Trainer::with_options(&client, &cfg, weights(&cfg, 5), opt.clone(), options).unwrap();
    check_donation(&remat, &cfg);
    // Switching a built trainer compiles the remat step too, to the same program.
    let switched = Trainer::new(&client, &cfg, weights(&cfg, 5), opt, 2, 8, 1)
        .unwrap()
        .with_remat(Remat::PerLayer)
        .unwrap();
    assert_eq!(
        switched.step_program().stablehlo(),
        remat.step_program().stablehlo()
    );
    let temps = |t: &Trainer| {
        let stats = t.step_program().executable().memory_stats().unwrap();
        stats.temporaries
    };
    let (plain_temps, remat_temps) = (temps(&plain), temps(&remat));
    assert!(
        remat_temps < plain_temps,
        "temporaries with remat {remat_temps} B, without {plain_temps} B"
    );
    let (mut plain, mut remat) = (plain, remat);
    for batch in tokens.chunks(plain.tokens_per_call()) {
        let (a, b) = (
            plain.step(batch, 3e-3).unwrap(),
            remat.step(batch, 3e-3).unwrap(),
        );
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "loss {a} vs {b} with remat"
        );
    }
    let (a, b) = (plain.weights().unwrap(), remat.weights().unwrap());
    for ((name, x), (_, y)) in a.named().into_iter().zip(b.named()) {
        let d = common::array_diff(x, y);
        assert!(d < 1e-5, "{name}: remat differs by {d}");
    }
}

/// The step program updates weights and moments in place: weights, `m`, `v` and the step
/// count are donated, each aliased to its own new value; the learning rate and the tokens are
/// not. Also which weights decay.
fn check_donation(trainer: &Trainer, cfg: &Mamba2Config) {
    let exe = trainer.step_program().executable();
    let n = weights(cfg, 8).named().len();
    assert_eq!(exe.donated_inputs(), (0..3 * n + 1).collect::<Vec<_>>());
    // Outputs 0 and 1 are the loss and the gradient norm.
    for i in 0..3 * n + 1 {
        assert_eq!(exe.aliased_output(i), Some(i + 2), "parameter {i}");
    }
    assert_eq!(exe.aliased_output(3 * n + 1), None);
    assert_eq!(exe.aliased_output(3 * n + 2), None);
    let types = Mamba2Weights::<TensorType>::types(cfg, DType::F32).unwrap();
    let decayed: Vec<String> = types
        .named()
        .into_iter()
        .filter(|(_, t)| decays(t))
        .map(|(n, _)| n)
        .collect();
    assert!(decayed.contains(&"embedding".to_string()));
    assert!(decayed.contains(&"layers.0.mixer.in_proj".to_string()));
    assert!(decayed.contains(&"layers.0.mixer.conv1d".to_string()));
    assert!(!decayed
        .iter()
        .any(|n| n.contains("A_log") || n.contains("norm") || n.contains("dt_bias")));
}

/// A trainer made from a snapshot's weights, with its moments and step count restored, takes
/// the same next step as the trainer that made the snapshot.
#[test]
fn training_resumes_from_weights_and_moments() {
    let cfg = cfg1();
    let client = common::client();
    let opt = AdamW {
        clip_norm: Some(1.0),
        ..AdamW::default()
    };
    let tokens = batches(&mut common::Rng::new(12), 3, 2, 8);
    let mut first = Trainer::new(&client, &cfg, weights(&cfg, 3), opt.clone(), 2, 8, 1).unwrap();
    let per = first.tokens_per_call();
    for batch in tokens.chunks(per).take(2) {
        first.step(batch, 1e-2).unwrap();
    }
    let snapshot = first.weights().unwrap();
    let (m, v) = first.moments().unwrap();
    let last = &tokens[2 * per..];
    let want = first.step(last, 1e-2).unwrap();
    let mut second = Trainer::new(&client, &cfg, snapshot, opt, 2, 8, 1).unwrap();
    let e = second.restore_optimizer(&v, &m, u64::MAX).unwrap_err();
    assert!(e.to_string().contains("steps_done"), "{e}");
    let wrong = weights(&cfg, 1).try_map(|name, a| {
        Ok(if name == "norm_f" {
            HostArray::from_vec(&[3], vec![0f32; 3])?
        } else {
            a.clone()
        })
    });
    let e = second
        .restore_optimizer(&wrong.unwrap(), &v, 2)
        .unwrap_err();
    assert!(
        e.to_string().contains("norm_f is f32[3], expected f32[32]"),
        "{e}"
    );
    second.restore_optimizer(&m, &v, 2).unwrap();
    assert_eq!(second.steps_done(), 2);
    let got = second.step(last, 1e-2).unwrap();
    assert_eq!(got, want);
    let (a, b) = (first.weights().unwrap(), second.weights().unwrap());
    for ((name, x), (_, y)) in a.named().into_iter().zip(b.named()) {
        assert_eq!(x, y, "{name}");
    }
}

#[test]
fn training_refuses_bad_input_by_name() {
    // A trainer may move to, and be read from, other threads.
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Trainer>();
    let cfg = cfg1();
    let client = common::client();
    let w = weights(&cfg, 1);
    let new = |w: Mamba2Weights<HostArray>, seq: usize| {
        Trainer::new(&client, &cfg, w, AdamW::default(), 2, seq, 1)
    };
    let e = new(w.clone(), 12).unwrap_err().to_string();
    assert!(e.contains("seq_len") && e.contains("chunk_size (8)"), "{e}");
    let bf16 = Mamba2Weights::random(&cfg, DType::BF16, 1).unwrap();
    let e = new(bf16, 8).unwrap_err().to_string();
    assert!(e.contains("weights") && e.contains("bf16"), "{e}");
    let mut trainer = new(w.clone(), 8).unwrap();
    let mut tokens = vec![1u32; 18];
    tokens[4] = 64;
    let e = trainer.step(&tokens, 1e-3).unwrap_err().to_string();
    assert!(e.contains("token id 64 (at position 4)"), "{e}");
    let e = trainer.step(&[1; 9], 1e-3).unwrap_err().to_string();
    assert!(e.contains("has 9 ids") && e.contains("= 18"), "{e}");
    let e = trainer.step(&[1; 18], f64::NAN).unwrap_err().to_string();
    assert!(e.contains("lr"), "{e}");
    let e = trainer.eval_loss(&[1; 10]).unwrap_err().to_string();
    assert!(e.contains("multiple"), "{e}");
    assert_eq!(trainer.steps_done(), 0);
    // lm_loss names its arguments.
    let g = Graph::new();
    let types = Mamba2Weights::<TensorType>::types(&cfg, DType::F32).unwrap();
    let gw = block::weight_parameters(&g, &types).unwrap();
    let ids = g.parameter("ids", DType::I32, &[2, 8]).unwrap();
    let short = g.parameter("short", DType::I32, &[2, 7]).unwrap();
    let ones = g.ones(DType::F32, &[2, 8]).unwrap();
    let e = lm_loss(&ids, &short, &ones, &ones, &gw, &cfg).unwrap_err();
    assert!(
        e.to_string().contains("argument `targets` is i32[2, 7]"),
        "{e}"
    );
    let e = lm_loss(&ids, &ids, &ids, &ones, &gw, &cfg).unwrap_err();
    assert!(
        e.to_string().contains("argument `weights` is i32[2, 8]"),
        "{e}"
    );
    let e = loss_and_grads(&client, &cfg, &w, &[vec![3]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("nothing to predict"), "{e}");
    let e = loss_and_grads(&client, &cfg, &w, &[vec![3, 70]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("token id 70"), "{e}");
}

/// Throughput of the training step on the small byte-level shape (`cargo test --release --test
/// mamba2 train:: -- --ignored --nocapture`): compile seconds and tokens per second, with one
/// and with four optimizer steps per program. Try it also with
/// `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (see [`Trainer`]'s docs).
#[test]
#[ignore = "a measurement, not a check"]
fn trainer_throughput_on_the_byte_level_shape() {
    let cfg = Mamba2Config::byte_level(4, 128).unwrap();
    let (batch, seq_len) = (8, 256);
    for micro in [1, 4] {
        let mut trainer = Trainer::new(
            &common::client(),
            &cfg,
            Mamba2Weights::random(&cfg, DType::F32, 1).unwrap(),
            AdamW::default(),
            batch,
            seq_len,
            micro,
        )
        .unwrap();
        let mut rng = common::Rng::new(2);
        let tokens: Vec<u32> = (0..trainer.tokens_per_call())
            .map(|_| rng.below(256) as u32)
            .collect();
        trainer.step(&tokens, 1e-3).unwrap();
        let calls = 8 / micro;
        let start = std::time::Instant::now();
        for _ in 0..calls {
            trainer.step(&tokens, 1e-3).unwrap();
        }
        let seconds = start.elapsed().as_secs_f64();
        let one_batch = &tokens[..batch * (seq_len + 1)];
        trainer.eval_loss(one_batch).unwrap();
        let start = std::time::Instant::now();
        for _ in 0..4 {
            trainer.eval_loss(one_batch).unwrap();
        }
        eprintln!(
            "forward only (eval_loss): {:.0} ms per batch",
            1e3 * start.elapsed().as_secs_f64() / 4.0
        );
        eprintln!(
            "byte_level(4, 128), batch {batch} x {seq_len}, micro_steps {micro}: compile {:.1} s, \
             {:.0} tokens/s, {:.0} ms per optimizer step",
            trainer.compile_seconds(),
            (calls * micro * batch * seq_len) as f64 / seconds,
            1e3 * seconds / (calls * micro) as f64
        );
    }
}
