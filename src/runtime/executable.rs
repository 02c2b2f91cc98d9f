//! Compiling StableHLO text and executing the result.

use std::sync::Arc;

use super::api::pjrt_call;
use super::buffer::Buffer;
use super::client::Client;
use super::compile_options::CompileOptions;
use super::{ffi, signature};
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};

/// A compiled program, loaded on its client's devices. Cheap to clone.
///
/// `Executable` is `Send + Sync`: PJRT allows one loaded executable to be executed from several
/// threads at once.
#[derive(Clone)]
pub struct Executable {
    inner: Arc<ExecutableInner>,
}

struct ExecutableInner {
    client: Client,
    loaded: *mut ffi::PJRT_LoadedExecutable,
    inputs: Option<Vec<TensorType>>,
    outputs: Vec<TensorType>,
}

// SAFETY: `xla::PjRtLoadedExecutable` is thread-safe, including concurrent `Execute` calls.
unsafe impl Send for ExecutableInner {}
unsafe impl Sync for ExecutableInner {}

impl Drop for ExecutableInner {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.loaded;
        // An error while freeing cannot be acted on; it is converted (and so destroyed).
        let _ = pjrt_call!(self.client.api(), PJRT_LoadedExecutable_Destroy, &mut args);
    }
}

/// Owns a `PJRT_Executable` obtained from a loaded executable, destroying it when dropped.
struct ExecutableView<'a> {
    client: &'a Client,
    raw: *mut ffi::PJRT_Executable,
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Executable_Destroy_Args::new();
        args.executable = self.raw;
        let _ = pjrt_call!(self.client.api(), PJRT_Executable_Destroy, &mut args);
    }
}

impl Client {
    /// Compiles a StableHLO module given as MLIR text (program format `"mlir"`), with one replica
    /// and one partition.
    ///
    /// Text that does not parse or verify is an [`Error::Pjrt`] whose message carries the plugin's
    /// diagnostics; the client stays usable.
    pub fn compile(&self, mlir: &str) -> Result<Executable> {
        self.compile_with(mlir, &CompileOptions::default())
    }

    /// Compiles a StableHLO module with explicit [`CompileOptions`].
    pub fn compile_with(&self, mlir: &str, options: &CompileOptions) -> Result<Executable> {
        if options.num_replicas < 1 || options.num_partitions < 1 {
            return Err(Error::InvalidArgument(format!(
                "compile options need at least one replica and one partition, got {} and {}",
                options.num_replicas, options.num_partitions
            )));
        }
        let api = self.api();
        let format = "mlir";
        let program = ffi::PJRT_Program {
            struct_size: ffi::PJRT_Program::STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            // PJRT only reads the code on compile, despite the mutable pointer type.
            code: mlir.as_ptr() as *mut _,
            code_size: mlir.len(),
            format: format.as_ptr().cast(),
            format_size: format.len(),
        };
        let encoded = options.encode();
        let mut args = ffi::PJRT_Client_Compile_Args::new();
        args.client = self.inner.raw;
        args.program = &program;
        args.compile_options = encoded.as_ptr().cast();
        args.compile_options_size = encoded.len();
        pjrt_call!(api, PJRT_Client_Compile, &mut args)?;
        let mut inner = ExecutableInner {
            client: self.clone(),
            loaded: args.executable,
            inputs: signature::main_parameters(mlir),
            outputs: Vec::new(),
        };
        // From here on, dropping `inner` destroys the loaded executable.
        inner.outputs = output_types(self, inner.loaded)?;
        Ok(Executable {
            inner: Arc::new(inner),
        })
    }
}

fn output_types(
    client: &Client,
    loaded: *mut ffi::PJRT_LoadedExecutable,
) -> Result<Vec<TensorType>> {
    let api = client.api();
    let mut get = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
    get.loaded_executable = loaded;
    pjrt_call!(api, PJRT_LoadedExecutable_GetExecutable, &mut get)?;
    let view = ExecutableView {
        client,
        raw: get.executable,
    };

    let mut num = ffi::PJRT_Executable_NumOutputs_Args::new();
    num.executable = view.raw;
    pjrt_call!(api, PJRT_Executable_NumOutputs, &mut num)?;
    let n = num.num_outputs;

    let mut types = ffi::PJRT_Executable_OutputElementTypes_Args::new();
    types.executable = view.raw;
    pjrt_call!(api, PJRT_Executable_OutputElementTypes, &mut types)?;
    let mut dims = ffi::PJRT_Executable_OutputDimensions_Args::new();
    dims.executable = view.raw;
    pjrt_call!(api, PJRT_Executable_OutputDimensions, &mut dims)?;
    if types.num_output_types != n || dims.num_outputs != n {
        return Err(Error::InvalidArgument(format!(
            "the plugin reports {n} outputs but {} element types and {} shapes",
            types.num_output_types, dims.num_outputs
        )));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: each array is owned by the executable and holds `n` entries; `dims.dims` holds the
    // concatenation of all output shapes, `dim_sizes[i]` entries for output `i`.
    let (raw_types, dim_sizes) = unsafe {
        (
            std::slice::from_raw_parts(types.output_types, n),
            std::slice::from_raw_parts(dims.dim_sizes, n),
        )
    };
    let total: usize = dim_sizes.iter().sum();
    let all_dims: &[i64] = if total == 0 {
        &[]
    } else {
        // SAFETY: see above.
        unsafe { std::slice::from_raw_parts(dims.dims, total) }
    };
    let mut outputs = Vec::with_capacity(n);
    let mut at = 0;
    for (i, (&raw, &rank)) in raw_types.iter().zip(dim_sizes).enumerate() {
        let dtype = DType::from_pjrt(raw).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "output {i} has PJRT element type {raw}, which stablegraph does not support"
            ))
        })?;
        let shape = all_dims[at..at + rank]
            .iter()
            .map(|&d| d as usize)
            .collect();
        at += rank;
        outputs.push(TensorType { dtype, dims: shape });
    }
    Ok(outputs)
}

impl Executable {
    /// The client this program was compiled by.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The number of outputs.
    pub fn num_outputs(&self) -> usize {
        self.inner.outputs.len()
    }

    /// The element type and shape of each parameter, read from the `@main` signature of the
    /// compiled text; `None` when that signature uses forms the reader does not handle (dynamic
    /// dimensions, tuples, unsupported element types), in which case arguments go unchecked.
    pub fn input_types(&self) -> Option<&[TensorType]> {
        self.inner.inputs.as_deref()
    }

    /// The element type and shape of each output, as the compiled program declares them.
    pub fn output_types(&self) -> &[TensorType] {
        &self.inner.outputs
    }

    /// Checks `args` against the program's parameters and client.
    fn check_args(&self, args: &[&Buffer]) -> Result<()> {
        for (i, a) in args.iter().enumerate() {
            if !a.client().same_as(&self.inner.client) {
                return Err(Error::InvalidArgument(format!(
                    "argument {i} ({a:?}) belongs to another client than the executable"
                )));
            }
        }
        let Some(inputs) = &self.inner.inputs else {
            return Ok(());
        };
        if inputs.len() != args.len() {
            return Err(Error::InvalidArgument(format!(
                "the program takes {} arguments, got {}",
                inputs.len(),
                args.len()
            )));
        }
        for (i, (want, got)) in inputs.iter().zip(args).enumerate() {
            if want.dtype != got.dtype() || want.dims != got.dims() {
                return Err(Error::InvalidArgument(format!(
                    "argument {i} is {}{:?}, the program's parameter {i} is {}{:?}",
                    got.dtype(),
                    got.dims(),
                    want.dtype,
                    want.dims
                )));
            }
        }
        Ok(())
    }

    /// Runs the program on device 0 with `args` (which must belong to the same client and match
    /// the parameter types) and returns its outputs as device buffers, after the execution has
    /// finished. Arguments are not consumed: they can be passed again.
    pub fn execute(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        self.check_args(args)?;
        let client = &self.inner.client;
        let api = client.api();
        let arg_ptrs: Vec<*mut ffi::PJRT_Buffer> = args.iter().map(|a| a.raw()).collect();
        let arg_lists: [*const *mut ffi::PJRT_Buffer; 1] = [arg_ptrs.as_ptr()];
        let mut outputs: Vec<*mut ffi::PJRT_Buffer> =
            vec![std::ptr::null_mut(); self.inner.outputs.len()];
        let output_lists: [*mut *mut ffi::PJRT_Buffer; 1] = [outputs.as_mut_ptr()];
        let mut complete: [*mut ffi::PJRT_Event; 1] = [std::ptr::null_mut()];
        let mut options = ffi::PJRT_ExecuteOptions::new();
        let mut exec = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        exec.executable = self.inner.loaded;
        exec.options = &mut options;
        exec.argument_lists = arg_lists.as_ptr();
        exec.num_devices = 1;
        exec.num_args = arg_ptrs.len();
        exec.output_lists = output_lists.as_ptr();
        exec.device_complete_events = complete.as_mut_ptr();
        pjrt_call!(api, PJRT_LoadedExecutable_Execute, &mut exec)?;
        // Take ownership of every output before anything can fail, so each is destroyed once.
        let owned: Vec<Result<Buffer>> = outputs
            .iter()
            .map(|&raw| {
                if raw.is_null() {
                    Err(Error::InvalidArgument(
                        "the plugin returned fewer outputs than the program declares".into(),
                    ))
                } else {
                    Buffer::from_raw(client, raw)
                }
            })
            .collect();
        api.await_event(complete[0], "PJRT_LoadedExecutable_Execute")?;
        owned.into_iter().collect()
    }
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("outputs", &self.inner.outputs)
            .finish()
    }
}
