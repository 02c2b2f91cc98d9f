//! Hand-declared `#[repr(C)]` mirror of the subset of the PJRT C API that stablegraph uses.
//!
//! The authority is `pjrt_c_api.h` (API 0.81, shipped inside the `xla-cpu-pjrt` wheel). Only what we
//! call is declared; the function table is declared in full, in header order, because a slot's offset
//! depends on every slot before it. Every argument struct starts with `struct_size` and
//! `extension_start`; [`args!`] sets `struct_size` to the header's `*_STRUCT_SIZE` (the end of the last
//! field, not `size_of`, which would include tail padding).

#![allow(non_camel_case_types, non_snake_case, dead_code, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

/// Opaque plugin-side objects. Only pointers to them cross the boundary.
macro_rules! opaque {
    ($($name:ident),* $(,)?) => {
        $(
            #[repr(C)]
            pub struct $name {
                _private: [u8; 0],
            }
        )*
    };
}

opaque!(
    PJRT_Error,
    PJRT_Event,
    PJRT_Client,
    PJRT_Device,
    PJRT_DeviceDescription,
    PJRT_Memory,
    PJRT_Executable,
    PJRT_LoadedExecutable,
    PJRT_Buffer,
    PJRT_SerializedExecutable,
    PJRT_ExecuteContext,
);

/// Declares an argument struct whose first two fields are `struct_size` and `extension_start`, with
/// a `new()` that zeroes it and sets `struct_size` to the header's `*_STRUCT_SIZE`.
macro_rules! args {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *mut c_void,
            $(pub $field: $ty,)*
        }

        impl $name {
            /// End of the last field, as `PJRT_STRUCT_SIZE` computes it.
            pub const STRUCT_SIZE: usize = {
                #[allow(unused_mut)]
                let mut end = std::mem::offset_of!($name, extension_start)
                    + std::mem::size_of::<*mut c_void>();
                $(
                    let field_end = std::mem::offset_of!($name, $field) + std::mem::size_of::<$ty>();
                    if field_end > end {
                        end = field_end;
                    }
                )*
                end
            };

            /// A zeroed struct with `struct_size` set.
            pub fn new() -> Self {
                // SAFETY: every field is an integer, a bool, a raw pointer, an `Option` of a function
                // pointer or a plain C struct of those; all-zero is a valid value for each.
                let mut s: Self = unsafe { std::mem::zeroed() };
                s.struct_size = Self::STRUCT_SIZE;
                s
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    };
}

// ---- enums (C enums are `int`) ----------------------------------------------------------------

pub type PJRT_Error_Code = c_int;
pub type PJRT_Buffer_Type = c_int;
pub type PJRT_NamedValue_Type = c_int;
pub type PJRT_HostBufferSemantics = c_int;

pub const PJRT_NAMED_VALUE_STRING: PJRT_NamedValue_Type = 0;
pub const PJRT_NAMED_VALUE_INT64: PJRT_NamedValue_Type = 1;
pub const PJRT_NAMED_VALUE_INT64_LIST: PJRT_NamedValue_Type = 2;
pub const PJRT_NAMED_VALUE_FLOAT: PJRT_NamedValue_Type = 3;
pub const PJRT_NAMED_VALUE_BOOL: PJRT_NamedValue_Type = 4;

pub const PJRT_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: PJRT_HostBufferSemantics = 0;

// ---- structs ----------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub major_version: c_int,
    pub minor_version: c_int,
}

/// `PJRT_NamedValue`: the value union is pointer-sized (`const char*`, `int64_t`, `const int64_t*`,
/// `float`, `bool`), so it is declared as one 8-byte field written through accessors.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub name: *const c_char,
    pub name_size: usize,
    pub type_: PJRT_NamedValue_Type,
    pub value: u64,
    pub value_size: usize,
}

impl PJRT_NamedValue {
    /// End of `value_size`, as `PJRT_STRUCT_SIZE` computes it.
    pub const STRUCT_SIZE: usize =
        std::mem::offset_of!(PJRT_NamedValue, value_size) + std::mem::size_of::<usize>();
}

args!(PJRT_Error_Destroy_Args { error: *mut PJRT_Error });
args!(PJRT_Error_Message_Args {
    error: *const PJRT_Error,
    message: *const c_char,
    message_size: usize,
});
args!(PJRT_Error_GetCode_Args {
    error: *const PJRT_Error,
    code: PJRT_Error_Code,
});
args!(PJRT_Plugin_Initialize_Args {});
args!(PJRT_Plugin_Attributes_Args {
    attributes: *const PJRT_NamedValue,
    num_attributes: usize,
});
args!(PJRT_Event_Destroy_Args { event: *mut PJRT_Event });
args!(PJRT_Event_Await_Args { event: *mut PJRT_Event });
args!(PJRT_Client_Create_Args {
    create_options: *const PJRT_NamedValue,
    num_options: usize,
    kv_get_callback: *mut c_void,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: *mut c_void,
    kv_put_user_arg: *mut c_void,
    client: *mut PJRT_Client,
    kv_try_get_callback: *mut c_void,
    kv_try_get_user_arg: *mut c_void,
});
args!(PJRT_Client_Destroy_Args { client: *mut PJRT_Client });
args!(PJRT_Client_PlatformName_Args {
    client: *mut PJRT_Client,
    platform_name: *const c_char,
    platform_name_size: usize,
});
args!(PJRT_Client_PlatformVersion_Args {
    client: *mut PJRT_Client,
    platform_version: *const c_char,
    platform_version_size: usize,
});
args!(PJRT_Client_AddressableDevices_Args {
    client: *mut PJRT_Client,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});

#[repr(C)]
pub struct PJRT_Program {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub code: *mut c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}

impl PJRT_Program {
    /// End of `format_size`, as `PJRT_STRUCT_SIZE` computes it.
    pub const STRUCT_SIZE: usize =
        std::mem::offset_of!(PJRT_Program, format_size) + std::mem::size_of::<usize>();
}

args!(PJRT_Client_Compile_Args {
    client: *mut PJRT_Client,
    program: *const PJRT_Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut PJRT_LoadedExecutable,
});
args!(PJRT_Client_BufferFromHostBuffer_Args {
    client: *mut PJRT_Client,
    data: *const c_void,
    type_: PJRT_Buffer_Type,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: PJRT_HostBufferSemantics,
    device: *mut PJRT_Device,
    memory: *mut PJRT_Memory,
    device_layout: *mut c_void,
    done_with_host_buffer: *mut PJRT_Event,
    buffer: *mut PJRT_Buffer,
});
args!(PJRT_DeviceDescription_Id_Args {
    device_description: *mut PJRT_DeviceDescription,
    id: c_int,
});
args!(PJRT_DeviceDescription_Kind_Args {
    device_description: *mut PJRT_DeviceDescription,
    device_kind: *const c_char,
    device_kind_size: usize,
});
args!(PJRT_DeviceDescription_ToString_Args {
    device_description: *mut PJRT_DeviceDescription,
    to_string: *const c_char,
    to_string_size: usize,
});
args!(PJRT_Device_GetDescription_Args {
    device: *mut PJRT_Device,
    device_description: *mut PJRT_DeviceDescription,
});
args!(PJRT_Executable_Destroy_Args { executable: *mut PJRT_Executable });
args!(PJRT_LoadedExecutable_Destroy_Args { executable: *mut PJRT_LoadedExecutable });
args!(PJRT_LoadedExecutable_GetExecutable_Args {
    loaded_executable: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
});
args!(PJRT_Executable_NumOutputs_Args {
    executable: *mut PJRT_Executable,
    num_outputs: usize,
});
args!(PJRT_Executable_OutputElementTypes_Args {
    executable: *mut PJRT_Executable,
    output_types: *mut PJRT_Buffer_Type,
    num_output_types: usize,
});
args!(PJRT_Executable_OutputDimensions_Args {
    executable: *mut PJRT_Executable,
    num_outputs: usize,
    dims: *const i64,
    dim_sizes: *const usize,
});
/// Frees the bytes `PJRT_Executable_Serialize` returned; call exactly once.
pub type SerializedExecutableDeleter =
    Option<unsafe extern "C" fn(exec: *mut PJRT_SerializedExecutable)>;
args!(PJRT_Executable_Serialize_Args {
    executable: *const PJRT_Executable,
    serialized_bytes: *const c_char,
    serialized_bytes_size: usize,
    serialized_executable: *mut PJRT_SerializedExecutable,
    serialized_executable_deleter: SerializedExecutableDeleter,
});
args!(PJRT_Executable_OptimizedProgram_Args {
    executable: *mut PJRT_Executable,
    program: *mut PJRT_Program,
});
args!(PJRT_Executable_GetCompiledMemoryStats_Args {
    executable: *mut PJRT_Executable,
    generated_code_size_in_bytes: i64,
    argument_size_in_bytes: i64,
    output_size_in_bytes: i64,
    alias_size_in_bytes: i64,
    temp_size_in_bytes: i64,
    host_generated_code_size_in_bytes: i64,
    host_argument_size_in_bytes: i64,
    host_output_size_in_bytes: i64,
    host_alias_size_in_bytes: i64,
    host_temp_size_in_bytes: i64,
    peak_memory_in_bytes: i64,
});
args!(PJRT_Executable_DeserializeAndLoad_Args {
    client: *mut PJRT_Client,
    serialized_executable: *const c_char,
    serialized_executable_size: usize,
    loaded_executable: *mut PJRT_LoadedExecutable,
    overridden_serialized_compile_options: *const c_char,
    overridden_serialized_compile_options_size: usize,
});
args!(PJRT_ExecuteOptions {
    send_callbacks: *mut c_void,
    recv_callbacks: *mut c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: c_int,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut PJRT_ExecuteContext,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut c_int,
    incarnation_ids: *mut i64,
});
args!(PJRT_LoadedExecutable_Execute_Args {
    executable: *mut PJRT_LoadedExecutable,
    options: *mut PJRT_ExecuteOptions,
    argument_lists: *const *const *mut PJRT_Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut PJRT_Buffer,
    device_complete_events: *mut *mut PJRT_Event,
    execute_device: *mut PJRT_Device,
});
args!(PJRT_Buffer_Destroy_Args { buffer: *mut PJRT_Buffer });
args!(PJRT_Buffer_IsDeleted_Args {
    buffer: *mut PJRT_Buffer,
    is_deleted: bool,
});
args!(PJRT_Buffer_ElementType_Args {
    buffer: *mut PJRT_Buffer,
    type_: PJRT_Buffer_Type,
});
args!(PJRT_Buffer_Dimensions_Args {
    buffer: *mut PJRT_Buffer,
    dims: *const i64,
    num_dims: usize,
});
args!(PJRT_Buffer_ToHostBuffer_Args {
    src: *mut PJRT_Buffer,
    host_layout: *mut c_void,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut PJRT_Event,
});

// ---- the function table -----------------------------------------------------------------------

/// A table entry we call: takes a pointer to its argument struct, returns an error or null.
pub type Fn = Option<unsafe extern "C" fn(args: *mut c_void) -> *mut PJRT_Error>;
/// `PJRT_Error_Destroy` and `PJRT_Error_Message` return nothing.
pub type VoidFn = Option<unsafe extern "C" fn(args: *mut c_void)>;

/// `PJRT_Api`, every slot in header order (API 0.81). Slots are only read after checking that the
/// plugin's `struct_size` covers them (see `runtime::api`).
#[repr(C)]
pub struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub pjrt_api_version: PJRT_Api_Version,
    pub PJRT_Error_Destroy: VoidFn,
    pub PJRT_Error_Message: VoidFn,
    pub PJRT_Error_GetCode: Fn,
    pub PJRT_Plugin_Initialize: Fn,
    pub PJRT_Plugin_Attributes: Fn,
    pub PJRT_Event_Destroy: Fn,
    pub PJRT_Event_IsReady: Fn,
    pub PJRT_Event_Error: Fn,
    pub PJRT_Event_Await: Fn,
    pub PJRT_Event_OnReady: Fn,
    pub PJRT_Client_Create: Fn,
    pub PJRT_Client_Destroy: Fn,
    pub PJRT_Client_PlatformName: Fn,
    pub PJRT_Client_ProcessIndex: Fn,
    pub PJRT_Client_PlatformVersion: Fn,
    pub PJRT_Client_Devices: Fn,
    pub PJRT_Client_AddressableDevices: Fn,
    pub PJRT_Client_LookupDevice: Fn,
    pub PJRT_Client_LookupAddressableDevice: Fn,
    pub PJRT_Client_AddressableMemories: Fn,
    pub PJRT_Client_Compile: Fn,
    pub PJRT_Client_DefaultDeviceAssignment: Fn,
    pub PJRT_Client_BufferFromHostBuffer: Fn,
    pub PJRT_DeviceDescription_Id: Fn,
    pub PJRT_DeviceDescription_ProcessIndex: Fn,
    pub PJRT_DeviceDescription_Attributes: Fn,
    pub PJRT_DeviceDescription_Kind: Fn,
    pub PJRT_DeviceDescription_DebugString: Fn,
    pub PJRT_DeviceDescription_ToString: Fn,
    pub PJRT_Device_GetDescription: Fn,
    pub PJRT_Device_IsAddressable: Fn,
    pub PJRT_Device_LocalHardwareId: Fn,
    pub PJRT_Device_AddressableMemories: Fn,
    pub PJRT_Device_DefaultMemory: Fn,
    pub PJRT_Device_MemoryStats: Fn,
    pub PJRT_Memory_Id: Fn,
    pub PJRT_Memory_Kind: Fn,
    pub PJRT_Memory_DebugString: Fn,
    pub PJRT_Memory_ToString: Fn,
    pub PJRT_Memory_AddressableByDevices: Fn,
    pub PJRT_Executable_Destroy: Fn,
    pub PJRT_Executable_Name: Fn,
    pub PJRT_Executable_NumReplicas: Fn,
    pub PJRT_Executable_NumPartitions: Fn,
    pub PJRT_Executable_NumOutputs: Fn,
    pub PJRT_Executable_SizeOfGeneratedCodeInBytes: Fn,
    pub PJRT_Executable_GetCostAnalysis: Fn,
    pub PJRT_Executable_OutputMemoryKinds: Fn,
    pub PJRT_Executable_OptimizedProgram: Fn,
    pub PJRT_Executable_Serialize: Fn,
    pub PJRT_LoadedExecutable_Destroy: Fn,
    pub PJRT_LoadedExecutable_GetExecutable: Fn,
    pub PJRT_LoadedExecutable_AddressableDevices: Fn,
    pub PJRT_LoadedExecutable_Delete: Fn,
    pub PJRT_LoadedExecutable_IsDeleted: Fn,
    pub PJRT_LoadedExecutable_Execute: Fn,
    pub PJRT_Executable_DeserializeAndLoad: Fn,
    pub PJRT_LoadedExecutable_Fingerprint: Fn,
    pub PJRT_Buffer_Destroy: Fn,
    pub PJRT_Buffer_ElementType: Fn,
    pub PJRT_Buffer_Dimensions: Fn,
    pub PJRT_Buffer_UnpaddedDimensions: Fn,
    pub PJRT_Buffer_DynamicDimensionIndices: Fn,
    pub PJRT_Buffer_GetMemoryLayout: Fn,
    pub PJRT_Buffer_OnDeviceSizeInBytes: Fn,
    pub PJRT_Buffer_Device: Fn,
    pub PJRT_Buffer_Memory: Fn,
    pub PJRT_Buffer_Delete: Fn,
    pub PJRT_Buffer_IsDeleted: Fn,
    pub PJRT_Buffer_CopyToDevice: Fn,
    pub PJRT_Buffer_ToHostBuffer: Fn,
    pub PJRT_Buffer_IsOnCpu: Fn,
    pub PJRT_Buffer_ReadyEvent: Fn,
    pub PJRT_Buffer_UnsafePointer: Fn,
    pub PJRT_Buffer_IncreaseExternalReferenceCount: Fn,
    pub PJRT_Buffer_DecreaseExternalReferenceCount: Fn,
    pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer: Fn,
    pub PJRT_CopyToDeviceStream_Destroy: Fn,
    pub PJRT_CopyToDeviceStream_AddChunk: Fn,
    pub PJRT_CopyToDeviceStream_TotalBytes: Fn,
    pub PJRT_CopyToDeviceStream_GranuleSize: Fn,
    pub PJRT_CopyToDeviceStream_CurrentBytes: Fn,
    pub PJRT_TopologyDescription_Create: Fn,
    pub PJRT_TopologyDescription_Destroy: Fn,
    pub PJRT_TopologyDescription_PlatformName: Fn,
    pub PJRT_TopologyDescription_PlatformVersion: Fn,
    pub PJRT_TopologyDescription_GetDeviceDescriptions: Fn,
    pub PJRT_TopologyDescription_Serialize: Fn,
    pub PJRT_TopologyDescription_Attributes: Fn,
    pub PJRT_Compile: Fn,
    pub PJRT_Executable_OutputElementTypes: Fn,
    pub PJRT_Executable_OutputDimensions: Fn,
    pub PJRT_Buffer_CopyToMemory: Fn,
    pub PJRT_Client_CreateViewOfDeviceBuffer: Fn,
    pub PJRT_Executable_Fingerprint: Fn,
    pub PJRT_Client_TopologyDescription: Fn,
    pub PJRT_Executable_GetCompiledMemoryStats: Fn,
    pub PJRT_Memory_Kind_Id: Fn,
    pub PJRT_ExecuteContext_Create: Fn,
    pub PJRT_ExecuteContext_Destroy: Fn,
    pub PJRT_Buffer_CopyRawToHost: Fn,
    pub PJRT_AsyncHostToDeviceTransferManager_Destroy: Fn,
    pub PJRT_AsyncHostToDeviceTransferManager_TransferData: Fn,
    pub PJRT_Client_CreateBuffersForAsyncHostToDevice: Fn,
    pub PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer: Fn,
    pub PJRT_AsyncHostToDeviceTransferManager_Device: Fn,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferCount: Fn,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferSize: Fn,
    pub PJRT_AsyncHostToDeviceTransferManager_SetBufferError: Fn,
    pub PJRT_AsyncHostToDeviceTransferManager_AddMetadata: Fn,
    pub PJRT_Client_DmaMap: Fn,
    pub PJRT_Client_DmaUnmap: Fn,
    pub PJRT_Client_CreateUninitializedBuffer: Fn,
    pub PJRT_Client_UpdateGlobalProcessInfo: Fn,
    pub PJRT_TopologyDescription_Deserialize: Fn,
    pub PJRT_Client_CreateAliasBuffer: Fn,
    pub PJRT_Client_FulfillAliasBuffer: Fn,
    pub PJRT_LoadedExecutable_GetDeviceAssignment: Fn,
}

/// A slot of `PJRT_Api` tied to the one argument struct its function takes, so that calling a
/// slot with another slot's arguments does not compile (see `Api::call`).
///
/// ```
/// use stablegraph::runtime::pjrt::{fns, Api, PJRT_Client_Destroy_Args};
///
/// fn destroy(api: &Api) {
///     let mut args = PJRT_Client_Destroy_Args::new();
///     // SAFETY: never called; this only shows that a matching call compiles.
///     let _ = unsafe { api.call::<fns::PJRT_Client_Destroy>(&mut args) };
/// }
/// ```
///
/// Passing `PJRT_Client_Destroy`'s arguments to `PJRT_Client_Create` is a type error:
///
/// ```compile_fail,E0308
/// use stablegraph::runtime::pjrt::{fns, Api, PJRT_Client_Destroy_Args};
///
/// fn mismatched(api: &Api) {
///     let mut args = PJRT_Client_Destroy_Args::new();
///     // SAFETY: never called; this must not compile.
///     let _ = unsafe { api.call::<fns::PJRT_Client_Create>(&mut args) };
/// }
/// ```
///
/// # Safety
/// `OFFSET` is the offset of the slot named `NAME`, whose function takes a pointer to `Args` and
/// returns a `PJRT_Error*`, as `pjrt_c_api.h` declares it.
pub unsafe trait Function {
    /// The argument struct of this slot's function.
    type Args;
    /// The slot's byte offset in `PJRT_Api`.
    const OFFSET: usize;
    /// The slot's name, for error messages.
    const NAME: &'static str;
}

/// Declares one marker type per slot in [`fns`], each implementing [`Function`] with its
/// argument struct: the single place where a slot meets its arguments.
macro_rules! functions {
    ($($name:ident($args:ident)),* $(,)?) => {
        /// One uninhabited marker type per function stablegraph calls, named as its slot.
        pub mod fns {
            $(
                #[doc = concat!("`", stringify!($name), "`, which takes `", stringify!($args), "`.")]
                pub enum $name {}

                // SAFETY: `pjrt_c_api.h` declares this slot's function as taking `$args*` and
                // returning `PJRT_Error*`; the offset is the slot's in our header-order table.
                unsafe impl super::Function for $name {
                    type Args = super::$args;
                    const OFFSET: usize = std::mem::offset_of!(super::PJRT_Api, $name);
                    const NAME: &'static str = stringify!($name);
                }
            )*
        }
    };
}

functions!(
    PJRT_Error_GetCode(PJRT_Error_GetCode_Args),
    PJRT_Plugin_Initialize(PJRT_Plugin_Initialize_Args),
    PJRT_Plugin_Attributes(PJRT_Plugin_Attributes_Args),
    PJRT_Event_Destroy(PJRT_Event_Destroy_Args),
    PJRT_Event_Await(PJRT_Event_Await_Args),
    PJRT_Client_Create(PJRT_Client_Create_Args),
    PJRT_Client_Destroy(PJRT_Client_Destroy_Args),
    PJRT_Client_PlatformName(PJRT_Client_PlatformName_Args),
    PJRT_Client_PlatformVersion(PJRT_Client_PlatformVersion_Args),
    PJRT_Client_AddressableDevices(PJRT_Client_AddressableDevices_Args),
    PJRT_Client_Compile(PJRT_Client_Compile_Args),
    PJRT_Client_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args),
    PJRT_DeviceDescription_Id(PJRT_DeviceDescription_Id_Args),
    PJRT_DeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args),
    PJRT_DeviceDescription_ToString(PJRT_DeviceDescription_ToString_Args),
    PJRT_Device_GetDescription(PJRT_Device_GetDescription_Args),
    PJRT_Executable_Destroy(PJRT_Executable_Destroy_Args),
    PJRT_Executable_NumOutputs(PJRT_Executable_NumOutputs_Args),
    PJRT_Executable_Serialize(PJRT_Executable_Serialize_Args),
    PJRT_Executable_OptimizedProgram(PJRT_Executable_OptimizedProgram_Args),
    PJRT_Executable_GetCompiledMemoryStats(PJRT_Executable_GetCompiledMemoryStats_Args),
    PJRT_Executable_OutputElementTypes(PJRT_Executable_OutputElementTypes_Args),
    PJRT_Executable_OutputDimensions(PJRT_Executable_OutputDimensions_Args),
    PJRT_Executable_DeserializeAndLoad(PJRT_Executable_DeserializeAndLoad_Args),
    PJRT_LoadedExecutable_Destroy(PJRT_LoadedExecutable_Destroy_Args),
    PJRT_LoadedExecutable_GetExecutable(PJRT_LoadedExecutable_GetExecutable_Args),
    PJRT_LoadedExecutable_Execute(PJRT_LoadedExecutable_Execute_Args),
    PJRT_Buffer_Destroy(PJRT_Buffer_Destroy_Args),
    PJRT_Buffer_ElementType(PJRT_Buffer_ElementType_Args),
    PJRT_Buffer_Dimensions(PJRT_Buffer_Dimensions_Args),
    PJRT_Buffer_IsDeleted(PJRT_Buffer_IsDeleted_Args),
    PJRT_Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args),
);

/// The exported entry point of every plugin.
pub type GetPjrtApiFn = unsafe extern "C" fn() -> *const PJRT_Api;

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values are the header's `*_STRUCT_SIZE` enums, printed by a C compiler from
    /// `pjrt_c_api.h` (API 0.81) with `scripts/pjrt_struct_sizes.sh`, not computed by this code.
    #[test]
    fn struct_sizes_match_the_header() {
        let ours: &[(&str, usize)] = &[
            ("PJRT_Api_Version", std::mem::size_of::<PJRT_Api_Version>()),
            ("PJRT_NamedValue", PJRT_NamedValue::STRUCT_SIZE),
            (
                "PJRT_Error_Message_Args",
                PJRT_Error_Message_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Error_GetCode_Args",
                PJRT_Error_GetCode_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Plugin_Initialize_Args",
                PJRT_Plugin_Initialize_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Plugin_Attributes_Args",
                PJRT_Plugin_Attributes_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Client_Create_Args",
                PJRT_Client_Create_Args::STRUCT_SIZE,
            ),
            ("PJRT_Program", PJRT_Program::STRUCT_SIZE),
            (
                "PJRT_Client_Compile_Args",
                PJRT_Client_Compile_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Client_BufferFromHostBuffer_Args",
                PJRT_Client_BufferFromHostBuffer_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_DeviceDescription_Id_Args",
                PJRT_DeviceDescription_Id_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Executable_OutputDimensions_Args",
                PJRT_Executable_OutputDimensions_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Executable_Serialize_Args",
                PJRT_Executable_Serialize_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Executable_DeserializeAndLoad_Args",
                PJRT_Executable_DeserializeAndLoad_Args::STRUCT_SIZE,
            ),
            ("PJRT_ExecuteOptions", PJRT_ExecuteOptions::STRUCT_SIZE),
            (
                "PJRT_LoadedExecutable_Execute_Args",
                PJRT_LoadedExecutable_Execute_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Buffer_ElementType_Args",
                PJRT_Buffer_ElementType_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Buffer_ToHostBuffer_Args",
                PJRT_Buffer_ToHostBuffer_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Executable_OptimizedProgram_Args",
                PJRT_Executable_OptimizedProgram_Args::STRUCT_SIZE,
            ),
            (
                "PJRT_Buffer_IsDeleted_Args",
                PJRT_Buffer_IsDeleted_Args::STRUCT_SIZE,
            ),
            ("PJRT_Api", std::mem::size_of::<PJRT_Api>()),
        ];
        for (name, size) in ours {
            let expected = HEADER_SIZES
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| *s)
                .unwrap_or_else(|| panic!("no header size recorded for {name}"));
            assert_eq!(*size, expected, "{name}");
        }
    }

    /// Output of `scripts/pjrt_struct_sizes.sh` on x86_64 Linux.
    const HEADER_SIZES: &[(&str, usize)] = &[
        ("PJRT_Api_Version", 24),
        ("PJRT_NamedValue", 56),
        ("PJRT_Error_Message_Args", 40),
        ("PJRT_Error_GetCode_Args", 28),
        ("PJRT_Plugin_Initialize_Args", 16),
        ("PJRT_Plugin_Attributes_Args", 32),
        ("PJRT_Client_Create_Args", 88),
        ("PJRT_Program", 48),
        ("PJRT_Client_Compile_Args", 56),
        ("PJRT_Client_BufferFromHostBuffer_Args", 120),
        ("PJRT_DeviceDescription_Id_Args", 28),
        ("PJRT_Executable_OutputDimensions_Args", 48),
        ("PJRT_Executable_Serialize_Args", 56),
        ("PJRT_Executable_DeserializeAndLoad_Args", 64),
        ("PJRT_ExecuteOptions", 112),
        ("PJRT_LoadedExecutable_Execute_Args", 80),
        ("PJRT_Buffer_ElementType_Args", 28),
        ("PJRT_Buffer_ToHostBuffer_Args", 56),
        ("PJRT_Buffer_IsDeleted_Args", 25),
        ("PJRT_Executable_OptimizedProgram_Args", 32),
        ("PJRT_Api", 984),
    ];
}
