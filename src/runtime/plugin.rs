//! Loading a PJRT plugin shared object and reading its attributes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::api::{pjrt_call, string_from, Api};
use super::ffi;
use crate::error::{Error, Result};

/// A named value, as PJRT passes plugin attributes and client create options.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    String(String),
    /// A 64-bit integer.
    Int64(i64),
    /// A list of 64-bit integers.
    Int64List(Vec<i64>),
    /// A 32-bit float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

/// A loaded PJRT plugin. Cheap to clone; loading the same path twice gives the same plugin.
///
/// Plugins are never unloaded: XLA plugins start threads and register global state, and unloading
/// one while any of that lives crashes the process. A loaded plugin therefore lives until exit.
///
/// `Plugin` is `Send + Sync`: it is an immutable function table.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    path: PathBuf,
    api: Api,
    attributes: Vec<(String, Value)>,
    // Keeps the library mapped (`None` for the test fake); the registry below keeps every
    // `PluginInner` alive forever.
    _library: Option<libloading::Library>,
}

/// Plugins loaded so far, by canonical path.
static LOADED: Mutex<Option<HashMap<PathBuf, Plugin>>> = Mutex::new(None);

impl Plugin {
    /// Loads the plugin shared object at `path` (for example `xla_cuda_plugin.so`), calls its
    /// `GetPjrtApi` and `PJRT_Plugin_Initialize`, and reads its attributes.
    ///
    /// The first call in a process first sets XLA's log level (`TF_CPP_MIN_LOG_LEVEL`, which
    /// XLA reads while its shared object loads): errors only, unless `STABLEGRAPH_LOG`,
    /// [`super::set_xla_log_level`] or a `TF_CPP_MIN_LOG_LEVEL` of the user's says otherwise
    /// (see [`super::XlaLogLevel`]). A plugin file in a `jax_plugins/xla_cudaNN/` folder (JAX's
    /// CUDA plugin) first has the NVIDIA libraries of its site-packages loaded, as JAX loads them
    /// ([`super::CudaPlugin::beside`]).
    ///
    /// Errors distinguish a missing file ([`Error::PluginNotFound`]), a file the dynamic loader
    /// refuses ([`Error::PluginLoad`]), a library without `GetPjrtApi` ([`Error::NotAPlugin`]) and
    /// an unusable function table ([`Error::PluginInvalid`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        super::logging::apply_before_first_load();
        let path = path.as_ref();
        if !path.is_file() {
            return Err(Error::PluginNotFound { path: path.into() });
        }
        let canonical = path
            .canonicalize()
            .map_err(|e| Error::io(format!("resolving {}", path.display()), e))?;
        // Holding the lock while loading makes `PJRT_Plugin_Initialize` run once per plugin.
        let mut loaded = LOADED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let loaded = loaded.get_or_insert_with(HashMap::new);
        if let Some(plugin) = loaded.get(&canonical) {
            return Ok(plugin.clone());
        }
        let plugin = Plugin::open(&canonical)?;
        loaded.insert(canonical, plugin.clone());
        Ok(plugin)
    }

    fn open(path: &Path) -> Result<Plugin> {
        // JAX's CUDA plugin finds its NVIDIA libraries only once they are loaded (see `cuda`).
        let not_preloaded = super::cuda::prepare_to_load(path);
        // SAFETY: loading a shared object runs its initialisers; that is what loading a plugin
        // means, and the caller chose the file.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| {
            let mut message = e.to_string();
            if !not_preloaded.is_empty() {
                message += &format!(
                    " (the CUDA libraries that failed to preload: {})",
                    not_preloaded.join("; ")
                );
            }
            Error::PluginLoad {
                path: path.into(),
                message,
            }
        })?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get_api = unsafe { library.get::<ffi::GetPjrtApiFn>(b"GetPjrtApi\0") }
            .map_err(|_| Error::NotAPlugin { path: path.into() })?;
        // SAFETY: calling the plugin's entry point; it returns a static table or null.
        let raw = unsafe { get_api() };
        // SAFETY: the table is static plugin data and the library is never unloaded.
        let api = unsafe { Api::new(raw) }.map_err(|message| Error::PluginInvalid {
            path: path.into(),
            message,
        })?;
        let (major, minor) = api.version();
        if major != 0 {
            return Err(Error::PluginInvalid {
                path: path.into(),
                message: format!(
                    "its PJRT C API version is {major}.{minor}; stablegraph speaks major version 0"
                ),
            });
        }
        let mut init = ffi::PJRT_Plugin_Initialize_Args::new();
        // SAFETY: the arguments hold no pointers.
        match unsafe { pjrt_call!(api, PJRT_Plugin_Initialize, &mut init) } {
            Ok(()) | Err(Error::Unsupported { .. }) => {}
            Err(e) => return Err(e),
        }
        let attributes = read_attributes(&api).unwrap_or_default();
        Ok(Plugin {
            inner: Arc::new(PluginInner {
                path: path.into(),
                api,
                attributes,
                _library: Some(library),
            }),
        })
    }

    /// A plugin over an in-memory function table, for tests.
    ///
    /// # Safety
    /// `raw` must point to a `PJRT_Api` that lives as long as the process.
    #[cfg(test)]
    pub(crate) unsafe fn from_table(raw: *const ffi::PJRT_Api, name: &str) -> Result<Plugin> {
        // SAFETY: the caller guarantees the table.
        let api = unsafe { Api::new(raw) }.map_err(|message| Error::PluginInvalid {
            path: name.into(),
            message,
        })?;
        Ok(Plugin {
            inner: Arc::new(PluginInner {
                path: name.into(),
                api,
                attributes: Vec::new(),
                _library: None,
            }),
        })
    }

    /// The plugin file's canonical path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The PJRT C API version the plugin implements, `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        self.inner.api.version()
    }

    /// The plugin's attributes (for example `stablehlo_current_version`, `xla_version`).
    pub fn attributes(&self) -> &[(String, Value)] {
        &self.inner.attributes
    }

    /// One attribute by name.
    pub fn attribute(&self, name: &str) -> Option<&Value> {
        self.inner
            .attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// The newest StableHLO version the plugin accepts, from its `stablehlo_current_version`
    /// attribute, as `[major, minor, patch]`.
    pub fn stablehlo_version(&self) -> Option<Vec<i64>> {
        match self.attribute("stablehlo_current_version")? {
            Value::Int64List(v) => Some(v.clone()),
            _ => None,
        }
    }

    pub(crate) fn api(&self) -> Api {
        self.inner.api
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.api_version();
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("api_version", &format_args!("{major}.{minor}"))
            .finish()
    }
}

fn read_attributes(api: &Api) -> Result<Vec<(String, Value)>> {
    let mut args = ffi::PJRT_Plugin_Attributes_Args::new();
    // SAFETY: the arguments hold no pointers on input.
    unsafe { pjrt_call!(api, PJRT_Plugin_Attributes, &mut args) }?;
    // SAFETY: the plugin returns `num_attributes` values it owns for its lifetime.
    Ok(unsafe { named_values(args.attributes, args.num_attributes) })
}

/// `value` as the `PJRT_NamedValue` named `name`, which points into both: they must outlive every
/// use of it. The value union is written at its start, as C lays out a union: a float's four
/// bytes or a bool's one byte first, whatever the byte order.
pub(crate) fn to_named_value(name: &str, value: &Value) -> ffi::PJRT_NamedValue {
    let start = |bytes: &[u8]| {
        let mut union = [0u8; 8];
        union[..bytes.len()].copy_from_slice(bytes);
        u64::from_ne_bytes(union)
    };
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
        Value::Float(f) => (ffi::PJRT_NAMED_VALUE_FLOAT, start(&f.to_ne_bytes()), 1),
        Value::Bool(b) => (ffi::PJRT_NAMED_VALUE_BOOL, start(&[u8::from(*b)]), 1),
    };
    ffi::PJRT_NamedValue {
        struct_size: ffi::PJRT_NamedValue::STRUCT_SIZE,
        extension_start: std::ptr::null_mut(),
        name: name.as_ptr().cast::<std::ffi::c_char>(),
        name_size: name.len(),
        type_,
        value: raw,
        value_size: size,
    }
}

/// Copies a plugin-owned array of `PJRT_NamedValue`.
///
/// # Safety
/// `values` must be null or valid for `n` elements, each with valid pointers for its type.
pub(crate) unsafe fn named_values(
    values: *const ffi::PJRT_NamedValue,
    n: usize,
) -> Vec<(String, Value)> {
    if values.is_null() {
        return Vec::new();
    }
    // SAFETY: non-null and valid for `n` elements (the caller's contract).
    let values = unsafe { std::slice::from_raw_parts(values, n) };
    values
        .iter()
        .filter_map(|v| {
            if v.name.is_null() {
                return None;
            }
            // SAFETY: non-null, and valid for `name_size` bytes (the caller's contract).
            let name = unsafe { string_from(v.name, v.name_size) };
            let value = match v.type_ {
                // SAFETY: a string value's pointer is null (read as "") or valid for
                // `value_size` bytes.
                ffi::PJRT_NAMED_VALUE_STRING => Value::String(unsafe {
                    string_from(v.value as usize as *const _, v.value_size)
                }),
                ffi::PJRT_NAMED_VALUE_INT64 => Value::Int64(v.value as i64),
                ffi::PJRT_NAMED_VALUE_INT64_LIST => {
                    let ptr = v.value as usize as *const i64;
                    if ptr.is_null() {
                        Value::Int64List(Vec::new())
                    } else {
                        // SAFETY: non-null, valid for `value_size` integers.
                        Value::Int64List(unsafe {
                            std::slice::from_raw_parts(ptr, v.value_size).to_vec()
                        })
                    }
                }
                ffi::PJRT_NAMED_VALUE_FLOAT => {
                    let [a, b, c, d, ..] = v.value.to_ne_bytes();
                    Value::Float(f32::from_ne_bytes([a, b, c, d]))
                }
                ffi::PJRT_NAMED_VALUE_BOOL => Value::Bool(v.value.to_ne_bytes()[0] != 0),
                _ => return None,
            };
            Some((name, value))
        })
        .collect()
}
