//! AdamW as a graph against an independent f64 host implementation of PyTorch's formulas
//! (`torch.optim.AdamW` and `torch.nn.utils.clip_grad_norm_`), over several steps, with the
//! clipping active and inactive, a runtime learning rate and a constant one.

mod common;

use stablegraph::ops::{Graph, Tensor};
use stablegraph::optim::{global_norm, AdamW};
use stablegraph::{CompiledGraph, DType, HostArray};

/// The shapes of the test's parameters and whether each is decayed.
const SHAPES: [(&[usize], bool); 3] = [(&[3, 4], true), (&[5], false), (&[2, 2, 2], true)];

/// PyTorch's AdamW step in f64, written from its documentation: clip (global norm, factor
/// `min(1, clip / (norm + 1e-6))`), decoupled decay, moments, bias corrections, update.
#[allow(clippy::too_many_arguments)]
fn host_step(
    opt: &AdamW,
    params: &mut [Vec<f64>],
    grads: &[Vec<f64>],
    m: &mut [Vec<f64>],
    v: &mut [Vec<f64>],
    decay: &[bool],
    t: i32,
    lr: f64,
) -> f64 {
    let norm = grads.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
    let coef = match opt.clip_norm {
        Some(c) => (c / (norm + 1e-6)).min(1.0),
        None => 1.0,
    };
    let bc1 = 1.0 - opt.beta1.powi(t);
    let bc2 = 1.0 - opt.beta2.powi(t);
    for i in 0..params.len() {
        for k in 0..params[i].len() {
            let g = grads[i][k] * coef;
            let mut p = params[i][k];
            if decay[i] {
                p *= 1.0 - lr * opt.weight_decay;
            }
            m[i][k] = opt.beta1 * m[i][k] + (1.0 - opt.beta1) * g;
            v[i][k] = opt.beta2 * v[i][k] + (1.0 - opt.beta2) * g * g;
            let denom = v[i][k].sqrt() / bc2.sqrt() + opt.eps;
            params[i][k] = p - lr / bc1 * m[i][k] / denom;
        }
    }
    norm
}

/// The update program: parameters `p`, `g`, `m`, `v` per tensor, then `step` (i32) and, with
/// `runtime_lr`, `lr` (f32); outputs the new `p`, `m`, `v` and the global norm of `g`.
fn program(opt: &AdamW, runtime_lr: bool) -> (Graph, CompiledGraph) {
    let g = Graph::new();
    let mut lists: [Vec<Tensor>; 4] = Default::default();
    for (name, list) in ["p", "g", "m", "v"].iter().zip(&mut lists) {
        for (i, (dims, _)) in SHAPES.iter().enumerate() {
            list.push(
                g.parameter(&format!("{name}{i}"), DType::F32, dims)
                    .unwrap(),
            );
        }
    }
    let step = g.parameter("step", DType::I32, &[]).unwrap();
    let lr = runtime_lr.then(|| g.parameter("lr", DType::F32, &[]).unwrap());
    let decay: Vec<bool> = SHAPES.iter().map(|s| s.1).collect();
    let [p, grads, m, v] = &lists;
    let (p, m, v) = opt
        .update(p, grads, m, v, &decay, &step, lr.as_ref())
        .unwrap();
    let norm = global_norm(grads).unwrap();
    let mut outs: Vec<&Tensor> = p.iter().chain(&m).chain(&v).collect();
    outs.push(&norm);
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

/// Runs `steps` steps of `opt` on the device and on the host from the same start, with
/// gradients scaled by `grad_scale`, comparing parameters and moments after every step; returns
/// the global gradient norms seen.
fn run_against_host(opt: &AdamW, runtime_lr: bool, grad_scale: f64, steps: i32) -> Vec<f64> {
    let (graph, compiled) = program(opt, runtime_lr);
    let mut rng = common::Rng::new(7);
    let sizes: Vec<usize> = SHAPES.iter().map(|(d, _)| d.iter().product()).collect();
    let draw = |rng: &mut common::Rng, scale: f64| -> Vec<Vec<f64>> {
        sizes
            .iter()
            .map(|&n| (0..n).map(|_| rng.uniform(-1.0, 1.0) * scale).collect())
            .collect()
    };
    // Host values start as the f32 values the device gets.
    let round = |v: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
        v.into_iter()
            .map(|r| r.into_iter().map(|x| f64::from(x as f32)).collect())
            .collect()
    };
    let mut p = round(draw(&mut rng, 1.0));
    let mut m: Vec<Vec<f64>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let mut v = m.clone();
    let (mut dp, mut dm, mut dv) = (arrays(&p), arrays(&m), arrays(&v));
    let decay: Vec<bool> = SHAPES.iter().map(|s| s.1).collect();
    let mut norms = Vec::new();
    for t in 1..=steps {
        let grads = round(draw(&mut rng, grad_scale));
        let lr = if runtime_lr {
            f64::from((0.05 / f64::from(t)) as f32)
        } else {
            opt.lr
        };
        let mut inputs: Vec<HostArray> = dp.clone();
        inputs.extend(arrays(&grads));
        inputs.extend(dm.clone());
        inputs.extend(dv.clone());
        inputs.push(HostArray::scalar(t));
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
        let norm = host_step(opt, &mut p, &grads, &mut m, &mut v, &decay, t, lr);
        let n = SHAPES.len();
        let device_norm = out[3 * n].to_f64_vec()[0];
        assert!(
            (device_norm - norm).abs() <= 1e-5 * norm,
            "step {t}: global norm {device_norm} vs {norm}"
        );
        norms.push(norm);
        for (what, got, want, tol) in [
            ("params", &out[..n], &p, 2e-6),
            ("m", &out[n..2 * n], &m, 1e-6 * grad_scale),
            ("v", &out[2 * n..3 * n], &v, 1e-6 * grad_scale * grad_scale),
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
        dp = out[..n].to_vec();
        dm = out[n..2 * n].to_vec();
        dv = out[2 * n..3 * n].to_vec();
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
