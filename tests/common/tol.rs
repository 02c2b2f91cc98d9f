//! Tolerances (one table, per dtype) and the comparison of two arrays with a report.

use stablegraph::{DType, HostArray};

use super::arrays::unravel;

/// How closely two arrays must agree. A NaN matches only a NaN; with `Close`, an infinity
/// matches only the same infinity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tol {
    /// Same bits (any NaN matches any NaN).
    Bits,
    /// Same value (integers exactly; floats `==`, so `-0 == 0`).
    Exact,
    /// `|got - want| <= atol + rtol * |want|`.
    Close { rtol: f64, atol: f64 },
}

impl Tol {
    /// The same tolerance with `rtol` times `r` and `atol` times `a` (exact ones stay exact).
    pub fn scaled(self, r: f64, a: f64) -> Tol {
        match self {
            Tol::Close { rtol, atol } => Tol::Close {
                rtol: rtol * r,
                atol: atol * a,
            },
            t => t,
        }
    }
}

/// The table, `(rtol, atol)` per float dtype, for one result computed two ways (the compiled
/// program, the interpreter, a formula in f64) from the same stored inputs. Integers and pred
/// have none: they are exact. Measured need with the committed seeds (the largest error over
/// all checks, as a fraction of the bound): f32 0.30 (gelu_exact, XLA's f32 erf against Rust's),
/// f16 0.71 (silu), bf16 0.47 (gelu_exact), f64 0.11 (the tanh gelu against its formula).
/// f16 and bf16 are JAX's bounds, about one unit of their precision (9.8e-4, 7.8e-3); f32 is ten
/// times JAX's 1e-6 because composites round through several transcendental functions that
/// XLA and Rust's libm compute differently (3e-6 measured). Whole f32 programs (a GPT-2 block,
/// a selective scan, an MLP loss) against plain Rust in f64 also hold to it.
pub fn table(d: DType) -> (f64, f64) {
    match d {
        DType::F32 => (1e-5, 1e-6),
        DType::F64 => (1e-12, 1e-14),
        DType::F16 => (1e-3, 1e-3),
        DType::BF16 => (1e-2, 1e-2),
        _ => (0.0, 0.0),
    }
}

/// The dtype's tolerance: [`table`] for floats, exact for integers and pred.
pub fn tol(d: DType) -> Tol {
    if d.is_float() {
        let (rtol, atol) = table(d);
        Tol::Close { rtol, atol }
    } else {
        Tol::Exact
    }
}

/// The tolerance for an accumulation of `terms` values of magnitude up to `scale`: [`table`]
/// plus `rtol * terms * scale` absolute, the usual bound for a sum computed in another order.
pub fn acc_tol(d: DType, terms: usize, scale: f64) -> Tol {
    match tol(d) {
        Tol::Close { rtol, atol } => Tol::Close {
            rtol,
            atol: atol + rtol * terms as f64 * scale,
        },
        t => t,
    }
}

/// Whether `g` (bits `gb`) matches `w` (bits `wb`) within `t`.
fn float_ok(g: f64, w: f64, gb: u64, wb: u64, t: Tol) -> bool {
    if g.is_nan() || w.is_nan() {
        return g.is_nan() && w.is_nan();
    }
    match t {
        Tol::Bits => gb == wb,
        Tol::Exact => g == w,
        Tol::Close { rtol, atol } => {
            if g.is_infinite() || w.is_infinite() {
                g == w
            } else {
                (g - w).abs() <= atol + rtol * w.abs()
            }
        }
    }
}

/// An array's elements: integers (and pred) as `i128`, floats as values and bits.
enum Elems {
    Int(Vec<i128>),
    Float(Vec<f64>, Vec<u64>),
}

fn elems(a: &HostArray) -> Elems {
    fn ints<T: Copy + Into<i128>>(a: &ndarray::ArrayD<T>) -> Elems {
        Elems::Int(a.iter().map(|&x| x.into()).collect())
    }
    fn floats<T>(a: &ndarray::ArrayD<T>, v: impl Fn(&T) -> f64, b: impl Fn(&T) -> u64) -> Elems {
        Elems::Float(a.iter().map(v).collect(), a.iter().map(b).collect())
    }
    match a {
        HostArray::Pred(a) => Elems::Int(a.iter().map(|&x| i128::from(x)).collect()),
        HostArray::U8(a) => ints(a),
        HostArray::U32(a) => ints(a),
        HostArray::U64(a) => ints(a),
        HostArray::I8(a) => ints(a),
        HostArray::I32(a) => ints(a),
        HostArray::I64(a) => ints(a),
        HostArray::F16(a) => floats(a, |x| x.to_f64(), |x| u64::from(x.to_bits())),
        HostArray::BF16(a) => floats(a, |x| x.to_f64(), |x| u64::from(x.to_bits())),
        HostArray::F32(a) => floats(a, |&x| f64::from(x), |x| u64::from(x.to_bits())),
        HostArray::F64(a) => floats(a, |&x| x, |x| x.to_bits()),
    }
}

/// `None` if `got` matches `want` within `t`, else a description of the mismatches. A `want` of
/// dtype f64 for a `got` of another dtype compares values (a formula computed in f64), exactly
/// for an integer `got`.
pub fn compare(got: &HostArray, want: &HostArray, t: Tol) -> Option<String> {
    if got.dims() != want.dims() || (got.dtype() != want.dtype() && want.dtype() != DType::F64) {
        return Some(format!("type {} but expected {}", got.ty(), want.ty()));
    }
    let dims = got.dims().to_vec();
    let mut bad = Vec::new();
    let mut count = 0;
    let mut note = |i: usize, g: String, w: String| {
        count += 1;
        if bad.len() < 4 {
            bad.push(format!("at {:?}: got {g}, want {w}", unravel(i, &dims)));
        }
    };
    if got.dtype() != want.dtype() {
        let t = if got.dtype().is_float() {
            t
        } else {
            Tol::Exact
        };
        for (i, (a, b)) in got
            .to_f64_vec()
            .into_iter()
            .zip(want.to_f64_vec())
            .enumerate()
        {
            if !float_ok(a, b, a.to_bits(), b.to_bits(), t) {
                note(i, format!("{a:e}"), format!("{b:e}"));
            }
        }
    } else {
        match (elems(got), elems(want)) {
            (Elems::Int(g), Elems::Int(w)) => {
                for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                    if a != b {
                        note(i, a.to_string(), b.to_string());
                    }
                }
            }
            (Elems::Float(g, gb), Elems::Float(w, wb)) => {
                let pairs = g.iter().zip(&gb).zip(w.iter().zip(&wb));
                for (i, ((&a, &ab), (&b, &bb))) in pairs.enumerate() {
                    if !float_ok(a, b, ab, bb, t) {
                        note(i, format!("{a:e} ({ab:#x})"), format!("{b:e} ({bb:#x})"));
                    }
                }
            }
            _ => unreachable!("same dtype"),
        }
    }
    (count > 0).then(|| {
        format!(
            "{count} of {} elements differ ({}): {}",
            got.dims().iter().product::<usize>(),
            got.ty(),
            bad.join("; ")
        )
    })
}

/// Panics with [`compare`]'s report unless `got` matches `want` within `t`.
#[track_caller]
pub fn assert_matches(got: &HostArray, want: &HostArray, t: Tol, what: &str) {
    if let Some(m) = compare(got, want, t) {
        panic!("{what}: {m}");
    }
}
