//! Conditionals (`cond`, `switch`) compiled through the PJRT CPU plugin against the reference
//! interpreter and against the same choice made here on the host: every branch taken, indices
//! out of range clamped, captured values, conditionals inside loops and inside each other, and
//! the build-time errors.

use super::*;

/// Runs `g` compiled and interpreted on `inputs`; checks that they agree within 1e-6 and
/// returns the compiled outputs as f64.
fn run_both(g: &Graph, inputs: &[HostArray]) -> Vec<Vec<f64>> {
    let exe = g.compile(&client()).unwrap_or_else(|e| {
        let text = g.to_stablehlo().unwrap_or_default();
        panic!("{e}\n--- module ---\n{text}")
    });
    let dev = exe.run(inputs).unwrap();
    let host = g.evaluate(inputs).unwrap();
    assert_eq!(dev.len(), host.len());
    dev.iter()
        .zip(&host)
        .map(|(d, h)| {
            assert_eq!(d.ty(), h.ty());
            let (d, h) = (d.to_f64_vec(), h.to_f64_vec());
            assert_close_f64(&d, &h, 1e-6);
            d
        })
        .collect()
}

fn assert_close_f64(got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len());
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= rtol * b.abs().max(1.0),
            "element {k}: {a} vs {b} (all: {got:?} vs {want:?})"
        );
    }
}

#[test]
fn cond_and_switch_take_the_branch_their_index_names() -> Result<()> {
    let g = Graph::new();
    let p = g.parameter("p", DType::Pred, &[])?;
    let i = g.parameter("i", DType::I64, &[])?;
    let x = g.parameter("x", DType::F32, &[4])?;
    let c = g.parameter("c", DType::F32, &[4])?;
    // `c` is captured, not an operand.
    let y = g.cond(&p, &x, |x| x.mul(2.0)?.add(&c), |x| x.exp())?;
    let branches: [stablegraph::ops::Branch<'_, (Tensor, Tensor), (Tensor, Tensor)>; 3] = [
        &|(x, c)| Ok((x.neg()?, c.clone())),
        &|(x, c)| Ok((x.mul(c)?, x.sin()?)),
        &|(x, _)| Ok((x.add(1.0)?, x.mul(3.0)?)),
    ];
    let (s0, s1) = g.switch(&i, &(x.clone(), c.clone()), &branches)?;
    g.set_outputs(&[&y, &s0, &s1])?;
    assert_eq!(g.to_stablehlo()?.matches("\"stablehlo.case\"").count(), 2);

    let xs = [0.5f32, -1.0, 2.0, 0.0];
    let cs = [1.0f32, 2.0, -3.0, 0.25];
    for (pred, index) in [(true, -3i64), (false, 0), (true, 1), (false, 2), (true, 9)] {
        let inputs = [
            HostArray::scalar(pred),
            HostArray::scalar(index),
            arr(&[4], xs.to_vec()),
            arr(&[4], cs.to_vec()),
        ];
        let out = run_both(&g, &inputs);
        let x: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
        let c: Vec<f64> = cs.iter().map(|&v| v as f64).collect();
        let want_y: Vec<f64> = match pred {
            true => x.iter().zip(&c).map(|(x, c)| 2.0 * x + c).collect(),
            false => x.iter().map(|x| x.exp()).collect(),
        };
        let (w0, w1): (Vec<f64>, Vec<f64>) = match index.clamp(0, 2) {
            0 => (x.iter().map(|x| -x).collect(), c.clone()),
            1 => (
                x.iter().zip(&c).map(|(x, c)| x * c).collect(),
                x.iter().map(|x| x.sin()).collect(),
            ),
            _ => (
                x.iter().map(|x| x + 1.0).collect(),
                x.iter().map(|x| 3.0 * x).collect(),
            ),
        };
        let case = format!("pred {pred}, index {index}");
        for (k, (got, want)) in out.iter().zip([&want_y, &w0, &w1]).enumerate() {
            for (a, b) in got.iter().zip(want.iter()) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{case}, output {k}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn conditionals_inside_loops_and_inside_each_other() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[3])?;
    let w = g.parameter("w", DType::F32, &[3])?;
    // for t in 0..7: h = t even ? (t < 4 ? h * w : h - w) : h * 0.5 + 1, w captured twice over.
    let h = g.fori_loop(0, 7, &x, |t, h| {
        let even = t.rem(2)?.eq(0)?;
        g.cond(
            &even,
            h,
            |h| {
                let early = t.lt(4)?;
                g.cond(&early, h, |h| h.mul(&w), |h| h.sub(&w))
            },
            |h| h.mul(0.5)?.add(1.0),
        )
    })?;
    g.set_outputs(&[&h])?;
    let (xs, ws) = ([1.0f32, -2.0, 0.5], [1.5f32, 0.5, -1.0]);
    let out = run_both(&g, &[arr(&[3], xs.to_vec()), arr(&[3], ws.to_vec())]);
    let mut want: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
    for t in 0..7 {
        for (h, &w) in want.iter_mut().zip(&ws) {
            *h = match (t % 2 == 0, t < 4) {
                (true, true) => *h * w as f64,
                (true, false) => *h - w as f64,
                (false, _) => *h * 0.5 + 1.0,
            };
        }
    }
    assert_close_f64(&out[0], &want, 1e-6);
    Ok(())
}

#[test]
fn conditionals_check_what_they_are_given() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[3])?;
    let p = g.parameter("p", DType::Pred, &[])?;
    let i = g.parameter("i", DType::I32, &[])?;
    let msg = |r: Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();

    let e = msg(g.cond(&p, &x, |x| x.sum(&[0]), |x| x.exp()));
    assert!(
        e.contains("on_true returns f32[] for output 0, on_false returns f32[3]"),
        "{e}"
    );
    let e = msg(g.cond(&x, &x, |x| x.exp(), |x| x.exp()));
    assert!(
        e.contains("the predicate must be a rank-0 pred, got f32[3]"),
        "{e}"
    );
    let e = msg(g.switch(&x, &x, &[&|x: &Tensor| x.exp()]));
    assert!(
        e.contains("the index must be a rank-0 integer, got f32[3]"),
        "{e}"
    );
    let e = msg(g.switch::<Tensor, Tensor>(&i, &x, &[]));
    assert!(e.contains("there are no branches"), "{e}");
    let e = msg(g
        .switch(
            &i,
            &x,
            &[&|x: &Tensor| Ok(vec![x.clone()]), &|x: &Tensor| {
                Ok(vec![x.clone(), x.clone()])
            }],
        )
        .map(|v| v[0].clone()));
    assert!(
        e.contains("branch 1 returns 2 values, branch 0 returns 1"),
        "{e}"
    );
    // A value made inside a branch cannot be used outside it.
    let mut inner = None;
    g.cond(
        &p,
        &x,
        |x| {
            let e = x.exp()?;
            inner = Some(e.clone());
            Ok(e)
        },
        |x| Ok(x.clone()),
    )?;
    let leaked = inner.map(|t| t.add(&x));
    assert!(
        matches!(leaked, Some(Err(_))),
        "a branch's value was usable outside it"
    );
    Ok(())
}
