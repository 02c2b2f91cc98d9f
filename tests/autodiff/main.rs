//! Reverse-mode differentiation: every differentiable primitive's VJP against central finite
//! differences in f64 (evaluated by the interpreter), and the gradient graph compiled by XLA
//! against the interpreter; the conventions at ties; loops and conditionals; errors.

#[path = "../common/mod.rs"]
mod common;
mod conv;
mod forward;
mod remat;

use common::arr;
use stablegraph::ops::{Graph, SortOrder, Tensor};
use stablegraph::{DType, HostArray, Result};

use DType::F64;

/// Builds `build(params)` over parameters shaped like `inputs`, reduces it to
/// `loss = sum(out * r)` with fixed random weights `r`, and checks the gradient of every
/// float input: against central finite differences of the loss (interpreter, f64), and the
/// whole graph compiled by XLA against the interpreter.
fn check(name: &str, inputs: Vec<HostArray>, build: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let g = Graph::new();
    let params: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(i, a)| g.parameter(&format!("p{i}"), a.dtype(), a.dims()).unwrap())
        .collect();
    let out = build(&params).unwrap_or_else(|e| panic!("{name}: build: {e}"));
    assert_eq!(out.dtype(), DType::F64, "{name}: the output must be f64");
    let mut rng = common::Rng::new(name.len() as u64 * 7919 + 1);
    let n: usize = out.dims().iter().product();
    let r: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let r = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(out.dims()), r).unwrap();
    let r = g.constant_array(&r).unwrap();
    let loss = out.mul(&r).unwrap().sum_all().unwrap();
    let float: Vec<usize> = (0..inputs.len())
        .filter(|&i| inputs[i].dtype().is_float())
        .collect();
    let wrt: Vec<&Tensor> = float.iter().map(|&i| &params[i]).collect();
    let grads = loss
        .grad(&wrt)
        .unwrap_or_else(|e| panic!("{name}: grad: {e}"));
    let mut outs = vec![&loss];
    outs.extend(grads.iter());
    g.set_outputs(&outs).unwrap();
    let got = g
        .evaluate(&inputs)
        .unwrap_or_else(|e| panic!("{name}: evaluate: {e}"));

    // Finite differences, on up to 16 elements of each input.
    for (slot, &i) in float.iter().enumerate() {
        let analytic = got[slot + 1].to_f64_vec();
        let x = inputs[i].to_f64_vec();
        let picks: Vec<usize> = if x.len() <= 16 {
            (0..x.len()).collect()
        } else {
            (0..16).map(|_| rng.below(x.len())).collect()
        };
        for e in picks {
            let h = 1e-6 * x[e].abs().max(1.0);
            let at = |delta: f64| -> f64 {
                let mut v = x.clone();
                v[e] += delta;
                let mut ins = inputs.clone();
                ins[i] = HostArray::from_vec(inputs[i].dims(), v).unwrap();
                g.evaluate(&ins).unwrap()[0].to_f64_vec()[0]
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let tol = 1e-6 * analytic[e].abs().max(1.0);
            assert!(
                (fd - analytic[e]).abs() <= tol,
                "{name}: d/d p{i}[{e}]: analytic {} vs finite difference {fd}",
                analytic[e]
            );
        }
    }

    // The same graph compiled.
    let compiled = g
        .compile(&common::client())
        .unwrap_or_else(|e| panic!("{name}: compile: {e}"));
    let run = compiled.run(&inputs).unwrap();
    for (k, (a, b)) in run.iter().zip(&got).enumerate() {
        for (p, q) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
            assert!(
                (p - q).abs() <= 1e-9 * q.abs().max(1.0),
                "{name}: output {k}: compiled {p} vs interpreter {q}"
            );
        }
    }
}

#[test]
fn unary_rules_match_finite_differences() {
    let mut rng = common::Rng::new(1);
    type F = fn(&Tensor) -> Result<Tensor>;
    let cases: [(&str, F, f64, f64); 15] = [
        ("neg", |x| x.neg(), -2.0, 2.0),
        ("abs", |x| x.abs(), 0.1, 2.0),
        ("abs_negative", |x| x.abs(), -2.0, -0.1),
        ("exp", |x| x.exp(), -2.0, 2.0),
        ("expm1", |x| x.expm1(), -1.0, 1.0),
        ("log", |x| x.log(), 0.2, 3.0),
        ("log1p", |x| x.log1p(), -0.5, 2.0),
        ("sqrt", |x| x.sqrt(), 0.2, 3.0),
        ("rsqrt", |x| x.rsqrt(), 0.2, 3.0),
        ("tanh", |x| x.tanh(), -2.0, 2.0),
        ("logistic", |x| x.logistic(), -3.0, 3.0),
        ("sin", |x| x.sin(), -3.0, 3.0),
        ("cos", |x| x.cos(), -3.0, 3.0),
        ("floor", |x| x.floor()?.add(x), 0.1, 0.9),
        ("sign_ceil", |x| x.sign()?.add(&x.ceil()?)?.add(x), 0.1, 0.9),
    ];
    for (name, f, lo, hi) in cases {
        check(name, vec![rng.array(F64, &[2, 3], lo, hi)], |p| f(&p[0]));
    }
}

#[test]
fn binary_rules_match_finite_differences() {
    let mut rng = common::Rng::new(2);
    type F = fn(&Tensor, &Tensor) -> Result<Tensor>;
    type Range = (f64, f64);
    let cases: [(&str, F, Range, Range); 8] = [
        ("add", |a, b| a.add(b), (-2.0, 2.0), (-2.0, 2.0)),
        ("sub", |a, b| a.sub(b), (-2.0, 2.0), (-2.0, 2.0)),
        ("mul", |a, b| a.mul(b), (-2.0, 2.0), (-2.0, 2.0)),
        ("div", |a, b| a.div(b), (-2.0, 2.0), (0.5, 2.0)),
        ("pow", |a, b| a.pow(b), (0.3, 2.0), (-1.5, 2.5)),
        ("max", |a, b| a.maximum(b), (-2.0, 2.0), (-2.0, 2.0)),
        ("min", |a, b| a.minimum(b), (-2.0, 2.0), (-2.0, 2.0)),
        ("rem", |a, b| a.rem(b), (-3.0, 3.0), (1.1, 1.9)),
    ];
    for (name, f, (alo, ahi), (blo, bhi)) in cases {
        let a = rng.array(F64, &[3, 4], alo, ahi);
        let b = rng.array(F64, &[3, 4], blo, bhi);
        check(name, vec![a, b], |p| f(&p[0], &p[1]));
    }
    // Broadcasting operands go through broadcast_in_dim (new and stretched dimensions).
    let a = rng.array(F64, &[3, 1], -1.0, 1.0);
    let b = rng.array(F64, &[4], -1.0, 1.0);
    check("broadcast_mul", vec![a, b], |p| p[0].mul(&p[1])?.add(&p[0]));
}

#[test]
fn select_clamp_and_converts() {
    let mut rng = common::Rng::new(3);
    let x = rng.array(F64, &[4, 3], -1.0, 1.0);
    let y = rng.array(F64, &[4, 3], -1.0, 1.0);
    check("select", vec![x.clone(), y.clone()], |p| {
        p[0].gt(0.0)?.select(&p[0].mul(&p[1])?, &p[1].exp()?)
    });
    let lo = rng.array(F64, &[4, 3], -0.6, -0.2);
    let hi = rng.array(F64, &[4, 3], 0.2, 0.6);
    check("clamp", vec![lo, x.clone(), hi], |p| {
        p[1].clamp(&p[0], &p[2])
    });
    // Through f32 and back: the cotangent is converted back (the f32 rounding is below the
    // finite-difference step only for the formula, so this one checks the formula).
    let g = Graph::new();
    let p = g.parameter("x", DType::F64, &[3]).unwrap();
    for mid in [DType::F32, DType::BF16, DType::F16] {
        let y = p
            .astype(mid)
            .unwrap()
            .mul(3.0)
            .unwrap()
            .astype(DType::F64)
            .unwrap();
        let loss = y.sum_all().unwrap();
        let d = loss.grad(&[&p]).unwrap().remove(0);
        g.set_outputs(&[&d]).unwrap();
        let input = HostArray::from_vec(&[3], vec![0.5f64, -1.25, 2.0]).unwrap();
        let got = g.evaluate(std::slice::from_ref(&input)).unwrap()[0].to_f64_vec();
        assert_eq!(got, [3.0; 3], "through {mid}");
        let run = g.compile(&common::client()).unwrap().run(&[input]).unwrap();
        assert_eq!(run[0].to_f64_vec(), [3.0; 3], "through {mid}, compiled");
    }
    // Integer conversions stop the flow: zero gradient.
    let g = Graph::new();
    let p = g.parameter("x", DType::F64, &[2]).unwrap();
    let loss = p
        .astype(DType::I32)
        .unwrap()
        .astype(DType::F64)
        .unwrap()
        .sum_all()
        .unwrap();
    let d = loss.grad(&[&p]).unwrap().remove(0);
    g.set_outputs(&[&d]).unwrap();
    let out = g
        .evaluate(&[HostArray::from_vec(&[2], vec![1.5f64, 2.5]).unwrap()])
        .unwrap();
    assert_eq!(out[0].to_f64_vec(), [0.0, 0.0]);
}

#[test]
fn shape_rules_match_finite_differences() {
    let mut rng = common::Rng::new(4);
    let x = || common::Rng::new(40).array(F64, &[3, 4], -1.0, 1.0);
    check("reshape", vec![x()], |p| p[0].reshape(&[2, 6])?.exp());
    check(
        "transpose",
        vec![rng.array(F64, &[2, 3, 4], -1.0, 1.0)],
        |p| p[0].transpose(&[2, 0, 1])?.tanh(),
    );
    check(
        "strided_slice",
        vec![rng.array(F64, &[5, 7], -1.0, 1.0)],
        |p| p[0].slice_all(&[1, 0], &[5, 7], &[2, 3])?.exp(),
    );
    check("pad", vec![x(), rng.array(F64, &[], -1.0, 1.0)], |p| {
        p[0].pad(&[1, -1], &[-2, 2], &[2, 1], &p[1])?.sin()
    });
    check(
        "concat",
        vec![x(), rng.array(F64, &[3, 2], -1.0, 1.0), x()],
        |p| Tensor::concat(&[&p[0], &p[1], &p[2].mul(&p[2])?], 1),
    );
    check("flip", vec![x()], |p| p[0].flip(&[0, 1])?.mul(&p[0]));
    // dynamic_slice and its update, with one start clamped (5 -> 1).
    check(
        "dynamic_slice",
        vec![x(), arr(&[], vec![1]), arr(&[], vec![5])],
        |p| p[0].dynamic_slice(&[&p[1], &p[2]], &[2, 3])?.exp(),
    );
    check(
        "dynamic_update_slice",
        vec![
            x(),
            rng.array(F64, &[2, 2], -1.0, 1.0),
            arr(&[], vec![1]),
            arr(&[], vec![-3]),
        ],
        |p| {
            p[0].dynamic_update_slice(&p[1].mul(&p[1])?, &[&p[2], &p[3]])?
                .mul(&p[0])
        },
    );
    check("expand_squeeze", vec![x()], |p| {
        p[0].expand_dims(1)?
            .broadcast_to(&[3, 5, 4])?
            .sum(&[0])?
            .exp()
    });
}

#[test]
fn reduction_rules_match_finite_differences() {
    let mut rng = common::Rng::new(5);
    let x = rng.array(F64, &[3, 4, 2], -1.0, 1.0);
    check("sum", vec![x.clone()], |p| p[0].sum(&[0, 2])?.exp());
    check("max", vec![x.clone()], |p| p[0].max(&[1])?.mul(2.0));
    check("min", vec![x.clone()], |p| p[0].min(&[0, 1])?.mul(2.0));
    check("prod", vec![x.clone()], |p| p[0].prod(&[1]));
    // Rows with no zero, one zero and two zeros: the product of the others, exactly.
    let z = HostArray::from_vec(
        &[3, 3],
        vec![0.5f64, -2.0, 1.5, 0.0, 3.0, -0.5, 0.0, 2.0, 0.0],
    )
    .unwrap();
    check("prod_with_zeros", vec![z], |p| p[0].prod(&[1]));
    check("cumsum", vec![x.clone()], |p| p[0].cumsum(1)?.mul(&p[0]));
    check("mean_var", vec![x.clone()], |p| {
        p[0].var(&[1])?
            .add(&p[0].mean(&[2])?.sum(&[1])?.expand_dims(1)?)
    });
    check("logsumexp", vec![x], |p| p[0].logsumexp(&[1]));
}

#[test]
fn dot_general_rules_match_finite_differences() {
    let mut rng = common::Rng::new(6);
    let mut a = |d: &[usize]| rng.array(F64, d, -1.0, 1.0);
    check("matmul", vec![a(&[3, 4]), a(&[4, 5])], |p| {
        p[0].matmul(&p[1])
    });
    check("batched", vec![a(&[2, 3, 4]), a(&[2, 4, 5])], |p| {
        p[0].dot_general(&p[1], &[(0, 0)], &[(2, 1)])
    });
    check(
        "two_contractions",
        vec![a(&[2, 3, 4]), a(&[4, 3, 5])],
        |p| p[0].dot_general(&p[1], &[], &[(1, 1), (2, 0)]),
    );
    check("permuted_batch", vec![a(&[3, 2, 4]), a(&[4, 2, 5])], |p| {
        p[0].dot_general(&p[1], &[(1, 1)], &[(2, 0)])
    });
    check(
        "two_batch_reversed",
        vec![a(&[2, 3, 4, 5]), a(&[3, 5, 2, 6])],
        |p| p[0].dot_general(&p[1], &[(1, 0), (0, 2)], &[(3, 1)]),
    );
    check("outer", vec![a(&[3]), a(&[2, 2])], |p| {
        p[0].dot_general(&p[1], &[], &[])
    });
    check(
        "einsum_ssd",
        vec![
            a(&[1, 2, 3, 2, 4]),
            a(&[1, 2, 3, 2, 4]),
            a(&[1, 2, 2, 3, 3]),
        ],
        |p| Tensor::einsum("bclhn,bcshn,bhcls->bclhs", &[&p[0], &p[1], &p[2]]),
    );
}

#[test]
fn gather_and_sort_rules_match_finite_differences() {
    let mut rng = common::Rng::new(7);
    // Repeated rows and out-of-range indices (clamped as the gather clamps them).
    check(
        "take",
        vec![
            rng.array(F64, &[5, 3], -1.0, 1.0),
            arr(&[2, 4], vec![0, 4, 4, 2, 7, -1, 2, 2]),
        ],
        |p| p[0].take(&p[1])?.exp(),
    );
    check(
        "index_add",
        vec![
            rng.array(F64, &[4, 2], -1.0, 1.0),
            arr(&[3], vec![1, 3, 1]),
            rng.array(F64, &[3, 2], -1.0, 1.0),
        ],
        |p| p[0].index_add(&p[1], &p[2].exp()?)?.sin(),
    );
    // Distinct rows: of repeated ones the kept update is unspecified.
    check(
        "index_set",
        vec![
            rng.array(F64, &[4, 2], -1.0, 1.0),
            arr(&[3], vec![1, 3, -5]),
            rng.array(F64, &[3, 2], -1.0, 1.0),
        ],
        |p| p[0].index_set(&p[1], &p[2].exp()?)?.sin()?.mul(&p[0]),
    );
    check(
        "take_along_axis",
        vec![
            rng.array(F64, &[3, 6], -1.0, 1.0),
            arr(&[3, 2], vec![0, 5, 3, 3, 1, 2]),
        ],
        |p| p[0].log_softmax(-1)?.take_along_axis(&p[1], -1),
    );
    check("sort", vec![rng.array(F64, &[3, 5], -1.0, 1.0)], |p| {
        p[0].sort(1, SortOrder::Descending)?.mul(&p[0].exp()?)
    });
    check("top_k", vec![rng.array(F64, &[2, 6], -1.0, 1.0)], |p| {
        Ok(p[0].top_k(3)?.0)
    });
}

#[test]
fn composites_match_finite_differences() {
    let mut rng = common::Rng::new(8);
    let x = rng.array(F64, &[2, 5], -2.0, 2.0);
    check("softmax", vec![x.clone()], |p| p[0].softmax(-1));
    check("softplus_silu_gelu", vec![x.clone()], |p| {
        p[0].softplus()?.add(&p[0].silu()?)?.add(&p[0].gelu()?)
    });
    check(
        "layer_norm",
        vec![
            x.clone(),
            rng.array(F64, &[5], 0.5, 1.5),
            rng.array(F64, &[5], -0.5, 0.5),
        ],
        |p| p[0].layer_norm(&[-1], Some(&p[1]), Some(&p[2]), 1e-5),
    );
    check("rms_norm", vec![x, rng.array(F64, &[5], 0.5, 1.5)], |p| {
        p[0].rms_norm(&[-1], Some(&p[1]), 1e-5)
    });
    check(
        "causal_conv1d",
        vec![
            rng.array(F64, &[2, 6, 3], -1.0, 1.0),
            rng.array(F64, &[3, 4], -1.0, 1.0),
            rng.array(F64, &[3], -1.0, 1.0),
        ],
        |p| p[0].causal_conv1d(&p[1], Some(&p[2])),
    );
    // The decay matrix of the SSD: exp of a segment sum under a causal mask (-inf above).
    check(
        "masked_exp_segsum",
        vec![rng.array(F64, &[2, 4], -1.0, 0.0)],
        |p| {
            let cs = p[0].cumsum(-1)?;
            let seg = cs.expand_dims(-1)?.sub(&cs.expand_dims(-2)?)?;
            p[0].graph()
                .tril_mask(4, 4, 0)?
                .select(&seg, f64::NEG_INFINITY)?
                .exp()
        },
    );
}

#[test]
fn fori_loop_is_differentiated_through_its_stored_carries() {
    let mut rng = common::Rng::new(9);
    // h_t = tanh(W h_{t-1} + x_t), 5 steps, W captured from outside the loop.
    check(
        "fori_rnn",
        vec![
            rng.array(F64, &[3], -1.0, 1.0),
            rng.array(F64, &[3, 3], -0.8, 0.8),
            rng.array(F64, &[5, 3], -1.0, 1.0),
        ],
        |p| {
            let g = p[0].graph();
            let zero = g.scalar_i64(0)?;
            let (h, acc) = g.fori_loop(
                0,
                5,
                &(p[0].clone(), g.zeros(DType::F64, &[])?),
                |t, (h, acc)| {
                    let x = p[2].dynamic_slice(&[t, &zero], &[1, 3])?.reshape(&[3])?;
                    let h = p[1].matmul(h)?.add(&x)?.tanh()?;
                    Ok((h.clone(), acc.add(&h.sum_all()?)?))
                },
            )?;
            h.mul(&acc)
        },
    );
    // scan is a fori_loop too; zero trips pass the cotangent straight through.
    check(
        "scan",
        vec![
            rng.array(F64, &[4, 2], -1.0, 1.0),
            rng.array(F64, &[2], -1.0, 1.0),
        ],
        |p| {
            let (h, hs) = p[0].graph().scan(&p[1], &p[0], |h, x| {
                let h = h.mul(x)?.sin()?.add(x)?;
                Ok((h.clone(), h))
            })?;
            hs.sum(&[0])?.mul(&h)
        },
    );
    check("zero_trips", vec![rng.array(F64, &[2], -1.0, 1.0)], |p| {
        let g = p[0].graph();
        g.fori_loop(3, 3, &p[0], |_, h| h.exp())?.mul(&p[0])
    });
}

#[test]
fn cond_and_switch_are_differentiated_through_the_taken_branch() {
    let mut rng = common::Rng::new(17);
    // Each branch taken in turn: the predicate is the sign of p0's sum.
    for (name, lo, hi) in [("cond_true", 0.2, 1.0), ("cond_false", -1.0, -0.2)] {
        check(
            name,
            vec![
                rng.array(F64, &[3], lo, hi),
                rng.array(F64, &[3], -1.0, 1.0),
            ],
            |p| {
                let g = p[0].graph();
                let pred = p[0].sum_all()?.gt(0.0)?;
                let (a, b) = (&p[0], &p[1]);
                // `b` captured by one branch, an operand of neither.
                g.cond(&pred, a, |a| a.mul(&b.sin()?), |a| a.exp()?.add(a))
            },
        );
    }
    // switch over three branches with two outputs, the index an i32 input (clamped).
    for index in [-1i32, 1, 2, 5] {
        check(
            &format!("switch_{index}"),
            vec![
                rng.array(F64, &[2, 2], -1.0, 1.0),
                rng.array(F64, &[2], -1.0, 1.0),
                HostArray::scalar(index),
            ],
            |p| {
                let g = p[0].graph();
                let branches: [stablegraph::ops::Branch<'_, (Tensor, Tensor), (Tensor, Tensor)>;
                    3] = [
                    &|(m, v)| Ok((m.matmul(v)?, v.tanh()?)),
                    &|(m, v)| Ok((m.sum(&[0])?.mul(v)?, v.mul(v)?)),
                    &|(m, v)| Ok((v.exp()?, m.sum(&[1])?)),
                ];
                let (y, z) = g.switch(&p[2], &(p[0].clone(), p[1].clone()), &branches)?;
                y.mul(&z)
            },
        );
    }
    // A cond inside a differentiated loop body, and a switch nested in a cond.
    check(
        "cond_in_loop",
        vec![
            rng.array(F64, &[3], -1.0, 1.0),
            rng.array(F64, &[3], -1.0, 1.0),
        ],
        |p| {
            let g = p[0].graph();
            g.fori_loop(0, 5, &p[0], |t, h| {
                let odd = t.rem(2)?.eq(1)?;
                g.cond(
                    &odd,
                    h,
                    |h| h.mul(&p[1])?.sin(),
                    |h| {
                        let which = t.div(2)?;
                        let branches: [stablegraph::ops::Branch<'_, Tensor, Tensor>; 2] =
                            [&|h| h.add(&p[1])?.tanh(), &|h| h.mul(h)?.mul(0.5)];
                        g.switch(&which, h, &branches)
                    },
                )
            })
        },
    );
}

#[test]
fn gradients_inside_a_loop_body_match_the_unrolled_steps() {
    // Three steps of gradient descent on f(x) = sum((x - c)^2 x) inside one fori_loop,
    // against the same steps unrolled.
    let g = Graph::new();
    let x0 = g.parameter("x", DType::F64, &[3]).unwrap();
    let c = g.parameter("c", DType::F64, &[3]).unwrap();
    let step = |x: &Tensor| -> Result<Tensor> {
        let f = x.sub(&c)?.square()?.mul(x)?.sum_all()?;
        let d = f.grad(&[x])?.remove(0);
        x.sub(&d.mul(0.1)?)
    };
    let looped = g.fori_loop(0, 3, &x0, |_, x| step(x)).unwrap();
    let mut unrolled = x0.clone();
    for _ in 0..3 {
        unrolled = step(&unrolled).unwrap();
    }
    g.set_outputs(&[&looped, &unrolled]).unwrap();
    let inputs = [
        HostArray::from_vec(&[3], vec![0.5f64, -0.3, 1.2]).unwrap(),
        HostArray::from_vec(&[3], vec![0.1f64, 0.4, -0.2]).unwrap(),
    ];
    let out = g.evaluate(&inputs).unwrap();
    // d/dx (x - c)^2 x = 2 (x - c) x + (x - c)^2, by hand for the first element's first step.
    let (x, cc) = (0.5f64, 0.1f64);
    let first = x - 0.1 * (2.0 * (x - cc) * x + (x - cc).powi(2));
    let (mut xs, cs) = ([0.5f64, -0.3, 1.2], [0.1f64, 0.4, -0.2]);
    for _ in 0..3 {
        for k in 0..3 {
            xs[k] -= 0.1 * (2.0 * (xs[k] - cs[k]) * xs[k] + (xs[k] - cs[k]).powi(2));
        }
    }
    assert!(first < x);
    assert_eq!(out[0].to_f64_vec(), out[1].to_f64_vec());
    common::assert_close(
        &out[0]
            .to_f64_vec()
            .iter()
            .map(|&v| v as f32)
            .collect::<Vec<_>>(),
        &xs.map(|v| v as f32),
        1e-6,
        1e-7,
    );
    let run = g.compile(&common::client()).unwrap().run(&inputs).unwrap();
    assert!(common::array_diff(&run[0], &out[0]) < 1e-12);
}

#[test]
fn ties_are_shared_evenly() {
    let g = Graph::new();
    let a = g.parameter("a", DType::F32, &[3]).unwrap();
    let b = g.parameter("b", DType::F32, &[3]).unwrap();
    let loss = a.maximum(&b).unwrap().sum_all().unwrap();
    let loss = loss.add(a.max(&[0]).unwrap()).unwrap();
    let d = loss.grad(&[&a, &b]).unwrap();
    g.set_outputs(&[&d[0], &d[1]]).unwrap();
    let inputs = [
        HostArray::from_vec(&[3], vec![1.0f32, 3.0, 3.0]).unwrap(),
        HostArray::from_vec(&[3], vec![1.0f32, 0.0, 5.0]).unwrap(),
    ];
    let out = g.evaluate(&inputs).unwrap();
    // max(a, b): tie at 0 (half each), a at 1, b at 2; max over a: tie between 1 and 2.
    assert_eq!(out[0].to_f64_vec(), [0.5, 1.5, 0.5]);
    assert_eq!(out[1].to_f64_vec(), [0.5, 0.0, 1.0]);
    let run = g.compile(&common::client()).unwrap().run(&inputs).unwrap();
    assert_eq!(run[0].to_f64_vec(), out[0].to_f64_vec());
    assert_eq!(run[1].to_f64_vec(), out[1].to_f64_vec());
}

#[test]
fn vjp_sums_over_outputs_and_unused_inputs_get_zeros() {
    let g = Graph::new();
    let x = g.parameter("x", DType::F64, &[2]).unwrap();
    let unused = g.parameter("u", DType::F64, &[2, 2]).unwrap();
    let y1 = x.exp().unwrap();
    let y2 = x.mul(&x).unwrap();
    let c1 = g.full(2.0, DType::F64, &[2]).unwrap();
    let c2 = g.full(-1.0, DType::F64, &[2]).unwrap();
    let d = g.vjp(&[&y1, &y2], &[&c1, &c2], &[&x, &unused]).unwrap();
    g.set_outputs(&[&d[0], &d[1]]).unwrap();
    let out = g
        .evaluate(&[
            HostArray::from_vec(&[2], vec![0.0f64, 1.0]).unwrap(),
            HostArray::from_vec(&[2, 2], vec![1.0f64; 4]).unwrap(),
        ])
        .unwrap();
    let want = [2.0 * 1.0 - 2.0 * 0.0, 2.0 * 1f64.exp() - 2.0];
    assert!(common::max_abs(&out[0].to_f64_vec(), &want) < 1e-12);
    assert_eq!(out[1].to_f64_vec(), [0.0; 4]);
}

#[test]
fn gradients_of_a_sharded_graph_match_the_interpreter() {
    // A layer over a 2-device mesh: x split by rows, w replicated, a constraint in between; the
    // gradient is one more part of the SPMD program.
    use stablegraph::runtime::Client;
    use stablegraph::sharding::{Mesh, PartitionSpec};
    let g = Graph::new();
    g.set_mesh(&Mesh::new(&[("data", 2)]).unwrap());
    let x = g.parameter("x", DType::F32, &[4, 3]).unwrap();
    let w = g.parameter("w", DType::F32, &[3, 5]).unwrap();
    g.shard_parameter(&x, &PartitionSpec::new([Some("data"), None]))
        .unwrap();
    let h = x
        .matmul(&w)
        .unwrap()
        .with_sharding_constraint(&PartitionSpec::new([Some("data"), None]))
        .unwrap()
        .tanh()
        .unwrap();
    let loss = h.square().unwrap().mean_all().unwrap();
    let d = loss.grad(&[&x, &w]).unwrap();
    g.set_outputs(&[&loss, &d[0], &d[1]]).unwrap();
    let mut rng = common::Rng::new(12);
    let inputs = [
        HostArray::from_vec(&[4, 3], rng.f32s(12, -1.0, 1.0)).unwrap(),
        HostArray::from_vec(&[3, 5], rng.f32s(15, -1.0, 1.0)).unwrap(),
    ];
    let want = g.evaluate(&inputs).unwrap();
    let client = Client::cpu_with_devices(2).unwrap();
    let got = g.compile(&client).unwrap().run(&inputs).unwrap();
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(common::array_diff(a, b) < 1e-6, "output {k}");
    }
}
