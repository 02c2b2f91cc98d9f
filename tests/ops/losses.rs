//! Losses and dropout against host formulas (PyTorch's definitions): cross-entropy and NLL with
//! and without an ignored label, MSE, binary cross-entropy on logits far from 0 (where the naive
//! form overflows), dropout's keep rate, scaling, key determinism and gradient; initializers'
//! bounds, moments and fans.

use super::*;
use stablegraph::init::{fans, Init};

#[test]
fn losses_match_their_formulas() -> Result<()> {
    let mut rng = Rng::new(71);
    let (rows, classes) = (6, 5);
    let g = Graph::new();
    let logits = g.parameter("logits", F64, &[2, 3, classes])?;
    let labels = g.parameter("labels", I64, &[2, 3])?;
    let pred = g.parameter("pred", F64, &[4, 3])?;
    let target = g.parameter("target", F64, &[4, 3])?;
    let ce = logits.cross_entropy(&labels, None)?;
    let ce_ignored = logits.cross_entropy(&labels, Some(-100))?;
    let nll = logits.log_softmax(-1)?.nll_loss(&labels, Some(2))?;
    let mse = pred.mse_loss(&target)?;
    let bce = pred.mul(8.0)?.binary_cross_entropy_with_logits(&target)?;
    // Far from 0, where sigmoid rounds to 0 or 1: each term is |x| or 0, not inf or NaN.
    let far = g.constant_array(&ndarray::arr1(&[200.0f64, -200.0, 200.0, -200.0]))?;
    let far_t = g.constant_array(&ndarray::arr1(&[0.0f64, 1.0, 1.0, 0.0]))?;
    let bce_far = far.binary_cross_entropy_with_logits(&far_t)?;
    g.set_outputs(&[&ce, &ce_ignored, &nll, &mse, &bce, &bce_far])?;
    let lv = rng.array(F64, &[2, 3, classes], -3.0, 3.0);
    let labs: Vec<i64> = vec![0, 4, -100, 2, 1, 2];
    let (pv, tv) = (
        rng.array(F64, &[4, 3], -1.0, 1.0),
        rng.array(F64, &[4, 3], 0.0, 1.0),
    );
    let ins = [
        lv.clone(),
        arr(&[2, 3], labs.clone()),
        pv.clone(),
        tv.clone(),
    ];
    let host = g.evaluate(&ins)?;
    let dev = g.compile(&client())?.run(&ins)?;

    let l = lv.to_f64_vec();
    let nll_of = |r: usize, c: usize| {
        let row = &l[r * classes..(r + 1) * classes];
        let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
        lse - row[c]
    };
    // The mean over the labels not ignored; an out-of-range label (-100 when it is not the
    // ignored one) picks nothing: it adds 0 and counts.
    let expected = |ignore: Option<i64>| {
        let counted: Vec<usize> = (0..rows).filter(|&r| Some(labs[r]) != ignore).collect();
        let sum: f64 = counted
            .iter()
            .filter(|&&r| labs[r] >= 0)
            .map(|&r| nll_of(r, labs[r] as usize))
            .sum();
        sum / counted.len() as f64
    };
    let (p, t) = (pv.to_f64_vec(), tv.to_f64_vec());
    let mse_want = p.iter().zip(&t).map(|(a, b)| (a - b).powi(2)).sum::<f64>() / 12.0;
    // The textbook form, fine at these moderate logits.
    let bce_want = p
        .iter()
        .zip(&t)
        .map(|(&x, &t)| {
            let s = 1.0 / (1.0 + (-8.0 * x).exp());
            -(t * s.ln() + (1.0 - t) * (1.0 - s).ln())
        })
        .sum::<f64>()
        / 12.0;
    let want = [
        expected(None),
        expected(Some(-100)),
        expected(Some(2)),
        mse_want,
        bce_want,
        100.0,
    ];
    for out in [&host, &dev] {
        for (k, w) in want.iter().enumerate() {
            let got = out[k].to_f64_vec()[0];
            assert!(
                (got - w).abs() <= 1e-12 * w.abs().max(1.0),
                "loss {k}: {got} vs {w}"
            );
        }
    }
    Ok(())
}

#[test]
fn dropout_keeps_and_scales_as_asked() -> Result<()> {
    let n = 20_000;
    let g = Graph::new();
    let x = g.parameter("x", F32, &[n])?;
    let key = g.parameter("key", U32, &[2])?;
    let y = x.dropout(&key, 0.25)?;
    let dx = y.sum_all()?.grad(&[&x])?.remove(0);
    g.set_outputs(&[&y, &dx])?;
    let ones = arr(&[n], vec![1.0f32; n]);
    let run = |k: [u32; 2]| g.evaluate(&[ones.clone(), arr(&[2], k.to_vec())]).unwrap();
    let (a, b, c) = (run([1, 2]), run([1, 2]), run([3, 4]));
    let ya = a[0].to_f64_vec();
    assert_eq!(
        ya,
        b[0].to_f64_vec(),
        "the same key drops the same elements"
    );
    assert_ne!(ya, c[0].to_f64_vec(), "another key drops others");
    let kept = ya.iter().filter(|&&v| v != 0.0).count();
    assert!(ya.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
    // Binomial(n, 0.75): standard deviation ~61; allow 5 of them.
    assert!(
        (kept as f64 - 0.75 * n as f64).abs() < 5.0 * 61.3,
        "kept {kept} of {n}"
    );
    assert_eq!(
        a[1].to_f64_vec(),
        ya,
        "the gradient is the same mask and scale"
    );
    let dev = g
        .compile(&client())?
        .run(&[ones.clone(), arr(&[2], vec![1u32, 2])])?;
    assert_eq!(dev[0].to_f64_vec(), ya, "compiled = interpreted");
    let e = x.dropout(&key, 1.0).unwrap_err().to_string();
    assert!(e.contains("a rate in [0, 1)"), "{e}");
    Ok(())
}

#[test]
fn initializers_follow_torch_formulas() -> Result<()> {
    assert_eq!(fans(&[8, 3, 5, 5])?, (75, 200));
    assert!(fans(&[4]).is_err());
    let n = 40_000;
    let check = |init: Init, dims: &[usize], bound: Option<f64>, std: f64| {
        let v = init.sample(dims, F64, 9).unwrap().to_f64_vec();
        assert_eq!(
            v,
            init.sample(dims, F64, 9).unwrap().to_f64_vec(),
            "{init:?}: seeded"
        );
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        // The sample mean's standard error is std / sqrt(n); its variance's ~std² sqrt(2 / n).
        let m = v.len() as f64;
        assert!(mean.abs() < 5.0 * std / m.sqrt(), "{init:?}: mean {mean}");
        assert!(
            (var - std * std).abs() < 6.0 * std * std * (2.0 / m).sqrt(),
            "{init:?}: var {var} vs {}",
            std * std
        );
        if let Some(b) = bound {
            let top = v.iter().fold(0.0f64, |t, x| t.max(x.abs()));
            assert!(
                top < b && top > 0.99 * b,
                "{init:?}: largest {top}, bound {b}"
            );
        }
    };
    // [out, in] = [200, 200]: fan_in = fan_out = 200.
    let dims = [200, n / 200];
    let b = (6.0f64 / 400.0).sqrt();
    check(
        Init::XavierUniform { gain: 1.0 },
        &dims,
        Some(b),
        b / 3f64.sqrt(),
    );
    check(
        Init::XavierNormal { gain: 1.0 },
        &dims,
        None,
        (2.0f64 / 400.0).sqrt(),
    );
    let b = (6.0f64 / 200.0).sqrt();
    check(
        Init::KaimingUniform { a: 0.0 },
        &dims,
        Some(b),
        b / 3f64.sqrt(),
    );
    check(
        Init::KaimingNormal { a: 0.0 },
        &dims,
        None,
        (2.0f64 / 200.0).sqrt(),
    );
    let b = 1.0 / 200f64.sqrt();
    check(Init::TORCH_DEFAULT, &dims, Some(b), b / 3f64.sqrt());
    check(Init::torch_bias(&dims)?, &[n], Some(b), b / 3f64.sqrt());
    check(
        Init::Normal {
            mean: 0.0,
            std: 0.02,
        },
        &[n],
        None,
        0.02,
    );
    assert_eq!(Init::Ones.sample(&[2], BF16, 0)?.to_f64_vec(), [1.0, 1.0]);
    assert!(Init::Zeros.sample(&[2], I32, 0).is_err());
    Ok(())
}
