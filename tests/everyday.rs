//! The everyday layer: softmax / log_softmax, layer_norm / rms_norm, erf / gelu_exact,
//! var / std / mean_all, split / chunk, take_along_axis / take_axis and scan, each checked two
//! ways on seeded random inputs: the interpreter against a formula computed here in plain Rust
//! (f64), and the program compiled for the CPU plugin against the interpreter. Then the three
//! programs a new user writes first (a GPT-2 block, a Mamba-1 selective scan, an MLP with a
//! cross-entropy loss), built from these ops and checked the same way at about 1e-5.
//!
//! Each test builds one graph holding all its cases, compiles it once and evaluates it once.
//! `silu`, `softplus`, `sigmoid`, `relu` and the tanh `gelu` are tested in `tests/ops.rs`
//! (`composites`).

mod common;

use std::f64::consts::PI;

use common::{client, Rng};
use half::{bf16, f16};
use stablegraph::ops::{Graph, Tensor, VarOptions};
use stablegraph::{DType, HostArray, Result};

use DType::{BF16, F16, F32, F64, I32, I64, U32, U64, U8};

// ---- the harness --------------------------------------------------------------------------------

/// `|got - want| <= atol + rtol * |want|`; NaN matches only NaN, an infinity only itself.
#[derive(Clone, Copy, Debug)]
struct Tol {
    rtol: f64,
    atol: f64,
}

const EXACT: Tol = Tol {
    rtol: 0.0,
    atol: 0.0,
};

/// Compiled program against interpreter, per output dtype.
fn device_tol(d: DType) -> Tol {
    match d {
        F32 => Tol {
            rtol: 2e-5,
            atol: 2e-6,
        },
        F64 => Tol {
            rtol: 1e-12,
            atol: 1e-13,
        },
        F16 => Tol {
            rtol: 4e-3,
            atol: 4e-3,
        },
        BF16 => Tol {
            rtol: 3e-2,
            atol: 3e-2,
        },
        _ => EXACT,
    }
}

/// Interpreter against a formula computed in f64 from the same (stored) inputs, per dtype.
fn formula_tol(d: DType) -> Tol {
    match d {
        F32 => Tol {
            rtol: 1e-5,
            atol: 1e-6,
        },
        F64 => Tol {
            rtol: 1e-12,
            atol: 1e-14,
        },
        F16 => Tol {
            rtol: 4e-3,
            atol: 4e-3,
        },
        BF16 => Tol {
            rtol: 3e-2,
            atol: 3e-2,
        },
        _ => EXACT,
    }
}

/// The tolerance the three user programs are held to.
const PROGRAM: Tol = Tol {
    rtol: 1e-5,
    atol: 1e-5,
};

fn close(got: f64, want: f64, t: Tol) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= t.atol + t.rtol * want.abs()
}

/// `None` when `got` matches `want` within `t`, else the first mismatches.
fn mismatch(got: &[f64], want: &[f64], t: Tol) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} values, want {}", got.len(), want.len()));
    }
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (&g, &w))| !close(g, w, t))
        .map(|(i, (g, w))| format!("[{i}] got {g:e}, want {w:e}"))
        .collect();
    if bad.is_empty() {
        None
    } else {
        let n = bad.len();
        Some(format!("{n} differ: {}", bad[..n.min(4)].join("; ")))
    }
}

/// An array of `dtype` holding `values` (rounded or truncated as `as` would).
fn array_of(dtype: DType, dims: &[usize], values: &[f64]) -> HostArray {
    let v = values;
    match dtype {
        F32 => HostArray::from_vec(dims, v.iter().map(|&x| x as f32).collect()),
        F64 => HostArray::from_vec(dims, v.to_vec()),
        F16 => HostArray::from_vec(dims, v.iter().map(|&x| f16::from_f64(x)).collect()),
        BF16 => HostArray::from_vec(dims, v.iter().map(|&x| bf16::from_f64(x)).collect()),
        I32 => HostArray::from_vec(dims, v.iter().map(|&x| x as i32).collect()),
        I64 => HostArray::from_vec(dims, v.iter().map(|&x| x as i64).collect()),
        U8 => HostArray::from_vec(dims, v.iter().map(|&x| x as u8).collect()),
        U32 => HostArray::from_vec(dims, v.iter().map(|&x| x as u32).collect()),
        U64 => HostArray::from_vec(dims, v.iter().map(|&x| x as u64).collect()),
        DType::Pred => HostArray::from_vec(dims, v.iter().map(|&x| x != 0.0).collect()),
    }
    .unwrap()
}

struct Check {
    label: String,
    out: Tensor,
    formula: Option<(Vec<f64>, Tol)>,
}

/// One graph of independent checks, compiled once: every output is compared between the
/// compiled program and the interpreter, and the interpreter's result against a formula
/// computed here where one is given.
struct Checks {
    g: Graph,
    rng: Rng,
    inputs: Vec<HostArray>,
    checks: Vec<Check>,
}

impl Checks {
    fn new(seed: u64) -> Checks {
        Checks {
            g: Graph::new(),
            rng: Rng::new(seed),
            inputs: Vec::new(),
            checks: Vec::new(),
        }
    }

    /// A parameter holding `value`.
    fn input(&mut self, value: HostArray) -> Tensor {
        let name = format!("p{}", self.inputs.len());
        let t = self
            .g
            .parameter(&name, value.dtype(), value.dims())
            .unwrap();
        self.inputs.push(value);
        t
    }

    /// A parameter holding `values` as `dtype`, and the values as stored.
    fn values(&mut self, dtype: DType, dims: &[usize], values: &[f64]) -> (Tensor, Vec<f64>) {
        let a = array_of(dtype, dims, values);
        let stored = a.to_f64_vec();
        (self.input(a), stored)
    }

    /// A parameter uniform in `[lo, hi)`, and its values as stored.
    fn uniform(&mut self, dtype: DType, dims: &[usize], lo: f64, hi: f64) -> (Tensor, Vec<f64>) {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n).map(|_| self.rng.uniform(lo, hi)).collect();
        self.values(dtype, dims, &v)
    }

    /// A parameter of integers uniform in `lo..=hi`, and its values.
    fn ints(&mut self, dtype: DType, dims: &[usize], lo: i64, hi: i64) -> (Tensor, Vec<f64>) {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n).map(|_| self.rng.int(lo, hi) as f64).collect();
        self.values(dtype, dims, &v)
    }

    /// A shape of rank `lo..=hi` with dimensions `1..=4`.
    fn shape(&mut self, lo: usize, hi: usize) -> Vec<usize> {
        let rank = self.rng.int(lo as i64, hi as i64) as usize;
        (0..rank).map(|_| self.rng.int(1, 4) as usize).collect()
    }

    /// Compares `t` between the compiled program and the interpreter, and the interpreter with
    /// `want` within `tol`.
    fn check(&mut self, label: impl Into<String>, t: &Tensor, want: Vec<f64>, tol: Tol) {
        self.checks.push(Check {
            label: label.into(),
            out: t.clone(),
            formula: Some((want, tol)),
        });
    }

    fn run(self) {
        let outs: Vec<&Tensor> = self.checks.iter().map(|c| &c.out).collect();
        self.g.set_outputs(&outs).unwrap();
        let want = self
            .g
            .evaluate(&self.inputs)
            .unwrap_or_else(|e| panic!("the interpreter failed: {e}"));
        let compiled = self
            .g
            .compile(&client())
            .unwrap_or_else(|e| panic!("compiling failed: {e}"));
        let got = compiled.run(&self.inputs).unwrap();
        let mut failures = Vec::new();
        for (k, c) in self.checks.iter().enumerate() {
            let mut why = Vec::new();
            for (what, a) in [("interpreter", &want[k]), ("PJRT", &got[k])] {
                if a.ty() != *c.out.ty() {
                    why.push(format!("{what} gives {}, built as {}", a.ty(), c.out.ty()));
                }
            }
            let (g, w) = (got[k].to_f64_vec(), want[k].to_f64_vec());
            if let Some(m) = mismatch(&g, &w, device_tol(c.out.dtype())) {
                why.push(format!("PJRT vs interpreter: {m}"));
            }
            if let Some((f, tol)) = &c.formula {
                if let Some(m) = mismatch(&w, f, *tol) {
                    why.push(format!("interpreter vs formula: {m}"));
                }
            }
            if !why.is_empty() {
                failures.push(format!(
                    "  {} ({}): {}",
                    c.label,
                    c.out.ty(),
                    why.join("; ")
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} checks failed:\n{}",
            failures.len(),
            self.checks.len(),
            failures.join("\n")
        );
    }
}

// ---- host formulas --------------------------------------------------------------------------------

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        c[d] = i % dims[d];
        i /= dims[d];
    }
    c
}

fn ravel(c: &[usize], dims: &[usize]) -> usize {
    c.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// The flat index into an array of `dims` (aligned to the trailing dimensions, size-1
/// dimensions broadcast) of the element at coordinate `c` of a larger array.
fn broadcast_index(c: &[usize], dims: &[usize]) -> usize {
    let skip = c.len() - dims.len();
    let own: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(d, &n)| if n == 1 { 0 } else { c[skip + d] })
        .collect();
    ravel(&own, dims)
}

fn norm_axis(a: isize, rank: usize) -> usize {
    if a < 0 {
        (a + rank as isize) as usize
    } else {
        a as usize
    }
}

/// For each position of the kept dimensions (row-major), the flat indices of the elements
/// reduced into it.
fn groups(dims: &[usize], axes: &[usize]) -> Vec<Vec<usize>> {
    let kept: Vec<usize> = (0..dims.len()).filter(|d| !axes.contains(d)).collect();
    let kept_dims: Vec<usize> = kept.iter().map(|&d| dims[d]).collect();
    let mut out = vec![Vec::new(); kept_dims.iter().product()];
    for i in 0..dims.iter().product() {
        let c = unravel(i, dims);
        let k: Vec<usize> = kept.iter().map(|&d| c[d]).collect();
        out[ravel(&k, &kept_dims)].push(i);
    }
    out
}

/// `(softmax, log_softmax)` of `x` along `axis`, shifted by the row maximum (by 0 where that
/// maximum is infinite, so that a row of `-inf` gives NaN).
fn softmax_ref(x: &[f64], dims: &[usize], axis: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut sm, mut lsm) = (vec![0.0; x.len()], vec![0.0; x.len()]);
    for g in groups(dims, &[axis]) {
        let m = g.iter().map(|&i| x[i]).fold(f64::NEG_INFINITY, f64::max);
        let m = if m.is_finite() { m } else { 0.0 };
        let s: f64 = g.iter().map(|&i| (x[i] - m).exp()).sum();
        for &i in &g {
            sm[i] = (x[i] - m).exp() / s;
            lsm[i] = (x[i] - m) - s.ln();
        }
    }
    (sm, lsm)
}

/// `(x - mean) / sqrt(var + eps) * w + b` over `axes`; `w`, `b` broadcast from `(values,
/// dims)`.
fn layer_norm_ref(
    x: &[f64],
    dims: &[usize],
    axes: &[usize],
    w: Option<(&[f64], &[usize])>,
    b: Option<(&[f64], &[usize])>,
    eps: f64,
) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for g in groups(dims, axes) {
        let n = g.len() as f64;
        let mean = g.iter().map(|&i| x[i]).sum::<f64>() / n;
        let var = g.iter().map(|&i| (x[i] - mean).powi(2)).sum::<f64>() / n;
        for &i in &g {
            y[i] = (x[i] - mean) / (var + eps).sqrt();
        }
    }
    affine(&mut y, dims, w, b);
    y
}

/// `x / sqrt(mean(x^2) + eps) * w` over `axes`.
fn rms_norm_ref(
    x: &[f64],
    dims: &[usize],
    axes: &[usize],
    w: Option<(&[f64], &[usize])>,
    eps: f64,
) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for g in groups(dims, axes) {
        let ms = g.iter().map(|&i| x[i] * x[i]).sum::<f64>() / g.len() as f64;
        for &i in &g {
            y[i] = x[i] / (ms + eps).sqrt();
        }
    }
    affine(&mut y, dims, w, None);
    y
}

fn affine(
    y: &mut [f64],
    dims: &[usize],
    w: Option<(&[f64], &[usize])>,
    b: Option<(&[f64], &[usize])>,
) {
    for (i, v) in y.iter_mut().enumerate() {
        let c = unravel(i, dims);
        if let Some((w, wd)) = w {
            *v *= w[broadcast_index(&c, wd)];
        }
        if let Some((b, bd)) = b {
            *v += b[broadcast_index(&c, bd)];
        }
    }
}

/// erf in f64, independent of the crate's: below 3 the series
/// `2/sqrt(pi) e^(-x^2) sum_n 2^n x^(2n+1) / (1 3 5 ... (2n+1))` (all terms positive); above,
/// the continued fraction `erfc(x) = e^(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`.
fn erf_ref(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let v = if a < 3.0 {
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        while term > sum * 1e-18 {
            n += 1.0;
            term *= 2.0 * a * a / (2.0 * n + 1.0);
            sum += term;
        }
        2.0 / PI.sqrt() * (-a * a).exp() * sum
    } else if a < 30.0 {
        let mut k = a;
        for j in (1..=300).rev() {
            k = a + (f64::from(j) / 2.0) / k;
        }
        1.0 - (-a * a).exp() / (PI.sqrt() * k)
    } else {
        1.0
    };
    v.copysign(x)
}

fn gelu_exact_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt()))
}

fn gelu_tanh_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// `sum((x - mean)^2) / (N - ddof)` over `axes`, optionally square-rooted.
fn var_ref(x: &[f64], dims: &[usize], axes: &[usize], ddof: usize, sqrt: bool) -> Vec<f64> {
    groups(dims, axes)
        .iter()
        .map(|g| {
            let n = g.len() as f64;
            let mean = g.iter().map(|&i| x[i]).sum::<f64>() / n;
            let ss = g.iter().map(|&i| (x[i] - mean).powi(2)).sum::<f64>();
            let v = ss / (n - ddof as f64).max(0.0);
            if sqrt {
                v.sqrt()
            } else {
                v
            }
        })
        .collect()
}

/// `x[..., start..end, ...]` along `axis`.
fn slice_ref(x: &[f64], dims: &[usize], axis: usize, start: usize, end: usize) -> Vec<f64> {
    (0..x.len())
        .filter(|&i| (start..end).contains(&unravel(i, dims)[axis]))
        .map(|i| x[i])
        .collect()
}

/// `a [m, k] @ b [k, n]`.
fn matmul_ref(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    out
}

/// `x [rows, n] + b [n]`.
fn add_row(x: &[f64], b: &[f64]) -> Vec<f64> {
    x.iter()
        .enumerate()
        .map(|(i, v)| v + b[i % b.len()])
        .collect()
}

fn silu_ref(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn softplus_ref(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

// ---- softmax ------------------------------------------------------------------------------------

#[test]
fn softmax_and_log_softmax() {
    let mut c = Checks::new(11);
    for dtype in [F32, F64] {
        for _ in 0..6 {
            let dims = c.shape(1, 3);
            let rank = dims.len() as i64;
            let axis = c.rng.int(-rank, rank - 1) as isize;
            let (x, xv) = c.uniform(dtype, &dims, -6.0, 6.0);
            let (sm, lsm) = softmax_ref(&xv, &dims, norm_axis(axis, dims.len()));
            let label = format!("{dtype}{dims:?} axis {axis}");
            c.check(
                format!("softmax {label}"),
                &x.softmax(axis).unwrap(),
                sm,
                formula_tol(dtype),
            );
            let y = x.log_softmax(axis).unwrap();
            c.check(format!("log_softmax {label}"), &y, lsm, formula_tol(dtype));
        }
        // Logits far beyond exp's range: exp(3e4) overflows even in f64 without the shift.
        let big: Vec<f64> = (0..12)
            .map(|i| 3e4 * [1.0, -1.0][i / 6] + i as f64)
            .collect();
        let (x, xv) = c.values(dtype, &[2, 6], &big);
        let (sm, lsm) = softmax_ref(&xv, &[2, 6], 1);
        assert!(sm.iter().all(|v| v.is_finite()));
        c.check(
            format!("softmax large {dtype}"),
            &x.softmax(-1).unwrap(),
            sm,
            formula_tol(dtype),
        );
        let y = x.log_softmax(-1).unwrap();
        c.check(
            format!("log_softmax large {dtype}"),
            &y,
            lsm,
            formula_tol(dtype),
        );
        // Masked entries (-inf) and a fully masked row, whose result is NaN.
        let inf = f64::NEG_INFINITY;
        let v = [
            0.5, inf, 2.0, inf, -1.0, inf, inf, inf, inf, inf, 1.0, 2.0, 3.0, 4.0, 5.0,
        ];
        let (x, xv) = c.values(dtype, &[3, 5], &v);
        let (sm, lsm) = softmax_ref(&xv, &[3, 5], 1);
        assert_eq!((sm[1], lsm[1]), (0.0, inf));
        assert!(sm[5].is_nan() && lsm[5].is_nan());
        c.check(
            format!("softmax masked {dtype}"),
            &x.softmax(1).unwrap(),
            sm,
            formula_tol(dtype),
        );
        let y = x.log_softmax(1).unwrap();
        c.check(
            format!("log_softmax masked {dtype}"),
            &y,
            lsm,
            formula_tol(dtype),
        );
        // A size-1 axis: softmax 1, log_softmax 0.
        let (x, _) = c.uniform(dtype, &[4, 1], -50.0, 50.0);
        c.check(
            "softmax size-1",
            &x.softmax(-1).unwrap(),
            vec![1.0; 4],
            EXACT,
        );
        c.check(
            "log_softmax size-1",
            &x.log_softmax(1).unwrap(),
            vec![0.0; 4],
            EXACT,
        );
    }
    for dtype in [F16, BF16] {
        let (x, xv) = c.uniform(dtype, &[3, 7], -4.0, 4.0);
        let (sm, _) = softmax_ref(&xv, &[3, 7], 1);
        let y = x.softmax(-1).unwrap();
        c.check(format!("softmax {dtype}"), &y, sm, formula_tol(dtype));
        let (_, lsm) = softmax_ref(&xv, &[3, 7], 0);
        let y = x.log_softmax(0).unwrap();
        c.check(format!("log_softmax {dtype}"), &y, lsm, formula_tol(dtype));
    }
    c.run();
}

// ---- norms --------------------------------------------------------------------------------------

#[test]
fn layer_norm_and_rms_norm() {
    let mut c = Checks::new(12);
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
            c.check(format!("layer_norm {label}"), &y, want, formula_tol(dtype));
            let y = x
                .rms_norm(axes, weight.as_ref().map(|p| &p.0), eps)
                .unwrap();
            let want = rms_norm_ref(&xv, dims, &a, w, eps);
            c.check(format!("rms_norm {label}"), &y, want, formula_tol(dtype));
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
    let mut c = Checks::new(13);
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
        let tol = match dtype {
            // Cephes' erf is within a few ulp; the reference series within a few more.
            F64 => Tol {
                rtol: 1e-14,
                atol: 1e-16,
            },
            // XLA's f32 rational approximation is within about 4e-7 of erf.
            F32 => Tol {
                rtol: 1e-6,
                atol: 1e-6,
            },
            _ => formula_tol(dtype),
        };
        let erf: Vec<f64> = xv.iter().map(|&x| erf_ref(x)).collect();
        c.check(format!("erf {dtype}"), &x.erf().unwrap(), erf, tol);
        let gelu: Vec<f64> = xv.iter().map(|&x| gelu_exact_ref(x)).collect();
        let gtol = Tol {
            rtol: tol.rtol * 4.0,
            atol: tol.atol * 16.0,
        };
        c.check(
            format!("gelu_exact {dtype}"),
            &x.gelu_exact().unwrap(),
            gelu,
            gtol,
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
            let tol = Tol {
                rtol: 1e-12,
                atol: 1e-14,
            };
            c.check("gelu (tanh) f64", &x.gelu().unwrap(), tanh, tol);
        }
    }
    c.run();
}

// ---- moments ------------------------------------------------------------------------------------

#[test]
fn var_std_mean_all() {
    let mut c = Checks::new(14);
    for dtype in [F32, F64] {
        for k in 0..8 {
            let dims = c.shape(1, 3);
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
            let tol = formula_tol(dtype);
            let v = x.var(&axes).unwrap();
            assert_eq!(v.dims(), kept.as_slice());
            c.check(
                format!("var {label}"),
                &v,
                var_ref(&xv, &dims, &a, 0, false),
                tol,
            );
            let s = x.std_keepdims(&axes).unwrap();
            assert_eq!(s.dims(), keep.as_slice());
            c.check(
                format!("std_keepdims {label}"),
                &s,
                var_ref(&xv, &dims, &a, 0, true),
                tol,
            );
            let s = x.std(&axes).unwrap();
            c.check(
                format!("std {label}"),
                &s,
                var_ref(&xv, &dims, &a, 0, true),
                tol,
            );
            let v = x.var_keepdims(&axes).unwrap();
            assert_eq!(v.dims(), keep.as_slice());
            c.check(
                format!("var_keepdims {label}"),
                &v,
                var_ref(&xv, &dims, &a, 0, false),
                tol,
            );
            let o = VarOptions {
                ddof: 1,
                keepdims: k % 2 == 0,
            };
            let want = var_ref(&xv, &dims, &a, 1, false);
            c.check(
                format!("var ddof 1 {label}"),
                &x.var_with(&axes, o).unwrap(),
                want,
                tol,
            );
            let want = var_ref(&xv, &dims, &a, 1, true);
            c.check(
                format!("std ddof 1 {label}"),
                &x.std_with(&axes, o).unwrap(),
                want,
                tol,
            );
            let mean = xv.iter().sum::<f64>() / xv.len() as f64;
            let m = x.mean_all().unwrap();
            assert_eq!(m.rank(), 0);
            c.check(format!("mean_all {label}"), &m, vec![mean], tol);
        }
        // ddof equal to the count divides by zero: infinity (NaN for a constant row), as NumPy.
        let (x, xv) = c.values(dtype, &[2, 3], &[1.0, 2.0, 4.0, 5.0, 5.0, 5.0]);
        let o = VarOptions {
            ddof: 3,
            keepdims: false,
        };
        let want = var_ref(&xv, &[2, 3], &[1], 3, false);
        assert!(want[0].is_infinite() && want[1].is_nan());
        c.check("var ddof = N", &x.var_with(&[1], o).unwrap(), want, EXACT);
    }
    let (x, xv) = c.uniform(BF16, &[4, 8], -2.0, 3.0);
    let want = var_ref(&xv, &[4, 8], &[1], 0, false);
    c.check("var bf16", &x.var(&[-1]).unwrap(), want, formula_tol(BF16));
    c.run();
}

// ---- split and chunk ----------------------------------------------------------------------------

#[test]
fn split_and_chunk() {
    let mut c = Checks::new(15);
    for dtype in [F32, I32] {
        let dims = [4, 6, 3];
        let (x, xv) = c.ints(dtype, &dims, -100, 100);
        let sizes = [1, 0, 2, 3];
        let parts = x.split(1, &sizes).unwrap();
        assert_eq!(parts.len(), 4);
        let mut at = 0;
        for (p, &n) in parts.iter().zip(&sizes) {
            assert_eq!(p.dims(), &[4, n, 3]);
            let want = slice_ref(&xv, &dims, 1, at, at + n);
            c.check(format!("split {dtype} [{at}, {})", at + n), p, want, EXACT);
            at += n;
        }
        for (axis, n) in [(-1, 3), (0, 2), (1, 1), (1, 6)] {
            let a = norm_axis(axis, 3);
            let len = dims[a] / n;
            let parts = x.chunk(axis, n).unwrap();
            assert_eq!(parts.len(), n);
            for (k, p) in parts.iter().enumerate() {
                let want = slice_ref(&xv, &dims, a, k * len, (k + 1) * len);
                c.check(
                    format!("chunk {dtype} axis {axis} into {n}: {k}"),
                    p,
                    want,
                    EXACT,
                );
            }
        }
    }
    let (x, _) = c.uniform(F32, &[0, 3], 0.0, 1.0);
    let parts = x.chunk(0, 1).unwrap();
    assert_eq!(parts[0].dims(), &[0, 3]);
    c.run();
}

// ---- gathers ------------------------------------------------------------------------------------

const INDEX_TYPES: [DType; 5] = [I32, I64, U8, U32, U64];

#[test]
fn take_along_axis_and_take_axis() {
    let mut c = Checks::new(16);
    for k in 0..30 {
        let tdims = c.shape(1, 3);
        let rank = tdims.len();
        let axis = c.rng.below(rank);
        let n = tdims[axis] as i64;
        // The indices' shape: its own length along the axis, elsewhere the table's size, or 1
        // (indices broadcast), or larger where the table's size is 1 (the table broadcasts).
        let idims: Vec<usize> = (0..rank)
            .map(|d| match (d == axis, tdims[d], c.rng.below(3)) {
                (true, _, _) => c.rng.int(0, 4) as usize,
                (false, _, 0) => 1,
                (false, 1, _) => c.rng.int(1, 3) as usize,
                (false, t, _) => t,
            })
            .collect();
        let odims: Vec<usize> = (0..rank)
            .map(|d| {
                if d == axis {
                    idims[d]
                } else {
                    tdims[d].max(idims[d])
                }
            })
            .collect();
        let idtype = INDEX_TYPES[k % 5];
        let dtype = [F32, I32, F64][k % 3];
        let (t, tv) = c.uniform(dtype, &tdims, -100.0, 100.0);
        let lo = if idtype.is_unsigned() { 0 } else { -3 };
        let (i, iv) = c.ints(idtype, &idims, lo, n + 3);
        let want: Vec<f64> = (0..odims.iter().product())
            .map(|o| {
                let oc = unravel(o, &odims);
                let mut tc: Vec<usize> = (0..rank)
                    .map(|d| if tdims[d] == 1 { 0 } else { oc[d] })
                    .collect();
                let j = iv[broadcast_index(&oc, &idims)] as i64;
                tc[axis] = j.clamp(0, n - 1) as usize;
                tv[ravel(&tc, &tdims)]
            })
            .collect();
        let axis_arg = if k % 2 == 0 {
            axis as isize
        } else {
            axis as isize - rank as isize
        };
        let y = t.take_along_axis(&i, axis_arg).unwrap();
        assert_eq!(y.dims(), odims.as_slice());
        let label =
            format!("take_along_axis {dtype}{tdims:?} by {idtype}{idims:?} axis {axis_arg}");
        c.check(label, &y, want, EXACT);
    }
    for k in 0..20 {
        let tdims = c.shape(1, 3);
        let rank = tdims.len();
        let axis = c.rng.below(rank);
        let n = tdims[axis] as i64;
        let idims = c.shape(0, 2);
        let idtype = INDEX_TYPES[k % 5];
        let (t, tv) = c.uniform(F32, &tdims, -100.0, 100.0);
        let lo = if idtype.is_unsigned() { 0 } else { -3 };
        let (i, iv) = c.ints(idtype, &idims, lo, n + 3);
        let mut odims = tdims[..axis].to_vec();
        odims.extend_from_slice(&idims);
        odims.extend_from_slice(&tdims[axis + 1..]);
        let want: Vec<f64> = (0..odims.iter().product())
            .map(|o| {
                let oc = unravel(o, &odims);
                let ic = &oc[axis..axis + idims.len()];
                let j = (iv[ravel(ic, &idims)] as i64).clamp(0, n - 1) as usize;
                let mut tc = oc[..axis].to_vec();
                tc.push(j);
                tc.extend_from_slice(&oc[axis + idims.len()..]);
                tv[ravel(&tc, &tdims)]
            })
            .collect();
        let y = t.take_axis(&i, axis as isize).unwrap();
        assert_eq!(y.dims(), odims.as_slice());
        c.check(
            format!("take_axis {tdims:?} by {idtype}{idims:?} axis {axis}"),
            &y,
            want,
            EXACT,
        );
    }
    // The largest u64 index clamps to the last entry.
    let (t, tv) = c.uniform(F32, &[2, 3], -1.0, 1.0);
    let i = c.input(HostArray::from_vec(&[2, 1], vec![u64::MAX, 1u64]).unwrap());
    c.check(
        "take_along_axis u64::MAX",
        &t.take_along_axis(&i, 1).unwrap(),
        vec![tv[2], tv[4]],
        EXACT,
    );
    c.run();
}

// ---- scan ---------------------------------------------------------------------------------------

#[test]
fn scan_threads_the_carry_and_stacks_outputs() {
    let mut c = Checks::new(17);
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
    let tol = formula_tol(F64);
    c.check("scan final h", &h, hv, tol);
    c.check("scan final total", &total, vec![tot], tol);
    c.check("scan stacked h", &hs, hs_want, tol);
    c.check("scan stacked totals", &totals, totals_want, tol);

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
    c.check("scan with a captured weight", &ys, want, formula_tol(F32));

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
    c.check("nested scan (cumsum)", &sums, want, formula_tol(F32));

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
    c.check("scan of 0 steps: carry", &h, h0v, EXACT);
    c.check("scan of 0 steps: ys", &ys[0], vec![], EXACT);
    c.run();
}

#[test]
fn fori_loop_with_scalar_i64_start() {
    // The pattern `scan` replaces, with the integer zero it needed.
    let mut c = Checks::new(18);
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
    c.check("fori_loop rows", &buf, want, formula_tol(F32));
    let big = c.g.scalar_i64(i64::MAX - 1).unwrap();
    c.check("scalar_i64 exact", &big, vec![(i64::MAX - 1) as f64], EXACT);
    c.run();
}

// ---- errors -------------------------------------------------------------------------------------

#[test]
fn bad_arguments_are_errors_that_say_what_was_wrong() {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[4, 8]).unwrap();
    let n = g.parameter("n", I32, &[4, 8]).unwrap();
    let w5 = g.parameter("w5", F32, &[5]).unwrap();
    let w64 = g.parameter("w64", F64, &[8]).unwrap();
    let idx = g.parameter("idx", I32, &[4, 2]).unwrap();
    let idx3 = g.parameter("idx3", I32, &[3, 2]).unwrap();
    let empty = g.parameter("empty", F32, &[4, 0]).unwrap();
    let xs = g.parameter("xs", F32, &[5, 8]).unwrap();
    let ys = g.parameter("ys", F32, &[6, 8]).unwrap();
    let s = g.parameter("s", F32, &[]).unwrap();
    let other = Graph::new().parameter("o", F32, &[4, 8]).unwrap();
    let zero_len = g.parameter("zero_len", F32, &[0]).unwrap();
    let unit = |r: Result<Tensor>| r.map(|_| ());
    let many = |r: Result<Vec<Tensor>>| r.map(|_| ());
    let cases: Vec<(&str, Result<()>, &str)> = vec![
        ("softmax axis", unit(x.softmax(2)), "axis 2 is out of range"),
        (
            "softmax dtype",
            unit(n.softmax(-1)),
            "softmax needs a float",
        ),
        (
            "log_softmax axis",
            unit(x.log_softmax(-3)),
            "axis -3 is out of range",
        ),
        (
            "layer_norm no axes",
            unit(x.layer_norm(&[], None, None, 1e-5)),
            "at least one axis",
        ),
        (
            "layer_norm twice",
            unit(x.layer_norm(&[1, -1], None, None, 1e-5)),
            "given twice",
        ),
        (
            "layer_norm weight shape",
            unit(x.layer_norm(&[-1], Some(&w5), None, 1e-5)),
            "weight f32[5]",
        ),
        (
            "layer_norm bias dtype",
            unit(x.layer_norm(&[-1], None, Some(&w64), 1e-5)),
            "bias f64[8]",
        ),
        (
            "layer_norm eps",
            unit(x.layer_norm(&[-1], None, None, -1.0)),
            "eps",
        ),
        (
            "layer_norm other graph",
            unit(x.layer_norm(&[-1], Some(&other), None, 1e-5)),
            "belongs to graph",
        ),
        (
            "rms_norm dtype",
            unit(n.rms_norm(&[-1], None, 1e-6)),
            "rms_norm needs a float",
        ),
        (
            "rms_norm eps",
            unit(x.rms_norm(&[-1], None, f64::NAN)),
            "eps",
        ),
        ("erf dtype", unit(n.erf()), "erf needs a float"),
        (
            "gelu_exact dtype",
            unit(n.gelu_exact()),
            "gelu_exact needs a float",
        ),
        ("var dtype", unit(n.var(&[0])), "var needs a float"),
        ("std axis", unit(x.std(&[5])), "axis 5 is out of range"),
        (
            "mean_all dtype",
            unit(n.mean_all()),
            "mean_all needs a float",
        ),
        ("split sum", many(x.split(1, &[3, 4])), "add up to 7"),
        (
            "split overflow",
            many(x.split(1, &[usize::MAX, 9])),
            "add up to",
        ),
        (
            "split axis",
            many(x.split(2, &[8])),
            "axis 2 is out of range",
        ),
        ("chunk uneven", many(x.chunk(1, 3)), "3 equal chunks"),
        ("chunk zero", many(x.chunk(0, 0)), "0 equal chunks"),
        (
            "chunk too many",
            many(zero_len.chunk(0, usize::MAX)),
            "more than the 65536",
        ),
        (
            "take_along_axis float indices",
            unit(x.take_along_axis(&x, 1)),
            "integers",
        ),
        (
            "take_along_axis rank",
            unit(x.take_along_axis(&n.sum(&[0]).unwrap(), 1)),
            "rank",
        ),
        (
            "take_along_axis broadcast",
            unit(x.take_along_axis(&idx3, 1)),
            "dimension 0 does not broadcast",
        ),
        (
            "take_along_axis empty axis",
            unit(empty.take_along_axis(&idx, 1)),
            "axis 1 is empty",
        ),
        (
            "take_along_axis axis",
            unit(x.take_along_axis(&idx, 2)),
            "axis 2 is out of range",
        ),
        (
            "take_axis float indices",
            unit(x.take_axis(&x, 0)),
            "integers",
        ),
        (
            "take_axis empty axis",
            unit(empty.take_axis(&idx, 1)),
            "axis 1 of f32[4, 0] is empty",
        ),
        (
            "take_axis other graph",
            unit(x.take_axis(&other, 0)),
            "belongs to graph",
        ),
    ];
    for (what, r, fragment) in cases {
        match r {
            Ok(()) => panic!("{what}: expected an error containing {fragment:?}"),
            Err(e) => {
                let m = e.to_string();
                assert!(m.contains(fragment), "{what}: {m:?} lacks {fragment:?}");
            }
        }
    }
    // scan: no inputs, unequal lengths, a rank-0 input, a carry that changes type.
    let step = |h: &Tensor, x: &Tensor| -> Result<(Tensor, Tensor)> { Ok((h.add(x)?, h.clone())) };
    let h0 = g.zeros(F32, &[8]).unwrap();
    let none: Vec<Tensor> = Vec::new();
    let e = g
        .scan(&h0, &none, |h, _| Ok((h.clone(), h.clone())))
        .err()
        .unwrap();
    assert!(e.to_string().contains("at least one input"), "{e}");
    let e = g
        .scan(&h0, &(xs.clone(), ys.clone()), |h, (x, _)| step(h, x))
        .err()
        .unwrap();
    assert!(e.to_string().contains("f32[5, 8], f32[6, 8]"), "{e}");
    let e = g.scan(&h0, &s, |h, x| step(h, x)).err().unwrap();
    assert!(e.to_string().contains("leading axis"), "{e}");
    let e = g
        .scan(&(h0.clone(), h0.clone()), &xs, |(h, k), x| {
            Ok(((h.add(x)?, k.sum_all()?), x.clone()))
        })
        .err()
        .unwrap();
    let m = e.to_string();
    assert!(
        m.contains("scan") && m.contains("carry component 1 changes from f32[8] to f32[]"),
        "{m}"
    );
    let e = g.scan(&h0, &other, |h, x| step(h, x)).err().unwrap();
    assert!(e.to_string().contains("belongs to graph"), "{e}");
    // The graph is still usable after the failed builds.
    let (_, ys) = g.scan(&h0, &xs, |h, x| step(h, x)).unwrap();
    g.set_outputs(&[&ys]).unwrap();
    g.to_stablehlo().unwrap();
}

// ---- three user programs ------------------------------------------------------------------------

/// A GPT-2 block on `[t, d]` activations: pre-norm causal self-attention with `heads` heads and
/// a tanh-GELU MLP, both residual.
#[test]
fn gpt2_block() {
    let mut c = Checks::new(21);
    let (t, d, heads) = (6, 8, 2);
    let dh = d / heads;
    let (x, xv) = c.uniform(F32, &[t, d], -1.0, 1.0);
    let (ln1_w, ln1_wv) = c.uniform(F32, &[d], 0.8, 1.2);
    let (ln1_b, ln1_bv) = c.uniform(F32, &[d], -0.1, 0.1);
    let (w_qkv, w_qkvv) = c.uniform(F32, &[d, 3 * d], -0.5, 0.5);
    let (b_qkv, b_qkvv) = c.uniform(F32, &[3 * d], -0.1, 0.1);
    let (w_o, w_ov) = c.uniform(F32, &[d, d], -0.5, 0.5);
    let (b_o, b_ov) = c.uniform(F32, &[d], -0.1, 0.1);
    let (ln2_w, ln2_wv) = c.uniform(F32, &[d], 0.8, 1.2);
    let (ln2_b, ln2_bv) = c.uniform(F32, &[d], -0.1, 0.1);
    let (w_fc, w_fcv) = c.uniform(F32, &[d, 4 * d], -0.5, 0.5);
    let (b_fc, b_fcv) = c.uniform(F32, &[4 * d], -0.1, 0.1);
    let (w_proj, w_projv) = c.uniform(F32, &[4 * d, d], -0.5, 0.5);
    let (b_proj, b_projv) = c.uniform(F32, &[d], -0.1, 0.1);
    let eps = 1e-5;

    // The graph, as a user writes it.
    let block = || -> Result<Tensor> {
        let h = x.layer_norm(&[-1], Some(&ln1_w), Some(&ln1_b), eps)?;
        let qkv = h.matmul(&w_qkv)?.add(&b_qkv)?;
        let heads_of = |m: &Tensor| m.reshape(&[t as isize, heads as isize, dh as isize]);
        let [q, k, v] = <[Tensor; 3]>::try_from(qkv.chunk(-1, 3)?).unwrap();
        let (q, k, v) = (heads_of(&q)?, heads_of(&k)?, heads_of(&v)?);
        let scores = Tensor::einsum("qhd,khd->hqk", &[&q, &k])?.mul(1.0 / (dh as f64).sqrt())?;
        let future = x.graph().triu_mask(t, t, 1)?;
        let probs = scores
            .masked_fill(&future, f64::NEG_INFINITY)?
            .softmax(-1)?;
        let attn =
            Tensor::einsum("hqk,khd->qhd", &[&probs, &v])?.reshape(&[t as isize, d as isize])?;
        let x1 = x.add(&attn.matmul(&w_o)?.add(&b_o)?)?;
        let h2 = x1.layer_norm(&[-1], Some(&ln2_w), Some(&ln2_b), eps)?;
        let m = h2.matmul(&w_fc)?.add(&b_fc)?.gelu()?;
        x1.add(&m.matmul(&w_proj)?.add(&b_proj)?)
    };
    let out = block().unwrap();

    // The same in plain Rust.
    let ln = |x: &[f64], w: &[f64], b: &[f64]| {
        layer_norm_ref(x, &[t, d], &[1], Some((w, &[d])), Some((b, &[d])), eps)
    };
    let h = ln(&xv, &ln1_wv, &ln1_bv);
    let qkv = add_row(&matmul_ref(&h, &w_qkvv, t, d, 3 * d), &b_qkvv);
    let at = |part: usize, i: usize, hd: usize, j: usize| qkv[i * 3 * d + part * d + hd * dh + j];
    let mut attn = vec![0.0; t * d];
    for hd in 0..heads {
        for i in 0..t {
            let scores: Vec<f64> = (0..=i)
                .map(|k| {
                    (0..dh)
                        .map(|j| at(0, i, hd, j) * at(1, k, hd, j))
                        .sum::<f64>()
                        / (dh as f64).sqrt()
                })
                .collect();
            let (p, _) = softmax_ref(&scores, &[i + 1], 0);
            for j in 0..dh {
                attn[i * d + hd * dh + j] = (0..=i).map(|k| p[k] * at(2, k, hd, j)).sum();
            }
        }
    }
    let proj = add_row(&matmul_ref(&attn, &w_ov, t, d, d), &b_ov);
    let x1: Vec<f64> = xv.iter().zip(&proj).map(|(a, b)| a + b).collect();
    let h2 = ln(&x1, &ln2_wv, &ln2_bv);
    let m: Vec<f64> = add_row(&matmul_ref(&h2, &w_fcv, t, d, 4 * d), &b_fcv)
        .into_iter()
        .map(gelu_tanh_ref)
        .collect();
    let mlp = add_row(&matmul_ref(&m, &w_projv, t, 4 * d, d), &b_projv);
    let want: Vec<f64> = x1.iter().zip(&mlp).map(|(a, b)| a + b).collect();
    c.check("gpt2 block", &out, want, PROGRAM);
    c.run();
}

/// Mamba-1's selective scan over `[l, d]` inputs with state size `n`: `delta = softplus(dt +
/// dt_bias)`, `h_t = exp(delta_t A) h_{t-1} + delta_t x_t B_t`, `y_t = h_t C_t + D x_t`, gated
/// by `silu(z)`.
#[test]
fn mamba1_selective_scan() {
    let mut c = Checks::new(22);
    let (l, d, n) = (9, 4, 3);
    let (x, xv) = c.uniform(F32, &[l, d], -1.0, 1.0);
    let (z, zv) = c.uniform(F32, &[l, d], -1.0, 1.0);
    let (dt, dtv) = c.uniform(F32, &[l, d], -2.0, 1.0);
    let (dt_bias, dt_biasv) = c.uniform(F32, &[d], -0.5, 0.5);
    let (a_log, a_logv) = c.uniform(F32, &[d, n], 0.0, 1.5);
    let (b, bv) = c.uniform(F32, &[l, n], -1.0, 1.0);
    let (cm, cv) = c.uniform(F32, &[l, n], -1.0, 1.0);
    let (skip, skipv) = c.uniform(F32, &[d], -1.0, 1.0);

    let program = || -> Result<Tensor> {
        let delta = dt.add(&dt_bias)?.softplus()?;
        let a = a_log.exp()?.neg()?;
        let h0 = x.graph().zeros(F32, &[d, n])?;
        let (_, ys) = x.graph().scan(
            &h0,
            &(x.clone(), delta, b.clone(), cm.clone()),
            |h, (x, delta, b, cm)| {
                let decay = delta.expand_dims(-1)?.mul(&a)?.exp()?; // [d, n]
                let input = delta.mul(x)?.expand_dims(-1)?.mul(b)?; // [d, n]
                let h = decay.mul(h)?.add(&input)?;
                let y = h.matmul(cm)?.add(&skip.mul(x)?)?; // [d]
                Ok((h, y))
            },
        )?;
        ys.mul(&z.silu()?)
    };
    let out = program().unwrap();

    let mut h = vec![0.0; d * n];
    let mut want = Vec::new();
    for t in 0..l {
        for i in 0..d {
            let delta = softplus_ref(dtv[t * d + i] + dt_biasv[i]);
            let x = xv[t * d + i];
            let mut y = skipv[i] * x;
            for j in 0..n {
                let a = -a_logv[i * n + j].exp();
                h[i * n + j] = (delta * a).exp() * h[i * n + j] + delta * x * bv[t * n + j];
                y += h[i * n + j] * cv[t * n + j];
            }
            want.push(y * silu_ref(zv[t * d + i]));
        }
    }
    c.check("mamba1 selective scan", &out, want, PROGRAM);
    c.run();
}

/// A two-layer MLP classifier with the mean cross-entropy of integer labels:
/// `loss = mean_i -log_softmax(relu(x W1 + b1) W2 + b2)[i, label_i]`.
#[test]
fn mlp_cross_entropy() {
    let mut c = Checks::new(23);
    let (batch, features, hidden, classes) = (5, 6, 16, 7);
    let (x, xv) = c.uniform(F32, &[batch, features], -1.0, 1.0);
    let (w1, w1v) = c.uniform(F32, &[features, hidden], -0.5, 0.5);
    let (b1, b1v) = c.uniform(F32, &[hidden], -0.1, 0.1);
    let (w2, w2v) = c.uniform(F32, &[hidden, classes], -0.5, 0.5);
    let (b2, b2v) = c.uniform(F32, &[classes], -0.1, 0.1);
    let (labels, labelsv) = c.ints(I32, &[batch], 0, classes as i64 - 1);

    let program = || -> Result<(Tensor, Tensor)> {
        let h = x.matmul(&w1)?.add(&b1)?.relu()?;
        let logp = h.matmul(&w2)?.add(&b2)?.log_softmax(-1)?;
        let picked = logp.take_along_axis(&labels.expand_dims(-1)?, -1)?;
        let loss = picked.neg()?.mean_all()?;
        Ok((loss, logp))
    };
    let (loss, logp) = program().unwrap();

    let h: Vec<f64> = add_row(&matmul_ref(&xv, &w1v, batch, features, hidden), &b1v)
        .into_iter()
        .map(|v| v.max(0.0))
        .collect();
    let logits = add_row(&matmul_ref(&h, &w2v, batch, hidden, classes), &b2v);
    let (_, logp_want) = softmax_ref(&logits, &[batch, classes], 1);
    let loss_want = (0..batch)
        .map(|i| -logp_want[i * classes + labelsv[i] as usize])
        .sum::<f64>()
        / batch as f64;
    c.check("mlp log-probabilities", &logp, logp_want, PROGRAM);
    c.check("mlp cross-entropy", &loss, vec![loss_want], PROGRAM);
    c.run();
}
