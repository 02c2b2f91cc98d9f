//! The graph DSL: a [`Graph`] of typed nodes built through [`Tensor`] methods that check shapes
//! and dtypes at once and return [`crate::Result`]; errors name the op, the operand types and the
//! caller's source line.
//!
//! Each op family keeps its shape rules beside its builders: `elementwise` (creation, elementwise,
//! conversions, composites), `operators` (`+ - * / %` for every operand form), `reduce`, `shape`,
//! `linalg` (dot_general, matmul, einsum), `mask` (tril, triu), `gather` (take, take_along_axis,
//! one_hot), `conv` (causal_conv1d), `conv_general` (conv_general_dilated, conv2d, max_pool,
//! avg_pool), `random`, `sort`, `control` (while_loop, fori_loop, scan), `cond` (cond, switch),
//! `assoc_scan` (associative_scan), `vmap`, `sharding` (meshes and layouts), `collectives`
//! (shard_map and the collectives inside it); and composites users reach for: `nn` (softmax,
//! layer_norm, rms_norm, erf, gelu_exact), `losses` (cross_entropy, nll_loss, mse_loss,
//! binary_cross_entropy_with_logits, dropout), `stats` (mean_all, var, std), `split` (split,
//! chunk).
//!
//! Conventions, so that a call site reads as what it does:
//!
//! - Names are NumPy's and JAX's (`sum`, `astype`, `flip`, `matrix_transpose`, `select` for
//!   `jnp.where`). A few names users of other libraries look for are aliases documented as such
//!   ([`Tensor::where_`], [`Tensor::t`], [`Tensor::convert`]); [`Tensor::masked_fill`] and
//!   [`Tensor::narrow`] keep torch's names for what NumPy has no name for.
//! - No positional booleans: a reduction drops its axes and its `*_keepdims` twin keeps them;
//!   [`Tensor::argmax_as`] names the index dtype, [`CumsumOptions`] the kind of running sum,
//!   [`SortOrder`] the order.
//! - Sizes are `usize`; what may be negative is `isize`: axes (counted from the end),
//!   [`Tensor::reshape`]'s `-1`, [`Tensor::slice`] bounds, [`Tensor::pad`] amounts and diagonal
//!   offsets.
//! - Numbers stand for tensors wherever an [`Operand`] is taken, and take the other operand's
//!   dtype.
//!
//! The primitive set is [`Op`] (in `op`), the IR readers see ([`Node`], [`Region`],
//! [`ValueId`]) is `ir`, the graph under construction is `graph` and the [`Tensor`] handle is
//! `tensor`. Each primitive's type rule (which operands it accepts, what types it gives), its
//! VJP rule (its operands' cotangents) and its batching rule (its results under `vmap`) are
//! written once, side by side, in `rules` (by family, as the interpreter and the lowering are
//! split); the builders create nodes through the type rule and record its types on the node,
//! `autodiff` asks the VJP rule and `vmap` the batching rule. `walk` is what every reader of a
//! finished graph starts with: the live nodes per region, after checking the graph's structure
//! and every live node against its rule, so that the lowering and the interpreter trust the
//! recorded types.
//!
//! A new primitive takes: its [`Op`] variant and its `Op::name` arm (in `op`); its type rule,
//! VJP rule and batching rule (in `rules/<family>.rs`, each with an arm in `rules/mod.rs`); the
//! builder that makes it; its emitter and dispatch arm in [`crate::lower`]; its evaluation and
//! dispatch arm in [`crate::interp`]. ARCHITECTURE.md lists each place, with tests.

mod assoc_scan;
mod autodiff;
mod collectives;
mod cond;
mod control;
mod conv;
mod conv_general;
mod elementwise;
mod gather;
mod graph;
mod ir;
pub(crate) mod linalg;
mod losses;
mod mask;
mod nn;
mod op;
mod operators;
pub(crate) mod random;
mod reduce;
mod regions;
mod rules;
mod shape;
mod sharding;
mod sort;
mod split;
mod stats;
mod tensor;
mod util;
mod vmap;
mod walk;

pub use cond::Branch;
pub use control::{Bound, Carry};
pub use conv_general::{ConvDimensionNumbers, ConvOptions, Padding};
pub use elementwise::{Number, Operand};
pub use graph::Graph;
pub use ir::{Node, Region, ValueId};
pub use op::{ArgKind, BinaryOp, Comparison, ConvWindow, Op, Precision, ReduceKind, UnaryOp};
pub use reduce::CumsumOptions;
#[cfg(test)]
pub(crate) use regions::malformed::cases as malformed_loops;
pub(crate) use rules::batching::{batch_broadcast, move_axis};
pub use sharding::GraphShardings;
pub use sort::SortOrder;
pub use stats::VarOptions;
pub use tensor::Tensor;
pub(crate) use walk::live_nodes;
