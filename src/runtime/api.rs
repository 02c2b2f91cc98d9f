//! Defensive access to a plugin's `PJRT_Api` function table: a slot is read only when the plugin's
//! `struct_size` covers it, and every returned `PJRT_Error` becomes an [`Error`] and is destroyed.

use std::ffi::{c_char, c_void};

use super::ffi::{self, PJRT_Api, PJRT_Error};
use crate::error::{Error, ErrorCode, Result};

/// A plugin's function table. Copyable: it is a pointer into the plugin, which is never unloaded.
#[derive(Clone, Copy)]
pub(crate) struct Api {
    raw: *const PJRT_Api,
    table_size: usize,
    major: i32,
    minor: i32,
}

// SAFETY: the table is immutable plugin data, and the PJRT C API's functions are thread-safe.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

/// Calls a PJRT function through [`Api::call`], naming the slot once.
macro_rules! pjrt_call {
    ($api:expr, $name:ident, $args:expr) => {
        $api.call(
            std::mem::offset_of!($crate::runtime::ffi::PJRT_Api, $name),
            stringify!($name),
            $args,
        )
    };
}
pub(crate) use pjrt_call;

impl Api {
    /// Wraps a table returned by `GetPjrtApi`, after checking it is long enough to hold its header.
    ///
    /// # Safety
    /// `raw` must be null or point to a `PJRT_Api` that lives as long as the process.
    pub(crate) unsafe fn new(raw: *const PJRT_Api) -> std::result::Result<Api, String> {
        if raw.is_null() {
            return Err("GetPjrtApi returned a null pointer".into());
        }
        let table_size = unsafe { (*raw).struct_size };
        let header_end = std::mem::offset_of!(PJRT_Api, pjrt_api_version)
            + std::mem::size_of::<ffi::PJRT_Api_Version>();
        if table_size < header_end {
            return Err(format!(
                "its PJRT_Api struct_size is {table_size}, smaller than the {header_end}-byte header"
            ));
        }
        let version = unsafe { (*raw).pjrt_api_version };
        Ok(Api {
            raw,
            table_size,
            major: version.major_version,
            minor: version.minor_version,
        })
    }

    /// The plugin's PJRT C API version `(major, minor)`.
    pub(crate) fn version(&self) -> (i32, i32) {
        (self.major, self.minor)
    }

    fn version_string(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    /// Reads the function pointer whose slot starts at `offset`, if the plugin's table covers it.
    fn slot<F: Copy>(&self, offset: usize, name: &'static str) -> Result<Option<F>> {
        let slot_end = offset + std::mem::size_of::<F>();
        if slot_end > self.table_size {
            return Err(Error::Unsupported {
                function: name,
                api_version: self.version_string(),
                table_size: self.table_size,
                slot_end,
            });
        }
        // SAFETY: the slot lies within the plugin's table (checked above); `F` is the
        // `Option<fn>` type of that slot.
        Ok(unsafe { self.raw.cast::<u8>().add(offset).cast::<Option<F>>().read() })
    }

    /// Calls the function in the slot at `offset` with `args`, converting a returned error.
    pub(crate) fn call<A>(&self, offset: usize, name: &'static str, args: &mut A) -> Result<()> {
        type RawFn = unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error;
        let f = self
            .slot::<RawFn>(offset, name)?
            .ok_or(Error::Unsupported {
                function: name,
                api_version: self.version_string(),
                table_size: self.table_size,
                slot_end: offset + std::mem::size_of::<RawFn>(),
            })?;
        // SAFETY: `args` is the argument struct this slot's function takes, with `struct_size` set
        // by its constructor; the pointer is valid for the duration of the call.
        let err = unsafe { f((args as *mut A).cast::<c_void>()) };
        self.check(err, name)
    }

    /// Converts a `PJRT_Error*` returned by `call` into a `Result`, destroying the error.
    pub(crate) fn check(&self, err: *mut PJRT_Error, call: &'static str) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let message = self
            .error_message(err)
            .unwrap_or_else(|| "(the plugin gave no message)".to_string());
        let mut code_args = ffi::PJRT_Error_GetCode_Args::new();
        code_args.error = err;
        let code = match self.call_no_error(
            std::mem::offset_of!(PJRT_Api, PJRT_Error_GetCode),
            &mut code_args,
        ) {
            true => ErrorCode::from_raw(code_args.code),
            false => ErrorCode::Unknown,
        };
        self.destroy_error(err);
        Err(Error::Pjrt {
            call,
            code,
            message,
        })
    }

    fn error_message(&self, err: *mut PJRT_Error) -> Option<String> {
        type MsgFn = unsafe extern "C" fn(*mut c_void);
        let f = self
            .slot::<MsgFn>(std::mem::offset_of!(PJRT_Api, PJRT_Error_Message), "")
            .ok()
            .flatten()?;
        let mut args = ffi::PJRT_Error_Message_Args::new();
        args.error = err;
        // SAFETY: valid args for PJRT_Error_Message; `err` is a live error.
        unsafe { f((&mut args as *mut ffi::PJRT_Error_Message_Args).cast()) };
        // SAFETY: the message is owned by `err`, which is still alive.
        Some(unsafe { string_from(args.message, args.message_size) })
    }

    /// Calls `PJRT_Error_GetCode`, reporting whether it ran and succeeded; an error it returns is
    /// destroyed.
    fn call_no_error(&self, offset: usize, args: &mut ffi::PJRT_Error_GetCode_Args) -> bool {
        type RawFn = unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error;
        let Ok(Some(f)) = self.slot::<RawFn>(offset, "PJRT_Error_GetCode") else {
            return false;
        };
        // SAFETY: valid args for PJRT_Error_GetCode.
        let err = unsafe { f((args as *mut ffi::PJRT_Error_GetCode_Args).cast()) };
        if err.is_null() {
            true
        } else {
            self.destroy_error(err);
            false
        }
    }

    fn destroy_error(&self, err: *mut PJRT_Error) {
        type DestroyFn = unsafe extern "C" fn(*mut c_void);
        if let Ok(Some(f)) =
            self.slot::<DestroyFn>(std::mem::offset_of!(PJRT_Api, PJRT_Error_Destroy), "")
        {
            let mut args = ffi::PJRT_Error_Destroy_Args::new();
            args.error = err;
            // SAFETY: `err` is live and destroyed exactly once, here.
            unsafe { f((&mut args as *mut ffi::PJRT_Error_Destroy_Args).cast()) };
        }
    }

    /// Waits for `event`, then destroys it; returns the event's error, if any.
    pub(crate) fn await_event(
        &self,
        event: *mut ffi::PJRT_Event,
        what: &'static str,
    ) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut wait = ffi::PJRT_Event_Await_Args::new();
        wait.event = event;
        let waited = pjrt_call!(self, PJRT_Event_Await, &mut wait);
        let mut destroy = ffi::PJRT_Event_Destroy_Args::new();
        destroy.event = event;
        let destroyed = pjrt_call!(self, PJRT_Event_Destroy, &mut destroy);
        waited.map_err(|e| match e {
            Error::Pjrt { code, message, .. } => Error::Pjrt {
                call: what,
                code,
                message,
            },
            other => other,
        })?;
        destroyed
    }
}

/// Copies a (pointer, length) string owned by the plugin.
///
/// # Safety
/// `ptr` must be null or valid for `len` bytes.
pub(crate) unsafe fn string_from(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}
