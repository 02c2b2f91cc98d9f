//! A PJRT client: the devices of one plugin, and the entry point for compiling programs and moving
//! data to devices.

use std::path::Path;
use std::sync::Arc;

use super::api::{pjrt_call, string_from, Api};
use super::cache::ClientCache;
use super::options::ClientOptions;
use super::plugin::{to_named_value, Plugin, Value};
use super::{cuda, ffi, install};
use crate::error::{Error, Result};

/// A PJRT client over one plugin. Cheap to clone (a reference count).
///
/// `Client` is `Send + Sync`: PJRT clients are thread-safe, and compiling, transferring and
/// executing from several threads at once is supported.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) handle: Arc<ClientHandle>,
    devices: Vec<*mut ffi::PJRT_Device>,
    /// The compile cache: configuration, compiled programs and counters (see `cache`).
    pub(crate) compile_cache: ClientCache,
}

// SAFETY: the device pointers are owned by the client and immutable; the rest is `Send + Sync`.
unsafe impl Send for ClientInner {}
// SAFETY: as above; nothing here is mutated through a shared reference except behind locks.
unsafe impl Sync for ClientInner {}

/// The `PJRT_Client` itself, destroyed when the last holder drops it.
///
/// Destruction order holds by construction: every object the client makes (a loaded program, a
/// buffer) holds an `Arc<ClientHandle>`, directly or through a [`Client`], and destroys its own
/// PJRT object in its `Drop::drop`, which Rust runs before it drops its fields; so the client
/// outlives every object it made, whatever order users drop them in, on whichever thread. The
/// compile cache holds programs but no `Client`, so there is no cycle.
pub(crate) struct ClientHandle {
    plugin: Plugin,
    raw: *mut ffi::PJRT_Client,
}

// SAFETY: a PJRT client is a thread-safe object (`xla::PjRtClient`); the handle only destroys it.
unsafe impl Send for ClientHandle {}
// SAFETY: as above; the handle has no interior mutability.
unsafe impl Sync for ClientHandle {}

impl ClientHandle {
    pub(crate) fn api(&self) -> Api {
        self.plugin.api()
    }

    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Client {
        self.raw
    }
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        // SAFETY: `raw` is a live client, destroyed once, here; nothing it made is alive (see
        // the type's doc). An error while tearing down cannot be acted on; it is converted (and
        // so destroyed).
        let _ = unsafe { pjrt_call!(self.plugin.api(), PJRT_Client_Destroy, &mut args) };
    }
}

impl Client {
    /// A client of the XLA CPU plugin, resolved as [`install::resolve_cpu_plugin`] describes
    /// (`STABLEGRAPH_PJRT_PLUGIN`, which may also name another plugin or be `cuda`, then the
    /// per-user cache, then a one-time fetch).
    pub fn cpu() -> Result<Client> {
        let path = install::resolve_cpu_plugin()?;
        Client::new(&Plugin::load(path)?, &[])
    }

    /// A client of the XLA CPU plugin (resolved as [`Client::cpu`] does) with `devices`
    /// addressable devices (the create option `cpu_device_count`), for programs over a mesh.
    pub fn cpu_with_devices(devices: usize) -> Result<Client> {
        let count = i64::try_from(devices)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("cpu_with_devices: {devices} devices"))
            })?;
        let path = install::resolve_cpu_plugin()?;
        Client::new(
            &Plugin::load(path)?,
            &[("cpu_device_count", Value::Int64(count))],
        )
    }

    /// A client of the plugin at `path`, with no create options.
    pub fn from_plugin_path(path: impl AsRef<Path>) -> Result<Client> {
        Client::new(&Plugin::load(path)?, &[])
    }

    /// A client of JAX's CUDA plugin, found through the Python that `STABLEGRAPH_PYTHON` names
    /// (default `python3`) as [`cuda::locate`] describes, its NVIDIA libraries loaded first,
    /// created with `options` (see [`ClientOptions::from_env`] for JAX's environment variables).
    pub fn cuda(options: &ClientOptions) -> Result<Client> {
        let plugin = cuda::locate(&cuda::python_from_env())?.load()?;
        Client::with_options(&plugin, options)
    }

    /// A client of `plugin` with typed create options, converted as
    /// [`ClientOptions::to_named_values`] says.
    pub fn with_options(plugin: &Plugin, options: &ClientOptions) -> Result<Client> {
        Client::new(plugin, &options.to_named_values()?)
    }

    /// Creates a client with plugin-specific create options, for example
    /// `("cpu_device_count", Value::Int64(4))` for the CPU plugin.
    pub fn new(plugin: &Plugin, options: &[(&str, Value)]) -> Result<Client> {
        let api = plugin.api();
        // The named values point into `options`, which outlives the call.
        let named: Vec<ffi::PJRT_NamedValue> = options
            .iter()
            .map(|(name, value)| to_named_value(name, value))
            .collect();
        let mut args = ffi::PJRT_Client_Create_Args::new();
        args.create_options = named.as_ptr();
        args.num_options = named.len();
        // SAFETY: `named` holds `num_options` values whose pointers point into `options`, which
        // outlive the call; the callbacks and key-value store are null (none).
        unsafe { pjrt_call!(api, PJRT_Client_Create, &mut args) }?;
        if args.client.is_null() {
            return Err(Error::PluginInvalid {
                path: plugin.path().into(),
                message: "PJRT_Client_Create succeeded but returned no client".into(),
            });
        }
        // From here on, dropping `handle` destroys the client.
        let handle = Arc::new(ClientHandle {
            plugin: plugin.clone(),
            raw: args.client,
        });
        let mut dev = ffi::PJRT_Client_AddressableDevices_Args::new();
        dev.client = handle.raw;
        // SAFETY: a live client.
        unsafe { pjrt_call!(api, PJRT_Client_AddressableDevices, &mut dev) }?;
        let mut devices = Vec::new();
        if !dev.addressable_devices.is_null() {
            // SAFETY: the client owns this array of `num_addressable_devices` pointers.
            devices = unsafe {
                std::slice::from_raw_parts(dev.addressable_devices, dev.num_addressable_devices)
            }
            .to_vec();
        }
        if devices.is_empty() || devices.iter().any(|d| d.is_null()) {
            return Err(Error::PluginInvalid {
                path: plugin.path().into(),
                message: format!(
                    "the client lists {} addressable devices, {} of them null",
                    devices.len(),
                    devices.iter().filter(|d| d.is_null()).count()
                ),
            });
        }
        Ok(Client {
            inner: Arc::new(ClientInner {
                handle,
                devices,
                compile_cache: ClientCache::from_env(),
            }),
        })
    }

    /// The plugin this client runs on.
    pub fn plugin(&self) -> &Plugin {
        &self.inner.handle.plugin
    }

    pub(crate) fn api(&self) -> Api {
        self.inner.handle.api()
    }

    /// The `PJRT_Client`, live as long as `self`.
    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Client {
        self.inner.handle.raw()
    }

    /// The platform name, for example `cpu` or `cuda`.
    pub fn platform_name(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformName_Args::new();
        args.client = self.raw();
        // SAFETY: a live client.
        unsafe { pjrt_call!(self.api(), PJRT_Client_PlatformName, &mut args) }?;
        // SAFETY: owned by the client, valid for `platform_name_size` bytes.
        Ok(unsafe { string_from(args.platform_name, args.platform_name_size) })
    }

    /// The platform version string (for CPU, the XLA build).
    pub fn platform_version(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformVersion_Args::new();
        args.client = self.raw();
        // SAFETY: a live client.
        unsafe { pjrt_call!(self.api(), PJRT_Client_PlatformVersion, &mut args) }?;
        // SAFETY: owned by the client, valid for `platform_version_size` bytes.
        Ok(unsafe { string_from(args.platform_version, args.platform_version_size) })
    }

    /// The devices this process can address, in the plugin's order.
    pub fn devices(&self) -> Vec<Device> {
        (0..self.inner.devices.len())
            .map(|index| Device {
                client: self.clone(),
                index,
            })
            .collect()
    }

    /// The number of addressable devices.
    pub fn device_count(&self) -> usize {
        self.inner.devices.len()
    }

    pub(crate) fn raw_device(&self, index: usize) -> Result<*mut ffi::PJRT_Device> {
        self.inner.devices.get(index).copied().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "device index {index} is out of range: the client has {} addressable devices",
                self.inner.devices.len()
            ))
        })
    }

    pub(crate) fn same_as(&self, other: &Client) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("plugin", self.plugin())
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

/// One addressable device of a [`Client`].
#[derive(Clone, Debug)]
pub struct Device {
    client: Client,
    index: usize,
}

impl Device {
    /// The position of this device in [`Client::devices`].
    pub fn index(&self) -> usize {
        self.index
    }

    fn description(&self) -> Result<*mut ffi::PJRT_DeviceDescription> {
        let mut args = ffi::PJRT_Device_GetDescription_Args::new();
        args.device = self.client.raw_device(self.index)?;
        // SAFETY: a device of a live client.
        unsafe { pjrt_call!(self.client.api(), PJRT_Device_GetDescription, &mut args) }?;
        if args.device_description.is_null() {
            return Err(Error::InvalidArgument(format!(
                "the plugin returned no description for device {}",
                self.index
            )));
        }
        Ok(args.device_description)
    }

    /// The device's global id.
    pub fn id(&self) -> Result<i32> {
        let mut args = ffi::PJRT_DeviceDescription_Id_Args::new();
        args.device_description = self.description()?;
        // SAFETY: a live description, owned by the device.
        unsafe { pjrt_call!(self.client.api(), PJRT_DeviceDescription_Id, &mut args) }?;
        Ok(args.id)
    }

    /// The device kind, for example `cpu` or the GPU model.
    pub fn kind(&self) -> Result<String> {
        let mut args = ffi::PJRT_DeviceDescription_Kind_Args::new();
        args.device_description = self.description()?;
        // SAFETY: a live description, owned by the device.
        unsafe { pjrt_call!(self.client.api(), PJRT_DeviceDescription_Kind, &mut args) }?;
        // SAFETY: owned by the description, valid for `device_kind_size` bytes.
        Ok(unsafe { string_from(args.device_kind, args.device_kind_size) })
    }

    /// A short human-readable description, for example `CpuDevice(id=0)`.
    pub fn describe(&self) -> Result<String> {
        let mut args = ffi::PJRT_DeviceDescription_ToString_Args::new();
        args.device_description = self.description()?;
        // SAFETY: a live description, owned by the device.
        unsafe {
            pjrt_call!(
                self.client.api(),
                PJRT_DeviceDescription_ToString,
                &mut args
            )
        }?;
        // SAFETY: owned by the description, valid for `to_string_size` bytes.
        Ok(unsafe { string_from(args.to_string, args.to_string_size) })
    }
}
