//! A PJRT client: the devices of one plugin, and the entry point for compiling programs and moving
//! data to devices.

use std::ffi::c_char;
use std::path::Path;
use std::sync::Arc;

use super::api::{pjrt_call, string_from, Api};
use super::cache::ClientCache;
use super::plugin::{Plugin, Value};
use super::{ffi, install};
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
    pub(crate) plugin: Plugin,
    pub(crate) raw: *mut ffi::PJRT_Client,
    devices: Vec<*mut ffi::PJRT_Device>,
    /// The compile cache: configuration, compiled programs and counters (see `cache`).
    pub(crate) compile_cache: ClientCache,
}

// SAFETY: a PJRT client is a thread-safe object (`xla::PjRtClient`), and the device pointers it
// hands out are owned by it and immutable.
unsafe impl Send for ClientInner {}
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Cached executables must be destroyed before their client.
        self.compile_cache.clear();
        let mut args = ffi::PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        // An error while tearing down cannot be acted on; it is converted (and so destroyed).
        let _ = pjrt_call!(self.plugin.api(), PJRT_Client_Destroy, &mut args);
    }
}

impl Client {
    /// A client of the XLA CPU plugin, resolved as [`install::resolve_cpu_plugin`] describes
    /// (`STABLEGRAPH_PJRT_PLUGIN`, then the per-user cache, then a one-time fetch).
    pub fn cpu() -> Result<Client> {
        let path = install::resolve_cpu_plugin()?;
        Client::new(&Plugin::load(path)?, &[])
    }

    /// A client of the plugin at `path`, with no create options.
    pub fn from_plugin_path(path: impl AsRef<Path>) -> Result<Client> {
        Client::new(&Plugin::load(path)?, &[])
    }

    /// Creates a client with plugin-specific create options, for example
    /// `("cpu_device_count", Value::Int64(4))` for the CPU plugin.
    pub fn new(plugin: &Plugin, options: &[(&str, Value)]) -> Result<Client> {
        let api = plugin.api();
        // The named values point into `options`, which outlives the call.
        let named: Vec<ffi::PJRT_NamedValue> = options
            .iter()
            .map(|(name, value)| {
                let (type_, raw, size) = match value {
                    Value::String(s) => (
                        ffi::PJRT_NAMED_VALUE_STRING,
                        s.as_ptr() as usize as u64,
                        s.len(),
                    ),
                    Value::Int64(i) => (ffi::PJRT_NAMED_VALUE_INT64, *i as u64, 1),
                    Value::Int64List(l) => (
                        ffi::PJRT_NAMED_VALUE_INT64_LIST,
                        l.as_ptr() as usize as u64,
                        l.len(),
                    ),
                    Value::Float(f) => (ffi::PJRT_NAMED_VALUE_FLOAT, f.to_bits() as u64, 1),
                    Value::Bool(b) => (ffi::PJRT_NAMED_VALUE_BOOL, *b as u64, 1),
                };
                ffi::PJRT_NamedValue {
                    struct_size: ffi::PJRT_NamedValue::STRUCT_SIZE,
                    extension_start: std::ptr::null_mut(),
                    name: name.as_ptr().cast::<c_char>(),
                    name_size: name.len(),
                    type_,
                    value: raw,
                    value_size: size,
                }
            })
            .collect();
        let mut args = ffi::PJRT_Client_Create_Args::new();
        args.create_options = named.as_ptr();
        args.num_options = named.len();
        pjrt_call!(api, PJRT_Client_Create, &mut args)?;
        if args.client.is_null() {
            return Err(Error::PluginInvalid {
                path: plugin.path().into(),
                message: "PJRT_Client_Create succeeded but returned no client".into(),
            });
        }
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            raw: args.client,
            devices: Vec::new(),
            compile_cache: ClientCache::from_env(),
        };
        // From here on, dropping `inner` destroys the client.
        let mut dev = ffi::PJRT_Client_AddressableDevices_Args::new();
        dev.client = inner.raw;
        pjrt_call!(api, PJRT_Client_AddressableDevices, &mut dev)?;
        if !dev.addressable_devices.is_null() {
            // SAFETY: the client owns this array of `num_addressable_devices` pointers.
            inner.devices = unsafe {
                std::slice::from_raw_parts(dev.addressable_devices, dev.num_addressable_devices)
            }
            .to_vec();
        }
        if inner.devices.is_empty() {
            return Err(Error::PluginInvalid {
                path: plugin.path().into(),
                message: "the client has no addressable devices".into(),
            });
        }
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// The plugin this client runs on.
    pub fn plugin(&self) -> &Plugin {
        &self.inner.plugin
    }

    pub(crate) fn api(&self) -> Api {
        self.inner.plugin.api()
    }

    /// The platform name, for example `cpu` or `cuda`.
    pub fn platform_name(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformName_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.api(), PJRT_Client_PlatformName, &mut args)?;
        // SAFETY: owned by the client, valid for `platform_name_size` bytes.
        Ok(unsafe { string_from(args.platform_name, args.platform_name_size) })
    }

    /// The platform version string (for CPU, the XLA build).
    pub fn platform_version(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformVersion_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.api(), PJRT_Client_PlatformVersion, &mut args)?;
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
            .field("plugin", &self.inner.plugin)
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
        pjrt_call!(self.client.api(), PJRT_Device_GetDescription, &mut args)?;
        Ok(args.device_description)
    }

    /// The device's global id.
    pub fn id(&self) -> Result<i32> {
        let mut args = ffi::PJRT_DeviceDescription_Id_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(self.client.api(), PJRT_DeviceDescription_Id, &mut args)?;
        Ok(args.id)
    }

    /// The device kind, for example `cpu` or the GPU model.
    pub fn kind(&self) -> Result<String> {
        let mut args = ffi::PJRT_DeviceDescription_Kind_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(self.client.api(), PJRT_DeviceDescription_Kind, &mut args)?;
        // SAFETY: owned by the description, valid for `device_kind_size` bytes.
        Ok(unsafe { string_from(args.device_kind, args.device_kind_size) })
    }

    /// A short human-readable description, for example `CpuDevice(id=0)`.
    pub fn describe(&self) -> Result<String> {
        let mut args = ffi::PJRT_DeviceDescription_ToString_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(
            self.client.api(),
            PJRT_DeviceDescription_ToString,
            &mut args
        )?;
        // SAFETY: owned by the description, valid for `to_string_size` bytes.
        Ok(unsafe { string_from(args.to_string, args.to_string_size) })
    }
}
