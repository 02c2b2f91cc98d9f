//! The PJRT runtime: plugins, clients, compiled executables and device buffers.
//!
//! This layer knows nothing of graphs: it takes StableHLO text and buffers. It talks to a PJRT
//! plugin through the PJRT C API, declared by hand in `ffi` and loaded with `libloading`.
//!
//! XLA's own log lines on stderr are limited to errors unless `STABLEGRAPH_LOG` (or
//! [`set_xla_log_level`], or `TF_CPP_MIN_LOG_LEVEL`) asks for more; see [`XlaLogLevel`].
//!
//! Thread safety: [`Plugin`], [`Client`], [`Executable`] and [`Buffer`] are `Send + Sync`, because
//! the PJRT objects behind them are thread-safe: one client may compile and transfer from many
//! threads, one executable may run from many threads at once, and a buffer may be read or passed
//! to executions from any thread.

mod api;
mod buffer;
mod cache;
mod client;
mod compile_options;
pub mod cuda;
mod executable;
#[cfg(test)]
mod fake;
mod ffi;
mod heap;
mod hlo;
pub mod install;
mod logging;
mod options;
mod plugin;
mod proto;
mod sharded;
pub(crate) mod signature;
pub(crate) use heap::trim_host_heap;

pub use buffer::Buffer;
pub use cache::{CacheStats, CompileCache};
pub use client::{Client, Device};
pub use compile_options::CompileOptions;
pub use cuda::CudaPlugin;
pub use executable::{Executable, ExecuteOptions, MemoryStats};
pub use hlo::Collective;
pub use install::{resolve_cpu_plugin, PluginResolver, PluginSource, PluginWheel};
pub use logging::{set_xla_log_level, XlaLogLevel};
pub use options::{ClientOptions, GpuAllocator};
pub use plugin::{Plugin, Value};
pub use sharded::ShardedBuffer;

/// The typed PJRT function table, exported only so that a doc test can show that calling a slot
/// with another slot's arguments does not compile. Not a stable API; everything in it is unsafe
/// to call.
#[doc(hidden)]
pub mod pjrt {
    pub use super::api::Api;
    pub use super::ffi::{fns, Function, PJRT_Client_Destroy_Args};
}
