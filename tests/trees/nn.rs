//! The nn layers against host formulas (PyTorch's definitions), their initial values against
//! PyTorch's bounds, and AdamW over a tree against the same update over flat parameters.

use super::common::{client, vals};
use stablegraph::init::Init;
use stablegraph::jit::jit;
use stablegraph::nn::{Activation, Conv2d, Embedding, LayerNorm, Linear, Mlp, RmsNorm};
use stablegraph::ops::{ConvOptions, Graph, Tensor};
use stablegraph::optim::{AdamW, AdamWState, AdamWTree, ParamState};
use stablegraph::rng::SplitMix64;
use stablegraph::tree::{self, Tree};
use stablegraph::HostArray;

/// Every layer of the module, one of each.
#[derive(Tree)]
struct Zoo<T> {
    embed: Embedding<T>,
    linear: Linear<T>,
    ln: LayerNorm<T>,
    rms: RmsNorm<T>,
    mlp: Mlp<T>,
    conv: Conv2d<T>,
}

fn zoo(seed: u64) -> Zoo<HostArray> {
    let key = &mut SplitMix64::new(seed);
    let mut ln = LayerNorm::init(3, true).unwrap();
    // Not the identity: scale and shift that the test can see.
    ln.weight = Some(HostArray::from_vec(&[3], vec![1.5f32, -1.0, 0.5]).unwrap());
    ln.bias = Some(HostArray::from_vec(&[3], vec![0.1f32, 0.2, 0.3]).unwrap());
    Zoo {
        embed: Embedding::init(5, 3, key).unwrap(),
        linear: Linear::init(3, 2, true, key).unwrap(),
        ln,
        rms: RmsNorm::init(3, true).unwrap(),
        mlp: Mlp::init(&[3, 4, 2], Activation::Tanh, key).unwrap(),
        conv: Conv2d::init(
            2,
            4,
            [2, 2],
            ConvOptions {
                feature_group_count: 2,
                ..ConvOptions::default()
            },
            false,
            key,
        )
        .unwrap(),
    }
}

#[test]
fn initial_values_follow_pytorch_and_the_seed() {
    let a = zoo(7);
    assert_eq!(
        a.paths(),
        [
            "embed.weight",
            "linear.weight",
            "linear.bias",
            "ln.weight",
            "ln.bias",
            "rms.weight",
            "mlp.layers.0.weight",
            "mlp.layers.0.bias",
            "mlp.layers.1.weight",
            "mlp.layers.1.bias",
            "conv.weight"
        ]
    );
    // Uniform in ±1/sqrt(fan_in): 3 inputs for the linear layer, 1 x 2 x 2 for the grouped conv.
    let bound = |a: &HostArray, b: f64| a.to_f64_vec().iter().all(|v| v.abs() <= b);
    assert!(bound(&a.linear.weight, 1.0 / 3f64.sqrt()));
    assert!(bound(a.linear.bias.as_ref().unwrap(), 1.0 / 3f64.sqrt()));
    assert_eq!(a.conv.weight.dims(), &[4, 1, 2, 2]);
    assert!(bound(&a.conv.weight, 0.5));
    assert_eq!(vals::<f32>(a.rms.weight.as_ref().unwrap()), [1.0; 3]);
    // The same seed gives the same values; each parameter draws its own.
    let b = zoo(7);
    assert_eq!(a.linear.weight.to_bytes(), b.linear.weight.to_bytes());
    assert_ne!(a.linear.weight.to_bytes(), zoo(8).linear.weight.to_bytes());
    assert_ne!(
        a.mlp.layers[0].weight.to_bytes()[..24],
        a.linear.weight.to_bytes()[..24]
    );
    let bad = Conv2d::init(
        3,
        4,
        [1, 1],
        ConvOptions {
            feature_group_count: 2,
            ..ConvOptions::default()
        },
        true,
        &mut SplitMix64::new(0),
    );
    assert!(bad
        .unwrap_err()
        .to_string()
        .contains("2 groups do not divide 3 input"));
    assert!(Mlp::init(&[3], Activation::Relu, &mut SplitMix64::new(0)).is_err());
}

/// `x @ W^T + b` rows on the host.
fn linear(w: &[f64], b: &[f64], x: &[f64], n_in: usize) -> Vec<f64> {
    let n_out = b.len();
    x.chunks(n_in)
        .flat_map(|row| {
            (0..n_out).map(move |o| (0..n_in).map(|i| row[i] * w[o * n_in + i]).sum::<f64>() + b[o])
        })
        .collect()
}

#[test]
fn layers_compute_pytorchs_formulas() {
    let c = client();
    let p = zoo(3);
    let ids = HostArray::from_vec(&[2], vec![4i32, 1]).unwrap();
    let x = HostArray::from_vec(&[2, 3], vec![0.5f32, -1.0, 2.0, 0.0, 1.5, -0.5]).unwrap();
    let image = HostArray::from_vec(
        &[1, 2, 3, 3],
        (0..18).map(|i| (i as f32 * 0.7).sin()).collect(),
    )
    .unwrap();
    let f = jit(
        &c,
        |(p, ids, x, image): (Zoo<Tensor>, Tensor, Tensor, Tensor)| {
            Ok(vec![
                p.embed.forward(&ids)?,
                p.linear.forward(&x)?,
                p.ln.forward(&x)?,
                p.rms.forward(&x)?,
                p.mlp.forward(&x)?,
                p.conv.forward(&image)?,
            ])
        },
    );
    let out = f
        .call(
            &tree::upload(
                &c,
                &(
                    tree::download(&tree::upload(&c, &p).unwrap()).unwrap(),
                    ids,
                    x.clone(),
                    image.clone(),
                ),
            )
            .unwrap(),
        )
        .unwrap();
    let got: Vec<Vec<f64>> = out
        .iter()
        .map(|b| b.to_host_array().unwrap().to_f64_vec())
        .collect();
    let close = |a: &[f64], b: &[f64], what: &str| {
        assert_eq!(a.len(), b.len(), "{what}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{what}: {a:?} against {b:?}");
        }
    };
    let e = p.embed.weight.to_f64_vec();
    close(&got[0], &[&e[12..15], &e[3..6]].concat(), "embedding");
    let xs = x.to_f64_vec();
    let (w, b) = (
        p.linear.weight.to_f64_vec(),
        p.linear.bias.as_ref().unwrap().to_f64_vec(),
    );
    close(&got[1], &linear(&w, &b, &xs, 3), "linear");
    let (g, s) = (
        p.ln.weight.as_ref().unwrap().to_f64_vec(),
        p.ln.bias.as_ref().unwrap().to_f64_vec(),
    );
    let (g, s) = (&g, &s);
    let ln: Vec<f64> = xs
        .chunks(3)
        .flat_map(|r| {
            let mean = r.iter().sum::<f64>() / 3.0;
            let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 3.0;
            (0..3)
                .map(move |i| (r[i] - mean) / (var + 1e-5).sqrt() * g[i] + s[i])
                .collect::<Vec<_>>()
        })
        .collect();
    close(&got[2], &ln, "layer_norm");
    let rms: Vec<f64> = xs
        .chunks(3)
        .flat_map(|r| {
            let ms = r.iter().map(|v| v * v).sum::<f64>() / 3.0;
            r.iter()
                .map(move |v| v / (ms + 1e-6).sqrt())
                .collect::<Vec<_>>()
        })
        .collect();
    close(&got[3], &rms, "rms_norm");
    let l = &p.mlp.layers;
    let h: Vec<f64> = linear(
        &l[0].weight.to_f64_vec(),
        &l[0].bias.as_ref().unwrap().to_f64_vec(),
        &xs,
        3,
    )
    .iter()
    .map(|v| v.tanh())
    .collect();
    close(
        &got[4],
        &linear(
            &l[1].weight.to_f64_vec(),
            &l[1].bias.as_ref().unwrap().to_f64_vec(),
            &h,
            4,
        ),
        "mlp",
    );
    // The grouped 2x2 convolution: output channel o reads input channel o / 2.
    let (k, im) = (p.conv.weight.to_f64_vec(), image.to_f64_vec());
    let mut conv = Vec::new();
    for o in 0..4 {
        for y in 0..2 {
            for x in 0..2 {
                conv.push(
                    (0..4)
                        .map(|t| k[o * 4 + t] * im[(o / 2) * 9 + (y + t / 2) * 3 + x + t % 2])
                        .sum::<f64>(),
                );
            }
        }
    }
    close(&got[5], &conv, "conv2d");
}

#[test]
fn adamw_over_a_tree_is_the_flat_update() {
    let p = zoo(5);
    let opt = AdamW {
        lr: 0.1,
        clip_norm: Some(0.5),
        ..AdamW::default()
    };
    let state0 = opt.init(&p).unwrap();
    assert_eq!(state0.paths().last().map(String::as_str), Some("step"));
    assert_eq!(state0.m.paths(), p.paths());
    // Two steps of the tree form and of the flat form on the same loss, in one graph each.
    let run = |tree_form: bool| -> Vec<HostArray> {
        let g = Graph::new();
        let params = p
            .try_map(|path, a| g.parameter(path, a.dtype(), a.dims()))
            .unwrap();
        let mut state: AdamWTree<Zoo<Tensor>, Tensor> = state0
            .try_map(|path, a| g.parameter(&format!("s.{path}"), a.dtype(), a.dims()))
            .unwrap();
        let mut params = params;
        let x = g
            .constant(
                &HostArray::from_vec(&[2, 3], vec![0.5f32, -1.0, 2.0, 0.0, 1.5, -0.5]).unwrap(),
            )
            .unwrap();
        let loss = |q: &Zoo<Tensor>| -> stablegraph::Result<Tensor> {
            let h = q.rms.forward(&q.ln.forward(&x)?)?;
            q.mlp
                .forward(&h)?
                .square()?
                .sum_all()?
                .add(&q.linear.forward(&x)?.square()?.sum_all()?)
        };
        for _ in 0..2 {
            let l = loss(&params).unwrap();
            if tree_form {
                let grads = l.grad_tree(&params).unwrap();
                (params, state) = opt.apply(&params, &grads, &state, None).unwrap();
            } else {
                let grads = l.grad(&params.leaves()).unwrap();
                let flat = AdamWState {
                    params: params
                        .named()
                        .into_iter()
                        .zip(state.m.leaves().into_iter().zip(state.v.leaves()))
                        .map(|((_, q), (m, v))| ParamState {
                            param: q.clone(),
                            m: m.clone(),
                            v: v.clone(),
                            decay: q.rank() >= 2,
                        })
                        .collect(),
                    step: state.step.clone(),
                };
                let next = opt.update(&flat, &grads, None).unwrap();
                params = params
                    .rebuild(next.params.iter().map(|s| s.param.clone()))
                    .unwrap();
                state = AdamWTree {
                    m: state
                        .m
                        .rebuild(next.params.iter().map(|s| s.m.clone()))
                        .unwrap(),
                    v: state
                        .v
                        .rebuild(next.params.iter().map(|s| s.v.clone()))
                        .unwrap(),
                    step: next.step,
                };
            }
        }
        let outs: Vec<Tensor> = params
            .flatten()
            .into_iter()
            .chain(state.flatten())
            .collect();
        g.set_outputs(&outs.iter().collect::<Vec<_>>()).unwrap();
        let inputs: Vec<HostArray> = p.flatten().into_iter().chain(state0.flatten()).collect();
        g.evaluate(&inputs).unwrap()
    };
    let (a, b) = (run(true), run(false));
    assert_eq!(a.len(), 2 * p.leaf_count() + p.leaf_count() + 1);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.to_bytes(), y.to_bytes());
    }
    // The parameters moved, and the step count is 2.
    assert_ne!(a[1].to_bytes(), p.linear.weight.to_bytes());
    assert_eq!(a.last().unwrap().to_f64_vec(), [2.0]);
    // Moments of another structure are refused, naming the path.
    let g = Graph::new();
    let params = p
        .try_map(|path, a| g.parameter(path, a.dtype(), a.dims()))
        .unwrap();
    let mut state = opt
        .init(&params)
        .unwrap()
        .try_map(|_, a| g.constant(a))
        .unwrap();
    state.m.linear.bias = None;
    let Err(err) = opt.apply(&params, &params, &state, None) else {
        panic!("moments of another structure were taken")
    };
    let err = err.to_string();
    assert!(
        err.contains("params and m") && err.contains("linear.bias"),
        "{err}"
    );
}

#[test]
fn init_refuses_integer_parameters() {
    let p = vec![HostArray::from_vec(&[2], vec![1i32, 2]).unwrap()];
    let err = AdamW::default().init(&p).unwrap_err().to_string();
    assert!(err.contains("the parameter `0` is i32"), "{err}");
}

#[test]
fn layers_take_any_initializer() {
    let key = &mut SplitMix64::new(11);
    let lin = Linear::init_with(
        30,
        20,
        Init::XavierUniform { gain: 1.0 },
        Some(Init::Zeros),
        key,
    )
    .unwrap();
    let bound = (6.0f64 / 50.0).sqrt();
    let w = lin.weight.to_f64_vec();
    assert!(w.iter().all(|v| v.abs() <= bound));
    // Spread over the range, not bunched at zero.
    assert!(w.iter().any(|v| v.abs() > 0.8 * bound));
    assert_eq!(lin.bias.unwrap().to_f64_vec(), vec![0.0; 20]);
    let emb = Embedding::init_with(7, 3, Init::Uniform { lo: 2.0, hi: 3.0 }, key).unwrap();
    assert!(emb
        .weight
        .to_f64_vec()
        .iter()
        .all(|v| (2.0..3.0).contains(v)));
    let conv = Conv2d::init(4, 8, [3, 3], ConvOptions::default(), true, key).unwrap();
    let conv = conv.reinit(Init::Constant(0.5), None, key).unwrap();
    assert_eq!(conv.weight.dims(), &[8, 4, 3, 3]);
    assert!(conv.weight.to_f64_vec().iter().all(|&v| v == 0.5));
    assert!(conv.bias.is_none());
}
