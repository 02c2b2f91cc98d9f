//! Loops (`while_loop`, `fori_loop`, `scan`) compiled through the PJRT CPU plugin and compared
//! with the reference interpreter, and where cheap with the same computation done by a host
//! loop here.

use super::*;
use stablegraph::ops::{Carry, Op};
use stablegraph::CompiledGraph;

/// Compiles `g`, panicking with the module text on failure.
fn compile_graph(g: &Graph) -> CompiledGraph {
    g.compile(&client()).unwrap_or_else(|e| {
        let text = g.to_stablehlo().unwrap_or_default();
        panic!("{e}\n--- module ---\n{text}")
    })
}

/// Runs `inputs` through the compiled program and the interpreter and checks that they agree:
/// byte for byte when `rtol` is 0 or for non-float outputs, else within `rtol * |x| + rtol / 10`.
/// Returns the device's outputs.
fn agree(exe: &CompiledGraph, g: &Graph, inputs: &[HostArray], rtol: f64) -> Vec<HostArray> {
    let dev = exe.run(inputs).unwrap();
    let host = g.evaluate(inputs).unwrap();
    assert_eq!(dev.len(), host.len());
    for (k, (d, h)) in dev.iter().zip(&host).enumerate() {
        assert_eq!(d.ty(), h.ty(), "output {k}");
        if rtol == 0.0 || !d.dtype().is_float() {
            assert_eq!(d.to_bytes(), h.to_bytes(), "output {k}: {d:?} vs {h:?}");
        } else {
            let t = Tol::Close {
                rtol,
                atol: rtol / 10.0,
            };
            assert_matches(d, h, t, &format!("output {k}, device vs interpreter"));
        }
    }
    dev
}

fn assert_near(got: &[f32], want: &[f32], rtol: f32) {
    assert_close(got, want, rtol, rtol / 10.0);
}

/// The `While` nodes of `g`.
fn while_nodes(g: &Graph) -> Vec<stablegraph::ops::Node> {
    g.nodes()
        .into_iter()
        .filter(|n| matches!(n.op, Op::While { .. }))
        .collect()
}

#[test]
fn golden_text_of_a_tiny_loop() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[2])?;
    let y = g.fori_loop(0, 3, &x, |_, x| x.mul(2.0))?;
    g.set_outputs(&[&y])?;
    let want = r#"module @stablegraph {
  func.func public @main(%p0_x: tensor<2xf32>) -> tensor<2xf32> {
    %v1 = stablehlo.constant dense<0> : tensor<i64>
    %v2 = stablehlo.constant dense<3> : tensor<i64>
    %v15:3 = "stablehlo.while"(%v1, %p0_x, %v2) ({
    ^bb0(%v3: tensor<i64>, %v4: tensor<2xf32>, %v5: tensor<i64>):
      %v6 = stablehlo.compare LT, %v3, %v5, SIGNED : (tensor<i64>, tensor<i64>) -> tensor<i1>
      stablehlo.return %v6 : tensor<i1>
    }, {
    ^bb0(%v7: tensor<i64>, %v8: tensor<2xf32>, %v14: tensor<i64>):
      %v9 = stablehlo.constant dense<2.0> : tensor<f32>
      %v10 = stablehlo.broadcast_in_dim %v9, dims = [] : (tensor<f32>) -> tensor<2xf32>
      %v11 = stablehlo.multiply %v8, %v10 : tensor<2xf32>
      %v12 = stablehlo.constant dense<1> : tensor<i64>
      %v13 = stablehlo.add %v7, %v12 : tensor<i64>
      stablehlo.return %v13, %v11, %v14 : tensor<i64>, tensor<2xf32>, tensor<i64>
    }) : (tensor<i64>, tensor<2xf32>, tensor<i64>) -> (tensor<i64>, tensor<2xf32>, tensor<i64>)
    return %v15#1 : tensor<2xf32>
  }
}
"#;
    assert_eq!(g.to_stablehlo()?, want);
    let exe = compile_graph(&g);
    let out = agree(&exe, &g, &[arr(&[2], vec![1.5f32, -3.0])], 0.0);
    assert_eq!(vals::<f32>(&out[0]), vec![12.0, -24.0]);
    Ok(())
}

/// 1,000 iterations of `x = 0.99 x + 0.01 i` (f32) and `s = 31 s + i` (wrapping i64), against
/// the same recurrence on the host.
#[test]
fn fori_runs_a_thousand_steps() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[4])?;
    let s = g.parameter("s", I64, &[])?;
    let (x_out, s_out) = g.fori_loop(0, 1000, &(x, s), |i, (x, s)| {
        let x = x.mul(0.99)?.add(&i.astype(F32)?.mul(0.01)?)?;
        let s = s.mul(31)?.add(i)?;
        Ok((x, s))
    })?;
    g.set_outputs(&[&x_out, &s_out])?;
    let text = g.to_stablehlo()?;
    assert_eq!(text.matches("stablehlo.while").count(), 1, "{text}");
    let exe = compile_graph(&g);

    let x0 = vec![1.0f32, -2.0, 100.0, 0.0];
    let out = agree(
        &exe,
        &g,
        &[arr(&[4], x0.clone()), HostArray::scalar(7i64)],
        1e-5,
    );
    let (mut hx, mut hs) = (x0, 7i64);
    for i in 0..1000i64 {
        for v in &mut hx {
            *v = *v * 0.99f32 + (i as f32) * 0.01f32;
        }
        hs = hs.wrapping_mul(31).wrapping_add(i);
    }
    assert_near(&vals::<f32>(&out[0]), &hx, 1e-5);
    assert_eq!(out[1], HostArray::scalar(hs));
    Ok(())
}

/// A data-dependent stop: Collatz steps from `n` (the count depends on the input), and Newton's
/// square root until `|x^2 - a| <= 1e-9 a`.
#[test]
fn while_stops_on_data() -> Result<()> {
    let g = Graph::new();
    let n = g.parameter("n", I64, &[])?;
    let (last, steps) = g.while_loop(
        &(n, g.scalar(0.0, I32)?),
        |(n, _)| n.ne(1),
        |(n, steps)| {
            let even = n.rem(2)?.eq(0)?;
            let next = even.select(&n.div(2)?, &n.mul(3)?.add(1)?)?;
            Ok((next, steps.add(1)?))
        },
    )?;
    let a = g.parameter("a", F64, &[])?;
    let (root, iters) = g.while_loop(
        &(a.clone(), g.scalar(0.0, I32)?),
        |(x, k)| {
            x.mul(x)?
                .sub(&a)?
                .abs()?
                .gt(&a.mul(1e-9)?)?
                .and(&k.lt(100)?)
        },
        |(x, k)| Ok((x.add(&a.div(x)?)?.mul(0.5)?, k.add(1)?)),
    )?;
    g.set_outputs(&[&last, &steps, &root, &iters])?;
    let exe = compile_graph(&g);

    let collatz = |mut n: i64| {
        let mut steps = 0i32;
        while n != 1 {
            n = if n % 2 == 0 { n / 2 } else { 3 * n + 1 };
            steps += 1;
        }
        steps
    };
    let newton = |a: f64| {
        let (mut x, mut k) = (a, 0i32);
        while (x * x - a).abs() > a * 1e-9 && k < 100 {
            x = (x + a / x) * 0.5;
            k += 1;
        }
        (x, k)
    };
    let mut counts = Vec::new();
    for (n, a) in [(1i64, 2.0f64), (6, 1e6), (27, 0.25), (97, 1e-6), (871, 3.0)] {
        let out = agree(&exe, &g, &[HostArray::scalar(n), HostArray::scalar(a)], 0.0);
        assert_eq!(out[0], HostArray::scalar(1i64));
        assert_eq!(out[1], HostArray::scalar(collatz(n)), "n = {n}");
        let (x, k) = newton(a);
        assert_eq!(out[2], HostArray::scalar(x), "a = {a}");
        assert_eq!(out[3], HostArray::scalar(k), "a = {a}");
        counts.push((collatz(n), k));
    }
    // The iteration counts really depend on the data.
    assert_eq!(
        counts.iter().map(|c| c.0).collect::<Vec<_>>(),
        [0, 8, 111, 118, 178]
    );
    assert!(counts.iter().any(|c| c.1 != counts[0].1), "{counts:?}");
    Ok(())
}

/// A fori inside a fori: the inner loop runs `i` times (the outer index as its bound) and adds
/// `w * (10 i + j)`, with `w` captured from outside both loops.
#[test]
fn nested_loops_capture_through_both_levels() -> Result<()> {
    let g = Graph::new();
    let w = g.parameter("w", F32, &[3])?;
    let init = (g.zeros(F32, &[3])?, g.scalar(0.0, I32)?);
    let (acc, count) = g.fori_loop(0, 5, &init, |i, state| {
        g.fori_loop(0, i, state, |j, (acc, count)| {
            let k = i.mul(10)?.add(j)?.astype(F32)?;
            Ok((acc.add(&w.mul(&k)?)?, count.add(1)?))
        })
    })?;
    g.set_outputs(&[&acc, &count])?;
    let text = g.to_stablehlo()?;
    assert_eq!(text.matches("\"stablehlo.while\"").count(), 2, "{text}");
    // The inner loop's lines sit two levels deeper than the outer loop's.
    assert!(text.contains("\n        stablehlo.return"), "{text}");
    let exe = compile_graph(&g);

    let w0 = [1.0f32, -2.0, 0.5];
    let out = agree(&exe, &g, &[arr(&[3], w0.to_vec())], 0.0);
    let mut want = [0f32; 3];
    let mut n = 0;
    for i in 0..5 {
        for j in 0..i {
            for (a, w) in want.iter_mut().zip(w0) {
                *a += w * (10 * i + j) as f32;
            }
            n += 1;
        }
    }
    assert_eq!(vals::<f32>(&out[0]), want);
    assert_eq!(out[1], HostArray::scalar(n));
    assert_eq!(n, 10);
    Ok(())
}

/// A state of f32, i32, pred and bf16 values, run `k` times.
#[test]
fn mixed_dtype_carry() -> Result<()> {
    let g = Graph::new();
    let k = g.parameter("k", I32, &[])?;
    let f = g.parameter("f", F32, &[2])?;
    let p = g.parameter("p", Pred, &[2])?;
    let b = g.parameter("b", BF16, &[3])?;
    let (f, n, p, b) = g.while_loop(
        &(f, g.scalar(0.0, I32)?, p, b),
        |(_, n, _, _)| n.lt(&k),
        |(f, n, p, b)| Ok((f.mul(1.5)?, n.add(1)?, p.not()?, b.add(0.5)?)),
    )?;
    g.set_outputs(&[&f, &n, &p, &b])?;
    let exe = compile_graph(&g);
    let b0 = [1.0f32, -2.0, 0.25];
    for steps in [0i32, 1, 7] {
        let out = agree(
            &exe,
            &g,
            &[
                HostArray::scalar(steps),
                arr(&[2], vec![1.0f32, -0.5]),
                arr(&[2], vec![true, false]),
                arr(&[3], b0.iter().map(|&x| bf16::from_f32(x)).collect()),
            ],
            0.0,
        );
        let scale = 1.5f32.powi(steps);
        assert_eq!(vals::<f32>(&out[0]), vec![scale, -0.5 * scale]);
        assert_eq!(out[1], HostArray::scalar(steps));
        let odd = steps % 2 == 1;
        assert_eq!(vals::<bool>(&out[2]), vec![!odd, odd]);
        let want: Vec<bf16> = b0
            .iter()
            .map(|&x| bf16::from_f32(x + 0.5 * steps as f32))
            .collect();
        assert_eq!(vals::<bf16>(&out[3]), want);
    }
    Ok(())
}

/// The generation pattern: each step computes `h = tanh(h W)` and writes it into row `i` of an
/// output buffer with `dynamic_update_slice`.
#[test]
fn loop_writes_each_step_into_a_buffer() -> Result<()> {
    const STEPS: usize = 6;
    const D: usize = 4;
    let g = Graph::new();
    let h0 = g.parameter("h0", F32, &[D])?;
    let w = g.parameter("w", F32, &[D, D])?;
    let buf0 = g.zeros(F32, &[STEPS, D])?;
    let (h, buf) = g.fori_loop(0, STEPS as i64, &(h0, buf0), |i, (h, buf)| {
        let next = h.reshape(&[1, D as isize])?.matmul(&w)?.tanh()?;
        let col = g.scalar(0.0, I64)?;
        let buf = buf.dynamic_update_slice(&next, &[i, &col])?;
        Ok((next.reshape(&[D as isize])?, buf))
    })?;
    g.set_outputs(&[&h, &buf])?;
    let exe = compile_graph(&g);

    let mut rng = common::Rng::new(11);
    let h0 = rng.f32s(D, -1.0, 1.0);
    let w0 = rng.f32s(D * D, -1.0, 1.0);
    let out = agree(
        &exe,
        &g,
        &[arr(&[D], h0.clone()), arr(&[D, D], w0.clone())],
        1e-5,
    );
    let rows = vals::<f32>(&out[1]);
    let mut h = h0;
    for step in 0..STEPS {
        h = (0..D)
            .map(|c| (0..D).map(|r| h[r] * w0[r * D + c]).sum::<f32>().tanh())
            .collect();
        assert_near(&rows[step * D..(step + 1) * D], &h, 1e-5);
    }
    assert_eq!(vals::<f32>(&out[0]), rows[(STEPS - 1) * D..].to_vec());
    Ok(())
}

/// Random numbers in a loop: each step draws bits and uniforms from the carried key and takes
/// the next key from the drawn bits. Device and interpreter agree on every bit.
#[test]
fn loop_threads_a_random_key() -> Result<()> {
    let g = Graph::new();
    let key = g.parameter("key", U32, &[2])?;
    let init = (key, g.zeros(U32, &[4])?, g.zeros(F32, &[4])?);
    let (key, acc, last) = g.fori_loop(0, 12, &init, |_, (key, acc, _)| {
        let bits = g.random_bits(key, &[6])?;
        let u = g.random_uniform(key, F32, &[4])?;
        let acc = acc.xor(&bits.narrow(0, 0, 4)?)?;
        Ok((bits.narrow(0, 4, 2)?, acc, u))
    })?;
    g.set_outputs(&[&key, &acc, &last])?;
    let exe = compile_graph(&g);
    let mut keys = Vec::new();
    for k in [[0u32, 0], [42, 7], [u32::MAX, 1]] {
        let out = agree(&exe, &g, &[arr(&[2], k.to_vec())], 0.0);
        let u = vals::<f32>(&out[2]);
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)), "{u:?}");
        keys.push(vals::<u32>(&out[0]));
    }
    assert!(keys[0] != keys[1] && keys[1] != keys[2], "{keys:?}");
    Ok(())
}

/// Loops whose body never runs return their initial state.
#[test]
fn zero_iteration_loops_return_the_init() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[3])?;
    let lo = g.parameter("lo", I32, &[])?;
    let a = g.fori_loop(5, 5, &x, |_, x| x.add(1.0))?;
    let b = g.fori_loop(7, 3, &x, |_, x| x.add(1.0))?;
    let c = g.while_loop(&x, |x| x.sum_all()?.gt(1e30), |x| x.mul(2.0))?;
    let d = g.fori_loop(&lo, &lo, &x, |i, x| x.add(&i.astype(F32)?))?;
    g.set_outputs(&[&a, &b, &c, &d])?;
    let exe = compile_graph(&g);
    let x0 = vec![1.5f32, f32::NAN, -0.0];
    let out = agree(
        &exe,
        &g,
        &[arr(&[3], x0.clone()), HostArray::scalar(-4i32)],
        0.0,
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for o in &out {
        assert_eq!(bits(&vals::<f32>(o)), bits(&x0));
    }
    Ok(())
}

/// `fori_loop` with i32 tensor bounds: one program for every range, empty ones included.
#[test]
fn tensor_bounds() -> Result<()> {
    let g = Graph::new();
    let lo = g.parameter("lo", I32, &[])?;
    let hi = g.parameter("hi", I32, &[])?;
    let x = g.parameter("x", F32, &[2])?;
    let (sum, x) = g.fori_loop(&lo, &hi, &(g.scalar(0.0, I32)?, x), |i, (s, x)| {
        assert_eq!(i.dtype(), I32);
        Ok((s.add(i)?, x.add(&i.astype(F32)?)?))
    })?;
    g.set_outputs(&[&sum, &x])?;
    let exe = compile_graph(&g);
    for (lo, hi) in [
        (0i32, 10i32),
        (-3, 4),
        (5, 5),
        (7, 2),
        (-100, 100),
        (-5, -1),
    ] {
        let out = agree(
            &exe,
            &g,
            &[
                HostArray::scalar(lo),
                HostArray::scalar(hi),
                arr(&[2], vec![0.5f32, -1.0]),
            ],
            0.0,
        );
        let want: i32 = (lo..hi).sum();
        assert_eq!(out[0], HostArray::scalar(want), "{lo}..{hi}");
        assert_eq!(
            vals::<f32>(&out[1]),
            vec![0.5 + want as f32, -1.0 + want as f32]
        );
    }
    Ok(())
}

/// Captures: a body using a parameter and a constant from outside; a condition using a tensor
/// the body does not (both regions still take the same state); one value captured by both.
#[test]
fn captured_values_line_up_in_the_state() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[3])?;
    let scale = g.parameter("scale", F32, &[])?;
    let limit = g.parameter("limit", F32, &[])?;
    let offset = g.constant_array(&ndarray::arr1(&[1.0f32, 2.0, 3.0]))?;
    let y = g.fori_loop(0, 4, &x, |_, x| x.mul(&scale)?.add(&offset))?;
    // `limit` only in the condition.
    let (z, n) = g.while_loop(
        &(x.clone(), g.scalar(0.0, I32)?),
        |(x, _)| x.abs()?.sum_all()?.lt(&limit),
        |(x, n)| Ok((x.mul(2.0)?, n.add(1)?)),
    )?;
    // `limit` in both regions: captured once.
    let (v, m) = g.while_loop(
        &(x.clone(), g.scalar(0.0, I32)?),
        |(x, _)| x.abs()?.sum_all()?.lt(&limit),
        |(x, n)| Ok((x.add(&limit.mul(0.125)?)?, n.add(1)?)),
    )?;
    g.set_outputs(&[&y, &z, &n, &v, &m])?;

    let loops = while_nodes(&g);
    assert_eq!(loops.len(), 3);
    // (i, x) + hi, scale, offset; (x, n) + limit; (x, n) + limit.
    let counts: Vec<usize> = loops.iter().map(|l| l.inputs.len()).collect();
    assert_eq!(counts, [5, 3, 3]);
    let regions = g.regions();
    for l in &loops {
        let Op::While { cond, body } = l.op else {
            unreachable!()
        };
        assert_eq!(regions[cond].args.len(), l.inputs.len());
        assert_eq!(regions[body].args.len(), l.inputs.len());
        assert_eq!(regions[body].results.len(), l.inputs.len());
    }
    // The second loop's body does not use `limit` but passes it on.
    let Op::While { body, .. } = loops[1].op else {
        unreachable!()
    };
    assert_eq!(regions[body].results[2], regions[body].args[2]);

    let exe = compile_graph(&g);
    let x0 = vec![0.5f32, -1.0, 0.25];
    let out = agree(
        &exe,
        &g,
        &[
            arr(&[3], x0.clone()),
            HostArray::scalar(1.5f32),
            HostArray::scalar(20.0f32),
        ],
        1e-6,
    );
    let mut hy = x0.clone();
    for _ in 0..4 {
        for (v, o) in hy.iter_mut().zip([1.0f32, 2.0, 3.0]) {
            *v = *v * 1.5 + o;
        }
    }
    assert_near(&vals::<f32>(&out[0]), &hy, 1e-6);
    // |x| sums to 1.75: doubled until it reaches 20 (1.75 * 16 = 28) after 4 steps.
    assert_eq!(
        vals::<f32>(&out[1]),
        x0.iter().map(|v| v * 16.0).collect::<Vec<_>>()
    );
    assert_eq!(out[2], HostArray::scalar(4i32));
    let (mut hv, mut k) = (x0, 0);
    while hv.iter().map(|v| v.abs()).sum::<f32>() < 20.0 {
        hv.iter_mut().for_each(|v| *v += 2.5);
        k += 1;
    }
    assert_eq!(vals::<f32>(&out[3]), hv);
    assert_eq!(out[4], HostArray::scalar(k));
    Ok(())
}

/// A user state: a named struct holding a tensor, a counter and a `Vec` of tensors.
struct State {
    h: Tensor,
    step: Tensor,
    history: Vec<Tensor>,
}

impl Carry for State {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.push(self.h.clone());
        out.push(self.step.clone());
        self.history.flatten(out);
    }
    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        Some(State {
            h: values.next()?,
            step: values.next()?,
            history: Vec::unflatten(&template.history, values)?,
        })
    }
}

impl Clone for State {
    fn clone(&self) -> Self {
        State {
            h: self.h.clone(),
            step: self.step.clone(),
            history: self.history.clone(),
        }
    }
}

/// Every kind of carry: a tuple, an array, a `Vec` and a user struct.
#[test]
fn carry_kinds() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[2])?;
    let one = g.scalar(1.0, I32)?;
    // A tuple holding an array.
    let (t, [a0, a1, a2]) = g.fori_loop(
        0,
        3,
        &(one.clone(), [x.clone(), x.add(1.0)?, x.add(2.0)?]),
        |_, (t, [a, b, c])| Ok((t.mul(2)?, [b.clone(), c.clone(), a.clone()])),
    )?;
    // A Vec.
    let v = g.fori_loop(0, 2, &vec![x.clone(), x.neg()?], |_, v| {
        v.iter().map(|t| t.mul(3.0)).collect::<Result<Vec<_>>>()
    })?;
    // A struct.
    let init = State {
        h: x.clone(),
        step: g.scalar(0.0, I32)?,
        history: vec![g.zeros(F32, &[2])?, g.zeros(F32, &[2])?],
    };
    let s = g.fori_loop(0, 4, &init, |_, s| {
        Ok(State {
            h: s.h.add(1.0)?,
            step: s.step.add(1)?,
            history: vec![s.history[1].clone(), s.h.clone()],
        })
    })?;
    g.set_outputs(&[
        &t,
        &a0,
        &a1,
        &a2,
        &v[0],
        &v[1],
        &s.h,
        &s.step,
        &s.history[0],
        &s.history[1],
    ])?;
    let exe = compile_graph(&g);
    let out = agree(&exe, &g, &[arr(&[2], vec![1.0f32, -1.0])], 0.0);
    let f = |k: usize| vals::<f32>(&out[k]);
    assert_eq!(out[0], HostArray::scalar(8i32));
    // Three rotations bring the array back.
    assert_eq!(
        (f(1), f(2), f(3)),
        (vec![1.0, -1.0], vec![2.0, 0.0], vec![3.0, 1.0])
    );
    assert_eq!((f(4), f(5)), (vec![9.0, -9.0], vec![-9.0, 9.0]));
    assert_eq!(f(6), vec![5.0, 3.0]);
    assert_eq!(out[7], HostArray::scalar(4i32));
    assert_eq!((f(8), f(9)), (vec![3.0, 1.0], vec![4.0, 2.0]));
    Ok(())
}

/// Less common shapes: three levels of fori using every enclosing index and a parameter; a loop
/// inside a condition; a body that returns an outer value as the next state; a condition that
/// returns a captured pred as it is; a loop whose initial state comes from two levels out.
#[test]
fn unusual_nesting_and_captures() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[2])?;
    let go = g.parameter("go", Pred, &[])?;
    let acc = g.fori_loop(0, 4, &g.zeros(F32, &[2])?, |i, acc| {
        g.fori_loop(0, i, acc, |j, acc| {
            g.fori_loop(0, j, acc, |k, acc| {
                let c = i.mul(100)?.add(&j.mul(10)?)?.add(k)?.astype(F32)?;
                acc.add(&x.mul(&c)?)
            })
        })
    })?;
    // The condition runs a loop of `n` steps summing `sum(x) + i`; the body replaces the state
    // with `x` from outside.
    let (n, y) = g.while_loop(
        &(g.scalar(0.0, I32)?, x.neg()?),
        |(n, y)| {
            let s = g.fori_loop(0, n, &y.sum_all()?, |i, s| {
                s.add(&x.sum_all()?)?.add(&i.astype(F32)?)
            })?;
            s.lt(20.0)
        },
        |(n, _)| Ok((n.add(1)?, x.clone())),
    )?;
    let held = g.while_loop(&x, |_| Ok(go.clone()), |x| x.add(1.0))?;
    // The inner loop starts from `x`, captured through the outer body.
    let from_outside = g.fori_loop(0, 2, &g.zeros(F32, &[2])?, |_, acc| {
        let inner = g.fori_loop(0, 3, &x, |_, v| v.mul(2.0))?;
        acc.add(&inner)
    })?;
    g.set_outputs(&[&acc, &n, &y, &held, &from_outside])?;
    let exe = compile_graph(&g);
    let x0 = [1.0f32, 0.5];
    let out = agree(
        &exe,
        &g,
        &[arr(&[2], x0.to_vec()), HostArray::scalar(false)],
        0.0,
    );
    let mut c = 0.0f32;
    for i in 0..4 {
        for j in 0..i {
            for k in 0..j {
                c += (100 * i + 10 * j + k) as f32;
            }
        }
    }
    assert_eq!(vals::<f32>(&out[0]), vec![x0[0] * c, x0[1] * c]);
    // sum(x) = 1.5; with state x the condition sums 1.5 + n * 1.5 + n(n-1)/2, below 20 until
    // n = 5 (1.5 + 7.5 + 10 = 19, n = 6: 1.5 + 9 + 15 = 25.5).
    let steps = (0..)
        .find(|&n: &i32| {
            let y = if n == 0 { -1.5 } else { 1.5 };
            y + 1.5 * n as f32 + (n * (n - 1) / 2) as f32 >= 20.0
        })
        .unwrap();
    assert_eq!(out[1], HostArray::scalar(steps));
    assert_eq!(vals::<f32>(&out[2]), x0.to_vec());
    assert_eq!(vals::<f32>(&out[3]), x0.to_vec());
    assert_eq!(vals::<f32>(&out[4]), vec![16.0, 8.0]);
    Ok(())
}

// ---- scan ---------------------------------------------------------------------------------------

#[test]
fn scan_threads_the_carry_and_stacks_outputs() {
    let mut c = Suite::new("scan", 17);
    let (t, d) = (7, 3);
    // h_t = a_t * h_{t-1} + b_t, total_t = total_{t-1} + sum(h_t); ys = (h_t, total_t).
    let (a, av) = c.uniform(F64, &[t, d], -1.0, 1.0);
    let (b, bv) = c.uniform(F64, &[t, d], -1.0, 1.0);
    let (h0, h0v) = c.uniform(F64, &[d], -1.0, 1.0);
    let total0 = c.g.scalar(0.0, F64).unwrap();
    let ((h, total), (hs, totals)) =
        c.g.scan(&(h0, total0), &(a, b), |(h, total), (a, b)| {
            let h = a.mul(h)?.add(b)?;
            let total = total.add(&h.sum_all()?)?;
            Ok(((h.clone(), total.clone()), (h, total)))
        })
        .unwrap();
    assert_eq!((hs.dims(), totals.dims()), (&[t, d][..], &[t][..]));
    let (mut hv, mut tot) = (h0v, 0.0);
    let (mut hs_want, mut totals_want) = (Vec::new(), Vec::new());
    for s in 0..t {
        for j in 0..d {
            hv[j] = av[s * d + j] * hv[j] + bv[s * d + j];
        }
        tot += hv.iter().sum::<f64>();
        hs_want.extend_from_slice(&hv);
        totals_want.push(tot);
    }
    c.check_values("scan final h", &h, hv);
    c.check_values("scan final total", &total, vec![tot]);
    c.check_values("scan stacked h", &hs, hs_want);
    c.check_values("scan stacked totals", &totals, totals_want);

    // A value from outside the loop (a weight) used in the body; h_t = tanh(W h_{t-1} + x_t).
    let (w, wv) = c.uniform(F32, &[d, d], -1.0, 1.0);
    let (xs, xv) = c.uniform(F32, &[5, d], -1.0, 1.0);
    let h0 = c.g.zeros(F32, &[d]).unwrap();
    let (_, ys) =
        c.g.scan(&h0, &xs, |h, x| {
            let h = w.matmul(h)?.add(x)?.tanh()?;
            Ok((h.clone(), h))
        })
        .unwrap();
    let mut h = vec![0.0; d];
    let mut want = Vec::new();
    for s in 0..5 {
        let wh = matmul_ref(&wv, &h, d, d, 1);
        h = (0..d).map(|j| (wh[j] + xv[s * d + j]).tanh()).collect();
        want.extend_from_slice(&h);
    }
    c.check_values("scan with a captured weight", &ys, want);

    // Nested: an outer scan over rows, an inner scan over each row's entries (a running sum),
    // so the stacked result is the cumulative sum along axis 1.
    let (m, mv) = c.uniform(F32, &[3, 4], -1.0, 1.0);
    let zero = c.g.scalar(0.0, F32).unwrap();
    let (_, sums) =
        c.g.scan(&zero, &m, |z, row| {
            let (_, running) = row.graph().scan(&z.mul(0.0)?, row, |s, x| {
                let s = s.add(x)?;
                Ok((s.clone(), s))
            })?;
            Ok((z.clone(), running))
        })
        .unwrap();
    let want: Vec<f64> = (0..12)
        .map(|i| (i - i % 4..=i).map(|j| mv[j]).sum())
        .collect();
    c.check_values("nested scan (cumsum)", &sums, want);

    // Zero steps: the carry is the initial one and the stacked outputs are empty.
    let (xs, _) = c.uniform(F32, &[0, 2], 0.0, 1.0);
    let (h0, h0v) = c.uniform(F32, &[2], -1.0, 1.0);
    let (h, ys) =
        c.g.scan(&h0, &xs, |h, x| {
            let h = h.add(x)?;
            Ok((h.clone(), vec![h.clone(), h.sum_all()?]))
        })
        .unwrap();
    assert_eq!((ys[0].dims(), ys[1].dims()), (&[0, 2][..], &[0][..]));
    c.check_values_tol("scan of 0 steps: carry", &h, h0v, Tol::Exact);
    c.check_values_tol("scan of 0 steps: ys", &ys[0], vec![], Tol::Exact);
    c.run();
}

#[test]
fn fori_loop_with_scalar_i64_start() {
    // The pattern `scan` replaces, with the integer zero it needed.
    let mut c = Suite::new("fori_loop_i64", 18);
    let (x, xv) = c.uniform(F32, &[3], -1.0, 1.0);
    let buf = c.g.zeros(F32, &[4, 3]).unwrap();
    let (_, buf) =
        c.g.fori_loop(0, 4, &(x, buf), |i, (x, buf)| {
            let x = x.mul(2.0)?;
            let zero = i.graph().scalar_i64(0)?;
            let buf = buf.dynamic_update_slice(&x.expand_dims(0)?, &[i, &zero])?;
            Ok((x, buf))
        })
        .unwrap();
    let want: Vec<f64> = (1..=4)
        .flat_map(|k| xv.iter().map(move |v| v * 2f64.powi(k)))
        .collect();
    c.check_values("fori_loop rows", &buf, want);
    let big = c.g.scalar_i64(i64::MAX - 1).unwrap();
    c.check_values_tol(
        "scalar_i64 exact",
        &big,
        vec![(i64::MAX - 1) as f64],
        Tol::Exact,
    );
    c.run();
}

#[test]
fn an_optimization_barrier_passes_values_and_gradients_through() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[3])?;
    let w = g.parameter("w", BF16, &[2, 3])?;
    let n = g.parameter("n", I32, &[])?;
    let out = Tensor::optimization_barrier(&[&x, &w, &n])?;
    assert_eq!(out.len(), 3);
    // A product after the barrier, and its gradient with respect to the values before it.
    let y = out[1].astype(F32)?.mul(&out[0])?.sum(&[0, 1])?;
    let d = y.grad(&[&x])?.remove(0);
    g.set_outputs(&[&out[0], &out[1], &out[2], &d])?;
    let text = g.to_stablehlo()?;
    // The value's own barrier, and the cotangents' in the backward pass.
    assert_eq!(
        text.matches("stablehlo.optimization_barrier").count(),
        2,
        "{text}"
    );
    let exe = compile_graph(&g);
    let xs = vec![1.5f32, -2.0, 0.25];
    let ws: Vec<bf16> = [1.0f32, 2.0, 3.0, -1.0, 0.5, 4.0]
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let got = agree(
        &exe,
        &g,
        &[
            arr(&[3], xs.clone()),
            arr(&[2, 3], ws.clone()),
            HostArray::scalar(7i32),
        ],
        0.0,
    );
    assert_eq!(vals::<f32>(&got[0]), xs);
    assert_eq!(vals::<bf16>(&got[1]), ws);
    assert_eq!(vals::<i32>(&got[2]), vec![7]);
    // d/dx sum_ij w_ij x_j = the column sums of w.
    assert_eq!(vals::<f32>(&got[3]), vec![0.0, 2.5, 7.0]);
    let err = Tensor::optimization_barrier(&[]).unwrap_err().to_string();
    assert!(
        err.contains("optimization_barrier") && err.contains("at least one"),
        "{err}"
    );
    Ok(())
}
