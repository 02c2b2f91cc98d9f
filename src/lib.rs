//! # stablegraph
//!
//! Compiler-first tensor graphs for Rust: build a graph, lower it to StableHLO, and let XLA compile
//! and run it through a PJRT plugin on CPU, GPU or TPU, from one source and with no hand-written
//! kernels.
//!
//! The layers, each usable alone:
//!
//! - [`ops`]: the graph DSL. A [`ops::Graph`] of typed nodes built through [`ops::Tensor`]
//!   methods that check shapes and dtypes at once; errors name the op, the operand types and the
//!   caller's line.
//! - [`lower`]: a graph as StableHLO text (no plugin needed).
//! - [`interp`]: an ndarray reference evaluator of the same graphs.
//! - [`runtime`]: a safe layer over the PJRT C API: plugins, clients, compiled executables and
//!   device buffers. The XLA CPU plugin is found or installed into a per-user cache automatically
//!   (see [`runtime::install`]).
//!
//! - [`sampling`]: choosing tokens from logits on the device (greedy; temperature, top-k and
//!   top-p as runtime inputs), for any model.
//! - [`serving`]: continuous batching over a fixed set of slots ([`serving::Scheduler`]):
//!   requests join and leave a batch that decodes in compiled segments, with no recompiles.
//! - [`models::mamba2`]: Mamba-2 inference from the graph DSL alone: chunked SSD prefill, the
//!   O(1) recurrent step, and whole-sequence generation as one compiled program; and its
//!   training step (loss, gradients and an optimizer update) as one compiled program.
//! - [`optim`]: optimizers as graphs (AdamW with global-norm clipping), so that a training
//!   step's update runs in the same program as its gradients.
//! - [`init`]: parameter initializers with PyTorch's formulas (normal, uniform, Xavier,
//!   Kaiming, the layers' defaults), seeded, on the host.
//!
//! [`ops::Graph::compile`] joins them: lower, compile, run on host arrays or device buffers.
//!
//! **Errors, not panics.** Every public function returns an [`Error`] on bad input (a wrong
//! rank, shape or dtype, a zero or overflowing size, a config or checkpoint that does not fit),
//! and the message names the argument, field or tensor that was wrong and the function that
//! refused it. A panic through a public function is a bug; please report it.
//!
//! ```
//! use stablegraph::ops::{Graph, Tensor};
//! use stablegraph::runtime::Client;
//! use stablegraph::{DType, HostArray};
//!
//! # fn main() -> stablegraph::Result<()> {
//! let g = Graph::new();
//! let q = g.parameter("q", DType::F32, &[4, 8])?;
//! let k = g.parameter("k", DType::F32, &[4, 8])?;
//! // Causal attention weights: softmax over the last axis of (q k^T) masked to the lower triangle.
//! let scores = Tensor::einsum("id,jd->ij", &[&q, &k])?;
//! let masked = scores.masked_fill(&g.triu_mask(4, 4, 1)?, f64::NEG_INFINITY)?;
//! let probs = masked.softmax(-1)?;
//! g.set_outputs(&[&probs])?;
//!
//! let text = g.to_stablehlo()?; // what XLA sees
//! assert!(text.contains("stablehlo.dot_general"));
//! let program = g.compile(&Client::cpu()?)?;
//! let data: Vec<f32> = (0..32).map(|i| i as f32 / 32.0).collect();
//! let inputs = [
//!     HostArray::from_vec(&[4, 8], data.clone())?,
//!     HostArray::from_vec(&[4, 8], data)?,
//! ];
//! let on_device = program.run(&inputs)?;
//! let reference = g.evaluate(&inputs)?; // the ndarray interpreter
//! for (d, r) in on_device[0].to_f64_vec().iter().zip(reference[0].to_f64_vec()) {
//!     assert!((d - r).abs() < 1e-5);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The runtime alone runs StableHLO text written by hand:
//!
//! ```
//! use stablegraph::runtime::Client;
//!
//! # fn main() -> stablegraph::Result<()> {
//! let client = Client::cpu()?;
//! let exe = client.compile(
//!     "func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
//!        %0 = stablehlo.add %a, %b : tensor<3xf32>
//!        return %0 : tensor<3xf32>
//!      }",
//! )?;
//! let a = client.buffer_from_slice(&[1.0f32, 2.0, 3.0], &[3])?;
//! let b = client.buffer_from_slice(&[10.0f32, 20.0, 30.0], &[3])?;
//! let out = exe.execute(&[&a, &b])?;
//! assert_eq!(out[0].to_vec::<f32>()?, vec![11.0, 22.0, 33.0]);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

// The `Tree` derive names this crate `::stablegraph`, also inside it.
extern crate self as stablegraph;

pub mod array;
mod compiled;
pub mod dtype;
pub mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod init;
pub mod interp;
pub mod jit;
pub mod lower;
pub mod models;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod rng;
pub mod runtime;
pub mod sampling;
pub mod serving;
pub mod sharding;
pub mod target;
pub mod transforms;
pub mod tree;

/// The README's and `docs/`'s Rust examples, compiled and run as doctests (`cargo test --doc`),
/// so that the pages stay true to the API.
#[cfg(doctest)]
mod doc_pages {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/graphs.md")]
    struct Graphs;
    #[doc = include_str!("../docs/mamba2.md")]
    struct Mamba2;
    #[doc = include_str!("../docs/mamba1.md")]
    struct Mamba1;
    #[doc = include_str!("../docs/hybrid.md")]
    struct Hybrid;
    #[doc = include_str!("../docs/transformers.md")]
    struct Transformers;
    #[doc = include_str!("../docs/training.md")]
    struct Training;
    #[doc = include_str!("../docs/devices.md")]
    struct Devices;
    #[doc = include_str!("../docs/runtime.md")]
    struct Runtime;
}

pub use array::HostArray;
pub use compiled::CompiledGraph;
pub use dtype::{DType, Element, TensorType};
pub use error::{Error, ErrorCode, ErrorKind, Result};
pub use sharding::{Mesh, PartitionSpec, Sharding};
pub use target::{Platform, Target};
