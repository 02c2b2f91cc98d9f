//! Typed create options for a GPU client, converted to the named values XLA's GPU plugin reads.
//!
//! The names and types are those XLA's GPU plugin accepts in `PJRT_Client_Create`
//! (`xla/pjrt/c/pjrt_c_api_gpu_internal.cc`, which refuses an unknown name or a wrong type) and
//! JAX passes (`generate_pjrt_gpu_plugin_options` in `jaxlib/xla_client.py`, `visible_devices` in
//! `jax/_src/xla_bridge.py`): `memory_fraction` a float, `preallocate` a bool, `visible_devices`
//! an int64 list, `allocator` a string.

use super::plugin::Value;
use crate::error::{Error, Result};

/// The GPU memory allocator XLA's GPU plugin uses (its `allocator` create option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GpuAllocator {
    /// XLA's choice (`default`): today the BFC allocator.
    Default,
    /// XLA's best-fit-with-coalescing pool (`bfc`), which `memory_fraction` and `preallocate`
    /// size.
    Bfc,
    /// Allocates and frees on demand with `cudaMalloc` (`platform`): slow, but holds only what is
    /// live; `memory_fraction` and `preallocate` do not apply.
    Platform,
    /// CUDA's stream-ordered allocator (`cuda_async`).
    CudaAsync,
    /// A virtual-memory allocator (`vmm`); plugins from April 2026 on only.
    Vmm,
}

impl GpuAllocator {
    /// The name the plugin reads.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuAllocator::Default => "default",
            GpuAllocator::Bfc => "bfc",
            GpuAllocator::Platform => "platform",
            GpuAllocator::CudaAsync => "cuda_async",
            GpuAllocator::Vmm => "vmm",
        }
    }

    /// The allocator of a name the plugin reads (any case).
    pub fn parse(name: &str) -> Result<GpuAllocator> {
        let lower = name.trim().to_ascii_lowercase();
        ALLOCATORS
            .into_iter()
            .find(|a| a.as_str() == lower)
            .ok_or_else(|| Error::InvalidArgument(unknown_allocator(name)))
    }
}

/// Every allocator, in the order the error lists them.
const ALLOCATORS: [GpuAllocator; 5] = [
    GpuAllocator::Default,
    GpuAllocator::Bfc,
    GpuAllocator::Platform,
    GpuAllocator::CudaAsync,
    GpuAllocator::Vmm,
];

fn unknown_allocator(name: &str) -> String {
    let names: Vec<&str> = ALLOCATORS.iter().map(|a| a.as_str()).collect();
    format!(
        "unknown GPU allocator {name:?}; known: {}",
        names.join(", ")
    )
}

/// Create options for a GPU client (see [`super::Client::with_options`] and
/// [`super::Client::cuda`]). Every field left `None` is not passed, so the plugin's default
/// holds (XLA's: the BFC allocator, 75% of each GPU's memory, preallocated; every GPU).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientOptions {
    /// The fraction of each GPU's memory the allocator may take, in (0, 1] (`memory_fraction`).
    pub memory_fraction: Option<f32>,
    /// Whether the allocator takes that memory when the client is created (`preallocate`).
    pub preallocate: Option<bool>,
    /// The GPUs the client uses, by CUDA device ordinal (`visible_devices`).
    pub visible_devices: Option<Vec<usize>>,
    /// The allocator (`allocator`).
    pub allocator: Option<GpuAllocator>,
}

/// JAX's variable for the memory fraction, and its deprecated older name.
const MEM_FRACTION: [&str; 2] = ["XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"];
const PREALLOCATE: &str = "XLA_PYTHON_CLIENT_PREALLOCATE";
const ALLOCATOR: &str = "XLA_PYTHON_CLIENT_ALLOCATOR";

impl ClientOptions {
    /// No options: the plugin's defaults.
    pub fn new() -> ClientOptions {
        ClientOptions::default()
    }

    /// Sets [`ClientOptions::memory_fraction`].
    pub fn memory_fraction(mut self, fraction: f32) -> ClientOptions {
        self.memory_fraction = Some(fraction);
        self
    }

    /// Sets [`ClientOptions::preallocate`].
    pub fn preallocate(mut self, preallocate: bool) -> ClientOptions {
        self.preallocate = Some(preallocate);
        self
    }

    /// Sets [`ClientOptions::visible_devices`].
    pub fn visible_devices(mut self, devices: &[usize]) -> ClientOptions {
        self.visible_devices = Some(devices.to_vec());
        self
    }

    /// Sets [`ClientOptions::allocator`].
    pub fn allocator(mut self, allocator: GpuAllocator) -> ClientOptions {
        self.allocator = Some(allocator);
        self
    }

    /// The options JAX takes from the environment, read as JAX reads them:
    /// `XLA_CLIENT_MEM_FRACTION` (or the older `XLA_PYTHON_CLIENT_MEM_FRACTION`, not both),
    /// `XLA_PYTHON_CLIENT_PREALLOCATE` (`false`, `False` or `0` turn it off, anything else on)
    /// and `XLA_PYTHON_CLIENT_ALLOCATOR`. An unset or empty variable leaves its option `None`.
    /// (JAX's visible devices are a config setting, not a variable; CUDA's own
    /// `CUDA_VISIBLE_DEVICES` works below the plugin either way.)
    pub fn from_env() -> Result<ClientOptions> {
        ClientOptions::from_vars(|name| std::env::var(name).ok())
    }

    /// [`ClientOptions::from_env`] over a given lookup of variables.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<ClientOptions> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let fraction = match (get(MEM_FRACTION[0]), get(MEM_FRACTION[1])) {
            (Some(_), Some(_)) => {
                return Err(Error::InvalidArgument(format!(
                    "{} and {} are both set; remove the second, older name",
                    MEM_FRACTION[0], MEM_FRACTION[1]
                )))
            }
            (Some(v), None) => Some((MEM_FRACTION[0], v)),
            (None, Some(v)) => Some((MEM_FRACTION[1], v)),
            (None, None) => None,
        };
        let memory_fraction = match fraction {
            Some((name, v)) => Some(
                v.trim()
                    .parse::<f32>()
                    .map_err(|_| Error::InvalidArgument(format!("{name}={v} is not a number")))?,
            ),
            None => None,
        };
        let allocator = match get(ALLOCATOR) {
            Some(v) => Some(GpuAllocator::parse(&v).map_err(|_| {
                Error::InvalidArgument(format!("{ALLOCATOR}: {}", unknown_allocator(&v)))
            })?),
            None => None,
        };
        Ok(ClientOptions {
            memory_fraction,
            preallocate: get(PREALLOCATE).map(|v| !matches!(v.as_str(), "false" | "False" | "0")),
            visible_devices: None,
            allocator,
        })
    }

    /// The create options as the plugin reads them, each set field once, in the order
    /// `allocator` (string), `memory_fraction` (float), `preallocate` (bool), `visible_devices`
    /// (int64 list). A fraction outside (0, 1] and an empty device list are errors.
    pub fn to_named_values(&self) -> Result<Vec<(&'static str, Value)>> {
        let mut named = Vec::new();
        if let Some(allocator) = self.allocator {
            named.push(("allocator", Value::String(allocator.as_str().into())));
        }
        if let Some(f) = self.memory_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(Error::InvalidArgument(format!(
                    "memory_fraction {f} is not in (0, 1]"
                )));
            }
            named.push(("memory_fraction", Value::Float(f)));
        }
        if let Some(preallocate) = self.preallocate {
            named.push(("preallocate", Value::Bool(preallocate)));
        }
        if let Some(devices) = &self.visible_devices {
            if devices.is_empty() {
                return Err(Error::InvalidArgument(
                    "visible_devices is empty: name at least one GPU, or leave it None for all"
                        .into(),
                ));
            }
            let ids = devices
                .iter()
                .map(|&d| i64::try_from(d))
                .collect::<std::result::Result<Vec<i64>, _>>()
                .map_err(|_| Error::InvalidArgument(format!("visible_devices {devices:?}")))?;
            named.push(("visible_devices", Value::Int64List(ids)));
        }
        Ok(named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::fake;
    use crate::runtime::Client;

    fn all_set() -> ClientOptions {
        ClientOptions::new()
            .allocator(GpuAllocator::CudaAsync)
            .memory_fraction(0.5)
            .preallocate(false)
            .visible_devices(&[1, 0])
    }

    #[test]
    fn options_become_the_plugins_names_types_and_values() {
        assert_eq!(ClientOptions::new().to_named_values().unwrap(), vec![]);
        assert_eq!(
            all_set().to_named_values().unwrap(),
            vec![
                ("allocator", Value::String("cuda_async".into())),
                ("memory_fraction", Value::Float(0.5)),
                ("preallocate", Value::Bool(false)),
                ("visible_devices", Value::Int64List(vec![1, 0])),
            ]
        );
        let only = ClientOptions::new().preallocate(true);
        assert_eq!(
            only.to_named_values().unwrap(),
            vec![("preallocate", Value::Bool(true))]
        );
    }

    #[test]
    fn bad_options_are_errors_not_plugin_failures() {
        for f in [0.0, -0.5, 1.5, f32::NAN, f32::INFINITY] {
            let e = ClientOptions::new().memory_fraction(f).to_named_values();
            assert!(
                e.unwrap_err().to_string().contains("memory_fraction"),
                "{f}"
            );
        }
        assert!(ClientOptions::new()
            .memory_fraction(1.0)
            .to_named_values()
            .is_ok());
        let e = ClientOptions::new().visible_devices(&[]).to_named_values();
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("visible_devices is empty"));
    }

    #[test]
    fn allocators_round_trip_through_their_names() {
        for a in ALLOCATORS {
            assert_eq!(GpuAllocator::parse(a.as_str()).unwrap(), a);
        }
        assert_eq!(GpuAllocator::parse("BFC").unwrap(), GpuAllocator::Bfc);
        let e = GpuAllocator::parse("arena").unwrap_err().to_string();
        assert!(e.contains("\"arena\"") && e.contains("cuda_async"), "{e}");
    }

    #[test]
    fn jax_environment_variables_are_read_as_jax_reads_them() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            ClientOptions::from_vars(vars(&[])).unwrap(),
            ClientOptions::new()
        );
        let o = ClientOptions::from_vars(vars(&[
            ("XLA_PYTHON_CLIENT_MEM_FRACTION", ".25"),
            ("XLA_PYTHON_CLIENT_PREALLOCATE", "False"),
            ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform"),
        ]))
        .unwrap();
        assert_eq!(
            o,
            ClientOptions::new()
                .memory_fraction(0.25)
                .preallocate(false)
                .allocator(GpuAllocator::Platform)
        );
        let o = ClientOptions::from_vars(vars(&[
            ("XLA_CLIENT_MEM_FRACTION", "0.9"),
            ("XLA_PYTHON_CLIENT_PREALLOCATE", "no"),
        ]))
        .unwrap();
        assert_eq!((o.memory_fraction, o.preallocate), (Some(0.9), Some(true)));
        let both = ClientOptions::from_vars(vars(&[
            ("XLA_CLIENT_MEM_FRACTION", "0.9"),
            ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5"),
        ]));
        assert!(both.unwrap_err().to_string().contains("both set"));
        let bad = ClientOptions::from_vars(vars(&[("XLA_CLIENT_MEM_FRACTION", "most")]));
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("XLA_CLIENT_MEM_FRACTION=most"));
        let bad = ClientOptions::from_vars(vars(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "arena")]));
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("XLA_PYTHON_CLIENT_ALLOCATOR"));
    }

    /// What the plugin receives through the C structs is what the options say, read back as a
    /// C reader of the union reads it.
    #[test]
    fn the_plugin_receives_the_options_through_the_c_api() {
        let client = Client::with_options(&fake::plugin(), &all_set()).unwrap();
        let received = fake::create_options_of(client.raw() as usize);
        let want: Vec<(String, Value)> = all_set()
            .to_named_values()
            .unwrap()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        assert_eq!(received, want);
        let bad = Client::with_options(&fake::plugin(), &ClientOptions::new().memory_fraction(2.0));
        assert!(matches!(bad, Err(Error::InvalidArgument(_))));
    }
}
