//! Defensive access to a plugin's `PJRT_Api` function table: a slot is read only when the plugin's
//! `struct_size` covers it, and every returned `PJRT_Error` becomes an [`Error`] and is destroyed.

use std::ffi::{c_char, c_void};

use super::ffi::{self, PJRT_Api, PJRT_Error};
use crate::error::{Error, ErrorCode, Result};

/// A plugin's function table. Copyable: it is a pointer into the plugin, which is never unloaded.
///
/// Exported (hidden) only through [`crate::runtime::pjrt`] for the doc test that shows a
/// mismatched call does not compile; not a stable API.
#[derive(Clone, Copy)]
pub struct Api {
    raw: *const PJRT_Api,
    table_size: usize,
    major: i32,
    minor: i32,
}

// SAFETY: the table is immutable plugin data, and the PJRT C API's functions are thread-safe.
unsafe impl Send for Api {}
// SAFETY: as above; `Api` has no interior mutability.
unsafe impl Sync for Api {}

/// Calls a PJRT function through [`Api::call`], naming its slot, whose argument type is checked
/// against `$args` at compile time. The caller's `unsafe` block vouches for the pointers in `$args`.
macro_rules! pjrt_call {
    ($api:expr, $name:ident, $args:expr) => {
        $api.call::<$crate::runtime::ffi::fns::$name>($args)
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
        // SAFETY: non-null, and the caller guarantees a table; `struct_size` is its first field.
        let table_size = unsafe { (*raw).struct_size };
        let header_end = std::mem::offset_of!(PJRT_Api, pjrt_api_version)
            + std::mem::size_of::<ffi::PJRT_Api_Version>();
        if table_size < header_end {
            return Err(format!(
                "its PJRT_Api struct_size is {table_size}, smaller than the {header_end}-byte header"
            ));
        }
        // SAFETY: the table is at least as long as its header (checked above).
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

    /// Calls the function of slot `F` with `args`, converting a returned error. A slot beyond the
    /// plugin's table, or a null slot, is [`Error::Unsupported`] and nothing is called.
    ///
    /// # Safety
    /// Every pointer in `args` must be what `F`'s function expects (live handles of this plugin,
    /// arrays of the stated lengths, null where the header allows it), valid for the call.
    pub unsafe fn call<F: ffi::Function>(&self, args: &mut F::Args) -> Result<()> {
        type RawFn = unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error;
        let f = self
            .slot::<RawFn>(F::OFFSET, F::NAME)?
            .ok_or(Error::Unsupported {
                function: F::NAME,
                api_version: self.version_string(),
                table_size: self.table_size,
                slot_end: F::OFFSET + std::mem::size_of::<RawFn>(),
            })?;
        // SAFETY: `F::Args` is the argument struct of this slot (the `Function` contract), with
        // `struct_size` set by its constructor; the caller vouches for the pointers inside it.
        let err = unsafe { f((args as *mut F::Args).cast::<c_void>()) };
        // SAFETY: a non-null return is a live error the caller now owns.
        unsafe { self.check(err, F::NAME) }
    }

    /// Converts a `PJRT_Error*` returned by a call into a `Result`, destroying the error.
    ///
    /// # Safety
    /// `err` must be null or a live error of this plugin, which this call destroys.
    unsafe fn check(&self, err: *mut PJRT_Error, call: &'static str) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        // SAFETY: `err` is live until `destroy_error` below.
        let message = unsafe { self.error_message(err) }
            .unwrap_or_else(|| "(the plugin gave no message)".to_string());
        let mut code_args = ffi::PJRT_Error_GetCode_Args::new();
        code_args.error = err;
        // SAFETY: `err` is live.
        let code = match unsafe { self.error_code(&mut code_args) } {
            true => ErrorCode::from_raw(code_args.code),
            false => ErrorCode::Unknown,
        };
        // SAFETY: `err` is live and destroyed once, here.
        unsafe { self.destroy_error(err) };
        Err(Error::Pjrt {
            call,
            code,
            message,
        })
    }

    /// The message of `err`.
    ///
    /// # Safety
    /// `err` must be a live error of this plugin.
    unsafe fn error_message(&self, err: *mut PJRT_Error) -> Option<String> {
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

    /// Calls `PJRT_Error_GetCode` on the live error in `args`, reporting whether it ran and
    /// succeeded. Not through [`Api::call`], which would recurse on an error from GetCode itself;
    /// such an error is destroyed here.
    ///
    /// # Safety
    /// `args.error` must be a live error of this plugin.
    unsafe fn error_code(&self, args: &mut ffi::PJRT_Error_GetCode_Args) -> bool {
        use ffi::Function as _;
        type GetCode = ffi::fns::PJRT_Error_GetCode;
        type RawFn = unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error;
        let Ok(Some(f)) = self.slot::<RawFn>(GetCode::OFFSET, GetCode::NAME) else {
            return false;
        };
        // SAFETY: the slot's argument struct, holding a live error that GetCode only reads.
        let err = unsafe { f((args as *mut ffi::PJRT_Error_GetCode_Args).cast()) };
        if err.is_null() {
            true
        } else {
            // SAFETY: a new error from GetCode, owned here and destroyed once.
            unsafe { self.destroy_error(err) };
            false
        }
    }

    /// Destroys `err`.
    ///
    /// # Safety
    /// `err` must be a live error of this plugin, not used afterwards.
    unsafe fn destroy_error(&self, err: *mut PJRT_Error) {
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
    ///
    /// # Safety
    /// `event` must be null or a live event of this plugin that the caller owns; it is destroyed
    /// here and must not be used afterwards.
    pub(crate) unsafe fn await_event(
        &self,
        event: *mut ffi::PJRT_Event,
        what: &'static str,
    ) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut wait = ffi::PJRT_Event_Await_Args::new();
        wait.event = event;
        // SAFETY: a live event.
        let waited = unsafe { pjrt_call!(self, PJRT_Event_Await, &mut wait) };
        let mut destroy = ffi::PJRT_Event_Destroy_Args::new();
        destroy.event = event;
        // SAFETY: the same live event, destroyed once, here.
        let destroyed = unsafe { pjrt_call!(self, PJRT_Event_Destroy, &mut destroy) };
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
    // SAFETY: non-null and valid for `len` bytes (the caller's contract).
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    //! A fake plugin table built in memory: checks the bounds rule and the error conversion
    //! without any real plugin.

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static DESTROYED: AtomicUsize = AtomicUsize::new(0);
    const MESSAGE: &str = "fake failure";

    unsafe extern "C" fn fake_destroy(_args: *mut c_void) {
        DESTROYED.fetch_add(1, Ordering::SeqCst);
    }

    unsafe extern "C" fn fake_message(args: *mut c_void) {
        // SAFETY: this slot's argument struct.
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Error_Message_Args>() };
        args.message = MESSAGE.as_ptr().cast();
        args.message_size = MESSAGE.len();
    }

    unsafe extern "C" fn fake_code(args: *mut c_void) -> *mut PJRT_Error {
        // SAFETY: this slot's argument struct.
        let args = unsafe { &mut *args.cast::<ffi::PJRT_Error_GetCode_Args>() };
        args.code = 5; // NOT_FOUND
        std::ptr::null_mut()
    }

    unsafe extern "C" fn failing_call(_args: *mut c_void) -> *mut PJRT_Error {
        // Any non-null pointer is an error handle to the caller; the fake functions ignore it.
        std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
    }

    /// A zeroed table of the given `struct_size`, with fake error functions and a failing
    /// `PJRT_Client_Create`.
    fn table(struct_size: usize) -> Box<PJRT_Api> {
        // SAFETY: all-zero is valid for the table (integers, null pointers, `None` slots).
        let mut t: Box<PJRT_Api> = Box::new(unsafe { std::mem::zeroed() });
        t.struct_size = struct_size;
        t.pjrt_api_version.minor_version = 81;
        t.PJRT_Error_Destroy = Some(fake_destroy);
        t.PJRT_Error_Message = Some(fake_message);
        t.PJRT_Error_GetCode = Some(fake_code);
        t.PJRT_Client_Create = Some(failing_call);
        t
    }

    fn end_of(offset: usize) -> usize {
        offset + std::mem::size_of::<usize>()
    }

    #[test]
    fn a_slot_beyond_the_table_is_unsupported_and_never_called() {
        // The table ends just before PJRT_Client_Create.
        let size = std::mem::offset_of!(PJRT_Api, PJRT_Client_Create);
        let t = table(size);
        // SAFETY: the table outlives `api` (both live to the end of the test).
        let api = unsafe { Api::new(&*t) }.unwrap();
        let mut args = ffi::PJRT_Client_Create_Args::new();
        // SAFETY: the fake functions read nothing from the arguments.
        match unsafe { pjrt_call!(api, PJRT_Client_Create, &mut args) } {
            Err(Error::Unsupported {
                function,
                table_size,
                slot_end,
                api_version,
            }) => {
                assert_eq!(function, "PJRT_Client_Create");
                assert_eq!(table_size, size);
                assert_eq!(slot_end, end_of(size));
                assert_eq!(api_version, "0.81");
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn a_null_slot_inside_the_table_is_unsupported() {
        let t = table(std::mem::size_of::<PJRT_Api>());
        // SAFETY: the table outlives `api` (both live to the end of the test).
        let api = unsafe { Api::new(&*t) }.unwrap();
        let mut args = ffi::PJRT_Client_Destroy_Args::new();
        // SAFETY: nothing is called: the slot is null.
        let err = unsafe { pjrt_call!(api, PJRT_Client_Destroy, &mut args) }.unwrap_err();
        assert!(matches!(
            err,
            Error::Unsupported {
                function: "PJRT_Client_Destroy",
                ..
            }
        ));
    }

    #[test]
    fn a_returned_error_is_converted_and_destroyed_once() {
        let t = table(end_of(std::mem::offset_of!(PJRT_Api, PJRT_Client_Create)));
        // SAFETY: the table outlives `api` (both live to the end of the test).
        let api = unsafe { Api::new(&*t) }.unwrap();
        let before = DESTROYED.load(Ordering::SeqCst);
        let mut args = ffi::PJRT_Client_Create_Args::new();
        // SAFETY: the fake functions read nothing from the arguments.
        match unsafe { pjrt_call!(api, PJRT_Client_Create, &mut args) } {
            Err(Error::Pjrt {
                call,
                code,
                message,
            }) => {
                assert_eq!(call, "PJRT_Client_Create");
                assert_eq!(code, ErrorCode::NotFound);
                assert_eq!(message, MESSAGE);
            }
            other => panic!("expected a PJRT error, got {other:?}"),
        }
        assert_eq!(DESTROYED.load(Ordering::SeqCst), before + 1);
    }

    #[test]
    fn a_table_shorter_than_its_header_is_refused() {
        let t = table(8);
        // SAFETY: a live table, and null, which `new` refuses.
        assert!(unsafe { Api::new(&*t) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { Api::new(std::ptr::null()) }.is_err());
    }
}
