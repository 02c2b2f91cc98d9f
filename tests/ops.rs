//! Per-op property tests: every builder (and so every primitive) runs many seeded random cases,
//! compiled through the PJRT CPU plugin and compared output by output against the reference
//! interpreter (`Graph::evaluate`), and where cheap also against a formula computed here on the
//! host.
//!
//! Each test builds ONE graph holding many independent cases (each with its own uniquely named
//! parameters), sets all their outputs, compiles once, runs once with random inputs and evaluates
//! the same inputs with the interpreter. `Graph::compile` checks the executable's output types
//! against the graph's inferred types, so every suite also checks type inference for its ops.
//!
//! Tolerances: f32 `1e-5` relative + `1e-6` absolute, f64 `1e-12` + `1e-13`, f16 `1e-3` + `1e-3`,
//! bf16 `1e-2` + `1e-2`; integers and pred exact; shape ops bit-exact. Accumulations (sums,
//! products, dot products) add `rtol * terms * scale` to the absolute tolerance, the usual bound
//! for a sum of `terms` values of magnitude up to `scale`. A NaN or infinity on either side must
//! be matched by the same (NaN, or infinity of the same sign) on the other.

mod common;

use common::{client, Rng};
use half::{bf16, f16};
use stablegraph::ops::{CumsumOptions, Graph, SortOrder, Tensor};
use stablegraph::{DType, HostArray, Result, TensorType};

use DType::{Pred, BF16, F16, F32, F64, I32, I64, U32, U64, U8};

const FLOATS: [DType; 4] = [F32, F64, F16, BF16];
const INTS: [DType; 5] = [U8, U32, U64, I32, I64];
const NUMERIC: [DType; 9] = [U8, U32, U64, I32, I64, F16, BF16, F32, F64];

// ---- random inputs ----------------------------------------------------------------------------

/// How the elements of a random input are drawn.
#[derive(Clone, Debug)]
enum Dist {
    /// Continuous uniform in `[lo, hi)`.
    U(f64, f64),
    /// Integer uniform in `lo..=hi`.
    Int(i64, i64),
    /// Raw random bits (every value of an integer type; any float bit pattern).
    Bits,
    /// One of these values.
    Pick(Vec<f64>),
    /// 1 with probability `p`, else 0 (pred: true / false).
    Bool(f64),
    /// Each element from one of these, chosen uniformly.
    OneOf(Vec<Dist>),
    /// With probability `p` one of the specials, else from the base.
    With(Box<Dist>, Vec<f64>, f64),
    /// `10^U(lo, hi)` with a random sign.
    LogU(f64, f64),
    /// `10^U(lo, hi)`, positive.
    PosLogU(f64, f64),
    /// From the base, redrawn while the value, stored as `src`, lies within 1e-3 ulp of a
    /// rounding midpoint of `dst` (so that narrowing it is insensitive to double rounding).
    AwayFromMid(Box<Dist>, DType, DType),
    /// From the base, redrawn while it is 0.
    NonZero(Box<Dist>),
}

#[derive(Clone, Copy, Debug)]
enum Sample {
    F(f64),
    B(u64),
}

const SPECIALS: [f64; 11] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -0.5,
    2.0,
    1e-3,
];

fn u(lo: f64, hi: f64) -> Dist {
    Dist::U(lo, hi)
}

fn with(base: Dist, specials: &[f64], p: f64) -> Dist {
    Dist::With(Box::new(base), specials.to_vec(), p)
}

fn one_of(ds: &[Dist]) -> Dist {
    Dist::OneOf(ds.to_vec())
}

fn nonzero(d: Dist) -> Dist {
    Dist::NonZero(Box::new(d))
}

fn pick(values: &[f64]) -> Dist {
    Dist::Pick(values.to_vec())
}

/// The value `v` has once stored as `dtype`.
fn stored(v: f64, dtype: DType) -> f64 {
    match dtype {
        F16 => f16::from_f64(v).to_f64(),
        BF16 => bf16::from_f64(v).to_f64(),
        F32 => f64::from(v as f32),
        _ => v,
    }
}

/// Whether `v` is within 1e-3 ulp of a rounding midpoint of the float type `dst`.
fn near_midpoint(v: f64, dst: DType) -> bool {
    let (p, emin) = match dst {
        F16 => (11, -14),
        BF16 => (8, -126),
        F32 => (24, -126),
        _ => return false,
    };
    if v == 0.0 || !v.is_finite() {
        return false;
    }
    let a = v.abs();
    let e = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
    let r = a / 2f64.powi(e - (p - 1));
    (r - r.floor() - 0.5).abs() < 1e-3
}

fn sample(rng: &mut Rng, d: &Dist) -> Sample {
    match d {
        Dist::U(lo, hi) => Sample::F(rng.uniform(*lo, *hi)),
        Dist::Int(lo, hi) => Sample::F(rng.int(*lo, *hi) as f64),
        Dist::Bits => Sample::B(rng.next_u64()),
        Dist::Pick(v) => Sample::F(rng.pick(v)),
        Dist::Bool(p) => Sample::F(if rng.chance(*p) { 1.0 } else { 0.0 }),
        Dist::OneOf(ds) => {
            let i = rng.below(ds.len());
            sample(rng, &ds[i])
        }
        Dist::With(base, specials, p) => {
            if rng.chance(*p) {
                Sample::F(rng.pick(specials))
            } else {
                sample(rng, base)
            }
        }
        Dist::LogU(lo, hi) => {
            let m = 10f64.powf(rng.uniform(*lo, *hi));
            Sample::F(if rng.chance(0.5) { -m } else { m })
        }
        Dist::PosLogU(lo, hi) => Sample::F(10f64.powf(rng.uniform(*lo, *hi))),
        Dist::AwayFromMid(base, src, dst) => loop {
            let s = sample(rng, base);
            match s {
                Sample::F(v) if near_midpoint(stored(v, *src), *dst) => continue,
                _ => break s,
            }
        },
        Dist::NonZero(base) => loop {
            let s = sample(rng, base);
            match s {
                Sample::F(0.0) => continue,
                Sample::B(0) => continue,
                _ => break s,
            }
        },
    }
}

fn array_from_samples(dtype: DType, dims: &[usize], s: &[Sample]) -> HostArray {
    fn conv<T: stablegraph::array::HostElement>(
        dims: &[usize],
        s: &[Sample],
        f: impl Fn(f64) -> T,
        b: impl Fn(u64) -> T,
    ) -> HostArray {
        let v = s
            .iter()
            .map(|x| match *x {
                Sample::F(v) => f(v),
                Sample::B(bits) => b(bits),
            })
            .collect();
        HostArray::from_vec(dims, v).unwrap()
    }
    match dtype {
        Pred => conv(dims, s, |v| v != 0.0, |b| b & 1 == 1),
        U8 => conv(dims, s, |v| v as u8, |b| b as u8),
        U32 => conv(dims, s, |v| v as u32, |b| b as u32),
        U64 => conv(dims, s, |v| v as u64, |b| b),
        I32 => conv(dims, s, |v| v as i32, |b| b as u32 as i32),
        I64 => conv(dims, s, |v| v as i64, |b| b as i64),
        F16 => conv(dims, s, f16::from_f64, |b| f16::from_bits(b as u16)),
        BF16 => conv(dims, s, bf16::from_f64, |b| bf16::from_bits(b as u16)),
        F32 => conv(dims, s, |v| v as f32, |b| f32::from_bits(b as u32)),
        F64 => conv(dims, s, |v| v, f64::from_bits),
    }
}

fn random_array(rng: &mut Rng, dtype: DType, dims: &[usize], dist: &Dist) -> HostArray {
    let n: usize = dims.iter().product();
    let s: Vec<Sample> = (0..n).map(|_| sample(rng, dist)).collect();
    array_from_samples(dtype, dims, &s)
}

/// An array of `dtype` holding `values` (converted as `as` / `from_f64` would).
fn array_of(dtype: DType, dims: &[usize], values: &[f64]) -> HostArray {
    let s: Vec<Sample> = values.iter().map(|&v| Sample::F(v)).collect();
    array_from_samples(dtype, dims, &s)
}

fn f64_array(dims: &[usize], values: Vec<f64>) -> HostArray {
    HostArray::from_vec(dims, values).unwrap()
}

/// Dimension sizes, weighted towards non-trivial ones.
const DIM_CHOICES: [usize; 12] = [0, 1, 1, 2, 2, 2, 3, 3, 3, 5, 5, 5];

fn dim(rng: &mut Rng) -> usize {
    rng.pick(&DIM_CHOICES)
}

fn nz_dim(rng: &mut Rng) -> usize {
    rng.pick(&[1, 2, 2, 3, 3, 5])
}

fn shape(rng: &mut Rng, min_rank: usize, max_rank: usize) -> Vec<usize> {
    let r = rng.int(min_rank as i64, max_rank as i64) as usize;
    (0..r).map(|_| dim(rng)).collect()
}

/// A shape that broadcasts to `out` (numpy rules): a suffix of it, some dims replaced by 1.
fn sub_broadcast(rng: &mut Rng, out: &[usize]) -> Vec<usize> {
    let r = rng.int(0, out.len() as i64) as usize;
    out[out.len() - r..]
        .iter()
        .map(|&d| if rng.chance(0.3) { 1 } else { d })
        .collect()
}

fn max_abs(a: &HostArray) -> f64 {
    a.to_f64_vec()
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(0.0, |m, v| m.max(v.abs()))
}

fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for (k, &d) in dims.iter().enumerate().rev() {
        if d > 0 {
            idx[k] = i % d;
            i /= d;
        }
    }
    idx
}

fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(strides(dims)).map(|(i, s)| i * s).sum()
}

/// A new array of `a`'s dtype with the elements of `a` at the flat indices `flat`.
fn gather(a: &HostArray, out_dims: &[usize], flat: &[usize]) -> HostArray {
    let sz = a.dtype().size_in_bytes();
    let b = a.to_bytes();
    let mut out = Vec::with_capacity(flat.len() * sz);
    for &i in flat {
        out.extend_from_slice(&b[i * sz..(i + 1) * sz]);
    }
    HostArray::from_bytes(&TensorType::new(a.dtype(), out_dims), &out).unwrap()
}

// ---- tolerances and comparison ----------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Tol {
    /// Same bits (any NaN matches any NaN).
    Bits,
    /// Same value (integers exactly; floats `==`, NaN matches NaN).
    Exact,
    /// `|got - want| <= atol + rtol * |want|`.
    Close { rtol: f64, atol: f64 },
}

fn rtol_of(d: DType) -> f64 {
    match d {
        F32 => 1e-5,
        F64 => 1e-12,
        F16 => 1e-3,
        BF16 => 1e-2,
        _ => 0.0,
    }
}

fn atol_of(d: DType) -> f64 {
    match d {
        F32 => 1e-6,
        F64 => 1e-13,
        F16 => 1e-3,
        BF16 => 1e-2,
        _ => 0.0,
    }
}

fn tol(d: DType) -> Tol {
    if d.is_float() {
        Tol::Close {
            rtol: rtol_of(d),
            atol: atol_of(d),
        }
    } else {
        Tol::Exact
    }
}

/// The tolerance for an accumulation of `terms` values of magnitude up to `scale`.
fn acc_tol(d: DType, terms: usize, scale: f64) -> Tol {
    if d.is_float() {
        Tol::Close {
            rtol: rtol_of(d),
            atol: atol_of(d) + rtol_of(d) * terms as f64 * scale,
        }
    } else {
        Tol::Exact
    }
}

enum Elems {
    Int(Vec<i128>),
    Float(Vec<f64>, Vec<u64>),
}

fn elems(a: &HostArray) -> Elems {
    fn ints<T: Copy + Into<i128>>(a: &ndarray::ArrayD<T>) -> Elems {
        Elems::Int(a.iter().map(|&x| x.into()).collect())
    }
    match a {
        HostArray::Pred(a) => Elems::Int(a.iter().map(|&x| i128::from(x)).collect()),
        HostArray::U8(a) => ints(a),
        HostArray::U32(a) => ints(a),
        HostArray::U64(a) => ints(a),
        HostArray::I32(a) => ints(a),
        HostArray::I64(a) => ints(a),
        HostArray::F16(a) => Elems::Float(
            a.iter().map(|x| x.to_f64()).collect(),
            a.iter().map(|x| u64::from(x.to_bits())).collect(),
        ),
        HostArray::BF16(a) => Elems::Float(
            a.iter().map(|x| x.to_f64()).collect(),
            a.iter().map(|x| u64::from(x.to_bits())).collect(),
        ),
        HostArray::F32(a) => Elems::Float(
            a.iter().map(|&x| f64::from(x)).collect(),
            a.iter().map(|x| u64::from(x.to_bits())).collect(),
        ),
        HostArray::F64(a) => Elems::Float(
            a.iter().copied().collect(),
            a.iter().map(|x| x.to_bits()).collect(),
        ),
    }
}

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

/// `None` if `got` matches `want` within `t`, else a description of the mismatches. A `want` of
/// dtype f64 for a `got` of another dtype compares values (a formula computed in f64).
fn compare(got: &HostArray, want: &HostArray, t: Tol) -> Option<String> {
    if got.dims() != want.dims() || (got.dtype() != want.dtype() && want.dtype() != F64) {
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
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
            let t = if got.dtype().is_float() {
                t
            } else {
                Tol::Exact
            };
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
    if count == 0 {
        None
    } else {
        Some(format!(
            "{count} of {} elements differ ({}): {}",
            got.dims().iter().product::<usize>(),
            got.ty(),
            bad.join("; ")
        ))
    }
}

fn show(a: &HostArray) -> String {
    if a.dims().iter().product::<usize>() > 64 {
        format!("{} (too large to print)", a.ty())
    } else {
        format!("{} {:?}", a.ty(), a.to_f64_vec())
    }
}

// ---- the harness ------------------------------------------------------------------------------

struct Check {
    case: String,
    params: Vec<usize>,
    out: Tensor,
    tol: Tol,
    formula: Option<(HostArray, Tol)>,
}

/// One graph of many independent cases, compiled once and compared output by output.
struct Suite {
    name: String,
    g: Graph,
    rng: Rng,
    inputs: Vec<HostArray>,
    names: Vec<String>,
    case: String,
    case_no: usize,
    case_params: Vec<usize>,
    checks: Vec<Check>,
}

/// The results of a suite's run.
struct Ran {
    compiled: stablegraph::CompiledGraph,
    inputs: Vec<HostArray>,
    got: Vec<HostArray>,
    want: Vec<HostArray>,
}

impl Suite {
    fn new(name: &str, seed: u64) -> Suite {
        Suite {
            name: name.to_string(),
            g: Graph::new(),
            rng: Rng::new(seed),
            inputs: Vec::new(),
            names: Vec::new(),
            case: String::new(),
            case_no: 0,
            case_params: Vec::new(),
            checks: Vec::new(),
        }
    }

    /// Starts a new case; parameters made from now on belong to it.
    fn case(&mut self, label: impl Into<String>) {
        self.case_no += 1;
        self.case = format!("case {} ({})", self.case_no, label.into());
        self.case_params.clear();
    }

    /// A parameter of this case holding `value`.
    fn input(&mut self, tag: &str, value: HostArray) -> Tensor {
        let mut name = format!("{tag}{}", self.case_no);
        while self.names.contains(&name) {
            name.push('_');
        }
        let t = self
            .g
            .parameter(&name, value.dtype(), value.dims())
            .unwrap();
        self.case_params.push(self.inputs.len());
        self.inputs.push(value);
        self.names.push(name);
        t
    }

    /// A parameter of this case with random contents.
    fn param(&mut self, tag: &str, dtype: DType, dims: &[usize], dist: &Dist) -> Tensor {
        let v = random_array(&mut self.rng, dtype, dims, dist);
        self.input(tag, v)
    }

    /// The value a parameter made by this suite holds.
    fn value(&self, t: &Tensor) -> &HostArray {
        let names = self.g.parameter_names();
        let params = self.g.parameters();
        let i = params
            .iter()
            .position(|p| *p == t.id())
            .expect("a parameter");
        assert_eq!(names[i], self.names[i]);
        &self.inputs[i]
    }

    /// Compares `t` between PJRT and the interpreter with the dtype's tolerance; returns the
    /// output index.
    fn check(&mut self, t: &Tensor) -> usize {
        self.check_tol(t, tol(t.dtype()))
    }

    fn check_tol(&mut self, t: &Tensor, tol: Tol) -> usize {
        self.checks.push(Check {
            case: self.case.clone(),
            params: self.case_params.clone(),
            out: t.clone(),
            tol,
            formula: None,
        });
        self.checks.len() - 1
    }

    /// As [`Suite::check_tol`], and both results must also match `want` (computed here) within
    /// `ftol`.
    fn check_formula(&mut self, t: &Tensor, tol: Tol, want: HostArray, ftol: Tol) -> usize {
        let i = self.check_tol(t, tol);
        self.checks[i].formula = Some((want, ftol));
        i
    }

    /// Finds which checks fail `f` when each output is alone in the graph.
    fn locate(&self, what: &str, f: impl Fn(&Graph) -> Result<()>) -> String {
        let mut out = Vec::new();
        for c in &self.checks {
            self.g.set_outputs(&[&c.out]).unwrap();
            if let Err(e) = f(&self.g) {
                out.push(format!("  {}: {what} fails: {e}", c.case));
                if out.len() >= 8 {
                    out.push("  ...".into());
                    break;
                }
            }
        }
        if out.is_empty() {
            "  (no single output fails alone)".into()
        } else {
            out.join("\n")
        }
    }

    fn describe(&self, c: &Check) -> String {
        c.params
            .iter()
            .map(|&p| format!("    {} = {}", self.names[p], show(&self.inputs[p])))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn run(self) -> Ran {
        let start = std::time::Instant::now();
        let outs: Vec<&Tensor> = self.checks.iter().map(|c| &c.out).collect();
        self.g.set_outputs(&outs).unwrap();
        let compiled = match self.g.compile(&client()) {
            Ok(c) => c,
            Err(e) => {
                let which = self.locate("compile", |g| g.compile(&client()).map(|_| ()));
                panic!("[{}] compiling the suite failed: {e}\n{which}", self.name);
            }
        };
        let compile_ms = start.elapsed().as_millis();
        assert_eq!(
            compiled.executable().output_types(),
            self.g.output_types().as_slice(),
            "[{}] executable output types differ from the inferred types",
            self.name
        );
        let got = compiled.run(&self.inputs).unwrap_or_else(|e| {
            panic!("[{}] running the suite failed: {e}", self.name);
        });
        let want = match self.g.evaluate(&self.inputs) {
            Ok(w) => w,
            Err(e) => {
                let which = self.locate("evaluate", |g| g.evaluate(&self.inputs).map(|_| ()));
                panic!("[{}] the interpreter failed: {e}\n{which}", self.name);
            }
        };
        assert_eq!(got.len(), self.checks.len());
        assert_eq!(want.len(), self.checks.len());
        let mut failures = Vec::new();
        for (k, c) in self.checks.iter().enumerate() {
            let mut why = Vec::new();
            if got[k].ty() != *c.out.ty() {
                why.push(format!(
                    "PJRT output type {} but inferred {}",
                    got[k].ty(),
                    c.out.ty()
                ));
            }
            if let Some(m) = compare(&got[k], &want[k], c.tol) {
                why.push(format!("PJRT vs interpreter: {m}"));
            }
            if let Some((f, ft)) = &c.formula {
                if let Some(m) = compare(&got[k], f, *ft) {
                    why.push(format!("PJRT vs formula: {m}"));
                }
                if let Some(m) = compare(&want[k], f, *ft) {
                    why.push(format!("interpreter vs formula: {m}"));
                }
            }
            if !why.is_empty() {
                failures.push(format!(
                    "  {} output {k} {}:\n    {}\n{}\n    PJRT        = {}\n    interpreter = {}",
                    c.case,
                    c.out.ty(),
                    why.join("\n    "),
                    self.describe(c),
                    show(&got[k]),
                    show(&want[k]),
                ));
            }
        }
        eprintln!(
            "[{}] {} cases, {} outputs, {} parameters; compiled in {compile_ms} ms, total {} ms",
            self.name,
            self.case_no,
            self.checks.len(),
            self.inputs.len(),
            start.elapsed().as_millis()
        );
        if !failures.is_empty() {
            let n = failures.len();
            failures.truncate(12);
            panic!(
                "[{}] {n} of {} outputs disagree:\n{}",
                self.name,
                self.checks.len(),
                failures.join("\n")
            );
        }
        Ran {
            compiled,
            inputs: self.inputs,
            got,
            want,
        }
    }
}

type Unary = fn(&Tensor) -> Result<Tensor>;
type Binary = fn(&Tensor, &Tensor) -> Result<Tensor>;

// ---- elementwise ------------------------------------------------------------------------------

fn unary_float_ops() -> Vec<(&'static str, Unary, Dist)> {
    vec![
        ("neg", Tensor::neg as Unary, u(-10.0, 10.0)),
        ("abs", Tensor::abs, u(-10.0, 10.0)),
        ("exp", Tensor::exp, u(-10.0, 10.0)),
        (
            "expm1",
            Tensor::expm1,
            one_of(&[u(-5.0, 5.0), u(-1e-3, 1e-3)]),
        ),
        ("log", Tensor::log, Dist::PosLogU(-3.0, 3.0)),
        (
            "log1p",
            Tensor::log1p,
            one_of(&[u(-0.99, 10.0), u(-1e-3, 1e-3)]),
        ),
        ("sqrt", Tensor::sqrt, with(u(0.0, 100.0), &[0.0], 0.1)),
        ("rsqrt", Tensor::rsqrt, Dist::PosLogU(-2.0, 3.0)),
        ("tanh", Tensor::tanh, u(-6.0, 6.0)),
        ("logistic", Tensor::logistic, u(-12.0, 12.0)),
        ("sigmoid", Tensor::sigmoid, u(-12.0, 12.0)),
        ("floor", Tensor::floor, u(-10.0, 10.0)),
        ("ceil", Tensor::ceil, u(-10.0, 10.0)),
        ("sign", Tensor::sign, with(u(-3.0, 3.0), &[0.0, -0.0], 0.2)),
        ("sin", Tensor::sin, u(-4.0, 4.0)),
        ("cos", Tensor::cos, u(-4.0, 4.0)),
    ]
}

#[test]
fn unary_float() {
    let mut s = Suite::new("unary_float", 101);
    for (name, f, dist) in unary_float_ops() {
        for dtype in FLOATS {
            for _ in 0..2 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let x = s.param("x", dtype, &dims, &dist);
                let y = f(&x).unwrap();
                s.check(&y);
            }
        }
    }
    s.run();
}

/// NaN, infinities, signed zeros and domain edges through every float unary op.
#[test]
fn unary_float_specials() {
    let mut s = Suite::new("unary_float_specials", 102);
    for (name, f, _) in unary_float_ops() {
        for dtype in FLOATS {
            s.case(format!("{name} {dtype} specials"));
            let x = s.input("x", array_of(dtype, &[SPECIALS.len()], &SPECIALS));
            let y = f(&x).unwrap();
            s.check(&y);
        }
    }
    s.run();
}

/// A NaN made inside the program stays NaN through `logistic` and whatever follows it. XLA's
/// CPU backend let a fused sine or cosine of `logistic(0 / 0)` assume a number (0.84, 1 or -0,
/// depending on memory contents; found by the random_graph fuzzer); the lowering now selects
/// the NaN operand. Device against the interpreter, NaN for NaN.
#[test]
fn logistic_of_a_nan_made_in_the_program_stays_nan() {
    let consumers: [(&str, Unary); 4] = [
        ("logistic", |l| Ok(l.clone())),
        ("sin", Tensor::sin),
        ("cos", Tensor::cos),
        ("exp(sin)", |l| l.sin()?.exp()),
    ];
    let client = client();
    for ((name, f), n) in consumers
        .into_iter()
        .flat_map(|c| [3usize, 17, 100, 1000].map(|n| (c, n)))
    {
        let g = Graph::new();
        let i = g.iota(F32, &[n], 0).unwrap();
        let y = f(&i.div(&i).unwrap().logistic().unwrap()).unwrap();
        g.set_outputs(&[&y]).unwrap();
        let want = stablegraph::interp::evaluate(&g, &[]).unwrap()[0].to_f64_vec();
        let got = g.compile(&client).unwrap().run(&[]).unwrap()[0].to_f64_vec();
        assert!(want[0].is_nan(), "{name}: the interpreter gave {}", want[0]);
        for (j, (x, y)) in got.iter().zip(&want).enumerate() {
            let same = (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-6;
            assert!(
                same,
                "{name} of {n}, element {j}: device {x}, interpreter {y}"
            );
        }
    }
}

#[test]
fn unary_int_and_pred() {
    let mut s = Suite::new("unary_int_and_pred", 103);
    let ops: [(&str, Unary); 4] = [
        ("neg", Tensor::neg),
        ("abs", Tensor::abs),
        ("sign", Tensor::sign),
        ("not", Tensor::not),
    ];
    let dist = one_of(&[Dist::Bits, Dist::Int(-3, 3), pick(&[0.0])]);
    let udist = one_of(&[Dist::Bits, Dist::Int(0, 3)]);
    for (name, f) in ops {
        for dtype in INTS {
            for _ in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let d = if dtype.is_unsigned() { &udist } else { &dist };
                let x = s.param("x", dtype, &dims, d);
                s.check(&f(&x).unwrap());
            }
        }
    }
    for _ in 0..4 {
        let dims = shape(&mut s.rng, 0, 3);
        s.case(format!("not pred{dims:?}"));
        let x = s.param("x", Pred, &dims, &Dist::Bool(0.5));
        s.check(&x.not().unwrap());
    }
    // The method and the operator are the same op.
    s.case("-x operator");
    let x = s.param("x", F32, &[3], &u(-1.0, 1.0));
    s.check(&(-&x).unwrap());
    s.run();
}

fn float_binary_ops() -> Vec<(&'static str, Binary)> {
    vec![
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("div", |a, b| a.div(b)),
        ("pow", |a, b| a.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
        ("rem", |a, b| a.rem(b)),
    ]
}

#[test]
fn binary_float() {
    let mut s = Suite::new("binary_float", 201);
    let plain = u(-10.0, 10.0);
    let with_nan = with(u(-10.0, 10.0), &[f64::NAN, 0.0, 1.0], 0.15);
    let away_from_zero = one_of(&[u(-10.0, -0.5), u(0.5, 10.0)]);
    for (name, f) in float_binary_ops() {
        for dtype in FLOATS {
            for k in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let (a, b) = match name {
                    "div" | "rem" => (
                        s.param("x", dtype, &dims, &plain),
                        s.param("y", dtype, &dims, &away_from_zero),
                    ),
                    // Positive bases with real exponents, or any base with small integral ones.
                    "pow" if k < 2 => (
                        s.param("x", dtype, &dims, &u(0.01, 4.0)),
                        s.param("y", dtype, &dims, &u(0.0, 3.0)),
                    ),
                    "pow" => (
                        s.param("x", dtype, &dims, &u(-4.0, 4.0)),
                        s.param("y", dtype, &dims, &Dist::Int(0, 3)),
                    ),
                    "maximum" | "minimum" => (
                        s.param("x", dtype, &dims, &with_nan),
                        s.param("y", dtype, &dims, &with_nan),
                    ),
                    _ => (
                        s.param("x", dtype, &dims, &plain),
                        s.param("y", dtype, &dims, &plain),
                    ),
                };
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    // IEEE specials where the result is fully defined (x/0, inf-inf, NaN propagation, ...).
    for (name, f) in float_binary_ops() {
        if name == "pow" || name == "rem" {
            continue; // see `float_specials_pow_and_rem`
        }
        for dtype in FLOATS {
            s.case(format!("{name} {dtype} specials"));
            let n = SPECIALS.len();
            let xs: Vec<f64> = (0..n * n).map(|i| SPECIALS[i / n]).collect();
            let ys: Vec<f64> = (0..n * n).map(|i| SPECIALS[i % n]).collect();
            let a = s.input("x", array_of(dtype, &[n, n], &xs));
            let b = s.input("y", array_of(dtype, &[n, n], &ys));
            s.check(&f(&a, &b).unwrap());
        }
    }
    s.run();
}

/// `pow` and `rem` on specials: C's `pow`/`fmod` conventions (`pow(x, 0) = 1`, `pow(1, y) = 1`,
/// `fmod(x, 0) = NaN`, `fmod(x, inf) = x`, ...).
#[test]
fn float_specials_pow_and_rem() {
    let mut s = Suite::new("float_specials_pow_and_rem", 202);
    for (name, f) in float_binary_ops() {
        if name != "pow" && name != "rem" {
            continue;
        }
        for dtype in FLOATS {
            s.case(format!("{name} {dtype} specials"));
            let n = SPECIALS.len();
            let xs: Vec<f64> = (0..n * n).map(|i| SPECIALS[i / n]).collect();
            let ys: Vec<f64> = (0..n * n).map(|i| SPECIALS[i % n]).collect();
            let a = s.input("x", array_of(dtype, &[n, n], &xs));
            let b = s.input("y", array_of(dtype, &[n, n], &ys));
            s.check(&f(&a, &b).unwrap());
        }
    }
    s.run();
}

#[test]
fn binary_int() {
    let mut s = Suite::new("binary_int", 203);
    let ops: Vec<(&str, Binary)> = vec![
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("div", |a, b| a.div(b)),
        ("pow", |a, b| a.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
        ("rem", |a, b| a.rem(b)),
    ];
    for (name, f) in ops {
        for dtype in INTS {
            let signed = !dtype.is_unsigned();
            for k in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let small = if signed {
                    Dist::Int(-100, 100)
                } else {
                    Dist::Int(0, 200)
                };
                let (a, b) = match name {
                    "div" | "rem" => {
                        let den = if signed {
                            nonzero(Dist::Int(-20, 20))
                        } else {
                            Dist::Int(1, 20)
                        };
                        (
                            s.param("x", dtype, &dims, &one_of(&[Dist::Bits, small])),
                            s.param("y", dtype, &dims, &den),
                        )
                    }
                    "pow" => {
                        let base = if k == 2 {
                            Dist::Bits // wraps
                        } else if signed {
                            Dist::Int(-6, 6)
                        } else {
                            Dist::Int(0, 6)
                        };
                        (
                            s.param("x", dtype, &dims, &base),
                            s.param("y", dtype, &dims, &Dist::Int(0, 5)),
                        )
                    }
                    _ => {
                        let d = if k == 0 { small } else { Dist::Bits };
                        (
                            s.param("x", dtype, &dims, &d),
                            s.param("y", dtype, &dims, &d),
                        )
                    }
                };
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    s.run();
}

/// Integer division and remainder by zero and the signed overflow case, as documented on
/// `BinaryOp` (XLA's definitions: `x / 0 = -1`, `x % 0 = x`, `MIN / -1 = MIN`, `MIN % -1 = 0`).
#[test]
fn int_division_edge_cases() {
    let mut s = Suite::new("int_division_edge_cases", 204);
    for dtype in INTS {
        let xs: Vec<f64> = match dtype {
            U8 => vec![0.0, 1.0, 7.0, 255.0],
            U32 => vec![0.0, 1.0, 7.0, 4294967295.0],
            U64 => vec![0.0, 1.0, 7.0, 1e19],
            I32 => vec![0.0, 1.0, -7.0, -2147483648.0],
            _ => vec![0.0, 1.0, -7.0, -9.223_372_036_854_776e18],
        };
        let ys = if dtype.is_unsigned() {
            vec![0.0, 0.0, 0.0, 0.0]
        } else {
            vec![0.0, 0.0, 0.0, -1.0]
        };
        s.case(format!("div/rem {dtype} by zero"));
        let a = s.input("x", array_of(dtype, &[4], &xs));
        let b = s.input("y", array_of(dtype, &[4], &ys));
        s.check(&a.div(&b).unwrap());
        s.check(&a.rem(&b).unwrap());
    }
    s.run();
}

#[test]
fn logical_and_shifts() {
    let mut s = Suite::new("logical_and_shifts", 301);
    let ops: Vec<(&str, Binary)> = vec![
        ("and", |a, b| a.and(b)),
        ("or", |a, b| a.or(b)),
        ("xor", |a, b| a.xor(b)),
    ];
    for (name, f) in &ops {
        for dtype in [Pred, U8, U32, U64, I32, I64] {
            for _ in 0..2 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let d = if dtype == Pred {
                    Dist::Bool(0.5)
                } else {
                    Dist::Bits
                };
                let a = s.param("x", dtype, &dims, &d);
                let b = s.param("y", dtype, &dims, &d);
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    let shifts: Vec<(&str, Binary)> = vec![
        ("shift_left", |a, b| a.shift_left(b)),
        ("shift_right", |a, b| a.shift_right_logical(b)),
    ];
    for (name, f) in &shifts {
        for (dtype, reps) in [(U32, 4), (I32, 4), (U8, 1), (U64, 1), (I64, 1)] {
            let bits = 8 * dtype.size_in_bytes() as i64;
            for _ in 0..reps {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let a = s.param("x", dtype, &dims, &Dist::Bits);
                let b = s.param("y", dtype, &dims, &Dist::Int(0, bits + 8));
                s.check(&f(&a, &b).unwrap());
            }
            // Every amount from 0 to past the width, on one value.
            s.case(format!("{name} {dtype} all amounts"));
            let n = (bits + 9) as usize;
            let a = s.param("x", dtype, &[n], &pick(&[1.0, 3.0, 100.0]));
            let amounts: Vec<f64> = (0..n).map(|i| i as f64).collect();
            let b = s.input("y", array_of(dtype, &[n], &amounts));
            s.check(&f(&a, &b).unwrap());
        }
    }
    s.run();
}

/// A shift by a negative amount of a signed type (an amount >= the width as unsigned).
#[test]
fn shift_by_negative_amount() {
    let mut s = Suite::new("shift_by_negative_amount", 302);
    for dtype in [I32, I64] {
        s.case(format!("{dtype} shifts by -1, -32, -64"));
        let a = s.input("x", array_of(dtype, &[3], &[-8.0, 12345.0, -1.0]));
        let b = s.input("y", array_of(dtype, &[3], &[-1.0, -32.0, -64.0]));
        s.check(&a.shift_left(&b).unwrap());
        s.check(&a.shift_right_logical(&b).unwrap());
    }
    s.run();
}

#[test]
fn comparisons() {
    let mut s = Suite::new("comparisons", 401);
    let ops: Vec<(&str, Binary)> = vec![
        ("eq", |a, b| a.eq(b)),
        ("ne", |a, b| a.ne(b)),
        ("lt", |a, b| a.lt(b)),
        ("le", |a, b| a.le(b)),
        ("gt", |a, b| a.gt(b)),
        ("ge", |a, b| a.ge(b)),
    ];
    let float = with(
        pick(&[-1.0, 0.0, 1.0, 2.5]),
        &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0],
        0.3,
    );
    for (name, f) in &ops {
        for dtype in [Pred, U8, U32, U64, I32, I64, F16, BF16, F32, F64] {
            for k in 0..2 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let d = match dtype {
                    Pred => Dist::Bool(0.5),
                    _ if dtype.is_float() => float.clone(),
                    _ if k == 0 => Dist::Int(0, 3), // many ties
                    _ => Dist::Bits,
                };
                let a = s.param("x", dtype, &dims, &d);
                let b = s.param("y", dtype, &dims, &d);
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    s.run();
}

#[test]
fn broadcasting_and_number_operands() {
    let mut s = Suite::new("broadcasting", 501);
    let ops: Vec<(&str, Binary)> = vec![
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("lt", |a, b| a.lt(b)),
        ("&a + &b", |a, b| a + b),
        ("&a * &b", |a, b| a * b),
        ("&a - &b", |a, b| a - b),
        ("(&a + &b) * &a", |a, b| (a + b) * a),
        ("&b * (&a - &b)", |a, b| b * (a - b)),
    ];
    for (name, f) in &ops {
        for dtype in [F32, F64, I32] {
            for _ in 0..3 {
                let out = shape(&mut s.rng, 0, 3);
                let (da, db) = (
                    sub_broadcast(&mut s.rng, &out),
                    sub_broadcast(&mut s.rng, &out),
                );
                s.case(format!("{name} {dtype}{da:?} with {dtype}{db:?}"));
                let a = s.param("x", dtype, &da, &Dist::Int(-5, 5));
                let b = s.param("y", dtype, &db, &Dist::Int(-5, 5));
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    let scalar_ops: Vec<(&str, Unary)> = vec![
        ("&a + 2.0", |a| a + 2.0),
        ("a + 2.0 (owned)", |a| a.clone() + 2.0),
        ("2.0 * &a", |a| 2.0 * a),
        ("2.0 - &a", |a| 2.0 - a),
        ("&a / 4.0", |a| a / 4.0),
        ("2.0 / a (owned)", |a| 2.0 / a.clone()),
        ("a.add(3i64)", |a| a.add(3i64)),
        ("a.mul(2i32)", |a| a.mul(2i32)),
        ("a.sub(1u32)", |a| a.sub(1u32)),
        ("a.maximum(0.5f32)", |a| a.maximum(0.5f32)),
        ("a.lt(1.0)", |a| a.lt(1.0)),
        ("a.ge(0usize)", |a| a.ge(0usize)),
    ];
    for (name, f) in &scalar_ops {
        for dtype in [F32, F64, F16, BF16] {
            let dims = shape(&mut s.rng, 0, 3);
            s.case(format!("{name} {dtype}{dims:?}"));
            let a = s.param("x", dtype, &dims, &nonzero(Dist::Int(-5, 5)));
            s.check(&f(&a).unwrap());
        }
    }
    for dtype in [I32, I64, U32] {
        let dims = shape(&mut s.rng, 0, 3);
        s.case(format!("int number operands {dtype}{dims:?}"));
        let a = s.param("x", dtype, &dims, &Dist::Int(1, 9));
        s.check(&a.add(3i64).unwrap());
        s.check(&(&a * 2.0).unwrap());
        s.check(&(7.0 - &a).unwrap());
        s.check(&a.rem(4u32).unwrap());
        s.check(&a.eq(5i32).unwrap());
    }
    s.run();
}

/// An operator applied to two tensors (in any of the operand forms) and the same arithmetic on
/// the host.
type OperatorCase = (&'static str, Binary, fn(f64, f64) -> f64);

/// Every operand form of the operators (`Tensor`, `&Tensor`, `Result<Tensor>`, numbers of each
/// kind on either side), against the interpreter and the same arithmetic on the host. Values
/// are small integers, so every result is exact in every dtype used.
#[test]
fn operators_every_operand_form() {
    let mut s = Suite::new("operators", 502);
    let forms: Vec<OperatorCase> = vec![
        ("a + b", |a, b| a.clone() + b.clone(), |x, y| x + y),
        ("&a - b", |a, b| a - b.clone(), |x, y| x - y),
        ("a * &b", |a, b| a.clone() * b, |x, y| x * y),
        ("&a % &b", |a, b| a % b, |x, y| x % y),
        ("a / (&b * 1)", |a, b| a.clone() / (b * 1), |x, y| x / y),
        ("(&a + &b) - b", |a, b| (a + b) - b.clone(), |x, _| x),
        (
            "a - (&a * &b)",
            |a, b| a.clone() - (a * b),
            |x, y| x - x * y,
        ),
        ("&b * (&a + 2)", |a, b| b * (a + 2), |x, y| y * (x + 2.0)),
        (
            "(&a * 3i64) + &b",
            |a, b| (a * 3i64) + b,
            |x, y| 3.0 * x + y,
        ),
        ("-(a) + &b", |a, b| -(a.clone()) + b, |x, y| y - x),
        (
            "&a * 10 - 4u32",
            |a, _| (a * 10)? - 4u32,
            |x, _| 10.0 * x - 4.0,
        ),
        ("6i64 - &a", |a, _| 6i64 - a, |x, _| 6.0 - x),
        (
            "2 * a + 1usize",
            |a, _| (2 * a.clone())? + 1usize,
            |x, _| 2.0 * x + 1.0,
        ),
        ("-&b", |_, b| -b, |_, y| -y),
    ];
    let float_forms: Vec<OperatorCase> = vec![
        ("&a * 0.5", |a, _| a * 0.5, |x, _| 0.5 * x),
        ("1.5 - a", |a, _| 1.5 - a.clone(), |x, _| 1.5 - x),
        ("&a / 2.0f32", |a, _| a / 2.0f32, |x, _| x / 2.0),
    ];
    for dtype in [F64, F32, BF16, I32, I64] {
        let ours = forms.iter().chain(if dtype.is_float() {
            &float_forms[..]
        } else {
            &[]
        });
        for (name, f, host) in ours {
            let dims = [2, 3];
            s.case(format!("{name} {dtype}"));
            let a = s.param("a", dtype, &dims, &Dist::Int(1, 6));
            let b = s.param("b", dtype, &dims, &Dist::Int(1, 4));
            let (av, bv) = (s.value(&a).to_f64_vec(), s.value(&b).to_f64_vec());
            let want: Vec<f64> = av
                .iter()
                .zip(&bv)
                .map(|(&x, &y)| {
                    let v = host(x, y);
                    // Integer division truncates.
                    if dtype.is_int() && name.contains('/') {
                        v.trunc()
                    } else {
                        v
                    }
                })
                .collect();
            let want = array_of(dtype, &dims, &want);
            s.check_formula(&f(&a, &b).unwrap(), Tol::Exact, want, Tol::Exact);
        }
    }
    // Integer numbers keep every bit: 2^60 + 1 does not round through an f64.
    let big = (1i64 << 60) + 1;
    s.case("i64 + 2^60 + 1");
    let a = s.param("a", I64, &[3], &Dist::Int(-5, 5));
    let want: Vec<i64> = s
        .value(&a)
        .to_f64_vec()
        .iter()
        .map(|&x| x as i64 + big)
        .collect();
    let want = HostArray::from_vec(&[3], want).unwrap();
    s.check_formula(&(&a + big).unwrap(), Tol::Exact, want, Tol::Exact);
    s.case("u64 * 3 + 2^63");
    let u = s.param("u", U64, &[3], &Dist::Int(0, 5));
    let want: Vec<u64> = s
        .value(&u)
        .to_f64_vec()
        .iter()
        .map(|&x| x as u64 * 3 + (1u64 << 63))
        .collect();
    let want = HostArray::from_vec(&[3], want).unwrap();
    let y = ((&u * 3).unwrap() + (1u64 << 63)).unwrap();
    s.check_formula(&y, Tol::Exact, want, Tol::Exact);
    s.run();
}

#[test]
fn select_where_clamp() {
    let mut s = Suite::new("select_where_clamp", 601);
    for k in 0..24 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dtype = if k % 10 == 9 { Pred } else { dtype };
        let out = shape(&mut s.rng, 0, 3);
        let (dc, dt, df) = (
            sub_broadcast(&mut s.rng, &out),
            sub_broadcast(&mut s.rng, &out),
            sub_broadcast(&mut s.rng, &out),
        );
        s.case(format!("select pred{dc:?} {dtype}{dt:?} {dtype}{df:?}"));
        let c = s.param("c", Pred, &dc, &Dist::Bool(0.5));
        let d = if dtype == Pred {
            Dist::Bool(0.5)
        } else {
            Dist::Bits
        };
        let t = s.param("t", dtype, &dt, &d);
        let f = s.param("f", dtype, &df, &d);
        s.check_tol(&c.select(&t, &f).unwrap(), Tol::Bits);
        s.check_tol(&t.where_(&c, &f).unwrap(), Tol::Bits);
        let one = if dtype == Pred { 1.0 } else { 7.0 };
        s.check_tol(&t.where_(&c, one).unwrap(), Tol::Bits);
        // A number for either branch takes the other's dtype.
        s.check_tol(&c.select(one, &f).unwrap(), Tol::Bits);
        s.check_tol(&c.select(&t, one).unwrap(), Tol::Bits);
    }
    for k in 0..24 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dims = shape(&mut s.rng, 0, 3);
        // NaN operands: see `clamp_propagates_nan`.
        let x_dist = if dtype.is_unsigned() {
            Dist::Int(0, 20)
        } else {
            Dist::Int(-10, 10)
        };
        s.case(format!("clamp {dtype}{dims:?}"));
        let x = s.param("x", dtype, &dims, &x_dist);
        let (lo, hi) = if dtype.is_unsigned() {
            (3.0, 12.0)
        } else {
            (-3.0, 4.0)
        };
        s.check(&x.clamp(lo, hi).unwrap());
        // Tensor bounds that broadcast to x (sometimes lo > hi: the result is then hi).
        let dl = sub_broadcast(&mut s.rng, &dims);
        let dh = sub_broadcast(&mut s.rng, &dims);
        let bound = if dtype.is_unsigned() {
            Dist::Int(0, 15)
        } else {
            Dist::Int(-8, 8)
        };
        let l = s.param("lo", dtype, &dl, &bound);
        let h = s.param("hi", dtype, &dh, &bound);
        s.check(&x.clamp(&l, &h).unwrap());
        s.check(&x.clamp(&l, hi).unwrap());
    }
    s.run();
}

/// `Clamp` is `min(max(x, lo), hi)` with the NaN-propagating float max and min of `BinaryOp`: a
/// NaN operand (x, lo or hi) gives NaN.
#[test]
fn clamp_propagates_nan() {
    let mut s = Suite::new("clamp_propagates_nan", 602);
    let nan = f64::NAN;
    for dtype in FLOATS {
        s.case(format!("clamp {dtype} with NaN operands"));
        let x = s.input("x", array_of(dtype, &[4], &[nan, 0.5, 0.5, nan]));
        let lo = s.input("lo", array_of(dtype, &[4], &[-1.0, nan, -1.0, 2.0]));
        let hi = s.input("hi", array_of(dtype, &[4], &[1.0, 1.0, nan, -2.0]));
        let want = array_of(dtype, &[4], &[nan, nan, nan, nan]);
        let y = x.clamp(&lo, &hi).unwrap();
        s.check_formula(&y, Tol::Exact, want, Tol::Exact);
        let want = array_of(dtype, &[4], &[nan, 0.5, 0.5, nan]);
        let y = x.clamp(-1.0, 1.0).unwrap();
        s.check_formula(&y, Tol::Exact, want, Tol::Exact);
    }
    s.run();
}

/// Source values for converting `src` to `dst` whose result is fully determined by the op's
/// documentation: in the target's range, away from float rounding midpoints.
fn convert_dist(src: DType, dst: DType) -> Dist {
    if src == Pred {
        return Dist::Bool(0.5);
    }
    if src.is_int() {
        if dst.is_int() || dst == Pred || dst == F32 || dst == F64 {
            return one_of(&[Dist::Bits, Dist::Int(0, 3)]);
        }
        // Within +-2^24, where every integer is an f32.
        let lim = 1 << 24;
        return match src {
            U8 => Dist::Bits,
            _ if src.is_unsigned() => one_of(&[Dist::Int(0, lim), Dist::Int(0, 300)]),
            _ => one_of(&[Dist::Int(-lim, lim), Dist::Int(-300, 300)]),
        };
    }
    // Float sources.
    let src_max = match src {
        F16 => 65504.0,
        _ => f64::MAX,
    };
    match dst {
        Pred => with(u(-2.0, 2.0), &[0.0, -0.0, f64::NAN, f64::INFINITY], 0.3),
        _ if dst.is_int() => {
            let hi: f64 = match dst {
                U8 => 255.0,
                U32 => 4294967295.0,
                U64 => 1.8e19,
                I32 => 2147483647.0,
                _ => 9.2e18,
            };
            let hi = (0.9 * hi).min(src_max);
            let lo = if dst.is_unsigned() { 0.0 } else { -hi };
            let small = if dst.is_unsigned() {
                u(0.0, 10.0)
            } else {
                u(-10.0, 10.0)
            };
            one_of(&[u(lo, hi), small])
        }
        _ => {
            let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0];
            // Widening is exact (bf16 -> f16 too, in the range used here); narrowing rounds.
            let wide = dst.size_in_bytes() > src.size_in_bytes() || (src == BF16 && dst == F16);
            let base = if src == F16 || dst == F16 {
                Dist::LogU(-3.0, 4.0)
            } else {
                Dist::LogU(-6.0, 6.0)
            };
            let base = if wide {
                base
            } else {
                Dist::AwayFromMid(Box::new(base), src, dst)
            };
            with(base, &specials, 0.15)
        }
    }
}

#[test]
fn convert_every_pair() {
    let mut s = Suite::new("convert_every_pair", 701);
    for src in DType::ALL {
        for dst in DType::ALL {
            for _ in 0..2 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("convert {src}{dims:?} to {dst}"));
                let x = s.param("x", src, &dims, &convert_dist(src, dst));
                s.check_tol(&x.astype(dst).unwrap(), Tol::Exact);
            }
        }
    }
    s.run();
}

/// Conversions at the edges of the documented semantics: narrowing rounds once, to nearest even,
/// from the exact source value (no double rounding through f32); f16 subnormals; huge integers.
#[test]
fn convert_rounding_edge_cases() {
    let mut s = Suite::new("convert_rounding_edge_cases", 702);
    // 1 + 2^-8 + 2^-30: directly to bf16 rounds up to 1 + 2^-7; through f32 it would first
    // become 1 + 2^-8 exactly (a bf16 tie) and then round to even, 1.
    let one = 1.0 + 2f64.powi(-8) + 2f64.powi(-30);
    // 1 + 2^-11 + 2^-40: same for f16, where f64 converts through f32 on every processor.
    let one_h = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    s.case("f64 -> bf16 / f16 just above a tie");
    let x = s.input("x", array_of(F64, &[4], &[one, -one, one_h, -one_h]));
    s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    // Exact ties round to even.
    s.case("exact ties");
    let ties = [
        1.0 + 2f64.powi(-8),
        1.0 + 3.0 * 2f64.powi(-8),
        1.0 + 2f64.powi(-11),
        1.0 + 3.0 * 2f64.powi(-11),
    ];
    let x = s.input("x", array_of(F32, &[4], &ties));
    s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    let x = s.input("y", array_of(F64, &[4], &ties));
    s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    // 2^25 + 2^17 + 1: directly to bf16 rounds up to 2^25 + 2^18; through f32 it would become
    // the tie 2^25 + 2^17 and round to even, 2^25.
    s.case("i64/i32/u32/u64 -> bf16 just above a tie");
    let v = 33_685_505.0;
    for dtype in [I32, I64, U32, U64] {
        let x = s.input("x", array_of(dtype, &[1], &[v]));
        s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    }
    // f16 subnormals and overflow.
    s.case("f32 -> f16 subnormals and overflow");
    let vals = [1e-5, -3e-6, 6e-8, 2.9e-8, 65519.0, 65520.0, 1e6, -1e6];
    let x = s.input("x", array_of(F32, &[vals.len()], &vals));
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    let x = s.input("y", array_of(F64, &[vals.len()], &vals));
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    s.case("f16 subnormals to wider types");
    let x = s.input(
        "x",
        HostArray::from_vec(
            &[3],
            vec![
                f16::from_bits(1),
                f16::from_bits(0x3ff),
                f16::from_bits(0x8001),
            ],
        )
        .unwrap(),
    );
    s.check_tol(&x.astype(F32).unwrap(), Tol::Exact);
    s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    s.run();
}

#[test]
fn bitcast_same_size_pairs() {
    let mut s = Suite::new("bitcast", 801);
    let groups: [&[DType]; 4] = [&[U8], &[F16, BF16], &[U32, I32, F32], &[U64, I64, F64]];
    for group in groups {
        for &src in group {
            for &dst in group {
                for _ in 0..2 {
                    let dims = shape(&mut s.rng, 0, 3);
                    s.case(format!("bitcast {src}{dims:?} to {dst}"));
                    let x = s.param("x", src, &dims, &Dist::Bits);
                    let v = s.value(&x).clone();
                    let want =
                        HostArray::from_bytes(&TensorType::new(dst, &dims), &v.to_bytes()).unwrap();
                    s.check_formula(&x.bitcast(dst).unwrap(), Tol::Bits, want, Tol::Bits);
                }
            }
        }
    }
    s.case("u32 -> f32 -> u32 round trip");
    let x = s.param("x", U32, &[16], &Dist::Bits);
    let v = s.value(&x).clone();
    let y = x.bitcast(F32).unwrap().bitcast(U32).unwrap();
    s.check_formula(&y, Tol::Exact, v, Tol::Exact);
    s.run();
}

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
                    let ft = Tol::Close {
                        rtol: 1e-12,
                        atol: 1e-14,
                    };
                    s.check_formula(&y, tol(dtype), w, ft);
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

// ---- creation ---------------------------------------------------------------------------------

#[test]
fn constants_of_every_dtype() {
    let mut s = Suite::new("constants", 1001);
    for dtype in DType::ALL {
        for k in 0..4 {
            let dims = match k {
                0 => vec![],
                1 => vec![2, 0, 3],
                _ => shape(&mut s.rng, 0, 3),
            };
            s.case(format!("constant {dtype}{dims:?}"));
            let d = if dtype == Pred {
                Dist::Bool(0.5)
            } else if k == 3 && dtype.is_float() {
                with(Dist::LogU(-40.0, 40.0), &SPECIALS, 0.3)
            } else {
                Dist::Bits
            };
            let v = random_array(&mut s.rng, dtype, &dims, &d);
            let c = s.g.constant(&v).unwrap();
            s.check_formula(&c, Tol::Bits, v, Tol::Bits);
        }
    }
    // Constants used by an op (not only returned).
    s.case("constant + parameter");
    let v = array_of(F32, &[2, 3], &[1.0, -2.0, 0.5, 1e-30, -0.0, 3e38]);
    let x = s.param("x", F32, &[2, 3], &u(-1.0, 1.0));
    let c = s.g.constant(&v).unwrap();
    s.check(&x.add(&c).unwrap());
    s.run();
}

#[test]
fn full_zeros_ones_scalar() {
    let mut s = Suite::new("full", 1002);
    let values = |d: DType| -> Vec<f64> {
        match d {
            Pred => vec![0.0, 1.0],
            U8 => vec![0.0, 255.0, 17.0],
            U32 => vec![0.0, 4294967295.0, 7.0],
            U64 => vec![0.0, 1e19, 123456789.0],
            I32 => vec![-2147483648.0, 2147483647.0, -5.0],
            I64 => vec![-9.223_372_036_854_776e18, 1e18, -5.0],
            _ => vec![-0.0, 1.5, -2.25, f64::INFINITY, f64::NAN, 65504.0, 1e-3],
        }
    };
    for dtype in DType::ALL {
        for v in values(dtype) {
            let dims = shape(&mut s.rng, 0, 3);
            s.case(format!("full({v}) {dtype}{dims:?}"));
            let n: usize = dims.iter().product();
            let want = array_of(dtype, &dims, &vec![v; n]);
            let t = s.g.full(v, dtype, &dims).unwrap();
            s.check_formula(&t, Tol::Bits, want, Tol::Bits);
        }
        let dims = shape(&mut s.rng, 0, 3);
        let n: usize = dims.iter().product();
        s.case(format!("zeros/ones/scalar {dtype}{dims:?}"));
        let z = s.g.zeros(dtype, &dims).unwrap();
        s.check_formula(
            &z,
            Tol::Bits,
            array_of(dtype, &dims, &vec![0.0; n]),
            Tol::Bits,
        );
        let o = s.g.ones(dtype, &dims).unwrap();
        s.check_formula(
            &o,
            Tol::Bits,
            array_of(dtype, &dims, &vec![1.0; n]),
            Tol::Bits,
        );
        let one = s.g.scalar(1.0, dtype).unwrap();
        s.check_formula(&one, Tol::Bits, array_of(dtype, &[], &[1.0]), Tol::Bits);
    }
    s.run();
}

#[test]
fn iota_over_every_dim() {
    let mut s = Suite::new("iota", 1003);
    for dtype in NUMERIC {
        for _ in 0..3 {
            let dims = shape(&mut s.rng, 1, 3);
            for d in 0..dims.len() {
                s.case(format!("iota {dtype}{dims:?} dim {d}"));
                let axis = if s.rng.chance(0.5) {
                    d as isize
                } else {
                    d as isize - dims.len() as isize
                };
                let t = s.g.iota(dtype, &dims, axis).unwrap();
                let n: usize = dims.iter().product();
                let want: Vec<f64> = (0..n).map(|i| unravel(i, &dims)[d] as f64).collect();
                s.check_formula(&t, Tol::Exact, array_of(dtype, &dims, &want), Tol::Exact);
            }
        }
    }
    s.run();
}

// ---- reductions -------------------------------------------------------------------------------

/// A random subset of `0..rank`, each axis written positive or negative, in random order.
fn random_axes(rng: &mut Rng, rank: usize) -> Vec<isize> {
    let mut a: Vec<isize> = Vec::new();
    for i in 0..rank as isize {
        if rng.chance(0.5) {
            a.push(if rng.chance(0.5) {
                i
            } else {
                i - rank as isize
            });
        }
    }
    rng.shuffle(&mut a);
    a
}

fn reduced_count(dims: &[usize], axes: &[isize]) -> usize {
    let r = dims.len() as isize;
    axes.iter()
        .map(|&a| dims[((a + r) % r.max(1)) as usize])
        .product()
}

#[test]
fn reductions() {
    let mut s = Suite::new("reductions", 1101);
    type Red = fn(&Tensor, &[isize], bool) -> Result<Tensor>;
    let ops: Vec<(&str, Red)> = vec![
        (
            "sum",
            |t, a, k| if k { t.sum_keepdims(a) } else { t.sum(a) },
        ),
        (
            "prod",
            |t, a, k| if k { t.prod_keepdims(a) } else { t.prod(a) },
        ),
        (
            "max",
            |t, a, k| if k { t.max_keepdims(a) } else { t.max(a) },
        ),
        (
            "min",
            |t, a, k| if k { t.min_keepdims(a) } else { t.min(a) },
        ),
        (
            "mean",
            |t, a, k| if k { t.mean_keepdims(a) } else { t.mean(a) },
        ),
        ("logsumexp", |t, a, k| {
            if k {
                t.logsumexp_keepdims(a)
            } else {
                t.logsumexp(a)
            }
        }),
    ];
    for (name, f) in &ops {
        let dtypes: &[DType] = match *name {
            "mean" | "logsumexp" => &FLOATS,
            _ => &NUMERIC,
        };
        for &dtype in dtypes {
            for k in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                let axes = random_axes(&mut s.rng, dims.len());
                let keep = s.rng.chance(0.5);
                s.case(format!(
                    "{name} {dtype}{dims:?} axes {axes:?} keepdims {keep}"
                ));
                let d = match (*name, dtype.is_float()) {
                    ("prod", true) => u(0.5, 1.6),
                    ("prod", false) if k == 0 => Dist::Bits, // wraps
                    ("prod", false) if dtype.is_unsigned() => Dist::Int(0, 3),
                    ("prod", false) => Dist::Int(-3, 3),
                    ("max" | "min", true) if k == 2 => with(
                        u(-5.0, 5.0),
                        &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
                        0.1,
                    ),
                    ("logsumexp", _) if k == 2 => with(u(-5.0, 5.0), &[f64::NEG_INFINITY], 0.6),
                    ("logsumexp", _) => u(-5.0, 5.0),
                    (_, true) => u(-1.0, 1.0),
                    (_, false) => Dist::Bits,
                };
                let x = s.param("x", dtype, &dims, &d);
                let y = f(&x, &axes, keep).unwrap();
                let terms = reduced_count(&dims, &axes);
                let t = match *name {
                    // Max and min are exact; a product's error is relative.
                    "max" | "min" => Tol::Exact,
                    "prod" => match acc_tol(dtype, terms, 0.0) {
                        Tol::Close { rtol, atol } => Tol::Close {
                            rtol: rtol * terms.max(1) as f64,
                            atol,
                        },
                        t => t,
                    },
                    "logsumexp" => acc_tol(dtype, terms, 1.0),
                    _ => acc_tol(dtype, terms, max_abs(s.value(&x))),
                };
                s.check_tol(&y, t);
            }
        }
    }
    // logsumexp with whole rows of -inf (and of +inf, NaN).
    for dtype in FLOATS {
        s.case(format!("logsumexp {dtype} -inf rows"));
        let ninf = f64::NEG_INFINITY;
        let v = [
            ninf,
            ninf,
            ninf, // all -inf: -inf
            0.0,
            ninf,
            1.0, // some -inf
            f64::INFINITY,
            0.0,
            ninf, // +inf: +inf
            f64::NAN,
            0.0,
            1.0, // NaN
        ];
        let x = s.input("x", array_of(dtype, &[4, 3], &v));
        s.check_tol(&x.logsumexp(&[1]).unwrap(), acc_tol(dtype, 3, 1.0));
        s.check_tol(
            &x.logsumexp_keepdims(&[-1]).unwrap(),
            acc_tol(dtype, 3, 1.0),
        );
        let e = s.input("e", array_of(dtype, &[2, 0], &[]));
        s.check(&e.logsumexp(&[1]).unwrap());
        s.check(&e.mean(&[1]).unwrap());
        s.check(&e.max(&[1]).unwrap());
        s.check(&e.min_keepdims(&[1]).unwrap());
        s.check(&e.prod(&[1]).unwrap());
    }
    for dtype in NUMERIC {
        let dims = shape(&mut s.rng, 0, 3);
        s.case(format!("sum_all {dtype}{dims:?}"));
        let d = if dtype.is_float() {
            u(-1.0, 1.0)
        } else {
            Dist::Bits
        };
        let x = s.param("x", dtype, &dims, &d);
        let n = dims.iter().product();
        s.check_tol(&x.sum_all().unwrap(), acc_tol(dtype, n, 1.0));
    }
    s.run();
}

#[test]
fn argmax_argmin() {
    let mut s = Suite::new("argmax_argmin", 1102);
    for dtype in NUMERIC {
        for k in 0..4 {
            let mut dims = shape(&mut s.rng, 1, 3);
            let axis = s.rng.below(dims.len());
            dims[axis] = nz_dim(&mut s.rng);
            let a = if s.rng.chance(0.5) {
                axis as isize
            } else {
                axis as isize - dims.len() as isize
            };
            let keep = s.rng.chance(0.5);
            s.case(format!("arg {dtype}{dims:?} axis {a} keepdims {keep}"));
            let d = match k {
                0 | 1 => pick(&[0.0, 1.0, 2.0]), // ties
                2 if dtype.is_float() => with(
                    pick(&[0.0, 1.0, 2.0]),
                    &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
                    0.3,
                ),
                _ => Dist::Bits,
            };
            let x = s.param("x", dtype, &dims, &d);
            if keep {
                s.check(&x.argmax_keepdims(a).unwrap());
                s.check(&x.argmin_keepdims(a).unwrap());
            } else {
                s.check(&x.argmax(a).unwrap());
                s.check(&x.argmin(a).unwrap());
            }
        }
    }
    // Every integer index dtype, against the interpreter and a host argmax (first extreme).
    for (k, index) in INTS.into_iter().enumerate() {
        let dtype = NUMERIC[(3 * k) % NUMERIC.len()];
        let mut dims = shape(&mut s.rng, 1, 3);
        let axis = s.rng.below(dims.len());
        dims[axis] = nz_dim(&mut s.rng);
        s.case(format!("arg_as {index} {dtype}{dims:?} axis {axis}"));
        let x = s.param("x", dtype, &dims, &pick(&[0.0, 1.0, 2.0, 3.0]));
        let v = s.value(&x).to_f64_vec();
        for max in [true, false] {
            let want = arg_ref(&v, &dims, axis, max);
            let mut out_dims = dims.clone();
            out_dims.remove(axis);
            let a = axis as isize;
            let y = if max {
                x.argmax_as(a, index)
            } else {
                x.argmin_as(a, index)
            };
            let want = array_of(index, &out_dims, &want);
            s.check_formula(&y.unwrap(), Tol::Exact, want, Tol::Exact);
        }
    }
    s.run();
}

/// The index of the first maximum (or minimum) of each lane of `v` (row-major, shape `dims`,
/// no NaN) along `axis`.
fn arg_ref(v: &[f64], dims: &[usize], axis: usize, max: bool) -> Vec<f64> {
    let n = dims[axis];
    let stride: usize = dims[axis + 1..].iter().product();
    let lanes = v.len() / n;
    (0..lanes)
        .map(|lane| {
            let base = (lane / stride) * stride * n + lane % stride;
            let at = |i: usize| v[base + i * stride];
            let mut best = 0;
            for i in 1..n {
                if (max && at(i) > at(best)) || (!max && at(i) < at(best)) {
                    best = i;
                }
            }
            best as f64
        })
        .collect()
}

#[test]
fn cumsum_every_mode() {
    let mut s = Suite::new("cumsum", 1103);
    for dtype in NUMERIC {
        for exclusive in [false, true] {
            for reverse in [false, true] {
                for _ in 0..2 {
                    let dims = shape(&mut s.rng, 1, 3);
                    let axis = s.rng.below(dims.len()) as isize
                        - if s.rng.chance(0.5) {
                            dims.len() as isize
                        } else {
                            0
                        };
                    s.case(format!(
                        "cumsum {dtype}{dims:?} axis {axis} exclusive {exclusive} reverse {reverse}"
                    ));
                    let d = if dtype.is_float() {
                        u(-1.0, 1.0)
                    } else {
                        Dist::Bits
                    };
                    let x = s.param("x", dtype, &dims, &d);
                    let n = dims[((axis + dims.len() as isize) as usize) % dims.len()];
                    let t = acc_tol(dtype, n, max_abs(s.value(&x)));
                    let options = CumsumOptions { exclusive, reverse };
                    s.check_tol(&x.cumsum_with(axis, options).unwrap(), t);
                }
            }
        }
    }
    // The plain cumsum is the inclusive forward sum: against a running sum on the host.
    for dtype in [F64, I64, I32] {
        let dims = [3, 4];
        s.case(format!("cumsum {dtype}{dims:?}"));
        let x = s.param("x", dtype, &dims, &Dist::Int(-9, 9));
        let v = s.value(&x).to_f64_vec();
        let want: Vec<f64> = (0..12).map(|i| v[i - i % 4..=i].iter().sum()).collect();
        let want = array_of(dtype, &dims, &want);
        s.check_formula(&x.cumsum(-1).unwrap(), Tol::Exact, want, Tol::Exact);
    }
    s.run();
}

// ---- shape ops --------------------------------------------------------------------------------

fn any_dtype(rng: &mut Rng) -> DType {
    rng.pick(&DType::ALL)
}

fn bits_dist(d: DType) -> Dist {
    if d == Pred {
        Dist::Bool(0.5)
    } else {
        Dist::Bits
    }
}

/// A random shape with the same element count as `dims`, with one `-1` sometimes.
fn reshape_target(rng: &mut Rng, dims: &[usize]) -> Vec<isize> {
    let n: usize = dims.iter().product();
    let r = rng.int(if n == 1 { 0 } else { 1 }, 4) as usize;
    let mut out = vec![1usize; r];
    if n == 0 {
        for d in out.iter_mut() {
            *d = rng.pick(&[1, 2, 3]);
        }
        let z = rng.below(r);
        out[z] = 0;
    } else {
        let mut m = n;
        for p in [2, 3, 5] {
            while m.is_multiple_of(p) {
                m /= p;
                let i = rng.below(r);
                out[i] *= p;
            }
        }
    }
    let mut t: Vec<isize> = out.iter().map(|&d| d as isize).collect();
    if n > 0 && r > 0 && rng.chance(0.5) {
        let i = rng.below(r);
        t[i] = -1;
    }
    t
}

#[test]
fn reshape_transpose_broadcast_squeeze() {
    let mut s = Suite::new("reshape_transpose", 1201);
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let target = reshape_target(&mut s.rng, &dims);
        s.case(format!("reshape {dtype}{dims:?} to {target:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.reshape(&target).unwrap(), Tol::Bits);
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 4);
        let mut perm: Vec<isize> = (0..dims.len() as isize).collect();
        s.rng.shuffle(&mut perm);
        let perm: Vec<isize> = perm
            .into_iter()
            .map(|p| {
                if s.rng.chance(0.3) {
                    p - dims.len() as isize
                } else {
                    p
                }
            })
            .collect();
        s.case(format!("transpose {dtype}{dims:?} by {perm:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.transpose(&perm).unwrap(), Tol::Bits);
        if dims.len() >= 2 {
            s.check_tol(&x.t().unwrap(), Tol::Bits);
        }
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let out = shape(&mut s.rng, 0, 4);
        let dims = sub_broadcast(&mut s.rng, &out);
        s.case(format!("broadcast_to {dtype}{dims:?} to {out:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.broadcast_to(&out).unwrap(), Tol::Bits);
    }
    for _ in 0..15 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let r = dims.len() as i64;
        let axis = s.rng.int(-(r + 1), r) as isize;
        s.case(format!("expand_dims {dtype}{dims:?} at {axis}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.expand_dims(axis).unwrap(), Tol::Bits);
    }
    for _ in 0..15 {
        let dtype = any_dtype(&mut s.rng);
        let dims: Vec<usize> = (0..s.rng.int(0, 4))
            .map(|_| {
                if s.rng.chance(0.5) {
                    1
                } else {
                    dim(&mut s.rng)
                }
            })
            .collect();
        let r = dims.len() as isize;
        let mut ones: Vec<isize> = Vec::new();
        for i in 0..r {
            if dims[i as usize] == 1 && s.rng.chance(0.6) {
                ones.push(if s.rng.chance(0.5) { i } else { i - r });
            }
        }
        s.case(format!("squeeze {dtype}{dims:?} axes {ones:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.squeeze(&ones).unwrap(), Tol::Bits);
        s.check_tol(&x.squeeze(&[]).unwrap(), Tol::Bits);
    }
    s.run();
}

#[test]
fn slices_reverse_pad_concat() {
    let mut s = Suite::new("slices", 1301);
    for _ in 0..25 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 1, 3);
        let r = dims.len();
        let a = s.rng.below(r);
        let n = dims[a] as i64;
        let (start, stop) = (
            s.rng.int(-n - 2, n + 2) as isize,
            s.rng.int(-n - 2, n + 2) as isize,
        );
        let step = s.rng.int(1, 3) as usize;
        let axis = if s.rng.chance(0.5) {
            a as isize
        } else {
            a as isize - r as isize
        };
        s.case(format!(
            "slice {dtype}{dims:?} axis {axis} [{start}:{stop}:{step}]"
        ));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.slice(axis, start, stop, step).unwrap(), Tol::Bits);
        let st = s.rng.int(0, n) as usize;
        let len = s.rng.int(0, n - st as i64) as usize;
        s.check_tol(&x.narrow(axis, st, len).unwrap(), Tol::Bits);
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let mut start = Vec::new();
        let mut limit = Vec::new();
        let mut stride = Vec::new();
        for &d in &dims {
            let a = s.rng.int(0, d as i64);
            let b = s.rng.int(a, d as i64);
            start.push(a as usize);
            limit.push(b as usize);
            stride.push(s.rng.int(1, 3) as usize);
        }
        s.case(format!(
            "slice_all {dtype}{dims:?} {start:?}..{limit:?} by {stride:?}"
        ));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.slice_all(&start, &limit, &stride).unwrap(), Tol::Bits);
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let axes = random_axes(&mut s.rng, dims.len());
        s.case(format!("flip {dtype}{dims:?} axes {axes:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.flip(&axes).unwrap(), Tol::Bits);
    }
    for _ in 0..25 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let (mut low, mut high, mut interior) = (Vec::new(), Vec::new(), Vec::new());
        for &d in &dims {
            let i = s.rng.int(0, 2);
            let inner = if d == 0 {
                0
            } else {
                d as i64 + (d as i64 - 1) * i
            };
            let mut l = s.rng.int(-2, 3);
            let mut h = s.rng.int(-2, 3);
            while l + inner + h < 0 {
                if l < 0 {
                    l += 1;
                } else {
                    h += 1;
                }
            }
            low.push(l as isize);
            high.push(h as isize);
            interior.push(i as usize);
        }
        let value = match dtype {
            Pred => 1.0,
            _ if dtype.is_unsigned() => 7.0,
            _ => -7.0,
        };
        s.case(format!(
            "pad {dtype}{dims:?} low {low:?} high {high:?} interior {interior:?}"
        ));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.pad(&low, &high, &interior, value).unwrap(), Tol::Bits);
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 1, 3);
        let a = s.rng.below(dims.len());
        let k = s.rng.int(2, 3);
        s.case(format!("concat {k} x {dtype}{dims:?} along {a}"));
        let parts: Vec<Tensor> = (0..k)
            .map(|i| {
                let mut d = dims.clone();
                d[a] = dim(&mut s.rng);
                s.param(&format!("x{i}_"), dtype, &d, &bits_dist(dtype))
            })
            .collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let axis = if s.rng.chance(0.5) {
            a as isize
        } else {
            a as isize - dims.len() as isize
        };
        s.check_tol(&Tensor::concat(&refs, axis).unwrap(), Tol::Bits);
    }
    s.run();
}

#[test]
fn dynamic_slices() {
    let mut s = Suite::new("dynamic_slices", 1401);
    for k in 0..40 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, if k == 0 { 0 } else { 1 }, 3);
        let idx_dtype = match k % 5 {
            0 | 1 => I32,
            2 | 3 => I64,
            _ => U32,
        };
        let sizes: Vec<usize> = dims
            .iter()
            .map(|&d| s.rng.int(0, d as i64) as usize)
            .collect();
        let update: Vec<usize> = dims
            .iter()
            .map(|&d| s.rng.int(0, d as i64) as usize)
            .collect();
        s.case(format!(
            "dynamic slice {dtype}{dims:?} sizes {sizes:?} update {update:?} {idx_dtype} starts"
        ));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        let starts: Vec<Tensor> = dims
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let lo = if idx_dtype == U32 { 0 } else { -3 };
                s.param(
                    &format!("i{i}_"),
                    idx_dtype,
                    &[],
                    &Dist::Int(lo, d as i64 + 3),
                )
            })
            .collect();
        let refs: Vec<&Tensor> = starts.iter().collect();
        s.check_tol(&x.dynamic_slice(&refs, &sizes).unwrap(), Tol::Bits);
        let up = s.param("u", dtype, &update, &bits_dist(dtype));
        s.check_tol(&x.dynamic_update_slice(&up, &refs).unwrap(), Tol::Bits);
    }
    s.run();
}

/// Unsigned indices beyond the signed range still clamp to the top (they are large, not
/// negative).
#[test]
fn huge_unsigned_indices_clamp_high() {
    let mut s = Suite::new("huge_unsigned_indices", 1402);
    s.case("dynamic_slice with u32 index 0xFFFFFFFF");
    let x = s.input("x", array_of(F32, &[5], &[0.0, 1.0, 2.0, 3.0, 4.0]));
    let i = s.input("i", HostArray::scalar(u32::MAX));
    let want = array_of(F32, &[2], &[3.0, 4.0]);
    s.check_formula(
        &x.dynamic_slice(&[&i], &[2]).unwrap(),
        Tol::Exact,
        want,
        Tol::Exact,
    );
    s.case("dynamic_slice with u64 index 2^63");
    let j = s.input("j", HostArray::scalar(1u64 << 63));
    let want = array_of(F32, &[2], &[3.0, 4.0]);
    s.check_formula(
        &x.dynamic_slice(&[&j], &[2]).unwrap(),
        Tol::Exact,
        want,
        Tol::Exact,
    );
    s.case("take with u32 index 0xFFFFFFFF and u64 index 2^63");
    let t = s.input("t", HostArray::from_vec(&[2], vec![u32::MAX, 1]).unwrap());
    let want = array_of(F32, &[2], &[4.0, 1.0]);
    s.check_formula(&x.take(&t).unwrap(), Tol::Exact, want, Tol::Exact);
    let t = s.input("w", HostArray::from_vec(&[2], vec![1u64 << 63, 2]).unwrap());
    let want = array_of(F32, &[2], &[4.0, 2.0]);
    s.check_formula(&x.take(&t).unwrap(), Tol::Exact, want, Tol::Exact);
    s.run();
}

// ---- linear algebra ---------------------------------------------------------------------------

/// A naive einsum in f64 (`spec` with explicit or implicit output) and the number of terms
/// summed per output element.
fn einsum_ref(spec: &str, ops: &[&HostArray]) -> (HostArray, usize) {
    let (lhs, out) = match spec.split_once("->") {
        Some((l, o)) => (l, Some(o)),
        None => (spec, None),
    };
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    let mut letters: Vec<char> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    for (t, a) in terms.iter().zip(ops) {
        for (c, &d) in t.iter().zip(a.dims()) {
            if !letters.contains(c) {
                letters.push(*c);
                sizes.push(d);
            }
        }
    }
    let out: Vec<char> = match out {
        Some(o) => o.chars().collect(),
        None => {
            let all: Vec<char> = terms.iter().flatten().copied().collect();
            let mut once: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| all.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    let size = |c: char| sizes[letters.iter().position(|d| *d == c).unwrap()];
    let out_dims: Vec<usize> = out.iter().map(|&c| size(c)).collect();
    let summed: usize = letters
        .iter()
        .filter(|c| !out.contains(c))
        .map(|&c| size(c))
        .product();
    let vals: Vec<Vec<f64>> = ops.iter().map(|a| a.to_f64_vec()).collect();
    let mut res = vec![0.0; out_dims.iter().product()];
    let total: usize = sizes.iter().product();
    for flat in 0..total {
        let assign = unravel(flat, &sizes);
        let at = |c: char| assign[letters.iter().position(|d| *d == c).unwrap()];
        let mut p = 1.0;
        for (t, (v, a)) in terms.iter().zip(vals.iter().zip(ops)) {
            let idx: Vec<usize> = t.iter().map(|&c| at(c)).collect();
            p *= v[ravel(&idx, a.dims())];
        }
        let oi: Vec<usize> = out.iter().map(|&c| at(c)).collect();
        res[ravel(&oi, &out_dims)] += p;
    }
    (f64_array(&out_dims, res), summed)
}

/// Operands for `spec` with random sizes per index letter (from `sizes`).
fn einsum_operands(s: &mut Suite, spec: &str, dtype: DType, sizes: &[usize]) -> Vec<Tensor> {
    let lhs = spec.split("->").next().unwrap();
    let mut letters: Vec<(char, usize)> = Vec::new();
    let mut ops = Vec::new();
    for (k, term) in lhs.split(',').enumerate() {
        let dims: Vec<usize> = term
            .chars()
            .map(|c| match letters.iter().find(|(d, _)| *d == c) {
                Some(&(_, n)) => n,
                None => {
                    let n = s.rng.pick(sizes);
                    letters.push((c, n));
                    n
                }
            })
            .collect();
        let d = if dtype.is_float() {
            u(-1.0, 1.0)
        } else {
            Dist::Int(-3, 3)
        };
        ops.push(s.param(&format!("x{k}_"), dtype, &dims, &d));
    }
    ops
}

#[test]
fn dot_general_random_dimension_numbers() {
    let mut s = Suite::new("dot_general", 1501);
    for k in 0..40 {
        let dtype = [F32, F64, F16, BF16, I32, I64][k % 6];
        let nb = s.rng.below(3);
        let nc = s.rng.below(3);
        let nl = s.rng.below(3).min(4 - nb - nc);
        let nr = s.rng.below(3).min(4 - nb - nc);
        // Roles: ('b', i) batch, ('c', i) contracting, ('l', i) / ('r', i) free.
        let mut lroles: Vec<(char, usize)> = (0..nb)
            .map(|i| ('b', i))
            .chain((0..nc).map(|i| ('c', i)))
            .chain((0..nl).map(|i| ('l', i)))
            .collect();
        let mut rroles: Vec<(char, usize)> = (0..nb)
            .map(|i| ('b', i))
            .chain((0..nc).map(|i| ('c', i)))
            .chain((0..nr).map(|i| ('r', i)))
            .collect();
        s.rng.shuffle(&mut lroles);
        s.rng.shuffle(&mut rroles);
        let letter = |(role, i): (char, usize)| -> char {
            let base = match role {
                'b' => b'a',
                'c' => b'f',
                'l' => b'k',
                _ => b'p',
            };
            (base + i as u8) as char
        };
        let mut size_of: Vec<(char, usize)> = Vec::new();
        for &r in lroles.iter().chain(&rroles) {
            let c = letter(r);
            if !size_of.iter().any(|(d, _)| *d == c) {
                let n = if s.rng.chance(0.1) {
                    0
                } else {
                    nz_dim(&mut s.rng)
                };
                size_of.push((c, n));
            }
        }
        let size = |c: char| size_of.iter().find(|(d, _)| *d == c).unwrap().1;
        let ldims: Vec<usize> = lroles.iter().map(|&r| size(letter(r))).collect();
        let rdims: Vec<usize> = rroles.iter().map(|&r| size(letter(r))).collect();
        let pos = |roles: &[(char, usize)], r: (char, usize), neg: bool| -> isize {
            let p = roles.iter().position(|&q| q == r).unwrap() as isize;
            if neg {
                p - roles.len() as isize
            } else {
                p
            }
        };
        let mut batch_order: Vec<usize> = (0..nb).collect();
        s.rng.shuffle(&mut batch_order);
        let batch: Vec<(isize, isize)> = batch_order
            .iter()
            .map(|&i| {
                let n = s.rng.chance(0.3);
                (pos(&lroles, ('b', i), n), pos(&rroles, ('b', i), !n))
            })
            .collect();
        let contract: Vec<(isize, isize)> = (0..nc)
            .map(|i| {
                let n = s.rng.chance(0.3);
                (pos(&lroles, ('c', i), n), pos(&rroles, ('c', i), n))
            })
            .collect();
        let lspec: String = lroles.iter().map(|&r| letter(r)).collect();
        let rspec: String = rroles.iter().map(|&r| letter(r)).collect();
        let ospec: String = batch_order
            .iter()
            .map(|&i| letter(('b', i)))
            .chain(lroles.iter().filter(|r| r.0 == 'l').map(|&r| letter(r)))
            .chain(rroles.iter().filter(|r| r.0 == 'r').map(|&r| letter(r)))
            .collect();
        let spec = format!("{lspec},{rspec}->{ospec}");
        s.case(format!(
            "dot_general {dtype}{ldims:?} x {dtype}{rdims:?} batch {batch:?} contract {contract:?} ({spec})"
        ));
        let d = if dtype.is_float() {
            u(-1.0, 1.0)
        } else {
            Dist::Int(-5, 5)
        };
        let a = s.param("x", dtype, &ldims, &d);
        let b = s.param("y", dtype, &rdims, &d);
        let y = a.dot_general(&b, &batch, &contract).unwrap();
        let (want, terms) = einsum_ref(&spec, &[s.value(&a), s.value(&b)]);
        let scale = if dtype.is_float() { 1.0 } else { 25.0 };
        let t = acc_tol(dtype, terms, scale);
        s.check_formula(&y, t, want, t);
    }
    s.run();
}

#[test]
fn matmul_forms() {
    let mut s = Suite::new("matmul", 1502);
    let forms: [(&str, &str); 8] = [
        ("[m,k] @ [k,n]", "mk,kn->mn"),
        ("[b,m,k] @ [b,k,n]", "bmk,bkn->bmn"),
        ("[a,b,m,k] @ [a,b,k,n]", "abmk,abkn->abmn"),
        ("[b,m,k] @ [k,n]", "bmk,kn->bmn"),
        ("[a,b,m,k] @ [k,n]", "abmk,kn->abmn"),
        ("[k] @ [k,n]", "k,kn->n"),
        ("[b,m,k] @ [k]", "bmk,k->bm"),
        ("[k] @ [k]", "k,k->"),
    ];
    for (name, spec) in forms {
        for dtype in [F32, F64, F16, BF16, I32] {
            s.case(format!("matmul {name} {dtype}"));
            let ops = einsum_operands(&mut s, spec, dtype, &[0, 1, 2, 3, 5]);
            let y = ops[0].matmul(&ops[1]).unwrap();
            let (want, terms) = einsum_ref(spec, &[s.value(&ops[0]), s.value(&ops[1])]);
            let scale = if dtype.is_float() { 1.0 } else { 9.0 };
            let t = acc_tol(dtype, terms, scale);
            s.check_formula(&y, t, want, t);
        }
    }
    s.run();
}

const EINSUM_SPECS: [&str; 16] = [
    // Mamba-2 SSD
    "bclhn,bcshn->bclhs",
    "bclhn,bchpn,bhcl->bclhp",
    "bhzc,bchpn->bzhpn",
    "bcln,bhcl,bclhp->bchpn",
    "bclhn,bhcl,bclhp->bchpn",
    "bclhs,bcshp->bclhp",
    "bclhn,bcshn,bhcls,bcshp->bclhp",
    // classic
    "ij,jk->ik",
    "bij,bjk->bik",
    "i,j->ij",
    "ij->ji",
    "ij->i",
    "ij->",
    "ijk,ik->j",
    "ij,jk",
    "ijk,kj",
];

#[test]
fn einsum_table() {
    let mut s = Suite::new("einsum", 1601);
    for spec in EINSUM_SPECS {
        for (k, dtype) in [F32, F32, F64, BF16].into_iter().enumerate() {
            let sizes: &[usize] = if k == 1 { &[0, 1, 2] } else { &[1, 2, 3] };
            s.case(format!("einsum {spec} {dtype}"));
            let ops = einsum_operands(&mut s, spec, dtype, sizes);
            let refs: Vec<&Tensor> = ops.iter().collect();
            let y = Tensor::einsum(spec, &refs).unwrap();
            let vals: Vec<&HostArray> = ops.iter().map(|t| s.value(t)).collect();
            let (want, terms) = einsum_ref(spec, &vals);
            // Multi-operand specs round intermediate products in the dtype.
            let terms = terms * ops.len();
            s.check_formula(
                &y,
                acc_tol(dtype, terms, 1.0),
                want,
                acc_tol(dtype, terms, 1.0),
            );
        }
    }
    s.run();
}

/// Every einsum contracts each pair of operands with exactly one `dot_general`.
#[test]
fn einsum_lowers_to_one_dot_general_per_pair() {
    let mut rng = Rng::new(1602);
    for spec in EINSUM_SPECS {
        let g = Graph::new();
        let lhs = spec.split("->").next().unwrap();
        let mut sizes: Vec<(char, usize)> = Vec::new();
        let ops: Vec<Tensor> = lhs
            .split(',')
            .enumerate()
            .map(|(k, term)| {
                let dims: Vec<usize> = term
                    .chars()
                    .map(|c| match sizes.iter().find(|(d, _)| *d == c) {
                        Some(&(_, n)) => n,
                        None => {
                            let n = rng.int(2, 4) as usize;
                            sizes.push((c, n));
                            n
                        }
                    })
                    .collect();
                g.parameter(&format!("x{k}"), F32, &dims).unwrap()
            })
            .collect();
        let refs: Vec<&Tensor> = ops.iter().collect();
        let y = Tensor::einsum(spec, &refs).unwrap();
        g.set_outputs(&[&y]).unwrap();
        let text = g.to_stablehlo().unwrap();
        let dots = text.matches("stablehlo.dot_general").count();
        assert_eq!(
            dots,
            ops.len() - 1,
            "einsum {spec:?} with {} operands lowered to {dots} dot_general ops:\n{text}",
            ops.len()
        );
        assert!(
            !text.contains("stablehlo.dot "),
            "einsum {spec:?} used a plain dot:\n{text}"
        );
    }
}

// ---- masks, gathers, conv ---------------------------------------------------------------------

#[test]
fn tril_triu_masked_fill() {
    let mut s = Suite::new("tril_triu", 1701);
    for offset in -2isize..=2 {
        for dtype in [F32, F64, BF16, I32, U8, I64] {
            let dims = shape(&mut s.rng, 2, 3);
            s.case(format!("tril/triu {dtype}{dims:?} offset {offset}"));
            let x = s.param("x", dtype, &dims, &Dist::Bits);
            let v = s.value(&x).clone();
            let r = dims.len();
            let keep = |i: usize, lower: bool| {
                let idx = unravel(i, &dims);
                let d = idx[r - 1] as isize - idx[r - 2] as isize;
                if lower {
                    d <= offset
                } else {
                    d >= offset
                }
            };
            let n: usize = dims.iter().product();
            let zero = array_of(dtype, &dims, &vec![0.0; n]);
            for lower in [true, false] {
                // Elements kept are copied; the others are zero.
                let mut bytes = Vec::new();
                let sz = dtype.size_in_bytes();
                let (vb, zb) = (v.to_bytes(), zero.to_bytes());
                for i in 0..n {
                    let src = if keep(i, lower) { &vb } else { &zb };
                    bytes.extend_from_slice(&src[i * sz..(i + 1) * sz]);
                }
                let want = HostArray::from_bytes(&TensorType::new(dtype, &dims), &bytes).unwrap();
                let y = if lower {
                    x.tril(offset)
                } else {
                    x.triu(offset)
                }
                .unwrap();
                s.check_formula(&y, Tol::Bits, want, Tol::Bits);
            }
        }
        let (rows, cols) = (dim(&mut s.rng), dim(&mut s.rng));
        s.case(format!("tril_mask/triu_mask {rows}x{cols} offset {offset}"));
        let lm = s.g.tril_mask(rows, cols, offset).unwrap();
        let um = s.g.triu_mask(rows, cols, offset).unwrap();
        let lw: Vec<f64> = (0..rows * cols)
            .map(|i| {
                f64::from(u8::from(
                    (i % cols) as isize - (i / cols) as isize <= offset,
                ))
            })
            .collect();
        let uw: Vec<f64> = (0..rows * cols)
            .map(|i| {
                f64::from(u8::from(
                    (i % cols) as isize - (i / cols) as isize >= offset,
                ))
            })
            .collect();
        s.check_formula(
            &lm,
            Tol::Exact,
            array_of(Pred, &[rows, cols], &lw),
            Tol::Exact,
        );
        s.check_formula(
            &um,
            Tol::Exact,
            array_of(Pred, &[rows, cols], &uw),
            Tol::Exact,
        );
    }
    for k in 0..20 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dims = shape(&mut s.rng, 0, 3);
        let dm = sub_broadcast(&mut s.rng, &dims);
        s.case(format!("masked_fill {dtype}{dims:?} mask {dm:?}"));
        let x = s.param("x", dtype, &dims, &Dist::Bits);
        let m = s.param("m", Pred, &dm, &Dist::Bool(0.4));
        let value = if dtype.is_float() { -1e9 } else { 7.0 };
        let value = if dtype == F16 {
            f64::NEG_INFINITY
        } else {
            value
        };
        s.check_tol(&x.masked_fill(&m, value).unwrap(), Tol::Bits);
    }
    // The fill value may be a rank-0 tensor (here a parameter) instead of a number.
    for dtype in [F32, I32] {
        s.case(format!("masked_fill {dtype} with a tensor value"));
        let x = s.param("x", dtype, &[2, 3], &Dist::Int(0, 9));
        let m = s.param("m", Pred, &[3], &Dist::Bool(0.5));
        let v = s.param("v", dtype, &[], &Dist::Int(-9, -1));
        let (xv, mv, vv) = (
            s.value(&x).to_f64_vec(),
            s.value(&m).to_f64_vec(),
            s.value(&v).to_f64_vec()[0],
        );
        let want: Vec<f64> = (0..6)
            .map(|i| if mv[i % 3] != 0.0 { vv } else { xv[i] })
            .collect();
        let want = array_of(dtype, &[2, 3], &want);
        s.check_formula(
            &x.masked_fill(&m, &v).unwrap(),
            Tol::Exact,
            want,
            Tol::Exact,
        );
    }
    s.run();
}

#[test]
fn take_index_add_and_one_hot() {
    let mut s = Suite::new("take_one_hot", 1801);
    for k in 0..30 {
        let dtype = any_dtype(&mut s.rng);
        let mut tdims = shape(&mut s.rng, 1, 3);
        tdims[0] = nz_dim(&mut s.rng);
        let n = tdims[0] as i64;
        let idims = shape(&mut s.rng, 0, 2);
        let idx_dtype = [I32, I64, U32, U8, U64][k % 5];
        s.case(format!("take {dtype}{tdims:?} by {idx_dtype}{idims:?}"));
        let table = s.param("t", dtype, &tdims, &bits_dist(dtype));
        let lo = if idx_dtype.is_unsigned() { 0 } else { -3 };
        let idx = s.param("i", idx_dtype, &idims, &Dist::Int(lo, n + 3));
        // Formula: rows picked by the clamped indices.
        let row: usize = tdims[1..].iter().product();
        let flat: Vec<usize> = s
            .value(&idx)
            .to_f64_vec()
            .into_iter()
            .flat_map(|i| {
                let r = (i as i64).clamp(0, n - 1) as usize;
                (0..row).map(move |j| r * row + j)
            })
            .collect();
        let mut odims = idims.clone();
        odims.extend_from_slice(&tdims[1..]);
        let want = gather(s.value(&table), &odims, &flat);
        s.check_formula(&table.take(&idx).unwrap(), Tol::Bits, want, Tol::Bits);
    }
    for k in 0..30 {
        // index_add: each update row added at its clamped index, repeats adding up.
        let dtype = [F32, F64, I32, I64, U8, U32][k % 6];
        let mut tdims = shape(&mut s.rng, 1, 3);
        tdims[0] = nz_dim(&mut s.rng);
        let n = tdims[0] as i64;
        let idims = shape(&mut s.rng, 0, 2);
        let idx_dtype = [I32, I64, U32, U8, U64][k % 5];
        s.case(format!(
            "index_add {dtype}{tdims:?} by {idx_dtype}{idims:?}"
        ));
        let dist = if dtype.is_float() {
            u(-2.0, 2.0)
        } else {
            Dist::Int(0, 9)
        };
        let table = s.param("t", dtype, &tdims, &dist);
        let lo = if idx_dtype.is_unsigned() { 0 } else { -3 };
        let idx = s.param("i", idx_dtype, &idims, &Dist::Int(lo, n + 3));
        let mut udims = idims.clone();
        udims.extend_from_slice(&tdims[1..]);
        let upd = s.param("u", dtype, &udims, &dist);
        let row: usize = tdims[1..].iter().product();
        let mut want = s.value(&table).to_f64_vec();
        let updates = s.value(&upd).to_f64_vec();
        for (p, i) in s.value(&idx).to_f64_vec().into_iter().enumerate() {
            let r = (i as i64).clamp(0, n - 1) as usize;
            for j in 0..row {
                want[r * row + j] += updates[p * row + j];
            }
        }
        let tol = if dtype.is_float() {
            Tol::Close {
                rtol: 1e-5,
                atol: 1e-6,
            }
        } else {
            Tol::Exact
        };
        s.check_formula(
            &table.index_add(&idx, &upd).unwrap(),
            tol,
            array_of(dtype, &tdims, &want),
            tol,
        );
    }
    for k in 0..20 {
        let idx_dtype = [I32, I64, U8, U32, U64][k % 5];
        let out = DType::ALL[k % DType::ALL.len()];
        let idims = shape(&mut s.rng, 0, 2);
        let depth = s.rng.int(0, 5) as usize;
        s.case(format!(
            "one_hot {idx_dtype}{idims:?} depth {depth} as {out}"
        ));
        let lo = if idx_dtype.is_unsigned() { 0 } else { -2 };
        let idx = s.param("i", idx_dtype, &idims, &Dist::Int(lo, depth as i64 + 2));
        let want: Vec<f64> = s
            .value(&idx)
            .to_f64_vec()
            .into_iter()
            .flat_map(|i| (0..depth).map(move |c| f64::from(u8::from(i == c as f64))))
            .collect();
        let mut odims = idims.clone();
        odims.push(depth);
        let y = idx.one_hot(depth, out).unwrap();
        s.check_formula(&y, Tol::Exact, array_of(out, &odims, &want), Tol::Exact);
    }
    s.run();
}

#[test]
fn causal_conv1d_kernels() {
    let mut s = Suite::new("causal_conv1d", 1901);
    for k in 1..=4usize {
        for (j, dtype) in [F32, F64, F16, BF16, F32, F64].into_iter().enumerate() {
            let dims = [
                s.rng.pick(&[0, 1, 2]),
                s.rng.pick(&[0, 1, 2, 3, 5]),
                s.rng.pick(&[1, 2, 3]),
            ];
            let with_bias = j % 2 == 0;
            s.case(format!(
                "causal_conv1d {dtype}{dims:?} k {k} bias {with_bias}"
            ));
            let x = s.param("x", dtype, &dims, &u(-1.0, 1.0));
            let w = s.param("w", dtype, &[dims[2], k], &u(-1.0, 1.0));
            let b = with_bias.then(|| s.param("b", dtype, &[dims[2]], &u(-1.0, 1.0)));
            let y = x.causal_conv1d(&w, b.as_ref()).unwrap();
            let (xv, wv) = (s.value(&x).to_f64_vec(), s.value(&w).to_f64_vec());
            let bv = b.as_ref().map(|b| s.value(b).to_f64_vec());
            let [nb, nt, nc] = dims;
            let mut want = vec![0.0; nb * nt * nc];
            for bi in 0..nb {
                for t in 0..nt {
                    for c in 0..nc {
                        let mut acc = bv.as_ref().map_or(0.0, |b| b[c]);
                        for q in 0..k {
                            let ti = t as i64 - (k as i64 - 1) + q as i64;
                            if ti >= 0 {
                                acc += wv[c * k + q] * xv[(bi * nt + ti as usize) * nc + c];
                            }
                        }
                        want[(bi * nt + t) * nc + c] = acc;
                    }
                }
            }
            let t = acc_tol(dtype, k + 1, 1.0);
            s.check_formula(
                &y,
                t,
                f64_array(&dims, want),
                acc_tol(dtype, 2 * k + 1, 1.0),
            );
        }
    }
    s.run();
}

// ---- sorting ----------------------------------------------------------------------------------

/// The stable sort of `v` along `axis`: values and source indices (NaN last ascending, first
/// descending).
fn sort_ref(v: &HostArray, axis: usize, descending: bool) -> (HostArray, Vec<f64>) {
    let dims = v.dims().to_vec();
    let vals = v.to_f64_vec();
    let n = dims[axis];
    let st = strides(&dims);
    let total: usize = dims.iter().product();
    let mut flat = vec![0usize; total];
    let mut idx = vec![0.0; total];
    for base in 0..total {
        if unravel(base, &dims)[axis] != 0 {
            continue;
        }
        let lane: Vec<usize> = (0..n).map(|i| base + i * st[axis]).collect();
        let mut order: Vec<usize> = (0..n).collect();
        // NaN is the largest value.
        let key = |i: usize| vals[lane[i]];
        order.sort_by(|&a, &b| {
            let (x, y) = (key(a), key(b));
            let o = match (x.is_nan(), y.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                _ => x.partial_cmp(&y).unwrap(),
            };
            if descending {
                o.reverse()
            } else {
                o
            }
        });
        for (i, &o) in order.iter().enumerate() {
            flat[lane[i]] = lane[o];
            idx[lane[i]] = o as f64;
        }
    }
    (gather(v, &dims, &flat), idx)
}

#[test]
fn sort_and_top_k() {
    let mut s = Suite::new("sort", 2001);
    for k in 0..36 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dims = shape(&mut s.rng, 1, 3);
        let axis = s.rng.below(dims.len());
        let descending = s.rng.chance(0.5);
        let a = if s.rng.chance(0.5) {
            axis as isize
        } else {
            axis as isize - dims.len() as isize
        };
        s.case(format!(
            "sort {dtype}{dims:?} axis {a} descending {descending}"
        ));
        let d = match (k / NUMERIC.len()) % 3 {
            0 => pick(&[0.0, 1.0, 2.0, 3.0]), // ties
            1 if dtype.is_float() => with(
                pick(&[-1.0, 0.0, 1.0, 2.5]),
                &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
                0.3,
            ),
            _ if dtype.is_float() => u(-100.0, 100.0),
            _ => Dist::Bits,
        };
        let x = s.param("x", dtype, &dims, &d);
        let (want, widx) = sort_ref(s.value(&x), axis, descending);
        let order = if descending {
            SortOrder::Descending
        } else {
            SortOrder::Ascending
        };
        s.check_formula(
            &x.sort(a, order).unwrap(),
            Tol::Bits,
            want.clone(),
            Tol::Bits,
        );
        let (v, i) = x.sort_with_indices(a, order).unwrap();
        s.check_formula(&v, Tol::Bits, want, Tol::Bits);
        s.check_formula(&i, Tol::Exact, array_of(I64, &dims, &widx), Tol::Exact);
    }
    for k in 0..27 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dims = shape(&mut s.rng, 1, 3);
        let n = *dims.last().unwrap();
        let kk = s.rng.int(0, n as i64) as usize;
        s.case(format!("top_k {dtype}{dims:?} k {kk}"));
        let d = if k % 2 == 0 {
            pick(&[0.0, 1.0, 2.0])
        } else if dtype.is_float() {
            with(u(-10.0, 10.0), &[f64::NAN, f64::INFINITY], 0.2)
        } else {
            Dist::Bits
        };
        let x = s.param("x", dtype, &dims, &d);
        let (sorted, sidx) = sort_ref(s.value(&x), dims.len() - 1, true);
        let mut odims = dims.clone();
        *odims.last_mut().unwrap() = kk;
        let total: usize = odims.iter().product();
        let flat: Vec<usize> = (0..total)
            .map(|i| {
                let mut idx = unravel(i, &odims);
                let last = idx.len() - 1;
                idx[last] = idx[last].min(n.saturating_sub(1));
                ravel(&idx, &dims)
            })
            .collect();
        let want = gather(&sorted, &odims, &flat);
        let widx: Vec<f64> = flat.iter().map(|&f| sidx[f]).collect();
        let (v, i) = x.top_k(kk).unwrap();
        s.check_formula(&v, Tol::Bits, want, Tol::Bits);
        s.check_formula(&i, Tol::Exact, array_of(I64, &odims, &widx), Tol::Exact);
    }
    s.run();
}

// ---- random numbers ---------------------------------------------------------------------------

fn key(a: u32, b: u32) -> HostArray {
    HostArray::from_vec(&[2], vec![a, b]).unwrap()
}

#[test]
fn random_agrees_with_interpreter() {
    let mut s = Suite::new("random", 2101);
    for k in 0..12 {
        let dims = shape(&mut s.rng, 0, 3);
        let (a, b) = (s.rng.next_u64() as u32, s.rng.next_u64() as u32);
        s.case(format!("random {dims:?} key [{a}, {b}]"));
        let kt = s.input("k", key(a, b));
        s.check(&s.g.random_bits(&kt, &dims).unwrap());
        // Floats are drawn in f32 and converted: f32's tolerance at least.
        let dtype = FLOATS[k % 4];
        let t = if dtype == F64 { tol(F32) } else { tol(dtype) };
        s.check_tol(&s.g.random_uniform(&kt, dtype, &dims).unwrap(), t);
        s.check_tol(&s.g.random_normal(&kt, dtype, &dims).unwrap(), t);
    }
    s.run();
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
    (m, var.sqrt())
}

#[test]
fn random_statistics_and_keys() {
    const N: usize = 10_000;
    let mut s = Suite::new("random_statistics", 2102);
    s.case("key 1");
    let k1 = s.input("k", key(0, 42));
    let bits = s.check(&s.g.random_bits(&k1, &[N]).unwrap());
    let uni = s.check(&s.g.random_uniform(&k1, F32, &[N]).unwrap());
    let nor = s.check(&s.g.random_normal(&k1, F32, &[100, 100]).unwrap());
    let mut small = Vec::new();
    for dtype in [F64, F16, BF16] {
        small.push(s.check(&s.g.random_uniform(&k1, dtype, &[1000]).unwrap()));
    }
    // The same key used twice in one graph gives the same values.
    let again = s.check(&s.g.random_bits(&k1, &[N]).unwrap());
    s.case("key 2");
    let k2 = s.input("k", key(0, 43));
    let bits2 = s.check(&s.g.random_bits(&k2, &[N]).unwrap());
    let ran = s.run();
    let got = &ran.got;

    let b1 = got[bits].as_array::<u32>().unwrap();
    let b2 = got[bits2].as_array::<u32>().unwrap();
    assert_eq!(got[bits], got[again], "the same key gave different bits");
    let same = b1.iter().zip(b2.iter()).filter(|(a, b)| a == b).count();
    assert!(
        same < 10,
        "keys [0, 42] and [0, 43] share {same} of {N} words"
    );
    let distinct: std::collections::HashSet<u32> = b1.iter().copied().collect();
    assert!(
        distinct.len() > N - 10,
        "only {} distinct words",
        distinct.len()
    );
    let ones: u32 = b1.iter().map(|w| w.count_ones()).sum();
    let frac = f64::from(ones) / (32 * N) as f64;
    assert!((frac - 0.5).abs() < 0.01, "fraction of one bits {frac}");

    let u = got[uni].to_f64_vec();
    assert!(
        u.iter().all(|&x| (0.0..1.0).contains(&x)),
        "uniform outside [0, 1)"
    );
    let (m, sd) = mean_std(&u);
    assert!((m - 0.5).abs() < 0.02, "uniform mean {m}");
    assert!(
        (sd - (1.0f64 / 12.0).sqrt()).abs() < 0.02,
        "uniform std {sd}"
    );
    for &i in &small {
        let v = got[i].to_f64_vec();
        assert!(
            v.iter().all(|&x| (0.0..1.0).contains(&x)),
            "uniform {} outside [0, 1)",
            got[i].dtype()
        );
        let (m, _) = mean_std(&v);
        assert!(
            (m - 0.5).abs() < 0.05,
            "uniform {} mean {m}",
            got[i].dtype()
        );
    }
    let n = got[nor].to_f64_vec();
    assert!(n.iter().all(|x| x.is_finite()), "normal not finite");
    let (m, sd) = mean_std(&n);
    assert!(m.abs() < 0.05, "normal mean {m}");
    assert!((sd - 1.0).abs() < 0.05, "normal std {sd}");

    // A second run of the same executable on the same key gives the same values; another key
    // gives other values.
    let again = ran.compiled.run(&ran.inputs).unwrap();
    assert_eq!(again, *got, "a second run gave different values");
    let mut other = ran.inputs.clone();
    other[0] = key(7, 42);
    let third = ran.compiled.run(&other).unwrap();
    assert_ne!(
        third[bits], got[bits],
        "keys [0, 42] and [7, 42] gave the same bits"
    );
    assert_eq!(third[bits2], got[bits2], "an unrelated key's bits changed");
    assert_eq!(ran.want[bits], got[bits]);
}

// ---- whole graphs -----------------------------------------------------------------------------

/// Many ops chained in one graph (a small Mamba-like block), with outputs of many dtypes: the
/// executable's output types equal the inferred types, and PJRT agrees with the interpreter.
#[test]
fn chained_block_output_types_match() {
    let mut s = Suite::new("chained_block", 2201);
    let (b, t, c, h, n) = (2, 5, 6, 2, 3);
    s.case("block");
    let x = s.param("x", F32, &[b, t, c], &u(-1.0, 1.0));
    let w = s.param("w", F32, &[c, 4], &u(-0.5, 0.5));
    let bias = s.param("bias", F32, &[c], &u(-0.1, 0.1));
    let key_t = s.input("key", key(1, 2));
    let tokens = s.param("tok", I32, &[b, t], &Dist::Int(0, 9));
    let emb = s.param("emb", F32, &[10, c], &u(-1.0, 1.0));

    let e = emb.take(&tokens).unwrap(); // [b, t, c]
    let xs = (&x + &e)
        .unwrap()
        .causal_conv1d(&w, Some(&bias))
        .unwrap()
        .silu()
        .unwrap();
    let heads = xs
        .reshape(&[b as isize, t as isize, h as isize, -1])
        .unwrap(); // [b,t,h,3]
    let bmat = heads.softplus().unwrap();
    let scores = Tensor::einsum("blhn,bshn->bhls", &[&heads, &bmat]).unwrap();
    let causal = scores.tril(0).unwrap();
    let masked = scores
        .masked_fill(&s.g.triu_mask(t, t, 1).unwrap(), f64::NEG_INFINITY)
        .unwrap();
    let lse = masked.logsumexp_keepdims(&[-1]).unwrap();
    let probs = masked.sub(&lse).unwrap().exp().unwrap();
    let y = Tensor::einsum("bhls,bshn->blhn", &[&probs, &heads]).unwrap();
    let flat = y.reshape(&[b as isize, t as isize, -1]).unwrap();
    let cum = flat
        .cumsum_with(
            1,
            CumsumOptions {
                exclusive: true,
                reverse: false,
            },
        )
        .unwrap();
    let noise = s.g.random_normal(&key_t, F32, &[b, t, h * n]).unwrap();
    let z = (&cum + &noise.mul(0.01).unwrap()).unwrap();
    let (top, top_i) = z.top_k(2).unwrap();
    let am = z.argmax(-1).unwrap();
    let hot = am.one_hot(h * n, Pred).unwrap();
    let dec = z.astype(BF16).unwrap().gelu().unwrap();
    let bits = s.g.random_bits(&key_t, &[3]).unwrap();
    let pooled = z.mean(&[1]).unwrap().astype(F16).unwrap();
    let gate = z.gt(0.0).unwrap().select(&z, z.mul(0.1).unwrap()).unwrap();
    let padded = gate.pad(&[0, 1, 0], &[0, -1, 0], &[0, 0, 1], 0.0).unwrap();
    let state = padded
        .dynamic_slice(
            &[
                &s.g.scalar(0.0, I64).unwrap(),
                &s.g.scalar(2.0, I64).unwrap(),
                &s.g.scalar(1.0, I64).unwrap(),
            ],
            &[b, 2, 3],
        )
        .unwrap();
    let mm = state.matmul(&state.t().unwrap()).unwrap();
    let u8s = tokens.astype(U8).unwrap().shift_left(1u32).unwrap();
    let rev = Tensor::concat(&[&u8s, &u8s.flip(&[1]).unwrap()], 0).unwrap();
    let sorted = rev
        .astype(U64)
        .unwrap()
        .sort(-1, SortOrder::Descending)
        .unwrap();
    let t_eq = (2.0 * &causal).unwrap().sum(&[1, 2]).unwrap();
    for o in [&xs, &scores, &causal, &y, &cum, &z, &top, &mm] {
        s.check_tol(o, acc_tol(F32, 30, 10.0));
    }
    for o in [&top_i, &am, &hot, &bits, &u8s, &rev, &sorted] {
        s.check(o);
    }
    s.check_tol(&dec, acc_tol(BF16, 1, 1.0));
    s.check_tol(&pooled, acc_tol(F16, 1, 1.0));
    s.check_tol(&t_eq, acc_tol(F32, 30, 10.0));
    let ran = s.run();
    assert_eq!(
        ran.compiled.output_types(),
        ran.compiled.executable().output_types()
    );
    for (g, w) in ran.got.iter().zip(&ran.want) {
        assert_eq!(g.ty(), w.ty());
    }
    let kinds: std::collections::HashSet<DType> = ran.got.iter().map(|a| a.dtype()).collect();
    assert!(kinds.len() >= 7, "outputs of {} dtypes only", kinds.len());
}

/// The exact lowering of a small composite, to keep the emitted text readable and stable.
#[test]
fn golden_softplus_lowering() {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[3]).unwrap();
    let y = x.softplus().unwrap();
    g.set_outputs(&[&y]).unwrap();
    let text = g.to_stablehlo().unwrap();
    let want = "\
module @stablegraph {
  func.func public @main(%p0_x: tensor<3xf32>) -> tensor<3xf32> {
    %v1 = stablehlo.constant dense<0.0> : tensor<f32>
    %v2 = stablehlo.broadcast_in_dim %v1, dims = [] : (tensor<f32>) -> tensor<3xf32>
    %v3_maximum = stablehlo.maximum %p0_x, %v2 : tensor<3xf32>
    %v3_a_nan = stablehlo.compare NE, %p0_x, %p0_x, FLOAT : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
    %v3_or_a = stablehlo.select %v3_a_nan, %p0_x, %v3_maximum : tensor<3xi1>, tensor<3xf32>
    %v3_b_nan = stablehlo.compare NE, %v2, %v2, FLOAT : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
    %v3 = stablehlo.select %v3_b_nan, %v2, %v3_or_a : tensor<3xi1>, tensor<3xf32>
    %v4 = stablehlo.abs %p0_x : tensor<3xf32>
    %v5 = stablehlo.negate %v4 : tensor<3xf32>
    %v6 = stablehlo.exponential %v5 : tensor<3xf32>
    %v7 = stablehlo.log_plus_one %v6 : tensor<3xf32>
    %v8 = stablehlo.add %v3, %v7 : tensor<3xf32>
    return %v8 : tensor<3xf32>
  }
}
";
    assert_eq!(text, want, "\n--- got ---\n{text}\n--- want ---\n{want}");
    let compiled = g.compile(&client()).unwrap();
    assert_eq!(compiled.stablehlo(), text);
}

/// Random123's known answer for Threefry-2x32-20 with key (0, 0) and counter (0, 0) is
/// (0x6b200159, 0x99ba4efe); `random_bits` returns the first word for counter 0.
#[test]
fn threefry_known_answer() {
    let g = Graph::new();
    let key = g.parameter("key", DType::U32, &[2]).unwrap();
    let bits = g.random_bits(&key, &[3]).unwrap();
    g.set_outputs(&[&bits]).unwrap();
    let inputs = [HostArray::from_vec(&[2], vec![0u32, 0]).unwrap()];
    let reference = g.evaluate(&inputs).unwrap();
    let device = g.compile(&common::client()).unwrap().run(&inputs).unwrap();
    let words = reference[0].as_array::<u32>().unwrap();
    assert_eq!(words[[0]], 0x6b20_0159);
    assert_eq!(reference, device);
}

#[test]
fn constant_array_from_ndarray_round_trips() {
    let g = Graph::new();
    let a = ndarray::arr2(&[[1.5f32, -2.0, 0.25], [4.0, 5.5, -6.0]]);
    let c = g.constant_array(&a.t()).unwrap(); // not row-major in memory
    let doubled = c.mul(2.0).unwrap();
    g.set_outputs(&[&doubled]).unwrap();
    let want = HostArray::from((a.t().to_owned() * 2.0).into_dyn());
    assert_eq!(g.evaluate(&[]).unwrap(), vec![want.clone()]);
    assert_eq!(
        g.compile(&common::client()).unwrap().run(&[]).unwrap(),
        vec![want]
    );
}
