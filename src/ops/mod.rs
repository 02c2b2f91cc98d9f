//! The graph DSL: a [`Graph`] of typed nodes built through [`Tensor`] methods that check shapes
//! and dtypes at once and return [`crate::Result`]; errors name the op, the operand types and the
//! caller's source line.
//!
//! Each op family keeps its shape rules beside its builders: `elementwise` (creation,
//! elementwise, conversions, composites, operators), `reduce`, `shape`, `linalg` (dot_general,
//! matmul, einsum), `mask` (tril, triu), `gather` (take, one_hot), `conv`, `random`, `sort`.

mod control;
mod conv;
mod elementwise;
mod gather;
mod graph;
pub(crate) mod linalg;
mod mask;
mod random;
mod reduce;
mod regions;
mod rules;
mod shape;
mod sort;
mod util;
mod walk;

pub use control::{Bound, Carry};
pub use elementwise::Operand;
pub use graph::{
    ArgKind, BinaryOp, Comparison, Graph, Node, Op, ReduceKind, Region, Tensor, UnaryOp, ValueId,
};
#[cfg(test)]
pub(crate) use regions::malformed::cases as malformed_loops;
pub(crate) use walk::live_nodes;
