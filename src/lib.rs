//! # stablegraph
//!
//! Compiler-first tensor graphs for Rust: build a graph, lower it to StableHLO, and let XLA compile
//! and run it through a PJRT plugin on CPU, GPU or TPU, from one source and with no hand-written
//! kernels.
//!
//! This crate currently provides the foundation: [`runtime`], a safe layer over the PJRT C API
//! that loads any PJRT plugin, compiles StableHLO text, and moves typed data (including
//! [`ndarray`] arrays) between the host and devices. The XLA CPU plugin is found or installed
//! into a per-user cache automatically (see [`runtime::install`]).
//!
//! ```no_run
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

pub mod array;
pub mod dtype;
pub mod error;
pub mod ops;
pub mod runtime;

pub use array::HostArray;
pub use dtype::{DType, Element, TensorType};
pub use error::{Error, ErrorCode, Result};
