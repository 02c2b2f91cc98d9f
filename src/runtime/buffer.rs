//! Device buffers: moving typed data between the host and a device.

use std::sync::atomic::{AtomicBool, Ordering};

use ndarray::{ArrayBase, ArrayD, Data, Dimension, IxDyn};

use super::api::pjrt_call;
use super::client::Client;
use super::ffi;
use crate::array::HostArray;
use crate::dtype::{as_bytes, DType, Element, TensorType};
use crate::error::{Error, Result};
use crate::with_host_array;

/// An array that lives on a device. Executions take buffers and return buffers, so a result can
/// feed the next execution without a trip through the host.
///
/// `Buffer` is `Send + Sync`: a PJRT buffer may be read, copied to the host or passed to
/// executions from any thread. It is destroyed exactly once, when dropped.
///
/// A buffer passed to a donated parameter of a program (see [`Executable::donated_inputs`]) gives
/// its device memory to that execution. From then on it is [donated](Buffer::is_donated): reading
/// it or passing it to another execution is an [`Error::InvalidArgument`], checked before PJRT is
/// called. Its shape and element type can still be read. A read racing with a donation on another
/// thread gets either the data or an error (PJRT checks as well), never freed memory: the
/// `PJRT_Buffer` handle lives until the `Buffer` is dropped.
///
/// [`Executable::donated_inputs`]: super::Executable::donated_inputs
pub struct Buffer {
    client: Client,
    raw: *mut ffi::PJRT_Buffer,
    /// The device it lives on, an index into [`Client::devices`].
    device: usize,
    dtype: DType,
    dims: Vec<usize>,
    /// Set once an execution has taken over the device memory; the `PJRT_Buffer` handle itself
    /// stays alive (PJRT still needs `PJRT_Buffer_Destroy`) until `Drop`.
    donated: AtomicBool,
}

// SAFETY: PJRT buffers (`xla::PjRtBuffer`) are thread-safe; `Buffer` only exposes operations that
// PJRT allows concurrently (reads, transfers to host, use as an execution argument).
unsafe impl Send for Buffer {}
// SAFETY: as above; the only Rust-side mutation is the atomic `donated` flag.
unsafe impl Sync for Buffer {}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Buffer_Destroy_Args::new();
        args.buffer = self.raw;
        // SAFETY: a live buffer of `self.client`, which is dropped only after this body, so the
        // PJRT client outlives the buffer; destroyed once, here. An error while freeing cannot be
        // acted on; it is converted (and so destroyed).
        let _ = unsafe { pjrt_call!(self.client.api(), PJRT_Buffer_Destroy, &mut args) };
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({}{:?})", self.dtype, self.dims)
    }
}

fn element_count(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::InvalidArgument(format!("shape {dims:?} has too many elements")))
}

impl Client {
    /// Copies `data` (row-major, `dims` shape) to device 0.
    pub fn buffer_from_slice<T: Element>(&self, data: &[T], dims: &[usize]) -> Result<Buffer> {
        self.buffer_from_bytes(T::DTYPE, dims, as_bytes(data), 0)
    }

    /// Copies an ndarray (any memory order) to device 0.
    pub fn buffer_from_array<T, S, D>(&self, array: &ArrayBase<S, D>) -> Result<Buffer>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        let dims = array.shape().to_vec();
        match array.as_slice() {
            Some(slice) => self.buffer_from_slice(slice, &dims),
            None => {
                let owned: Vec<T> = array.iter().copied().collect();
                self.buffer_from_slice(&owned, &dims)
            }
        }
    }

    /// Copies a [`HostArray`] (any element type) to device 0, with its dtype and shape.
    pub fn buffer_from_host_array(&self, array: &HostArray) -> Result<Buffer> {
        with_host_array!(array, a => self.buffer_from_array(a))
    }

    /// Copies a scalar to device 0 as a rank-0 buffer.
    pub fn buffer_from_scalar<T: Element>(&self, value: T) -> Result<Buffer> {
        self.buffer_from_slice(&[value], &[])
    }

    /// Copies raw row-major bytes of `dtype` elements with shape `dims` to the device at `device`
    /// (an index into [`Client::devices`]). `bytes` must hold exactly the shape's elements.
    pub fn buffer_from_bytes(
        &self,
        dtype: DType,
        dims: &[usize],
        bytes: &[u8],
        device: usize,
    ) -> Result<Buffer> {
        let expected = element_count(dims)?
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| Error::InvalidArgument(format!("shape {dims:?} is too large")))?;
        if bytes.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "a {dtype} buffer of shape {dims:?} needs {expected} bytes, got {}",
                bytes.len()
            )));
        }
        let dims_i64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let mut args = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.raw();
        // PJRT reads nothing for an empty shape, but the pointer must not be null.
        args.data = if bytes.is_empty() {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            bytes.as_ptr().cast()
        };
        args.type_ = dtype.to_pjrt();
        args.dims = dims_i64.as_ptr();
        args.num_dims = dims_i64.len();
        args.host_buffer_semantics = ffi::PJRT_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL;
        args.device = self.raw_device(device)?;
        // SAFETY: a live client and one of its devices; `data` holds the shape's bytes (checked
        // above) and `dims` its dimensions, both alive until the host-buffer event completes
        // (awaited below, before they are dropped); byte strides, memory and layout are null
        // (dense row-major on the device's default memory).
        unsafe { pjrt_call!(self.api(), PJRT_Client_BufferFromHostBuffer, &mut args) }?;
        if args.buffer.is_null() {
            // SAFETY: the call's event, ours to destroy; its error, if any, says more.
            unsafe {
                self.api().await_event(
                    args.done_with_host_buffer,
                    "PJRT_Client_BufferFromHostBuffer",
                )
            }?;
            return Err(Error::InvalidArgument(
                "PJRT_Client_BufferFromHostBuffer returned no buffer".into(),
            ));
        }
        let buffer = Buffer {
            client: self.clone(),
            raw: args.buffer,
            device,
            dtype,
            dims: dims.to_vec(),
            donated: AtomicBool::new(false),
        };
        // The host data was only borrowed for the call; the event says when PJRT is done with it.
        // SAFETY: the call's event (or null), ours to destroy.
        unsafe {
            self.api().await_event(
                args.done_with_host_buffer,
                "PJRT_Client_BufferFromHostBuffer",
            )
        }?;
        Ok(buffer)
    }
}

impl Buffer {
    /// Wraps a buffer returned by an execution on `device` (an index into [`Client::devices`]),
    /// reading its element type and shape.
    ///
    /// # Safety
    /// `raw` must be a live, non-null buffer of `client`, whose ownership passes to the result
    /// (it is destroyed exactly once, by the `Buffer`, even when this returns an error).
    pub(crate) unsafe fn from_raw(
        client: &Client,
        raw: *mut ffi::PJRT_Buffer,
        device: usize,
    ) -> Result<Buffer> {
        let api = client.api();
        // Take ownership first, so that the buffer is destroyed whatever happens below.
        let mut buffer = Buffer {
            client: client.clone(),
            raw,
            device,
            dtype: DType::F32,
            dims: Vec::new(),
            donated: AtomicBool::new(false),
        };
        let mut ty = ffi::PJRT_Buffer_ElementType_Args::new();
        ty.buffer = raw;
        // SAFETY: a live buffer (the caller's contract).
        unsafe { pjrt_call!(api, PJRT_Buffer_ElementType, &mut ty) }?;
        buffer.dtype = DType::from_pjrt(ty.type_).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the program returned a buffer of PJRT element type {}, which stablegraph does \
                 not support",
                ty.type_
            ))
        })?;
        let mut dims = ffi::PJRT_Buffer_Dimensions_Args::new();
        dims.buffer = raw;
        // SAFETY: a live buffer (the caller's contract).
        unsafe { pjrt_call!(api, PJRT_Buffer_Dimensions, &mut dims) }?;
        if dims.num_dims > 0 {
            if dims.dims.is_null() {
                return Err(Error::InvalidArgument(format!(
                    "the plugin reports a rank-{} buffer but returned no dimensions",
                    dims.num_dims
                )));
            }
            // SAFETY: non-null (checked), owned by the buffer, valid for `num_dims` elements.
            let raw_dims = unsafe { std::slice::from_raw_parts(dims.dims, dims.num_dims) };
            buffer.dims = raw_dims
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| {
                    Error::InvalidArgument(format!(
                        "the program returned a buffer of dimensions {raw_dims:?}; dynamic \
                         dimensions are not supported"
                    ))
                })?;
            element_count(&buffer.dims)?;
        }
        Ok(buffer)
    }

    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Buffer {
        self.raw
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Whether an execution has taken over this buffer's device memory (it was passed to a
    /// donated parameter). A donated buffer can no longer be read or passed to executions; drop it,
    /// and use the execution's output instead.
    pub fn is_donated(&self) -> bool {
        self.donated.load(Ordering::Acquire)
    }

    /// Records that an execution took over the device memory.
    pub(crate) fn mark_donated(&self) {
        self.donated.store(true, Ordering::Release);
    }

    /// An error if the buffer was donated, so that no later use reaches PJRT.
    pub(crate) fn check_usable(&self) -> Result<()> {
        if self.is_donated() {
            return Err(Error::InvalidArgument(format!(
                "buffer {}{:?} was donated to an execution and can no longer be used",
                self.dtype, self.dims
            )));
        }
        Ok(())
    }

    /// Asks PJRT whether the buffer's device memory is gone (`PJRT_Buffer_IsDeleted`), and marks
    /// the buffer donated if so. Used after a failed execution, where PJRT may or may not have
    /// consumed the donated arguments.
    pub(crate) fn sync_donated_with_pjrt(&self) -> Result<()> {
        let mut args = ffi::PJRT_Buffer_IsDeleted_Args::new();
        args.buffer = self.raw;
        // SAFETY: a live buffer handle (its memory may be gone; the handle is not).
        unsafe { pjrt_call!(self.client.api(), PJRT_Buffer_IsDeleted, &mut args) }?;
        if args.is_deleted {
            self.mark_donated();
        }
        Ok(())
    }

    /// The device it lives on, an index into [`Client::devices`].
    pub fn device(&self) -> usize {
        self.device
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The number of elements.
    pub fn element_count(&self) -> usize {
        self.dims.iter().product()
    }

    /// Copies the buffer to the host as raw row-major bytes, waiting for the copy to finish (and
    /// so for the computation that produces the buffer). A [donated](Buffer::is_donated) buffer
    /// is an [`Error::InvalidArgument`].
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.check_usable()?;
        let api = self.client.api();
        let expected = self.element_count() * self.dtype.size_in_bytes();
        let mut query = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        query.src = self.raw;
        // SAFETY: a live buffer; a null destination asks for the size only.
        unsafe { pjrt_call!(api, PJRT_Buffer_ToHostBuffer, &mut query) }?;
        // A size query starts no copy; should a plugin return an event anyway, free it.
        // SAFETY: the call's event (or null), ours to destroy.
        unsafe { api.await_event(query.event, "PJRT_Buffer_ToHostBuffer") }?;
        if query.dst_size != expected {
            return Err(Error::InvalidArgument(format!(
                "the device reports {} bytes for a {} buffer of shape {:?}, expected {expected} \
                 (a non-dense device layout is not supported)",
                query.dst_size, self.dtype, self.dims
            )));
        }
        let mut out = vec![0u8; expected];
        if expected == 0 {
            return Ok(out);
        }
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        args.dst = out.as_mut_ptr().cast();
        args.dst_size = out.len();
        // SAFETY: a live buffer and a destination of `dst_size` bytes, which stays alive and
        // untouched until the copy's event completes, below.
        unsafe { pjrt_call!(api, PJRT_Buffer_ToHostBuffer, &mut args) }?;
        // SAFETY: the call's event (or null), ours to destroy.
        unsafe { api.await_event(args.event, "PJRT_Buffer_ToHostBuffer") }?;
        Ok(out)
    }

    fn check_dtype<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::InvalidArgument(format!(
                "cannot read a {} buffer of shape {:?} as {}",
                self.dtype,
                self.dims,
                T::DTYPE
            )));
        }
        Ok(())
    }

    /// Copies the buffer to the host as a row-major `Vec`; `T` must match [`Buffer::dtype`].
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype::<T>()?;
        Ok(T::from_bytes(&self.to_bytes()?))
    }

    /// Copies the buffer to the host as an ndarray; `T` must match [`Buffer::dtype`].
    pub fn to_array<T: Element>(&self) -> Result<ArrayD<T>> {
        let data = self.to_vec::<T>()?;
        ArrayD::from_shape_vec(IxDyn(&self.dims), data)
            .map_err(|e| Error::InvalidArgument(format!("buffer shape {:?}: {e}", self.dims)))
    }

    /// Copies the buffer to the host as a [`HostArray`] of its own dtype and shape (no type to
    /// name: the download for code that handles every dtype).
    pub fn to_host_array(&self) -> Result<HostArray> {
        HostArray::from_bytes(&TensorType::new(self.dtype, &self.dims), &self.to_bytes()?)
    }

    /// Copies a rank-0 (or one-element) buffer to the host as a scalar.
    pub fn to_scalar<T: Element>(&self) -> Result<T> {
        let v = self.to_vec::<T>()?;
        match v.as_slice() {
            [x] => Ok(*x),
            _ => Err(Error::InvalidArgument(format!(
                "to_scalar on a buffer of shape {:?} ({} elements)",
                self.dims,
                v.len()
            ))),
        }
    }
}
