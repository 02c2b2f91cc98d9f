//! [`Suite`]: one graph of many independent checks, compiled once, run once, and compared output
//! by output between the compiled program, the interpreter and, where given, a formula.

use stablegraph::ops::{Graph, Tensor};
use stablegraph::{CompiledGraph, DType, HostArray, Result};

use super::arrays::{array_of, f64_array, show};
use super::client;
use super::random::{random_array, Dist, Rng};
use super::tol::{compare, tol, Tol};

/// One output to compare.
struct Check {
    label: String,
    params: Vec<usize>,
    out: Tensor,
    tol: Tol,
    formula: Option<(HostArray, Tol)>,
}

/// One graph of many independent cases, compiled once and compared output by output: the
/// compiled program against the interpreter within a tolerance, both against a formula computed
/// on the host where one is given, and the types of both results against the type the graph
/// inferred (`Graph::compile` also checks the executable's output types against it).
pub struct Suite {
    name: String,
    /// The graph the cases are built in.
    pub g: Graph,
    /// The suite's seeded generator (for shapes and choices; inputs draw from it too).
    pub rng: Rng,
    inputs: Vec<HostArray>,
    names: Vec<String>,
    case: String,
    case_no: usize,
    case_params: Vec<usize>,
    checks: Vec<Check>,
}

/// The results of a suite's run.
pub struct Ran {
    pub compiled: CompiledGraph,
    pub inputs: Vec<HostArray>,
    /// The compiled program's outputs, in check order.
    pub got: Vec<HostArray>,
    /// The interpreter's outputs, in check order.
    pub want: Vec<HostArray>,
}

impl Suite {
    /// An empty suite named `name` (in its reports), drawing from a generator seeded by `seed`.
    pub fn new(name: &str, seed: u64) -> Suite {
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

    /// Starts a new case; parameters made from now on belong to it and are shown when one of its
    /// checks fails.
    pub fn case(&mut self, label: impl Into<String>) {
        self.case_no += 1;
        self.case = format!("case {} ({})", self.case_no, label.into());
        self.case_params.clear();
    }

    /// A parameter of this case holding `value`.
    pub fn input(&mut self, tag: &str, value: HostArray) -> Tensor {
        let mut name = format!("{tag}{}", self.inputs.len());
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
    pub fn param(&mut self, tag: &str, dtype: DType, dims: &[usize], dist: &Dist) -> Tensor {
        let v = random_array(&mut self.rng, dtype, dims, dist);
        self.input(tag, v)
    }

    /// A parameter holding `values` as `dtype`, and the values as stored (rounded to the dtype).
    pub fn values(&mut self, dtype: DType, dims: &[usize], values: &[f64]) -> (Tensor, Vec<f64>) {
        let a = array_of(dtype, dims, values);
        let stored = a.to_f64_vec();
        (self.input("p", a), stored)
    }

    /// A parameter uniform in `[lo, hi)`, and its values as stored.
    pub fn uniform(
        &mut self,
        dtype: DType,
        dims: &[usize],
        lo: f64,
        hi: f64,
    ) -> (Tensor, Vec<f64>) {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n).map(|_| self.rng.uniform(lo, hi)).collect();
        self.values(dtype, dims, &v)
    }

    /// A parameter of integers uniform in `lo..=hi`, and its values.
    pub fn ints(&mut self, dtype: DType, dims: &[usize], lo: i64, hi: i64) -> (Tensor, Vec<f64>) {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n).map(|_| self.rng.int(lo, hi) as f64).collect();
        self.values(dtype, dims, &v)
    }

    /// A random shape of rank `lo..=hi` with dimensions `1..=4`.
    pub fn nonempty_shape(&mut self, lo: usize, hi: usize) -> Vec<usize> {
        let rank = self.rng.int(lo as i64, hi as i64) as usize;
        (0..rank).map(|_| self.rng.int(1, 4) as usize).collect()
    }

    /// The value a parameter made by this suite holds.
    pub fn value(&self, t: &Tensor) -> &HostArray {
        let i = self
            .g
            .parameters()
            .iter()
            .position(|p| *p == t.id())
            .expect("a parameter");
        assert_eq!(self.g.parameter_names()[i], self.names[i]);
        &self.inputs[i]
    }

    /// Compares `t` between the compiled program and the interpreter with its dtype's
    /// tolerance; returns the output index.
    pub fn check(&mut self, t: &Tensor) -> usize {
        self.check_tol(t, tol(t.dtype()))
    }

    /// As [`Suite::check`], within `tol`.
    pub fn check_tol(&mut self, t: &Tensor, tol: Tol) -> usize {
        self.checks.push(Check {
            label: self.case.clone(),
            params: self.case_params.clone(),
            out: t.clone(),
            tol,
            formula: None,
        });
        self.checks.len() - 1
    }

    /// As [`Suite::check_tol`], and both results must also match `want` (computed here) within
    /// `ftol`.
    pub fn check_formula(&mut self, t: &Tensor, tol: Tol, want: HostArray, ftol: Tol) -> usize {
        let i = self.check_tol(t, tol);
        self.checks[i].formula = Some((want, ftol));
        i
    }

    /// Both results must equal `want` (computed here) and each other exactly (floats by value).
    pub fn check_exact(&mut self, t: &Tensor, want: HostArray) -> usize {
        self.check_formula(t, Tol::Exact, want, Tol::Exact)
    }

    /// Both results must have the bits of `want` (computed here) and of each other.
    pub fn check_bits(&mut self, t: &Tensor, want: HostArray) -> usize {
        self.check_formula(t, Tol::Bits, want, Tol::Bits)
    }

    /// As [`Suite::check`], and both results must also match the row-major values `want`
    /// (computed here in f64) within the output dtype's tolerance; `label` names the check.
    pub fn check_values(&mut self, label: impl Into<String>, t: &Tensor, want: Vec<f64>) {
        self.check_values_tol(label, t, want, tol(t.dtype()));
    }

    /// As [`Suite::check_values`], within `ftol` of `want`.
    pub fn check_values_tol(
        &mut self,
        label: impl Into<String>,
        t: &Tensor,
        want: Vec<f64>,
        ftol: Tol,
    ) {
        let want = f64_array(t.dims(), want);
        let i = self.check_formula(t, tol(t.dtype()), want, ftol);
        let c = &mut self.checks[i];
        c.label = [label.into(), std::mem::take(&mut c.label)].join(" ");
        c.label.truncate(c.label.trim_end().len());
    }

    /// Finds which checks fail `f` when each output is alone in the graph.
    fn locate(&self, what: &str, f: impl Fn(&Graph) -> Result<()>) -> String {
        let mut out = Vec::new();
        for c in &self.checks {
            self.g.set_outputs(&[&c.out]).unwrap();
            if let Err(e) = f(&self.g) {
                out.push(format!("  {}: {what} fails: {e}", c.label));
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

    /// The parameters of a check's case, with their values where small.
    fn describe(&self, c: &Check) -> String {
        if c.params.len() > 8 {
            return format!("    ({} parameters)", c.params.len());
        }
        let shown: Vec<String> = c
            .params
            .iter()
            .map(|&p| format!("    {} = {}", self.names[p], show(&self.inputs[p])))
            .collect();
        shown.join("\n")
    }

    /// Compiles and runs the graph, evaluates it with the interpreter, and panics with a report
    /// of every check that fails.
    pub fn run(self) -> Ran {
        let start = std::time::Instant::now();
        let outs: Vec<&Tensor> = self.checks.iter().map(|c| &c.out).collect();
        self.g.set_outputs(&outs).unwrap();
        let compiled = self.g.compile(&client()).unwrap_or_else(|e| {
            let which = self.locate("compile", |g| g.compile(&client()).map(|_| ()));
            panic!("[{}] compiling the suite failed: {e}\n{which}", self.name);
        });
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
        let want = self.g.evaluate(&self.inputs).unwrap_or_else(|e| {
            let which = self.locate("evaluate", |g| g.evaluate(&self.inputs).map(|_| ()));
            panic!("[{}] the interpreter failed: {e}\n{which}", self.name);
        });
        assert_eq!(got.len(), self.checks.len());
        assert_eq!(want.len(), self.checks.len());
        let mut failures = Vec::new();
        for (k, c) in self.checks.iter().enumerate() {
            let mut why = Vec::new();
            for (who, a) in [("PJRT", &got[k]), ("interpreter", &want[k])] {
                if a.ty() != *c.out.ty() {
                    why.push(format!(
                        "{who} output type {} but inferred {}",
                        a.ty(),
                        c.out.ty()
                    ));
                }
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
                    c.label,
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
