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
//! Tolerances: the table of `common::tol` (f32 `1e-5` relative + `1e-6` absolute, f64 `1e-12` +
//! `1e-14`, f16 `1e-3` + `1e-3`, bf16 `1e-2` + `1e-2`; integers and pred exact; shape ops
//! bit-exact). Accumulations (sums, products, dot products) add `rtol * terms * scale` to the
//! absolute tolerance (`acc_tol`), the usual bound for a sum of `terms` values of magnitude up to
//! `scale`. A NaN or infinity on either side must be matched by the same (NaN, or infinity of the
//! same sign) on the other.
//!
//! One binary, one file per family: [`elementwise`], [`nn`] (the layers), [`shape`],
//! [`reductions`], [`indexing`], [`linalg`], [`random`], [`loops`], [`cond`], [`assoc_scan`], [`conv`], [`losses`] (and the initializers), [`vmap`] and whole [`programs`].

#[path = "../common/mod.rs"]
mod common;

mod assoc_scan;
mod cond;
mod conv;
mod elementwise;
mod formulas;
mod indexing;
mod linalg;
mod loops;
mod losses;
mod nn;
mod programs;
mod random;
mod reductions;
mod shape;
mod vmap;
mod vmap_loops;

use common::*;
use formulas::*;
use half::{bf16, f16};
use stablegraph::ops::{CumsumOptions, Graph, SortOrder, Tensor, VarOptions};
use stablegraph::{DType, HostArray, Result, TensorType};

use DType::{Pred, BF16, F16, F32, F64, I32, I64, I8, U32, U64, U8};

const FLOATS: [DType; 4] = [F32, F64, F16, BF16];
const INTS: [DType; 6] = [U8, U32, U64, I8, I32, I64];
const NUMERIC: [DType; 10] = [U8, U32, U64, I8, I32, I64, F16, BF16, F32, F64];

type Unary = fn(&Tensor) -> Result<Tensor>;
type Binary = fn(&Tensor, &Tensor) -> Result<Tensor>;

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

/// Any dtype, uniformly.
fn any_dtype(rng: &mut Rng) -> DType {
    rng.pick(&DType::ALL)
}

/// Every bit pattern of `d` (true and false for pred).
fn bits_dist(d: DType) -> Dist {
    if d == Pred {
        Dist::Bool(0.5)
    } else {
        Dist::Bits
    }
}

/// A Threefry key.
fn key(a: u32, b: u32) -> HostArray {
    HostArray::from_vec(&[2], vec![a, b]).unwrap()
}

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
