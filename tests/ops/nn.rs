//! The layers: the composites `softplus`, `silu`, `sigmoid`, `gelu`, `relu`, `square`;
//! softmax / log_softmax, layer_norm / rms_norm, erf / gelu_exact, var / std / mean_all; each
//! against a formula computed here in f64 as well as against the interpreter.

use super::*;

fn softplus64(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn composites() {
    let mut s = Suite::new("composites", 901);
    type Formula = fn(f64) -> f64;
    let ops: Vec<(&str, Unary, Formula)> = vec![
        ("softplus", Tensor::softplus, softplus64),
        ("silu", Tensor::silu, |x| x / (1.0 + (-x).exp())),
        ("sigmoid", Tensor::sigmoid, |x| 1.0 / (1.0 + (-x).exp())),
        ("gelu", Tensor::gelu, gelu64),
        ("relu", Tensor::relu, |x| x.max(0.0)),
        ("square", Tensor::square, |x| x * x),
    ];
    for (name, f, formula) in &ops {
        for dtype in FLOATS {
            for k in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let d = if k == 2 {
                    with(
                        u(-30.0, 30.0),
                        &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
                        0.2,
                    )
                } else {
                    u(-8.0, 8.0)
                };
                let x = s.param("x", dtype, &dims, &d);
                let y = f(&x).unwrap();
                if dtype == F64 {
                    let want: Vec<f64> =
                        s.value(&x).to_f64_vec().into_iter().map(formula).collect();
                    let w = f64_array(&dims, want);
                    s.check_formula(&y, tol(dtype), w, tol(dtype));
                } else {
                    s.check(&y);
                }
            }
        }
    }
    for dtype in [I32, I64, U8] {
        let dims = shape(&mut s.rng, 0, 3);
        s.case(format!("relu/square {dtype}{dims:?}"));
        let d = if dtype == U8 {
            Dist::Int(0, 15)
        } else {
            Dist::Int(-100, 100)
        };
        let x = s.param("x", dtype, &dims, &d);
        s.check(&x.relu().unwrap());
        s.check(&x.square().unwrap());
    }
    s.run();
}

// ---- softmax ------------------------------------------------------------------------------------

#[test]
fn softmax_and_log_softmax() {
    let mut c = Suite::new("softmax", 11);
    for dtype in [F32, F64] {
        for _ in 0..6 {
            let dims = c.nonempty_shape(1, 3);
            let rank = dims.len() as i64;
            let axis = c.rng.int(-rank, rank - 1) as isize;
            let (x, xv) = c.uniform(dtype, &dims, -6.0, 6.0);
            let (sm, lsm) = softmax_ref(&xv, &dims, norm_axis(axis, dims.len()));
            let label = format!("{dtype}{dims:?} axis {axis}");
            c.check_values(format!("softmax {label}"), &x.softmax(axis).unwrap(), sm);
            let y = x.log_softmax(axis).unwrap();
            c.check_values(format!("log_softmax {label}"), &y, lsm);
        }
        // Logits far beyond exp's range: exp(3e4) overflows even in f64 without the shift.
        let big: Vec<f64> = (0..12)
            .map(|i| 3e4 * [1.0, -1.0][i / 6] + i as f64)
            .collect();
        let (x, xv) = c.values(dtype, &[2, 6], &big);
        let (sm, lsm) = softmax_ref(&xv, &[2, 6], 1);
        assert!(sm.iter().all(|v| v.is_finite()));
        c.check_values(
            format!("softmax large {dtype}"),
            &x.softmax(-1).unwrap(),
            sm,
        );
        let y = x.log_softmax(-1).unwrap();
        c.check_values(format!("log_softmax large {dtype}"), &y, lsm);
        // Masked entries (-inf) and a fully masked row, whose result is NaN.
        let inf = f64::NEG_INFINITY;
        let v = [
            0.5, inf, 2.0, inf, -1.0, inf, inf, inf, inf, inf, 1.0, 2.0, 3.0, 4.0, 5.0,
        ];
        let (x, xv) = c.values(dtype, &[3, 5], &v);
        let (sm, lsm) = softmax_ref(&xv, &[3, 5], 1);
        assert_eq!((sm[1], lsm[1]), (0.0, inf));
        assert!(sm[5].is_nan() && lsm[5].is_nan());
        c.check_values(
            format!("softmax masked {dtype}"),
            &x.softmax(1).unwrap(),
            sm,
        );
        let y = x.log_softmax(1).unwrap();
        c.check_values(format!("log_softmax masked {dtype}"), &y, lsm);
        // A size-1 axis: softmax 1, log_softmax 0.
        let (x, _) = c.uniform(dtype, &[4, 1], -50.0, 50.0);
        c.check_values_tol(
            "softmax size-1",
            &x.softmax(-1).unwrap(),
            vec![1.0; 4],
            Tol::Exact,
        );
        c.check_values_tol(
            "log_softmax size-1",
            &x.log_softmax(1).unwrap(),
            vec![0.0; 4],
            Tol::Exact,
        );
    }
    for dtype in [F16, BF16] {
        let (x, xv) = c.uniform(dtype, &[3, 7], -4.0, 4.0);
        let (sm, _) = softmax_ref(&xv, &[3, 7], 1);
        let y = x.softmax(-1).unwrap();
        c.check_values(format!("softmax {dtype}"), &y, sm);
        let (_, lsm) = softmax_ref(&xv, &[3, 7], 0);
        let y = x.log_softmax(0).unwrap();
        c.check_values(format!("log_softmax {dtype}"), &y, lsm);
    }
    c.run();
}

// ---- norms --------------------------------------------------------------------------------------

#[test]
fn layer_norm_and_rms_norm() {
    let mut c = Suite::new("norms", 12);
    type Case = (
        &'static [usize],
        &'static [isize],
        Option<&'static [usize]>,
        bool,
    );
    let cases: [Case; 6] = [
        (&[4, 8], &[-1], Some(&[8]), true),
        (&[2, 3, 6], &[-1], Some(&[6]), false),
        (&[2, 3, 6], &[-2, -1], Some(&[3, 6]), true),
        (&[5, 4], &[0], Some(&[5, 1]), true),
        (&[2, 4, 3], &[2, 0], None, true),
        (&[3, 1], &[-1], None, false),
    ];
    let eps = 1e-5;
    for dtype in [F32, F64, BF16] {
        for &(dims, axes, wdims, with_bias) in &cases {
            let (x, xv) = c.uniform(dtype, dims, -3.0, 5.0);
            let weight = wdims.map(|d| c.uniform(dtype, d, 0.5, 1.5));
            let bdims = wdims.unwrap_or(&dims[dims.len() - 1..]);
            let bias = with_bias.then(|| c.uniform(dtype, bdims, -1.0, 1.0));
            let a: Vec<usize> = axes.iter().map(|&a| norm_axis(a, dims.len())).collect();
            let w = weight.as_ref().map(|(_, v)| (v.as_slice(), wdims.unwrap()));
            let b = bias.as_ref().map(|(_, v)| (v.as_slice(), bdims));
            let label = format!("{dtype}{dims:?} over {axes:?}");
            let y = x
                .layer_norm(
                    axes,
                    weight.as_ref().map(|p| &p.0),
                    bias.as_ref().map(|p| &p.0),
                    eps,
                )
                .unwrap();
            let want = layer_norm_ref(&xv, dims, &a, w, b, eps);
            c.check_values(format!("layer_norm {label}"), &y, want);
            let y = x
                .rms_norm(axes, weight.as_ref().map(|p| &p.0), eps)
                .unwrap();
            let want = rms_norm_ref(&xv, dims, &a, w, eps);
            c.check_values(format!("rms_norm {label}"), &y, want);
        }
    }
    c.run();
}

// ---- erf and gelu -------------------------------------------------------------------------------

#[test]
fn erf_reference_matches_known_values() {
    // erf(0.5), erf(1), erf(2), erf(3) to 16 digits (Abramowitz and Stegun, table 7.1).
    let known = [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.0, 0.999_977_909_503_001_4),
    ];
    for (x, want) in known {
        assert!(
            (erf_ref(x) - want).abs() < 1e-15,
            "erf({x}) = {}",
            erf_ref(x)
        );
        assert_eq!(erf_ref(-x), -erf_ref(x));
    }
}

#[test]
fn erf_gelu_exact_and_gelu_tanh() {
    let mut c = Suite::new("erf_gelu", 13);
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.999_999,
        1.000_001,
        5.99,
        6.01,
        -30.0,
        30.0,
        1e-30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    for dtype in [F64, F32, F16, BF16] {
        let mut v: Vec<f64> = (0..64).map(|_| c.rng.uniform(-7.0, 7.0)).collect();
        v.extend(specials);
        let (x, xv) = c.values(dtype, &[2, v.len() / 2], &v);
        let etol = match dtype {
            // Cephes' erf is within a few ulp; the reference series within a few more.
            F64 => Tol::Close {
                rtol: 1e-14,
                atol: 1e-16,
            },
            // XLA's f32 rational approximation is within about 4e-7 of erf.
            F32 => Tol::Close {
                rtol: 1e-6,
                atol: 1e-6,
            },
            _ => tol(dtype),
        };
        let erf: Vec<f64> = xv.iter().map(|&x| erf_ref(x)).collect();
        c.check_values_tol(format!("erf {dtype}"), &x.erf().unwrap(), erf, etol);
        let gelu: Vec<f64> = xv.iter().map(|&x| gelu_exact_ref(x)).collect();
        let y = x.gelu_exact().unwrap();
        c.check_values_tol(
            format!("gelu_exact {dtype}"),
            &y,
            gelu,
            etol.scaled(4.0, 16.0),
        );
        let tanh: Vec<f64> = xv.iter().map(|&x| gelu_tanh_ref(x)).collect();
        if dtype == F64 {
            // The two forms differ by up to about 5e-4 (the tanh form is an approximation).
            let gap = xv
                .iter()
                .filter(|x| x.is_finite())
                .map(|&x| (gelu_exact_ref(x) - gelu_tanh_ref(x)).abs())
                .fold(0.0, f64::max);
            assert!(gap > 1e-5 && gap < 1e-3, "gap {gap}");
            c.check_values("gelu (tanh) f64", &x.gelu().unwrap(), tanh);
        }
    }
    c.run();
}

// ---- moments ------------------------------------------------------------------------------------

#[test]
fn var_std_mean_all() {
    let mut c = Suite::new("moments", 14);
    for dtype in [F32, F64] {
        for k in 0..8 {
            let dims = c.nonempty_shape(1, 3);
            let rank = dims.len();
            let mut axes = Vec::new();
            for a in 0..rank as isize {
                if c.rng.chance(0.5) {
                    axes.push(if c.rng.chance(0.5) {
                        a - rank as isize
                    } else {
                        a
                    });
                }
            }
            if k == 0 {
                axes.clear();
            }
            let a: Vec<usize> = axes.iter().map(|&a| norm_axis(a, rank)).collect();
            let (x, xv) = c.uniform(dtype, &dims, -2.0, 3.0);
            let kept: Vec<usize> = (0..rank)
                .filter(|d| !a.contains(d))
                .map(|d| dims[d])
                .collect();
            let keep: Vec<usize> = (0..rank)
                .map(|d| if a.contains(&d) { 1 } else { dims[d] })
                .collect();
            let label = format!("{dtype}{dims:?} over {axes:?}");
            let v = x.var(&axes).unwrap();
            assert_eq!(v.dims(), kept.as_slice());
            c.check_values(
                format!("var {label}"),
                &v,
                var_ref(&xv, &dims, &a, 0, false),
            );
            let s = x.std_keepdims(&axes).unwrap();
            assert_eq!(s.dims(), keep.as_slice());
            c.check_values(
                format!("std_keepdims {label}"),
                &s,
                var_ref(&xv, &dims, &a, 0, true),
            );
            let s = x.std(&axes).unwrap();
            c.check_values(format!("std {label}"), &s, var_ref(&xv, &dims, &a, 0, true));
            let v = x.var_keepdims(&axes).unwrap();
            assert_eq!(v.dims(), keep.as_slice());
            c.check_values(
                format!("var_keepdims {label}"),
                &v,
                var_ref(&xv, &dims, &a, 0, false),
            );
            let o = VarOptions {
                ddof: 1,
                keepdims: k % 2 == 0,
            };
            let want = var_ref(&xv, &dims, &a, 1, false);
            c.check_values(
                format!("var ddof 1 {label}"),
                &x.var_with(&axes, o).unwrap(),
                want,
            );
            let want = var_ref(&xv, &dims, &a, 1, true);
            c.check_values(
                format!("std ddof 1 {label}"),
                &x.std_with(&axes, o).unwrap(),
                want,
            );
            let mean = xv.iter().sum::<f64>() / xv.len() as f64;
            let m = x.mean_all().unwrap();
            assert_eq!(m.rank(), 0);
            c.check_values(format!("mean_all {label}"), &m, vec![mean]);
        }
        // ddof equal to the count divides by zero: infinity (NaN for a constant row), as NumPy.
        let (x, xv) = c.values(dtype, &[2, 3], &[1.0, 2.0, 4.0, 5.0, 5.0, 5.0]);
        let o = VarOptions {
            ddof: 3,
            keepdims: false,
        };
        let want = var_ref(&xv, &[2, 3], &[1], 3, false);
        assert!(want[0].is_infinite() && want[1].is_nan());
        c.check_values_tol(
            "var ddof = N",
            &x.var_with(&[1], o).unwrap(),
            want,
            Tol::Exact,
        );
    }
    let (x, xv) = c.uniform(BF16, &[4, 8], -2.0, 3.0);
    let want = var_ref(&xv, &[4, 8], &[1], 0, false);
    c.check_values("var bf16", &x.var(&[-1]).unwrap(), want);
    c.run();
}
