//! The `random_graph` target: a graph built by [`GraphBuilder`] from fuzzer bytes, lowered,
//! compiled, run, and checked against the interpreter.

use super::graph_builder::GraphBuilder;
use super::Bytes;
use crate::dtype::{DType, TensorType};
use crate::ops::{Graph, Tensor};
use crate::runtime::Client;
use crate::HostArray;

/// At most this many top-level builder calls per graph.
const GRAPH_STEPS: usize = 24;
/// Graphs with a larger value anywhere (in elements, its zero dims counted as 1: see [`extent`])
/// are lowered but not compiled.
const COMPILE_ELEMENTS: usize = 1 << 16;
/// Graphs whose inputs and outputs are this small (in elements) are also run and interpreted.
const RUN_ELEMENTS: usize = 1 << 12;

/// A random graph: `data` drives a sequence of DSL calls (parameters, constants, elementwise
/// unary and binary ops by method and by operator, with tensors or numbers of every type on
/// either side, comparisons, converts and bitcasts, selects, masks, reductions, cumulative sums,
/// moments, shape ops, concatenation, splits and chunks, `dot_general`, `matmul` and `einsum`,
/// gathers, sorts and top-k, dynamic slices, convolutions, random numbers, the neural-network
/// composites, and loops and scans whose bodies are built the same way) with random shapes,
/// axes, dtypes and options, often invalid ones.
///
/// Every call must return `Ok` or `Err`; a graph that builds must lower. With a `client`, the
/// text must compile or be refused with an `Err` (never abort), and a small program that
/// compiles runs, and the interpreter evaluates the graph too (both `Ok` or `Err`); where the
/// graph uses only ops whose results do not depend on the backend (no integer division, shifts
/// or float-to-integer conversions, no pred-to-float ones, no f16/bf16, no non-finite
/// constants, no `f32` variances or layer norms), the two agree to 1e-3. Every other graph
/// also outputs the gradient of its first float output's sum (see [`Tensor::grad`]).
pub fn random_graph(data: &[u8], client: Option<&Client>) {
    let mut b = Bytes::new(data);
    let g = Graph::new();
    let (pool, robust) = {
        let mut builder = GraphBuilder::new(&g, &mut b);
        let pool = builder.build(GRAPH_STEPS);
        (pool, builder.robust())
    };
    let count = 1 + b.below(3);
    let mut outputs: Vec<Tensor> = pool.iter().rev().take(count).cloned().collect();
    if b.below(2) == 0 {
        outputs.extend(gradients(&g, &outputs));
    }
    let outputs: Vec<&Tensor> = outputs.iter().collect();
    if outputs.is_empty() || g.set_outputs(&outputs).is_err() {
        return;
    }
    let text = match g.to_stablehlo() {
        Ok(text) => text,
        Err(e) => panic!("a graph that built did not lower: {e}"),
    };
    let Some(client) = client else {
        return;
    };
    if !compilable(&g) {
        return;
    }
    let Ok(program) = g.compile(client) else {
        return;
    };
    if !runnable(&g) {
        return;
    }
    let inputs = inputs(&g);
    let on_device = program.run(&inputs);
    let interpreted = g.evaluate(&inputs);
    if let (Ok(device), Ok(host), true) = (&on_device, &interpreted, comparable(&g, robust)) {
        compare_outputs(device, host, &text);
    }
}

/// The gradient of the sum of the first float output with respect to every float parameter
/// (none when the transformation refuses the graph: it must return `Err`, never panic).
pub(super) fn gradients(g: &Graph, outputs: &[Tensor]) -> Vec<Tensor> {
    let Some(y) = outputs.iter().find(|t| t.dtype().is_float()) else {
        return Vec::new();
    };
    let params: Vec<Tensor> = g
        .parameters()
        .iter()
        .filter_map(|&p| g.tensor(p))
        .filter(|p| p.dtype().is_float())
        .collect();
    let wrt: Vec<&Tensor> = params.iter().collect();
    y.sum_all()
        .and_then(|loss| loss.grad(&wrt))
        .unwrap_or_default()
}

/// Whether `g` is small enough to compile: no value or parameter larger than
/// [`COMPILE_ELEMENTS`] (see [`extent`]).
pub(super) fn compilable(g: &Graph) -> bool {
    let largest = g
        .nodes()
        .iter()
        .flat_map(|n| &n.outputs)
        .chain(g.parameter_types().iter())
        .map(extent)
        .max()
        .unwrap_or(0);
    largest <= COMPILE_ELEMENTS
}

/// Whether `g`'s inputs and outputs are small enough ([`RUN_ELEMENTS`]) to run and interpret.
pub(super) fn runnable(g: &Graph) -> bool {
    let small = |t: &TensorType| t.element_count() <= RUN_ELEMENTS;
    g.parameter_types().iter().all(small) && g.output_types().iter().all(small)
}

/// Inputs for `g`'s parameters (see [`host_values`]).
pub(super) fn inputs(g: &Graph) -> Vec<HostArray> {
    g.parameter_types()
        .iter()
        .enumerate()
        .map(|(i, t)| host_values(t, i))
        .collect()
}

/// Whether the device and the interpreter must agree on `g`: its builder found every op
/// `robust`, and no value is f16 or bf16.
pub(super) fn comparable(g: &Graph, robust: bool) -> bool {
    robust
        && g.nodes()
            .iter()
            .flat_map(|n| &n.outputs)
            .all(|t| !matches!(t.dtype, DType::F16 | DType::BF16))
}

/// The number of elements of `ty` with its zero dims counted as 1 (saturating). XLA's CPU
/// compiler takes time in proportion to it even for an empty value: an identity on
/// `f32[2^29, 1, 0]` compiles in about 90 s.
fn extent(ty: &TensorType) -> usize {
    ty.dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .unwrap_or(usize::MAX)
}

/// Small, exactly representable values for a parameter of type `ty` (the `i`-th).
fn host_values(ty: &TensorType, i: usize) -> HostArray {
    let n = ty.element_count();
    let v = |k: usize| ((k * 7 + i * 5) % 9) as f64 - 4.0;
    let bytes: Vec<u8> = (0..n)
        .flat_map(|k| -> Vec<u8> {
            let x = v(k);
            match ty.dtype {
                DType::Pred => vec![u8::from(x > 0.0)],
                DType::U8 => vec![(x + 4.0) as u8],
                DType::U32 => ((x + 4.0) as u32).to_le_bytes().to_vec(),
                DType::U64 => ((x + 4.0) as u64).to_le_bytes().to_vec(),
                DType::I8 => vec![x as i8 as u8],
                DType::I32 => (x as i32).to_le_bytes().to_vec(),
                DType::I64 => (x as i64).to_le_bytes().to_vec(),
                DType::F16 => half::f16::from_f64(x / 2.0).to_le_bytes().to_vec(),
                DType::BF16 => half::bf16::from_f64(x / 2.0).to_le_bytes().to_vec(),
                DType::F32 => ((x / 2.0) as f32).to_le_bytes().to_vec(),
                DType::F64 => (x / 2.0).to_le_bytes().to_vec(),
            }
        })
        .collect();
    match HostArray::from_bytes(ty, &bytes) {
        Ok(a) => a,
        Err(e) => panic!("host values for {ty}: {e}"),
    }
}

/// Panics unless the device's and the interpreter's outputs agree (types exactly, values to
/// 1e-3 relative and absolute; NaN equals NaN).
pub(super) fn compare_outputs(device: &[HostArray], host: &[HostArray], text: &str) {
    assert_eq!(device.len(), host.len(), "output counts differ:\n{text}");
    for (k, (d, h)) in device.iter().zip(host).enumerate() {
        assert_eq!(d.ty(), h.ty(), "output {k} types differ:\n{text}");
        for (j, (x, y)) in d.to_f64_vec().into_iter().zip(h.to_f64_vec()).enumerate() {
            let close = x == y
                || (x.is_nan() && y.is_nan())
                || (x - y).abs() <= 1e-3 * (1.0 + x.abs().max(y.abs()));
            assert!(
                close,
                "output {k} element {j}: device {x}, interpreter {y}\n{text}"
            );
        }
    }
}
