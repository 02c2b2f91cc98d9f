//! The graph DSL: a [`Graph`] of typed nodes built through [`Tensor`] methods that check shapes
//! and dtypes at once and return [`crate::Result`]; errors name the op, the operand types and the
//! caller's source line.
//!
//! The builders, by family: `elementwise` (creation, elementwise, conversions, composites,
//! operators), `reduce`, `shape`, `linalg` (dot_general, matmul, einsum), `mask` (tril, triu),
//! `gather` (take, one_hot), `conv`, `random`, `sort`, `control` (loops). They turn what the user
//! wrote (negative axes, broadcasting, options) into primitives.
//!
//! Each primitive's rule (which operands it accepts, what types it gives) is written once, in
//! `rules` (by family, as the interpreter and the lowering are split); the builders create
//! nodes through it and record its types on the node. `walk` is what every reader of a finished
//! graph starts with: the live nodes per region, after checking the graph's structure and every
//! live node against its rule, so that the lowering and the interpreter trust the recorded types.
//!
//! A new primitive takes: its [`Op`] variant (in `graph`) and its rule (in `rules`, with an arm
//! in its dispatch) plus the builder that makes it; its emitter in [`crate::lower`]; its
//! evaluation in [`crate::interp`]. Then tests: the rule's cases, a lowering compiled and run,
//! and the interpreter against a formula.

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
