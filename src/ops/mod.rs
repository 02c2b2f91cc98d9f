//! The graph DSL: a [`Graph`] of typed nodes built through [`Tensor`] methods that check shapes
//! and dtypes at once and return [`crate::Result`]; errors name the op, the operand types and the
//! caller's source line.
//!
//! Each op family keeps its shape rules beside its builders: `elementwise` (creation,
//! elementwise, conversions, composites, operators), `reduce`, `shape`, `linalg` (dot_general,
//! matmul, einsum), `mask` (tril, triu), `gather` (take, take_along_axis, one_hot), `conv`,
//! `random`, `sort`, `control` (while_loop, fori_loop, scan); and composites users reach for:
//! `nn` (softmax, layer_norm, rms_norm, erf, gelu_exact), `stats` (mean_all, var, std), `split`
//! (split, chunk).

mod control;
mod conv;
mod elementwise;
mod gather;
mod graph;
pub(crate) mod linalg;
mod mask;
mod nn;
mod random;
mod reduce;
mod regions;
mod shape;
mod sort;
mod split;
mod stats;
mod util;

pub use control::{Bound, Carry};
pub use elementwise::Operand;
pub use graph::{
    ArgKind, BinaryOp, Comparison, Graph, Node, Op, ReduceKind, Region, Tensor, UnaryOp, ValueId,
};
pub(crate) use regions::check_while;
#[cfg(test)]
pub(crate) use regions::malformed::cases as malformed_loops;
pub use stats::VarOptions;
