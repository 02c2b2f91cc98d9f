//! Host formulas in f64, written independently of the library, that the tests compare with.

use std::f64::consts::PI;

use super::*;

/// The flat index into an array of `dims` (aligned to the trailing dimensions, size-1
/// dimensions broadcast) of the element at coordinate `c` of a larger array.
pub fn broadcast_index(c: &[usize], dims: &[usize]) -> usize {
    let skip = c.len() - dims.len();
    let own: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(d, &n)| if n == 1 { 0 } else { c[skip + d] })
        .collect();
    ravel(&own, dims)
}

pub fn norm_axis(a: isize, rank: usize) -> usize {
    if a < 0 {
        (a + rank as isize) as usize
    } else {
        a as usize
    }
}

/// For each position of the kept dimensions (row-major), the flat indices of the elements
/// reduced into it.
pub fn groups(dims: &[usize], axes: &[usize]) -> Vec<Vec<usize>> {
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
pub fn softmax_ref(x: &[f64], dims: &[usize], axis: usize) -> (Vec<f64>, Vec<f64>) {
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
pub fn layer_norm_ref(
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
pub fn rms_norm_ref(
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

pub fn affine(
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
pub fn erf_ref(x: f64) -> f64 {
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

pub fn gelu_exact_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt()))
}

pub fn gelu_tanh_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// `sum((x - mean)^2) / (N - ddof)` over `axes`, optionally square-rooted.
pub fn var_ref(x: &[f64], dims: &[usize], axes: &[usize], ddof: usize, sqrt: bool) -> Vec<f64> {
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
pub fn slice_ref(x: &[f64], dims: &[usize], axis: usize, start: usize, end: usize) -> Vec<f64> {
    (0..x.len())
        .filter(|&i| (start..end).contains(&unravel(i, dims)[axis]))
        .map(|i| x[i])
        .collect()
}

/// `a [m, k] @ b [k, n]`.
pub fn matmul_ref(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    out
}

/// `x [rows, n] + b [n]`.
pub fn add_row(x: &[f64], b: &[f64]) -> Vec<f64> {
    x.iter()
        .enumerate()
        .map(|(i, v)| v + b[i % b.len()])
        .collect()
}

pub fn silu_ref(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

pub fn softplus_ref(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}
