//! AdamW as a graph against an independent f64 host implementation of PyTorch's formulas
//! (`torch.optim.AdamW` and `torch.nn.utils.clip_grad_norm_`), over several steps, with the
//! clipping active, inactive and off (the default), a runtime learning rate and a constant one,
//! and several steps in one device loop; the warm-up + cosine schedule against its formula (on
//! the host and in the graph); and gradient-transformation chains (optax's `chain`) against
//! the same host formulas: clip + Adam + decay + learning rate is AdamW, momentum (plain and
//! Nesterov), value clipping.

mod common;

use stablegraph::ops::{Graph, Tensor};
use stablegraph::optim::{
    apply_updates, global_norm, AdamW, AdamWState, Chain, ParamState, Schedule, Transform,
    WarmupCosine,
};
use stablegraph::tree::Tree;
use stablegraph::{CompiledGraph, DType, HostArray};

/// The shapes of the test's parameters and whether each is decayed.
const SHAPES: [(&[usize], bool); 3] = [(&[3, 4], true), (&[5], false), (&[2, 2, 2], true)];

/// The host's optimizer state: per parameter its values and moments, in f64.
#[derive(Clone)]
struct Host {
    p: Vec<Vec<f64>>,
    m: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

/// PyTorch's AdamW step `t` (1-based) in f64, written from its documentation: clip (global
/// norm, factor `min(1, clip / (norm + 1e-6))`), decoupled decay, moments, bias corrections,
/// update. Returns the gradients' global norm before clipping.
fn host_step(opt: &AdamW, s: &mut Host, grads: &[Vec<f64>], t: i32, lr: f64) -> f64 {
    let norm = grads.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
    let coef = match opt.clip_norm {
        Some(c) => (c / (norm + 1e-6)).min(1.0),
        None => 1.0,
    };
    let bc1 = 1.0 - opt.beta1.powi(t);
    let bc2 = 1.0 - opt.beta2.powi(t);
    for (i, (_, decay)) in SHAPES.iter().enumerate() {
        for (k, g) in grads[i].iter().enumerate() {
            let g = g * coef;
            let mut p = s.p[i][k];
            if *decay {
                p *= 1.0 - lr * opt.weight_decay;
            }
            s.m[i][k] = opt.beta1 * s.m[i][k] + (1.0 - opt.beta1) * g;
            s.v[i][k] = opt.beta2 * s.v[i][k] + (1.0 - opt.beta2) * g * g;
            let denom = s.v[i][k].sqrt() / bc2.sqrt() + opt.eps;
            s.p[i][k] = p - lr / bc1 * s.m[i][k] / denom;
        }
    }
    norm
}

/// Graph parameters named `{prefix}{i}`, one per shape.
fn parameters(g: &Graph, prefix: &str) -> Vec<Tensor> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, (dims, _))| {
            g.parameter(&format!("{prefix}{i}"), DType::F32, dims)
                .unwrap()
        })
        .collect()
}

/// The optimizer state over parameters `p*`, `m*`, `v*` and `step` (i32, steps done).
fn state_parameters(g: &Graph) -> AdamWState {
    let (p, m, v) = (parameters(g, "p"), parameters(g, "m"), parameters(g, "v"));
    let params = p
        .into_iter()
        .zip(m.into_iter().zip(v))
        .zip(SHAPES)
        .map(|((param, (m, v)), (_, decay))| ParamState { param, m, v, decay })
        .collect();
    let step = g.parameter("step", DType::I32, &[]).unwrap();
    AdamWState { params, step }
}

/// The outputs of a state: every `p`, every `m`, every `v`, then the step count.
fn state_outputs(s: &AdamWState) -> Vec<&Tensor> {
    let mut outs: Vec<&Tensor> = s.params.iter().map(|p| &p.param).collect();
    outs.extend(s.params.iter().map(|p| &p.m));
    outs.extend(s.params.iter().map(|p| &p.v));
    outs.push(&s.step);
    outs
}

/// The update program: parameters `p*`, `m*`, `v*`, `step` (i32, steps done), then `g*` and,
/// with `runtime_lr`, `lr` (f32); outputs the new `p`, `m`, `v`, step count and the global norm
/// of `g` (from [`AdamW::update_with_norm`], checked against [`global_norm`] and
/// [`AdamW::update`]).
fn program(opt: &AdamW, runtime_lr: bool) -> (Graph, CompiledGraph) {
    let g = Graph::new();
    let state = state_parameters(&g);
    let grads = parameters(&g, "g");
    let lr = runtime_lr.then(|| g.parameter("lr", DType::F32, &[]).unwrap());
    let (next, norm) = opt.update_with_norm(&state, &grads, lr.as_ref()).unwrap();
    let plain = opt.update(&state, &grads, lr.as_ref()).unwrap();
    let direct = global_norm(&grads).unwrap();
    let mut outs = state_outputs(&next);
    outs.push(&norm);
    outs.extend(state_outputs(&plain));
    outs.push(&direct);
    g.set_outputs(&outs).unwrap();
    let compiled = g.compile(&common::client()).unwrap();
    (g, compiled)
}

fn arrays(values: &[Vec<f64>]) -> Vec<HostArray> {
    values
        .iter()
        .zip(SHAPES)
        .map(|(v, (dims, _))| {
            HostArray::from_vec(dims, v.iter().map(|&x| x as f32).collect()).unwrap()
        })
        .collect()
}

/// Draws one value per parameter element, uniform in `[-scale, scale)`, rounded to f32 (the
/// values the device gets).
fn draw(rng: &mut common::Rng, scale: f64) -> Vec<Vec<f64>> {
    SHAPES
        .iter()
        .map(|(d, _)| {
            (0..d.iter().product::<usize>())
                .map(|_| f64::from((rng.uniform(-1.0, 1.0) * scale) as f32))
                .collect()
        })
        .collect()
}

/// A fresh host state: random parameters, zero moments.
fn host_start(rng: &mut common::Rng) -> Host {
    let p = draw(rng, 1.0);
    let zeros: Vec<Vec<f64>> = p.iter().map(|r| vec![0.0; r.len()]).collect();
    Host {
        p,
        m: zeros.clone(),
        v: zeros,
    }
}

/// Asserts that device outputs `p`, `m`, `v` (in that order, `n` each) match the host's.
fn assert_state(t: i32, out: &[HostArray], host: &Host, grad_scale: f64) {
    let n = SHAPES.len();
    for (what, got, want, tol) in [
        ("params", &out[..n], &host.p, 2e-6),
        ("m", &out[n..2 * n], &host.m, 1e-6 * grad_scale),
        (
            "v",
            &out[2 * n..3 * n],
            &host.v,
            1e-6 * grad_scale * grad_scale,
        ),
    ] {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            for (k, (a, b)) in g.to_f64_vec().iter().zip(w).enumerate() {
                assert!(
                    (a - b).abs() <= tol + 1e-5 * b.abs(),
                    "step {t}, {what}[{i}][{k}]: device {a}, host {b}"
                );
            }
        }
    }
}

/// Runs `steps` steps of `opt` on the device and on the host from the same start, with
/// gradients scaled by `grad_scale`, comparing parameters, moments, the step count and the
/// norm after every step; returns the global gradient norms seen.
fn run_against_host(opt: &AdamW, runtime_lr: bool, grad_scale: f64, steps: i32) -> Vec<f64> {
    let (graph, compiled) = program(opt, runtime_lr);
    let mut rng = common::Rng::new(7);
    let mut host = host_start(&mut rng);
    let n = SHAPES.len();
    let mut state = arrays(&host.p);
    state.extend(arrays(&host.m));
    state.extend(arrays(&host.v));
    state.push(HostArray::scalar(0i32));
    let mut norms = Vec::new();
    for t in 1..=steps {
        let grads = draw(&mut rng, grad_scale);
        let lr = if runtime_lr {
            f64::from((0.05 / f64::from(t)) as f32)
        } else {
            opt.lr
        };
        let mut inputs = state.clone();
        inputs.extend(arrays(&grads));
        if runtime_lr {
            inputs.push(HostArray::scalar(lr as f32));
        }
        let out = compiled.run(&inputs).unwrap();
        if t == 1 {
            // The interpreter computes the same step.
            let reference = graph.evaluate(&inputs).unwrap();
            for (a, b) in out.iter().zip(&reference) {
                for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                    assert!(
                        (x - y).abs() <= 1e-6 * (1.0 + y.abs()),
                        "device {x} and interpreter {y} differ"
                    );
                }
            }
        }
        let norm = host_step(opt, &mut host, &grads, t, lr);
        let device_norm = out[3 * n + 1].to_f64_vec()[0];
        assert!(
            (device_norm - norm).abs() <= 1e-5 * norm,
            "step {t}: global norm {device_norm} vs {norm}"
        );
        assert_eq!(out[3 * n].to_f64_vec(), [f64::from(t)], "the step count");
        norms.push(norm);
        assert_state(t, &out, &host, grad_scale);
        // `update` and `global_norm` give what `update_with_norm` gave.
        let (with_norm, plain) = out.split_at(3 * n + 2);
        for (a, b) in with_norm.iter().zip(plain) {
            assert_eq!(a.to_f64_vec(), b.to_f64_vec());
        }
        state = out[..3 * n + 1].to_vec();
    }
    norms
}

#[test]
fn adamw_with_active_clipping_and_a_runtime_lr_matches_the_formulas() {
    let opt = AdamW {
        weight_decay: 0.1,
        clip_norm: Some(1.0),
        ..AdamW::default()
    };
    // Gradients of norm about 10 * sqrt(25 / 3): clipped at every step.
    let norms = run_against_host(&opt, true, 10.0, 6);
    assert!(norms.iter().all(|&n| n > 5.0), "{norms:?}");
}

#[test]
fn adamw_with_inactive_clipping_and_a_constant_lr_matches_the_formulas() {
    let opt = AdamW {
        lr: 0.02,
        beta1: 0.8,
        beta2: 0.95,
        eps: 1e-6,
        weight_decay: 0.05,
        clip_norm: Some(100.0),
    };
    let norms = run_against_host(&opt, false, 0.5, 6);
    assert!(norms.iter().all(|&n| n < 100.0), "{norms:?}");
    // No clipping at all gives the same numbers here.
    let unclipped = AdamW {
        clip_norm: None,
        ..opt
    };
    run_against_host(&unclipped, false, 0.5, 3);
}

/// The defaults are `torch.optim.AdamW`'s, which do not clip: gradients far above norm 1 are
/// used as they are.
#[test]
fn adamw_defaults_are_torchs_and_do_not_clip() {
    let opt = AdamW::default();
    assert_eq!(
        (opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay),
        (1e-3, 0.9, 0.999, 1e-8, 1e-2)
    );
    assert_eq!(opt.clip_norm, None);
    let norms = run_against_host(&opt, false, 10.0, 4);
    assert!(norms.iter().all(|&n| n > 5.0), "{norms:?}");
}

/// Several updates in one device loop (the state as a `fori_loop` carry) equal the host's
/// steps, and a fresh state ([`AdamWState::new`]) starts from zero moments and step 0.
#[test]
fn adamw_steps_in_a_device_loop_from_a_fresh_state() {
    let opt = AdamW {
        lr: 0.01,
        clip_norm: Some(2.0),
        ..AdamW::default()
    };
    let g = Graph::new();
    let p = parameters(&g, "p");
    let grads = parameters(&g, "g");
    let fresh = AdamWState::new(
        p.into_iter()
            .zip(SHAPES)
            .map(|(t, (_, decay))| ParamState::new(t, decay).unwrap())
            .collect(),
    )
    .unwrap();
    // The same gradients at every step (captured by the loop body).
    let last = g
        .fori_loop(0, 3, &fresh, |_, s| opt.update(s, &grads, None))
        .unwrap();
    g.set_outputs(&state_outputs(&last)).unwrap();
    let compiled = g.compile(&common::client()).unwrap();
    let mut rng = common::Rng::new(11);
    let mut host = host_start(&mut rng);
    let grad_values = draw(&mut rng, 3.0);
    let mut inputs = arrays(&host.p);
    inputs.extend(arrays(&grad_values));
    let out = compiled.run(&inputs).unwrap();
    for t in 1..=3 {
        host_step(&opt, &mut host, &grad_values, t, opt.lr);
    }
    assert_state(3, &out, &host, 3.0);
    assert_eq!(out[3 * SHAPES.len()].to_f64_vec(), [3.0]);
}

/// The schedule against its formula, evaluated here by cases from the definition: linear
/// warm-up to the peak, then `f + (1 - f) * (1 + cos(pi * progress)) / 2` of the peak.
#[test]
fn warmup_cosine_follows_its_formula() {
    let s = WarmupCosine {
        peak_lr: 2e-3,
        warmup_steps: 10,
        total_steps: 110,
        final_fraction: 0.25,
    };
    s.validate().unwrap();
    for step in 0..=10u64 {
        let want = 2e-3 * step as f64 / 10.0;
        assert!((s.lr(step) - want).abs() < 1e-15, "warm-up step {step}");
    }
    // A quarter, half and three quarters of the way down the cosine, and the end.
    for (step, cos) in [
        (35u64, 0.5f64.sqrt()),
        (60, 0.0),
        (85, -(0.5f64.sqrt())),
        (110, -1.0),
    ] {
        let want = 2e-3 * (0.25 + 0.75 * (1.0 + cos) / 2.0);
        assert!(
            (s.lr(step) - want).abs() < 1e-15,
            "step {step}: {} vs {want}",
            s.lr(step)
        );
    }
    assert!((s.lr(1000) - 5e-4).abs() < 1e-15, "after the end");
    let lrs: Vec<f64> = (10..=110).map(|t| s.lr(t)).collect();
    assert!(lrs.windows(2).all(|w| w[1] < w[0]), "decays strictly");
    // No warm-up: the decay starts at once.
    let none = WarmupCosine {
        warmup_steps: 0,
        ..s
    };
    assert_eq!(none.lr(0), 2e-3);
    assert!((none.lr(110) - 5e-4).abs() < 1e-15);
    // Bad fields are named.
    let e = WarmupCosine {
        final_fraction: 1.5,
        ..s
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("final_fraction"), "{e}");
    let e = WarmupCosine {
        peak_lr: f64::NAN,
        ..s
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("peak_lr"), "{e}");
}

/// `WarmupCosine::new` is the schedule the `train` example used before it moved here: the same
/// f64 for every step of several lengths (so training runs are unchanged), and the example's
/// figures (warm-up over 5% of the steps, down to a tenth).
#[test]
fn warmup_cosine_new_is_the_train_examples_schedule() {
    // The example's former function, verbatim.
    fn learning_rate(peak: f64, step: usize, steps: usize) -> f64 {
        let warmup = (steps / 20).clamp(1, 100);
        if step <= warmup {
            return peak * step as f64 / warmup as f64;
        }
        let progress = (step - warmup) as f64 / (steps - warmup).max(1) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos());
        peak * (0.1 + 0.9 * cosine)
    }
    for (peak, steps) in [(3e-3, 2400), (1e-2, 1000), (5e-4, 7), (3e-3, 1), (2e-3, 4)] {
        let s = WarmupCosine::new(peak, steps as u64);
        for step in 1..=steps {
            assert_eq!(
                s.lr(step as u64).to_bits(),
                learning_rate(peak, step, steps).to_bits(),
                "peak {peak}, step {step} of {steps}"
            );
        }
    }
    let peak = 3e-3;
    let s = WarmupCosine::new(peak, 1000);
    assert_eq!((s.warmup_steps, s.final_fraction), (50, 0.1));
    assert!((s.lr(1) - peak / 50.0).abs() < 1e-12);
    assert!((s.lr(50) - peak).abs() < 1e-12);
    assert!((s.lr(1000) - peak / 10.0).abs() < 1e-12);
    assert!((s.lr(525) - peak * 0.55).abs() < 1e-9);
    assert!((WarmupCosine::new(peak, 1).lr(1) - peak).abs() < 1e-12);
}

/// Runs `chain` for `grads.len()` steps in one f64 graph from parameters `p0` (in [`SHAPES`]),
/// each step's gradients given, and returns the parameters after each step.
fn chain_steps(chain: &Chain, p0: &[Vec<f64>], grads: &[Vec<Vec<f64>>]) -> Vec<Vec<Vec<f64>>> {
    let g = Graph::new();
    let f64s = |rows: &[Vec<f64>]| -> Vec<HostArray> {
        rows.iter()
            .zip(SHAPES)
            .map(|(v, (dims, _))| HostArray::from_vec(dims, v.clone()).unwrap())
            .collect()
    };
    let start = f64s(p0);
    let mut params: Vec<Tensor> = start.iter().map(|a| g.constant(a).unwrap()).collect();
    let mut state = chain
        .init(&params)
        .unwrap()
        .try_map(|_, a| g.constant(a))
        .unwrap();
    let mut outs = Vec::new();
    for step in grads {
        let gs: Vec<Tensor> = f64s(step).iter().map(|a| g.constant(a).unwrap()).collect();
        let (updates, next) = chain.update(&gs, &state, &params).unwrap();
        params = apply_updates(&params, &updates).unwrap();
        state = next;
        outs.extend(params.iter().cloned());
    }
    g.set_outputs(&outs.iter().collect::<Vec<_>>()).unwrap();
    let values = g.compile(&common::client()).unwrap().run(&[]).unwrap();
    values
        .chunks(SHAPES.len())
        .map(|c| c.iter().map(HostArray::to_f64_vec).collect())
        .collect()
}

fn assert_close(got: &[Vec<f64>], want: &[Vec<f64>], what: &str) {
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                "{what}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn a_chain_of_clip_adam_decay_and_a_learning_rate_is_adamw() {
    let mut rng = common::Rng::new(71);
    let opt = AdamW {
        lr: 0.05,
        clip_norm: Some(0.5),
        ..AdamW::default()
    };
    let chain = Chain(vec![
        Transform::ClipByGlobalNorm(0.5),
        Transform::ScaleByAdam {
            b1: opt.beta1,
            b2: opt.beta2,
            eps: opt.eps,
        },
        Transform::AddDecayedWeights(opt.weight_decay),
        Transform::ScaleByLearningRate(Schedule::Constant(opt.lr)),
    ]);
    let mut host = host_start(&mut rng);
    let p0 = host.p.clone();
    let grads: Vec<Vec<Vec<f64>>> = (0..3).map(|_| draw(&mut rng, 2.0)).collect();
    let got = chain_steps(&chain, &p0, &grads);
    for (t, gs) in grads.iter().enumerate() {
        host_step(&opt, &mut host, gs, t as i32 + 1, opt.lr);
        assert_close(&got[t], &host.p, &format!("step {}", t + 1));
    }
}

#[test]
fn momentum_and_value_clipping_follow_their_formulas() {
    let mut rng = common::Rng::new(73);
    let p0 = draw(&mut rng, 1.0);
    let grads: Vec<Vec<Vec<f64>>> = (0..3).map(|_| draw(&mut rng, 2.0)).collect();
    for nesterov in [false, true] {
        let chain = Chain(vec![
            Transform::ClipByValue(1.5),
            Transform::Trace {
                decay: 0.9,
                nesterov,
            },
            Transform::Scale(-0.1),
        ]);
        let got = chain_steps(&chain, &p0, &grads);
        let mut p = p0.clone();
        let mut trace: Vec<Vec<f64>> = p0.iter().map(|r| vec![0.0; r.len()]).collect();
        for (t, gs) in grads.iter().enumerate() {
            for i in 0..p.len() {
                for k in 0..p[i].len() {
                    let g = gs[i][k].clamp(-1.5, 1.5);
                    trace[i][k] = 0.9 * trace[i][k] + g;
                    let u = if nesterov {
                        0.9 * trace[i][k] + g
                    } else {
                        trace[i][k]
                    };
                    p[i][k] -= 0.1 * u;
                }
            }
            assert_close(&got[t], &p, &format!("nesterov {nesterov}, step {}", t + 1));
        }
    }
}

#[test]
fn the_schedule_in_the_graph_is_the_host_schedule() {
    for s in [
        WarmupCosine::new(3e-3, 200),
        WarmupCosine {
            warmup_steps: 0,
            ..WarmupCosine::new(1.0, 10)
        },
    ] {
        let g = Graph::new();
        let steps: Vec<f64> = (0..=s.total_steps + 3).map(|t| t as f64).collect();
        let t = g
            .constant(&HostArray::from_vec(&[steps.len()], steps.clone()).unwrap())
            .unwrap();
        g.set_outputs(&[&s.lr_at(&t).unwrap()]).unwrap();
        let got = g.evaluate(&[]).unwrap()[0].to_f64_vec();
        for (k, v) in got.iter().enumerate() {
            let want = s.lr(k as u64);
            assert!(
                (v - want).abs() <= 1e-12 * want.abs().max(1e-3),
                "step {k}: {v} vs {want}"
            );
        }
    }
}

#[test]
fn chains_name_what_does_not_fit() {
    let ints = vec![HostArray::from_vec(&[2], vec![1i32, 2]).unwrap()];
    let chain = Chain(vec![Transform::ScaleByAdam {
        b1: 0.9,
        b2: 0.99,
        eps: 1e-8,
    }]);
    let e = chain.init(&ints).unwrap_err().to_string();
    assert!(e.contains("the parameter `0` is i32"), "{e}");
    let g = Graph::new();
    let p = vec![g.parameter("p", DType::F32, &[2]).unwrap()];
    let empty = std::collections::BTreeMap::new();
    let Err(e) = chain.update(&p, &empty, &p) else {
        panic!("a missing state was taken")
    };
    assert!(e.to_string().contains("the state has no `0.count`"), "{e}");
}
