//! `checkpoint` (remat): gradients equal to those without it (interpreted and compiled), with
//! captured weights, several results, an intermediate used after the span and a conditional
//! inside, and inside a loop body reading a captured weight; over a `fori_loop` and a `cond`
//! against JAX's; over `scan` and `fori_loop` stacks of layers (conditionals nested in the
//! body), around the loop or inside its body; the compiled program's temporaries smaller; a
//! loop without a VJP refused when a gradient reaches it, accepted when none does.

use super::common;
use stablegraph::ops::{Graph, Tensor};
use stablegraph::{DType, HostArray, Result};

/// `blocks` residual MLP blocks `h + down(tanh(up(h)))` over `x` `[rows, d]` (hidden `4 d`),
/// each checkpointed when `remat`; the loss is `sum(h²)` plus a term on the first block's
/// hidden activation (an intermediate of a checkpointed span used after it). Outputs: the loss
/// and its gradient with respect to every weight.
fn mlp(remat: bool, blocks: usize, rows: usize, d: usize, dtype: DType) -> Result<Graph> {
    let g = Graph::new();
    let x = g.parameter("x", dtype, &[rows, d])?;
    let mut weights = Vec::new();
    for b in 0..blocks {
        weights.push(g.parameter(&format!("up{b}"), dtype, &[d, 4 * d])?);
        weights.push(g.parameter(&format!("down{b}"), dtype, &[4 * d, d])?);
    }
    let block = |h: &Tensor, b: usize| -> Result<(Tensor, Tensor)> {
        let a = h.matmul(&weights[2 * b])?.tanh()?;
        // A conditional inside the span: odd blocks halve their update.
        let odd = g.scalar(b as f64, DType::I32)?.rem(2)?.eq(1)?;
        let update = a.matmul(&weights[2 * b + 1])?;
        let update = g.cond(&odd, &update, |u| u.mul(0.5), |u| Ok(u.clone()))?;
        Ok((h.add(&update)?, a))
    };
    let mut h = x.clone();
    let mut first_hidden = None;
    for b in 0..blocks {
        let (next, a) = match remat {
            true => g.checkpoint(&h, |h| block(h, b))?,
            false => block(&h, b)?,
        };
        first_hidden.get_or_insert(a);
        h = next;
    }
    let extra = first_hidden.expect("one block at least").sin()?.sum_all()?;
    let loss = h.mul(&h)?.sum_all()?.add(&extra)?;
    let wrt: Vec<&Tensor> = weights.iter().collect();
    let grads = loss.grad(&wrt)?;
    let mut outs = vec![&loss];
    outs.extend(grads.iter());
    g.set_outputs(&outs)?;
    Ok(g)
}

fn inputs(blocks: usize, rows: usize, d: usize, dtype: DType) -> Vec<HostArray> {
    let mut rng = common::Rng::new(77);
    let mut ins = vec![rng.array(dtype, &[rows, d], -1.0, 1.0)];
    for _ in 0..blocks {
        ins.push(rng.array(dtype, &[d, 4 * d], -0.3, 0.3));
        ins.push(rng.array(dtype, &[4 * d, d], -0.3, 0.3));
    }
    ins
}

#[test]
fn checkpointed_gradients_equal_plain_ones() -> Result<()> {
    let (blocks, rows, d) = (3, 4, 3);
    let ins = inputs(blocks, rows, d, DType::F64);
    let plain = mlp(false, blocks, rows, d, DType::F64)?;
    let remat = mlp(true, blocks, rows, d, DType::F64)?;
    assert!(remat.to_stablehlo()?.contains("optimization_barrier"));
    assert!(!plain.to_stablehlo()?.contains("optimization_barrier"));
    let want = plain.evaluate(&ins)?;
    let got = remat.evaluate(&ins)?;
    let compiled = remat.compile(&common::client())?.run(&ins)?;
    for (k, w) in want.iter().enumerate() {
        for (what, g) in [("interpreter", &got[k]), ("compiled", &compiled[k])] {
            for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                    "output {k} ({what}): {a} vs {b} without checkpoint"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn checkpointing_shrinks_the_programs_temporaries() -> Result<()> {
    let (blocks, rows, d) = (6, 128, 64);
    let client = common::client();
    let temps = |remat: bool| -> Result<u64> {
        let program = mlp(remat, blocks, rows, d, DType::F32)?.compile(&client)?;
        Ok(program.executable().memory_stats()?.temporaries)
    };
    let (plain, remat) = (temps(false)?, temps(true)?);
    // Without it, each block keeps two [rows, 4 d] activations (256 KB each) for the backward
    // pass; with it, only its [rows, d] input (32 KB).
    assert!(
        remat * 2 < plain,
        "temporaries with checkpoint {remat} B, without {plain} B"
    );
    Ok(())
}

/// Outputs of `g` on `ins` (interpreted, then compiled for the CPU) against `want`, each
/// element to `tol` relative to its size (at least 1).
fn assert_close(g: &Graph, ins: &[HostArray], want: &[HostArray], tol: f64, what: &str) {
    let got = g.evaluate(ins).unwrap();
    let compiled = g.compile(&common::client()).unwrap().run(ins).unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, w) in want.iter().enumerate() {
        for (run, g) in [("interpreter", &got[k]), ("compiled", &compiled[k])] {
            assert_eq!(g.dims(), w.dims(), "{what}: output {k} ({run})");
            for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
                assert!(
                    (a - b).abs() <= tol * b.abs().max(1.0),
                    "{what}: output {k} ({run}): {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn a_checkpointed_loop_and_cond_match_jax() -> Result<()> {
    // Section `checkpoint_loop` of tests/fixtures/jax/make_functions.py: block(x, w) is
    // h = fori_loop(0, 3, h -> tanh(w @ h) + x, x), then cond(sum(h) > 0, h * 2, sin(h));
    // loss = sum(checkpoint(block)(x, w)^2).
    let c = common::jax::JaxFixture::load("functions.json", "checkpoint_loop");
    let get = |k: &str, dims: &[usize]| c.array(k, dims);
    let g = Graph::new();
    let x = g.parameter("x", DType::F64, &[3])?;
    let w = g.parameter("w", DType::F64, &[3, 3])?;
    let out = g.checkpoint(&(x.clone(), w.clone()), |(x, w)| {
        let h = g.fori_loop(0, 3, x, |_, h| w.matmul(h)?.tanh()?.add(x))?;
        let pos = h.sum_all()?.gt(0.0)?;
        g.cond(&pos, &h, |h| h.mul(2.0), |h| h.sin())
    })?;
    let loss = out.square()?.sum_all()?;
    let grads = loss.grad(&[&x, &w])?;
    g.set_outputs(&[&loss, &grads[0], &grads[1]])?;
    assert!(g.to_stablehlo()?.contains("optimization_barrier"));
    let ins = [get("x", &[3]), get("w", &[3, 3])];
    let want = [get("y", &[]), get("gx", &[3]), get("gw", &[3, 3])];
    assert_close(&g, &ins, &want, 1e-10, "checkpoint_loop");
    Ok(())
}

/// The loop that runs the layers of [`layers`].
#[derive(Clone, Copy, Debug)]
enum Over {
    /// `scan` over the stacked weights, the layer counter and the carry's every step stacked.
    Scan,
    /// `fori_loop` slicing the stacked weights, its upper bound a constant from outside the
    /// checkpoint.
    Fori,
}

/// Where [`layers`] puts `checkpoint`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Remat {
    None,
    /// Around the whole loop.
    Loop,
    /// Around each layer, inside the loop body.
    Layer,
}

/// Four residual layers `h + switch(k % 3, cond(sum(a) > 0, a / 2, sin a))` with
/// `a = tanh(h @ w_k + b)` over `x` `[2, 3]`, the weights `ws` `[4, 3, 3]` stacked and `b`
/// captured; loss `sum(h^2)` (plus `sum(sin(hs))` over the scanned steps). Outputs: the loss
/// and its gradients with respect to `x`, `ws` and `b`.
fn layers(over: Over, remat: Remat) -> Result<Graph> {
    let g = Graph::new();
    let x = g.parameter("x", DType::F64, &[2, 3])?;
    let ws = g.parameter("ws", DType::F64, &[4, 3, 3])?;
    let b = g.parameter("b", DType::F64, &[3])?;
    let hi = g.scalar_i64(4)?;
    let layer = |(h, w, k): &(Tensor, Tensor, Tensor)| -> Result<Tensor> {
        let a = h.matmul(w)?.add(&b)?.tanh()?;
        let pos = a.sum_all()?.gt(0.0)?;
        let a = g.cond(&pos, &a, |a| a.mul(0.5), |a| a.sin())?;
        let a = g.switch(
            &k.rem(3)?,
            &a,
            &[
                &|a: &Tensor| Ok(a.clone()),
                &|a: &Tensor| a.mul(2.0),
                &|a: &Tensor| a.neg(),
            ],
        )?;
        h.add(&a)
    };
    let step = |h: &Tensor, w: &Tensor, k: &Tensor| -> Result<Tensor> {
        let args = (h.clone(), w.clone(), k.clone());
        match remat {
            Remat::Layer => g.checkpoint(&args, layer),
            _ => layer(&args),
        }
    };
    let run = |x: &Tensor| -> Result<Tensor> {
        match over {
            Over::Scan => {
                let init = (x.clone(), g.scalar_i64(0)?);
                let ((h, _), hs) = g.scan(&init, &ws, |(h, k), w| {
                    let h = step(h, w, k)?;
                    Ok(((h.clone(), k.add(1)?), h))
                })?;
                h.add(&hs.sin()?.sum(&[0])?)
            }
            Over::Fori => g.fori_loop(0, &hi, x, |i, h| {
                let zero = g.scalar_i64(0)?;
                let w = ws.dynamic_slice(&[i, &zero, &zero], &[1, 3, 3])?;
                step(h, &w.reshape(&[3, 3])?, i)
            }),
        }
    };
    let h = match remat {
        Remat::Loop => g.checkpoint(&x, run)?,
        _ => run(&x)?,
    };
    let loss = h.square()?.sum_all()?;
    let grads = loss.grad(&[&x, &ws, &b])?;
    g.set_outputs(&[&loss, &grads[0], &grads[1], &grads[2]])?;
    Ok(g)
}

#[test]
fn checkpointed_layer_loops_have_the_plain_gradients() -> Result<()> {
    let mut rng = common::Rng::new(81);
    let ins = [
        rng.array(DType::F64, &[2, 3], -1.0, 1.0),
        rng.array(DType::F64, &[4, 3, 3], -0.9, 0.9),
        rng.array(DType::F64, &[3], -0.5, 0.5),
    ];
    let whiles =
        |g: &Graph| -> Result<usize> { Ok(g.to_stablehlo()?.matches("stablehlo.while").count()) };
    for over in [Over::Scan, Over::Fori] {
        let plain = layers(over, Remat::None)?;
        let want = plain.evaluate(&ins)?;
        for remat in [Remat::Loop, Remat::Layer] {
            let g = layers(over, remat)?;
            if remat == Remat::Loop {
                assert!(g.to_stablehlo()?.contains("optimization_barrier"));
            }
            // Plain: the loop, its VJP's stacking run and its backward loop. Around the scan,
            // its copy runs too (the stacked steps are read after it); the fori_loop's copy
            // is dead (the VJP reruns the loop from its operands) and is not lowered.
            let copy = usize::from(matches!((over, remat), (Over::Scan, Remat::Loop)));
            assert_eq!(whiles(&g)?, whiles(&plain)? + copy, "{over:?} {remat:?}");
            assert_close(&g, &ins, &want, 1e-12, &format!("{over:?} {remat:?}"));
        }
    }
    Ok(())
}

#[test]
fn a_while_loop_no_gradient_reaches_may_be_checkpointed() -> Result<()> {
    // The loop counts (n = 4, the first n with n^2 >= 10); only its integer result is used.
    let g = Graph::new();
    let x = g.parameter("x", DType::F64, &[3])?;
    let y = g.checkpoint(&x, |x| {
        let n = g.while_loop(&g.scalar_i64(1)?, |n| n.mul(n)?.lt(10), |n| n.add(1))?;
        x.mul(&n.convert(DType::F64)?)?.sin()
    })?;
    let dx = y.sum_all()?.grad(&[&x])?.remove(0);
    g.set_outputs(&[&dx])?;
    let x0 = [0.3, -1.2, 2.0];
    let want: Vec<f64> = x0.iter().map(|x: &f64| 4.0 * (4.0 * x).cos()).collect();
    let ins = [HostArray::from_vec(&[3], x0.to_vec())?];
    let want = [HostArray::from_vec(&[3], want)?];
    assert_close(&g, &ins, &want, 1e-12, "integer while_loop");
    Ok(())
}

#[test]
fn a_checkpointed_loop_without_a_vjp_is_an_error() {
    // A data-dependent exit, and a fori_loop whose bound is not a constant.
    let g = Graph::new();
    let x = g.parameter("x", DType::F64, &[3]).unwrap();
    let n = g.parameter("n", DType::I64, &[]).unwrap();
    let exits = g
        .checkpoint(&x, |x| {
            g.while_loop(x, |h| h.sum_all()?.lt(10.0), |h| h.mul(2.0))
        })
        .unwrap();
    let counted = g
        .checkpoint(&x, |x| g.fori_loop(0, &n, x, |_, h| h.sin()))
        .unwrap();
    for y in [exits, counted] {
        let e = y.sum_all().unwrap().grad(&[&x]).unwrap_err().to_string();
        assert!(
            e.contains("a while_loop is differentiable only as a fori_loop with constant bounds"),
            "{e}"
        );
    }
}

#[test]
fn checkpoints_reading_a_constant_have_the_plain_gradients() -> Result<()> {
    // Six spans in a row read one float constant made before them (copied by each replay, not
    // passed through its barrier); the gradient with respect to the constant itself still
    // gathers every span's share.
    let build = |remat: bool| -> Result<Graph> {
        let g = Graph::new();
        let x = g.parameter("x", DType::F64, &[3])?;
        let c = g.scalar(0.7, DType::F64)?;
        let block = |h: &Tensor| h.mul(&c)?.sin()?.add(h);
        let mut h = x.clone();
        for _ in 0..6 {
            h = match remat {
                true => g.checkpoint(&h, block)?,
                false => block(&h)?,
            };
        }
        let loss = h.square()?.sum_all()?;
        let grads = loss.grad(&[&x, &c])?;
        g.set_outputs(&[&loss, &grads[0], &grads[1]])?;
        Ok(g)
    };
    let ins = [HostArray::from_vec(&[3], vec![0.4, -1.1, 2.3])?];
    let want = build(false)?.evaluate(&ins)?;
    assert_close(&build(true)?, &ins, &want, 1e-12, "constant");
    Ok(())
}

#[test]
fn a_checkpoint_inside_a_loop_body_reads_its_captures() -> Result<()> {
    // Gradients taken inside the body of a span that captures `w` from outside the loop (a
    // block argument made while the span is built): the replay reads it instead of copying it.
    let run = |remat: bool| -> Result<Vec<f64>> {
        let g = Graph::new();
        let x = g.parameter("x", DType::F64, &[2, 3])?;
        let w = g.parameter("w", DType::F64, &[3, 3])?;
        let init = (x.clone(), g.zeros(DType::F64, &[3, 3])?);
        let (h, total) = g.fori_loop(0, 3, &init, |_, (h, total)| {
            let step = |h: &Tensor| h.matmul(&w)?.tanh();
            let next = match remat {
                true => g.checkpoint(h, step)?,
                false => step(h)?,
            };
            let gw = next.square()?.sum_all()?.grad(&[&w])?.remove(0);
            Ok((next, total.add(&gw)?))
        })?;
        g.set_outputs(&[&h, &total])?;
        let mut rng = common::Rng::new(79);
        let ins = [
            rng.array(DType::F64, &[2, 3], -1.0, 1.0),
            rng.array(DType::F64, &[3, 3], -0.8, 0.8),
        ];
        let host = g.evaluate(&ins)?;
        let dev = g.compile(&common::client())?.run(&ins)?;
        for (a, b) in host.iter().zip(&dev) {
            for (p, q) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                assert!((p - q).abs() <= 1e-12, "interpreter {p} vs compiled {q}");
            }
        }
        Ok(host.iter().flat_map(HostArray::to_f64_vec).collect())
    };
    let (with, without) = (run(true)?, run(false)?);
    for (a, b) in with.iter().zip(&without) {
        assert!((a - b).abs() <= 1e-12, "remat {a} vs plain {b}");
    }
    Ok(())
}
