//! Forward mode and what builds on it: `jvp`, `hvp`, `jacfwd` and `jacrev` against JAX's on
//! recorded fixtures (`tests/fixtures/jax/make_fixtures.py`) and against finite differences.

use super::common;
use stablegraph::ops::{Graph, SortOrder, Tensor};
use stablegraph::{DType, HostArray, Result};

use DType::F64;

/// The functions of `tests/fixtures/jax/make_fixtures.py`'s cases, built with the DSL.
fn fixture_function(name: &str, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let g = x.graph();
    match name {
        "plain" => w.matmul(x)?.tanh()?.mul(&x.mul(x)?.sum_all()?),
        "loop" => g.fori_loop(0, 4, x, |_, h| {
            h.mul(1.5)?.add(&w.matmul(h)?)?.sin()?.add(x)
        }),
        "cond_true" | "cond_false" => {
            let pred = x.sum_all()?.gt(0.0)?;
            g.cond(&pred, x, |x| w.matmul(x)?.exp(), |x| x.mul(&w.sum_all()?))
        }
        _ => {
            // switch_0, switch_1, switch_clamped (index 5: the last branch).
            let k = match name {
                "switch_0" => 0.0,
                "switch_1" => 1.0,
                _ => 5.0,
            };
            let branches: [stablegraph::ops::Branch<'_, Tensor, Tensor>; 3] = [
                &|x| w.matmul(x)?.sin(),
                &|x| x.mul(&w.mul(w)?.sum_all()?),
                &|x| x.tanh()?.reshape(&[1, 3])?.matmul(w)?.reshape(&[3]),
            ];
            g.switch(&g.scalar(k, DType::I32)?, x, &branches)
        }
    }
}

#[test]
fn jvp_grad_hvp_and_jacobians_match_jax() {
    let text = std::fs::read_to_string("tests/fixtures/jax/transforms.json").unwrap();
    let fixtures: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = fixtures["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 7);
    for (name, c) in cases {
        let get = |k: &str, dims: &[usize]| {
            let v: Vec<f64> = c[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            HostArray::from_vec(dims, v).unwrap()
        };
        let g = Graph::new();
        let p = |n: &str, dims: &[usize]| g.parameter(n, F64, dims).unwrap();
        let (x, w, tx, tw, vx, r) = (
            p("x", &[3]),
            p("w", &[3, 3]),
            p("tx", &[3]),
            p("tw", &[3, 3]),
            p("vx", &[3]),
            p("r", &[3]),
        );
        let y = fixture_function(name, &x, &w).unwrap();
        let ty = g.jvp(&[&y], &[&x, &w], &[&tx, &tw]).unwrap().remove(0);
        let loss = y.mul(&r).unwrap().sum_all().unwrap();
        let grads = loss.grad(&[&x, &w]).unwrap();
        let hv = loss.hvp(&[&x], &[&vx]).unwrap().remove(0);
        let jac = g.jacfwd(&y, &x).unwrap();
        let jac_rev = g.jacrev(&y, &x).unwrap();
        g.set_outputs(&[&y, &ty, &grads[0], &grads[1], &hv, &jac, &jac_rev])
            .unwrap();
        let inputs = [
            get("x", &[3]),
            get("w", &[3, 3]),
            get("tx", &[3]),
            get("tw", &[3, 3]),
            get("vx", &[3]),
            get("r", &[3]),
        ];
        let host = g.evaluate(&inputs).unwrap();
        let compiled = g.compile(&common::client()).unwrap().run(&inputs).unwrap();
        let keys = ["y", "ty", "gx", "gw", "hvp", "jac", "jac"];
        for (k, key) in keys.iter().enumerate() {
            let want: Vec<f64> = c[*key]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            for (what, got) in [("interpreter", &host[k]), ("compiled", &compiled[k])] {
                let got = got.to_f64_vec();
                assert_eq!(got.len(), want.len(), "{name} {key}");
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        (a - b).abs() <= 1e-10 * b.abs().max(1.0),
                        "{name}: output {k} ({key}, {what}): {got:?} vs JAX {want:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn jvp_and_hvp_match_finite_differences() {
    let mut rng = common::Rng::new(23);
    let x0 = rng.array(F64, &[4], -1.0, 1.0);
    let t0 = rng.array(F64, &[4], -1.0, 1.0);
    let g = Graph::new();
    let x = g.parameter("x", F64, &[4]).unwrap();
    let t = g.parameter("t", F64, &[4]).unwrap();
    // Softmax of a scan's states, a cumulative sum, a sort: several rule families at once.
    let (_, hs) = g
        .scan(
            &x.mul(0.5).unwrap(),
            &x.reshape(&[4, 1]).unwrap(),
            |h, xi| {
                let h = h.mul(xi)?.tanh()?.add(h)?;
                Ok((h.clone(), h))
            },
        )
        .unwrap();
    let y = hs
        .sum(&[0])
        .unwrap()
        .softmax(-1)
        .unwrap()
        .cumsum(0)
        .unwrap()
        .sort(0, SortOrder::Descending)
        .unwrap();
    let loss = y.mul(&y).unwrap().sum_all().unwrap();
    let ty = g.jvp(&[&y], &[&x], &[&t]).unwrap().remove(0);
    let hv = loss.hvp(&[&x], &[&t]).unwrap().remove(0);
    let gx = loss.grad(&[&x]).unwrap().remove(0);
    g.set_outputs(&[&y, &ty, &hv, &gx]).unwrap();
    let at = |delta: f64| {
        let xs: Vec<f64> = x0
            .to_f64_vec()
            .iter()
            .zip(t0.to_f64_vec())
            .map(|(a, b)| a + delta * b)
            .collect();
        g.evaluate(&[HostArray::from_vec(&[4], xs).unwrap(), t0.clone()])
            .unwrap()
    };
    let (plus, minus, here) = (at(1e-6), at(-1e-6), at(0.0));
    // The jvp is y's directional derivative, the hvp the gradient's.
    for (k, got_at, what) in [(0, 1, "jvp of y"), (3, 2, "hvp of the loss")] {
        let fd: Vec<f64> = plus[k]
            .to_f64_vec()
            .iter()
            .zip(minus[k].to_f64_vec())
            .map(|(p, m)| (p - m) / 2e-6)
            .collect();
        let got = here[got_at].to_f64_vec();
        for (a, b) in got.iter().zip(&fd) {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{what}: {got:?} vs {fd:?}"
            );
        }
    }
}

#[test]
fn forward_mode_checks_its_arguments() {
    let g = Graph::new();
    let x = g.parameter("x", F64, &[3]).unwrap();
    let bad = g.parameter("t", DType::F32, &[3]).unwrap();
    let y = x.exp().unwrap();
    let e = g.jvp(&[&y], &[&x], &[&bad]).unwrap_err().to_string();
    assert!(
        e.contains("argument 0 is f64[3] but its entry of tangents is f32[3]"),
        "{e}"
    );
    let e = g.jvp(&[&y], &[&x], &[]).unwrap_err().to_string();
    assert!(
        e.contains("1 values to differentiate by but 0 tangents"),
        "{e}"
    );
    let big = g.parameter("big", F64, &[4097]).unwrap();
    let e = g.jacrev(&big.exp().unwrap(), &big).unwrap_err().to_string();
    assert!(e.contains("4097 elements of the output"), "{e}");
    let e = y.hvp(&[&x], &[&x]).unwrap_err().to_string();
    assert!(e.contains("rank-0 float"), "{e}");
}
