//! The crate's error type. Every fallible public function returns [`Result`]; nothing panics on
//! user input.

use std::fmt;
use std::path::PathBuf;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in stablegraph, each variant naming what was wrong and where.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No file exists at the plugin path.
    #[error("no PJRT plugin at {path}: the file does not exist")]
    PluginNotFound {
        /// The path that was tried.
        path: PathBuf,
    },
    /// The file exists but the dynamic loader refused it (not a shared library, wrong architecture,
    /// missing dependencies).
    #[error("cannot load {path} as a shared library: {message}")]
    PluginLoad {
        /// The path that was tried.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The shared library loaded but does not export `GetPjrtApi`.
    #[error("{path} is a shared library but not a PJRT plugin: it does not export `GetPjrtApi`")]
    NotAPlugin {
        /// The path that was tried.
        path: PathBuf,
    },
    /// The plugin exports `GetPjrtApi` but what it returned cannot be used.
    #[error("PJRT plugin {path} is unusable: {message}")]
    PluginInvalid {
        /// The plugin's path.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The plugin's function table is too short to hold the function we need.
    #[error(
        "the PJRT plugin (API {api_version}) does not provide {function}: its function table ends \
         at byte {table_size}, the function's slot ends at byte {slot_end}"
    )]
    Unsupported {
        /// The PJRT C API function.
        function: &'static str,
        /// The plugin's `major.minor` API version.
        api_version: String,
        /// The plugin's `PJRT_Api.struct_size`.
        table_size: usize,
        /// Where the function's slot ends in our declaration of the table.
        slot_end: usize,
    },
    /// A PJRT call returned an error.
    #[error("{call} failed ({code}): {message}")]
    Pjrt {
        /// The PJRT C API function that failed.
        call: &'static str,
        /// The plugin's error code.
        code: ErrorCode,
        /// The plugin's message (for a compile, the MLIR parser's or compiler's diagnostics).
        message: String,
    },
    /// The CPU plugin could not be found or installed into the plugin cache.
    #[error("cannot provide the XLA CPU PJRT plugin: {0}")]
    PluginInstall(String),
    /// No plugin of the kind asked for (`cuda`) is installed where it was looked for, or the
    /// Python that says where to look could not be asked. The message is one line that names
    /// what to install or set.
    #[error("{0}")]
    PluginSearch(String),
    /// A graph builder rejected its operands (wrong shapes or dtypes, operands of another graph).
    #[error("{op}: {message} (at {location})")]
    Graph {
        /// The op being built.
        op: &'static str,
        /// What was wrong, with the operand types.
        message: String,
        /// The caller's `file:line:column`.
        location: String,
    },
    /// The interpreter cannot evaluate a graph (missing inputs, wrong input types).
    #[error("interpreter: {0}")]
    Interp(String),
    /// An argument given to a stablegraph function is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A checkpoint (its config or its tensors) cannot be read as the model it claims to be.
    #[error("bad checkpoint: {0}")]
    Checkpoint(String),
    /// A file system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// What kind of failure an [`Error`] is, for a service to answer without reading messages:
/// the caller's input (a 4xx), a checkpoint that does not fit (the operator's), or the runtime
/// (a 5xx: the plugin, the device, the file system).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input: arguments, shapes, settings, prompts.
    Input,
    /// A checkpoint whose config or tensors do not fit.
    Checkpoint,
    /// The plugin, the device, the compiler or the file system failed.
    Runtime,
}

impl Error {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Graph { .. } | Error::Interp(_) | Error::InvalidArgument(_) => ErrorKind::Input,
            Error::Checkpoint(_) => ErrorKind::Checkpoint,
            _ => ErrorKind::Runtime,
        }
    }

    /// This error as one of reading the checkpoint in `dir`: an input error (a config or
    /// tensor that does not fit, a missing file) becomes [`Error::Checkpoint`], naming the
    /// directory unless the message does; others are kept.
    pub(crate) fn in_checkpoint(self, dir: &std::path::Path) -> Error {
        let shown = dir.display().to_string();
        let name = |m: String| match m.contains(&shown) {
            true => m,
            false => format!("{shown}: {m}"),
        };
        match self {
            Error::InvalidArgument(m) => Error::Checkpoint(name(m)),
            Error::Io { context, source } => {
                Error::Checkpoint(name(format!("{context}: {source}")))
            }
            other => other,
        }
    }

    /// An [`Error::Io`] with `context` describing the operation and its path.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// The status codes a PJRT error carries (the `absl::StatusCode` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The operation was cancelled.
    Cancelled,
    /// Unknown error.
    Unknown,
    /// The caller passed an invalid argument (for example MLIR that does not parse).
    InvalidArgument,
    /// A deadline expired.
    DeadlineExceeded,
    /// Something was not found.
    NotFound,
    /// Something already exists.
    AlreadyExists,
    /// Permission denied.
    PermissionDenied,
    /// Out of memory or another resource.
    ResourceExhausted,
    /// The system is not in a state required for the operation.
    FailedPrecondition,
    /// The operation was aborted.
    Aborted,
    /// Out of range.
    OutOfRange,
    /// Not implemented by this plugin.
    Unimplemented,
    /// Internal error in the plugin.
    Internal,
    /// The service is unavailable.
    Unavailable,
    /// Unrecoverable data loss.
    DataLoss,
    /// Not authenticated.
    Unauthenticated,
    /// A code outside the known range.
    Other(i32),
}

impl ErrorCode {
    /// Maps the C enum value.
    pub(crate) fn from_raw(code: i32) -> Self {
        use ErrorCode::*;
        match code {
            1 => Cancelled,
            2 => Unknown,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            other => Other(other),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::Other(code) => write!(f, "code {code}"),
            named => write!(f, "{named:?}"),
        }
    }
}
