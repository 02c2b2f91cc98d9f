//! Compiling StableHLO text and executing the result.

use std::sync::Arc;

use super::api::pjrt_call;
use super::buffer::Buffer;
use super::cache;
use super::client::{Client, ClientHandle};
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
    /// The loaded program, shared with the client's compile cache.
    program: Arc<LoadedProgram>,
    /// The client devices (indices into [`Client::devices`]) the program runs on, one per
    /// partition (replica-major), in the order of its argument lists.
    devices: Vec<usize>,
}

/// A loaded PJRT executable and its parameter and output types: what the compile cache keeps and
/// every [`Executable`] made from it shares. It holds the [`ClientHandle`] (not a [`Client`],
/// whose cache holds programs: that would be a cycle), and its `Drop` destroys the executable
/// before that field is dropped, so the client always outlives it.
pub(crate) struct LoadedProgram {
    client: Arc<ClientHandle>,
    raw: *mut ffi::PJRT_LoadedExecutable,
    inputs: signature::Inputs,
    outputs: Vec<TensorType>,
}

// SAFETY: `xla::PjRtLoadedExecutable` is thread-safe, including concurrent `Execute` calls.
unsafe impl Send for LoadedProgram {}
// SAFETY: as above; the Rust side is immutable after construction.
unsafe impl Sync for LoadedProgram {}

impl Drop for LoadedProgram {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: a live executable of the live client `self.client` (dropped only after this
        // body), destroyed once, here. An error while freeing cannot be acted on; it is
        // converted (and so destroyed).
        let _ = unsafe { pjrt_call!(self.client.api(), PJRT_LoadedExecutable_Destroy, &mut args) };
    }
}

impl LoadedProgram {
    /// Takes ownership of `raw`, a loaded executable of `client` made from the module `mlir`, and
    /// reads its types: the parameters from the text, the outputs from the plugin.
    pub(crate) fn new(
        client: &Client,
        raw: *mut ffi::PJRT_LoadedExecutable,
        mlir: &str,
    ) -> Result<Arc<LoadedProgram>> {
        if raw.is_null() {
            return Err(Error::InvalidArgument(
                "the plugin reported success but returned no executable".into(),
            ));
        }
        let mut program = LoadedProgram {
            client: client.inner.handle.clone(),
            raw,
            inputs: signature::main_parameters(mlir),
            outputs: Vec::new(),
        };
        // From here on, dropping `program` destroys the loaded executable.
        program.outputs = output_types(client, raw)?;
        Ok(Arc::new(program))
    }

    /// The executable in the plugin's serialized form (`PJRT_Executable_Serialize`).
    pub(crate) fn serialize(&self, client: &Client) -> Result<Vec<u8>> {
        let api = client.api();
        let mut get = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        get.loaded_executable = self.raw;
        let view = ExecutableView::new(client, &mut get)?;
        let mut args = ffi::PJRT_Executable_Serialize_Args::new();
        args.executable = view.raw;
        // SAFETY: a live executable view.
        unsafe { pjrt_call!(api, PJRT_Executable_Serialize, &mut args) }?;
        let bytes = if args.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: valid for `serialized_bytes_size` bytes until the deleter runs, below.
            unsafe {
                std::slice::from_raw_parts(
                    args.serialized_bytes.cast::<u8>(),
                    args.serialized_bytes_size,
                )
            }
            .to_vec()
        };
        if let (Some(deleter), false) = (
            args.serialized_executable_deleter,
            args.serialized_executable.is_null(),
        ) {
            // SAFETY: frees the plugin's copy exactly once, after we copied it.
            unsafe { deleter(args.serialized_executable) };
        }
        if bytes.is_empty() {
            return Err(Error::InvalidArgument(
                "PJRT_Executable_Serialize returned no bytes".into(),
            ));
        }
        Ok(bytes)
    }
}

/// Owns a `PJRT_Executable` obtained from a loaded executable, destroying it when dropped; the
/// borrow keeps its client alive meanwhile.
struct ExecutableView<'a> {
    client: &'a Client,
    raw: *mut ffi::PJRT_Executable,
}

impl<'a> ExecutableView<'a> {
    /// Calls `PJRT_LoadedExecutable_GetExecutable` with `get` (whose loaded executable must be a
    /// live one of `client`) and owns the result.
    fn new(
        client: &'a Client,
        get: &mut ffi::PJRT_LoadedExecutable_GetExecutable_Args,
    ) -> Result<ExecutableView<'a>> {
        // SAFETY: the caller passes a live loaded executable of `client`.
        unsafe { pjrt_call!(client.api(), PJRT_LoadedExecutable_GetExecutable, get) }?;
        if get.executable.is_null() {
            return Err(Error::InvalidArgument(
                "PJRT_LoadedExecutable_GetExecutable returned no executable".into(),
            ));
        }
        Ok(ExecutableView {
            client,
            raw: get.executable,
        })
    }
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Executable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: a live view, destroyed once, here, while the borrowed client lives.
        let _ = unsafe { pjrt_call!(self.client.api(), PJRT_Executable_Destroy, &mut args) };
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
        let devices = self.program_devices(options)?;
        let encoded = options.encode();
        let program = cache::compile_cached(self, mlir, &encoded, || {
            self.compile_uncached(mlir, &encoded)
        })?;
        Ok(Executable {
            inner: Arc::new(ExecutableInner {
                client: self.clone(),
                program,
                devices,
            }),
        })
    }

    /// The devices a program compiled with `options` runs on, in the order of its argument
    /// lists: the device assignment's (replica-major, as PJRT orders them), else devices
    /// `0..replicas * partitions` (the plugin's default assignment), else the one device.
    fn program_devices(&self, options: &CompileOptions) -> Result<Vec<usize>> {
        let count = options
            .num_replicas
            .checked_mul(options.num_partitions)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= self.device_count())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "compile options ask for {} replicas times {} partitions, but the client has \
                     {} addressable devices",
                    options.num_replicas,
                    options.num_partitions,
                    self.device_count()
                ))
            })?;
        let Some(assignment) = &options.device_assignment else {
            if count == 1 {
                let ordinal = options.device_ordinal.unwrap_or(0);
                return Ok(vec![usize::try_from(ordinal).unwrap_or(0)]);
            }
            return Ok((0..count).collect());
        };
        let ids = self
            .devices()
            .iter()
            .map(|d| d.id().map(i64::from))
            .collect::<Result<Vec<i64>>>()?;
        let replicas = options.num_replicas as usize;
        let partitions = options.num_partitions as usize;
        if assignment.len() != partitions || assignment.iter().any(|c| c.len() != replicas) {
            return Err(Error::InvalidArgument(format!(
                "the device assignment {assignment:?} is not {partitions} partitions of \
                 {replicas} replicas each"
            )));
        }
        let mut devices = Vec::with_capacity(count);
        for r in 0..replicas {
            for computation in assignment {
                let id = computation[r];
                let index = ids.iter().position(|&i| i == id).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "the device assignment names device id {id}, which is not an \
                         addressable device of the client (ids {ids:?})"
                    ))
                })?;
                if devices.contains(&index) {
                    return Err(Error::InvalidArgument(format!(
                        "the device assignment {assignment:?} names device id {id} twice"
                    )));
                }
                devices.push(index);
            }
        }
        Ok(devices)
    }

    /// Compiles with the plugin, bypassing the compile cache; `encoded` is the serialized
    /// `CompileOptionsProto`.
    fn compile_uncached(&self, mlir: &str, encoded: &[u8]) -> Result<Arc<LoadedProgram>> {
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
        let mut args = ffi::PJRT_Client_Compile_Args::new();
        args.client = self.raw();
        args.program = &program;
        args.compile_options = encoded.as_ptr().cast();
        args.compile_options_size = encoded.len();
        // SAFETY: a live client; the program's code and format and the options point into
        // `mlir`, `format` and `encoded`, which outlive the call and are only read.
        unsafe { pjrt_call!(api, PJRT_Client_Compile, &mut args) }?;
        LoadedProgram::new(self, args.executable, mlir)
    }
}

fn output_types(
    client: &Client,
    loaded: *mut ffi::PJRT_LoadedExecutable,
) -> Result<Vec<TensorType>> {
    let api = client.api();
    let mut get = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
    get.loaded_executable = loaded;
    let view = ExecutableView::new(client, &mut get)?;

    let mut num = ffi::PJRT_Executable_NumOutputs_Args::new();
    num.executable = view.raw;
    // SAFETY: a live executable view.
    unsafe { pjrt_call!(api, PJRT_Executable_NumOutputs, &mut num) }?;
    let n = num.num_outputs;

    let mut types = ffi::PJRT_Executable_OutputElementTypes_Args::new();
    types.executable = view.raw;
    // SAFETY: a live executable view.
    unsafe { pjrt_call!(api, PJRT_Executable_OutputElementTypes, &mut types) }?;
    let mut dims = ffi::PJRT_Executable_OutputDimensions_Args::new();
    dims.executable = view.raw;
    // SAFETY: a live executable view.
    unsafe { pjrt_call!(api, PJRT_Executable_OutputDimensions, &mut dims) }?;
    if types.num_output_types != n || dims.num_outputs != n {
        return Err(Error::InvalidArgument(format!(
            "the plugin reports {n} outputs but {} element types and {} shapes",
            types.num_output_types, dims.num_outputs
        )));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    if types.output_types.is_null() || dims.dim_sizes.is_null() {
        return Err(Error::InvalidArgument(format!(
            "the plugin reports {n} outputs but returned no list of their element types or ranks"
        )));
    }
    // SAFETY: non-null (checked), owned by the view, which lives to the end of this function,
    // each holding `n` entries.
    let (raw_types, dim_sizes) = unsafe {
        (
            std::slice::from_raw_parts(types.output_types, n),
            std::slice::from_raw_parts(dims.dim_sizes, n),
        )
    };
    let total = dim_sizes
        .iter()
        .try_fold(0usize, |t, &r| t.checked_add(r))
        .ok_or_else(|| {
            Error::InvalidArgument(format!("the plugin reports output ranks {dim_sizes:?}"))
        })?;
    let all_dims: &[i64] = if total == 0 {
        &[]
    } else if dims.dims.is_null() {
        return Err(Error::InvalidArgument(format!(
            "the plugin reports {total} output dimensions but returned no list of them"
        )));
    } else {
        // SAFETY: non-null (checked), owned by the view, holding the concatenation of every
        // output's shape: `dim_sizes[i]` entries for output `i`, `total` in all.
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
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<Vec<usize>, _>>()
            .map_err(|_| {
                Error::InvalidArgument(format!(
                    "output {i} has dimensions {:?}; dynamic dimensions are not supported",
                    &all_dims[at..at + rank]
                ))
            })?;
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
        self.inner.program.outputs.len()
    }

    /// The element type and shape of each parameter, read from the `@main` signature of the
    /// compiled text; `None` when that signature uses forms the reader does not handle (dynamic
    /// dimensions, tuples, unsupported element types), in which case arguments go unchecked.
    pub fn input_types(&self) -> Option<&[TensorType]> {
        self.inner.program.inputs.types.as_deref()
    }

    /// The element type and shape of each output, as the compiled program declares them.
    pub fn output_types(&self) -> &[TensorType] {
        &self.inner.program.outputs
    }

    /// What the runtime read from `@main`'s parameters (types and donation).
    fn signature(&self) -> &signature::Inputs {
        &self.inner.program.inputs
    }

    /// The donated parameters, ascending: those marked `tf.aliasing_output = N : i32` or
    /// `jax.buffer_donor = true` in the `@main` signature. An execution takes over the argument
    /// buffers in these positions (see [`Executable::execute`]).
    pub fn donated_inputs(&self) -> &[usize] {
        &self.signature().donated
    }

    /// The output that donated parameter `input` is aliased to (`tf.aliasing_output = N`): the
    /// program writes that output into the argument's memory. `None` for parameters that are not
    /// aliased (a `jax.buffer_donor` leaves the choice to the compiler).
    pub fn aliased_output(&self, input: usize) -> Option<usize> {
        self.signature()
            .aliases
            .iter()
            .find(|&&(i, _)| i == input)
            .map(|&(_, output)| output)
    }

    /// The client devices (indices into [`Client::devices`]) the program runs on, in the order
    /// of [`Executable::execute_partitioned`]'s argument lists: one for a program compiled
    /// for one device, one per partition for an SPMD program.
    pub fn devices(&self) -> &[usize] {
        &self.inner.devices
    }

    /// Checks `args` (one list per device) against the program's devices, parameters and
    /// client, and that none was donated before; with `donate`, also that no buffer in a
    /// donated position is passed twice.
    fn check_args(&self, args: &[Vec<&Buffer>], donate: bool) -> Result<()> {
        let devices = &self.inner.devices;
        if args.len() != devices.len() {
            return Err(Error::InvalidArgument(format!(
                "the program runs on {} devices, got {} argument lists",
                devices.len(),
                args.len()
            )));
        }
        let count = args.first().map_or(0, Vec::len);
        for (list, &device) in args.iter().zip(devices) {
            if list.len() != count {
                return Err(Error::InvalidArgument(format!(
                    "argument lists of different lengths: {count} for the first device, {} for \
                     device {device}",
                    list.len()
                )));
            }
            for (i, a) in list.iter().enumerate() {
                if !a.client().same_as(&self.inner.client) {
                    return Err(Error::InvalidArgument(format!(
                        "argument {i} ({a:?}) belongs to another client than the executable"
                    )));
                }
                if let Err(Error::InvalidArgument(message)) = a.check_usable() {
                    return Err(Error::InvalidArgument(format!("argument {i}: {message}")));
                }
                // PJRT checks a one-device program's placement itself (and reports it as a
                // failed execution); a partitioned program's lists are checked here.
                if devices.len() > 1 && a.device() != device {
                    return Err(Error::InvalidArgument(format!(
                        "argument {i} ({a:?}) is on device {}, but the program runs that \
                         argument list on device {device}",
                        a.device()
                    )));
                }
            }
        }
        if donate {
            for (li, list) in args.iter().enumerate() {
                for &d in self.donated_inputs() {
                    let Some(donated) = list.get(d) else {
                        continue;
                    };
                    let again = args.iter().enumerate().find_map(|(lk, other)| {
                        other
                            .iter()
                            .enumerate()
                            .find(|&(j, a)| (lk, j) != (li, d) && a.raw() == donated.raw())
                            .map(|(j, _)| j)
                    });
                    if let Some(j) = again {
                        return Err(Error::InvalidArgument(format!(
                            "argument {d} ({donated:?}) is donated and the same buffer is also \
                             argument {j}: an execution cannot consume a buffer it also reads; \
                             pass a copy, or execute with `ExecuteOptions {{ donate: false }}`"
                        )));
                    }
                }
            }
        }
        // The text's parameter types are global; only a one-device program's are the buffers'.
        let (Some(inputs), [list]) = (&self.inner.program.inputs.types, args) else {
            return Ok(());
        };
        if inputs.len() != list.len() {
            return Err(Error::InvalidArgument(format!(
                "the program takes {} arguments, got {}",
                inputs.len(),
                list.len()
            )));
        }
        for (i, (want, got)) in inputs.iter().zip(list).enumerate() {
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

    /// Runs the program on its device with `args` (which must belong to the same client, live on
    /// that device, and match the parameter types) and returns its outputs as device buffers,
    /// after the execution has finished.
    ///
    /// Arguments in [donated](Executable::donated_inputs) positions are consumed: PJRT hands
    /// their device memory to the program, which may update it in place, and the buffers are
    /// marked [donated](Buffer::is_donated), so that any later use is an error. A buffer passed
    /// in a donated position and again in another is refused before PJRT is called, as JAX does.
    /// If the execution fails, an argument is marked donated when PJRT reports its memory gone
    /// (`PJRT_Buffer_IsDeleted`). Other arguments are not consumed and can be passed again; use
    /// [`Executable::execute_with`] to keep every argument.
    pub fn execute(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        self.execute_with(args, ExecuteOptions::default())
    }

    /// Runs the program as [`Executable::execute`] does, with `options`.
    pub fn execute_with(&self, args: &[&Buffer], options: ExecuteOptions) -> Result<Vec<Buffer>> {
        let mut outputs = self.execute_partitioned(&[args.to_vec()], options)?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Runs a program compiled for several devices (the partitions of an SPMD program):
    /// `args[i]` is the argument list of device [`Executable::devices`]`()[i]`, each buffer on
    /// that device; returns each device's outputs, in the same order. Donation works per buffer
    /// as in [`Executable::execute`]. The buffers' shapes are each device's blocks, which the
    /// text's (global) signature does not give: PJRT refuses a block of the wrong size
    /// ("RuntimeProgramInputMismatch"), and [`crate::CompiledGraph::run_sharded`] checks the
    /// global types and layouts first, naming the parameter.
    pub fn execute_partitioned(
        &self,
        args: &[Vec<&Buffer>],
        options: ExecuteOptions,
    ) -> Result<Vec<Vec<Buffer>>> {
        self.check_args(args, options.donate)?;
        let client = &self.inner.client;
        let api = client.api();
        let devices = &self.inner.devices;
        let num_args = args.first().map_or(0, Vec::len);
        let arg_ptrs: Vec<Vec<*mut ffi::PJRT_Buffer>> = args
            .iter()
            .map(|l| l.iter().map(|a| a.raw()).collect())
            .collect();
        let arg_lists: Vec<*const *mut ffi::PJRT_Buffer> =
            arg_ptrs.iter().map(|l| l.as_ptr()).collect();
        let n_out = self.inner.program.outputs.len();
        let mut outputs: Vec<Vec<*mut ffi::PJRT_Buffer>> = devices
            .iter()
            .map(|_| vec![std::ptr::null_mut(); n_out])
            .collect();
        let output_lists: Vec<*mut *mut ffi::PJRT_Buffer> =
            outputs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        let mut complete: Vec<*mut ffi::PJRT_Event> = vec![std::ptr::null_mut(); devices.len()];
        // Without donation every position is listed, not only the donated ones we read from the
        // signature, so that PJRT donates nothing whatever the program says.
        let non_donatable: Vec<i64> = if options.donate {
            Vec::new()
        } else {
            (0..num_args as i64).collect()
        };
        let mut raw_options = ffi::PJRT_ExecuteOptions::new();
        raw_options.non_donatable_input_indices = non_donatable.as_ptr();
        raw_options.num_non_donatable_input_indices = non_donatable.len();
        let mut exec = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        exec.executable = self.inner.program.raw;
        exec.options = &mut raw_options;
        exec.argument_lists = arg_lists.as_ptr();
        exec.num_devices = devices.len();
        exec.num_args = num_args;
        exec.output_lists = output_lists.as_ptr();
        exec.device_complete_events = complete.as_mut_ptr();
        // SAFETY: a live executable of this client (checked in `check_args`, with the arguments:
        // live, undonated buffers of this client, on the program's devices); one argument list
        // of `num_args` buffers, one output list with room for every output and one event slot
        // per device, all alive until the call returns; `raw_options` and `non_donatable`
        // outlive it too.
        let launched = unsafe { pjrt_call!(api, PJRT_LoadedExecutable_Execute, &mut exec) };
        if let Err(e) = launched {
            // PJRT may have taken some arguments before failing: ask it about each. Should even
            // that query fail, the buffer stays as it was; PJRT refuses a deleted buffer itself.
            for a in args.iter().flatten() {
                let _ = a.sync_donated_with_pjrt();
            }
            return Err(e);
        }
        // PJRT took the donated arguments when it launched the execution (their memory is gone
        // whether or not the computation then succeeds).
        if options.donate {
            self.mark_donated(args);
        }
        // Take ownership of every output before anything can fail, so each is destroyed once.
        // SAFETY: the output lists the launch just filled: new buffers of this client (or null
        // where the plugin gave fewer), one list per device of `devices`, in order.
        let owned = unsafe { own_outputs(client, &outputs, devices) };
        let mut first_error = None;
        for &event in &complete {
            // SAFETY: each device's completion event (or null), ours to destroy, awaited once.
            if let Err(e) = unsafe { api.await_event(event, "PJRT_LoadedExecutable_Execute") } {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        owned
            .into_iter()
            .map(|list| list.into_iter().collect())
            .collect()
    }

    /// Marks the arguments in donated positions of every device's list as donated.
    fn mark_donated(&self, args: &[Vec<&Buffer>]) {
        for list in args {
            for &d in self.donated_inputs() {
                if let Some(a) = list.get(d) {
                    a.mark_donated();
                }
            }
        }
    }
}

/// Each device's outputs as owned buffers: `outputs[i]` from the device `devices[i]`, a null
/// pointer an error (the plugin returned fewer outputs than the program declares).
///
/// # Safety
/// Every non-null pointer of `outputs` must be a new, live buffer of `client` on its device,
/// whose ownership passes to the result (each is destroyed exactly once, by its `Buffer`).
unsafe fn own_outputs(
    client: &Client,
    outputs: &[Vec<*mut ffi::PJRT_Buffer>],
    devices: &[usize],
) -> Vec<Vec<Result<Buffer>>> {
    outputs
        .iter()
        .zip(devices)
        .map(|(list, &device)| {
            list.iter()
                .map(|&raw| {
                    if raw.is_null() {
                        Err(Error::InvalidArgument(
                            "the plugin returned fewer outputs than the program declares".into(),
                        ))
                    } else {
                        // SAFETY: a new, live output buffer of this client on `device`, owned
                        // from here on (the caller's promise).
                        unsafe { Buffer::from_raw(client, raw, device) }
                    }
                })
                .collect()
        })
        .collect()
}

impl Executable {
    /// The program XLA compiled, after its passes (partitioning included), as a serialized
    /// `HloModuleProto` (`PJRT_Executable_OptimizedProgram`, whose format `hlo` is one and
    /// `hlo_with_config`, what the CPU plugins return, holds one as field 1). See
    /// [`Executable::collectives`] for what the runtime reads from it.
    pub fn optimized_hlo(&self) -> Result<Vec<u8>> {
        let client = &self.inner.client;
        let api = client.api();
        let mut get = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        get.loaded_executable = self.inner.program.raw;
        let view = ExecutableView::new(client, &mut get)?;
        let mut program = ffi::PJRT_Program {
            struct_size: ffi::PJRT_Program::STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            code: std::ptr::null_mut(),
            code_size: 0,
            format: std::ptr::null(),
            format_size: 0,
        };
        let mut args = ffi::PJRT_Executable_OptimizedProgram_Args::new();
        args.executable = view.raw;
        args.program = &mut program;
        // SAFETY: a live executable view; a null `code` asks for the size only.
        unsafe { pjrt_call!(api, PJRT_Executable_OptimizedProgram, &mut args) }?;
        // SAFETY: the format is owned by the plugin, valid for `format_size` bytes.
        let format = unsafe { super::api::string_from(program.format, program.format_size) };
        if format != "hlo" && format != "hlo_with_config" {
            return Err(Error::InvalidArgument(format!(
                "the plugin returns the optimized program as {format:?}, not a serialized \
                 HloModuleProto (\"hlo\" or \"hlo_with_config\")"
            )));
        }
        let mut code = vec![0u8; program.code_size];
        if code.is_empty() {
            return Ok(code);
        }
        program.code = code.as_mut_ptr().cast();
        args.program = &mut program;
        // SAFETY: as above, with `code` a buffer of `code_size` bytes that outlives the call.
        unsafe { pjrt_call!(api, PJRT_Executable_OptimizedProgram, &mut args) }?;
        code.truncate(program.code_size);
        if format == "hlo_with_config" {
            return super::hlo::module_of_config(&code);
        }
        Ok(code)
    }

    /// What the compiler reserved for this program on its device, in bytes (PJRT's
    /// `GetCompiledMemoryStats`): the temporaries are the peak of the intermediate values a
    /// run holds, what rematerialisation (`Graph::checkpoint`) trades for compute.
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        let client = &self.inner.client;
        let mut get = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        get.loaded_executable = self.inner.program.raw;
        let view = ExecutableView::new(client, &mut get)?;
        let mut args = ffi::PJRT_Executable_GetCompiledMemoryStats_Args::new();
        args.executable = view.raw;
        // SAFETY: a live executable view; every field after it is an output.
        unsafe {
            pjrt_call!(
                client.api(),
                PJRT_Executable_GetCompiledMemoryStats,
                &mut args
            )
        }?;
        let bytes = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(MemoryStats {
            generated_code: bytes(args.generated_code_size_in_bytes),
            arguments: bytes(args.argument_size_in_bytes),
            outputs: bytes(args.output_size_in_bytes),
            aliased: bytes(args.alias_size_in_bytes),
            temporaries: bytes(args.temp_size_in_bytes),
            peak: bytes(args.peak_memory_in_bytes),
        })
    }

    /// The collectives of the optimized program (see [`Executable::optimized_hlo`]): what XLA's
    /// partitioner inserted, or a `shard_map` wrote, in computation and instruction order.
    pub fn collectives(&self) -> Result<Vec<super::hlo::Collective>> {
        super::hlo::collectives(&self.optimized_hlo()?)
    }
}

/// Options for [`Executable::execute_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExecuteOptions {
    /// Whether arguments in [donated](Executable::donated_inputs) positions are handed to the
    /// execution (the default, `true`). With `false`, PJRT is told to donate no argument: every
    /// argument stays usable, and an aliased output is written to fresh memory instead, at the
    /// cost of a copy of the argument.
    pub donate: bool,
}

impl Default for ExecuteOptions {
    fn default() -> Self {
        ExecuteOptions { donate: true }
    }
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("outputs", &self.inner.program.outputs)
            .finish()
    }
}

/// A compiled program's memory on its device, in bytes ([`Executable::memory_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// The program's code.
    pub generated_code: u64,
    /// Its parameters.
    pub arguments: u64,
    /// Its results.
    pub outputs: u64,
    /// Results that reuse a donated parameter's buffer.
    pub aliased: u64,
    /// The peak of its intermediate values.
    pub temporaries: u64,
    /// The peak of everything it holds at once (0 where the plugin does not say).
    pub peak: u64,
}
