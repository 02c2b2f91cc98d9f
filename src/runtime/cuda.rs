//! Finding the CUDA PJRT plugin that JAX installed, and the NVIDIA libraries it loads.
//!
//! JAX's CUDA plugin is the `jax-cuda13-pjrt` (or `jax-cuda12-pjrt`) wheel: the package
//! `jax_plugins/xla_cuda13/` (`xla_cuda12/`) in site-packages holds `xla_cuda_plugin.so`. The CUDA
//! libraries come as `nvidia-*` wheels beside it: CUDA 13's in `nvidia/cu13/lib/`, CUDA 12's one
//! folder per component (`nvidia/cublas/lib/`, `nvidia/cuda_runtime/lib/`, ...), and cuDNN, NCCL
//! and NVSHMEM in `nvidia/cudnn/lib/`, `nvidia/nccl/lib/`, `nvidia/nvshmem/lib/`.
//!
//! The plugin itself has no run path to those folders: XLA opens `libcudart.so.13`, `libcublas`
//! and the rest by their names, and the dynamic loader would look only in the system's folders.
//! JAX's plugin package therefore loads each library by its full path from the wheels before it
//! loads the plugin (`_load_nvidia_libraries` in `jax_plugins/cuda/__init__.py`, with ctypes:
//! `RTLD_NOW | RTLD_LOCAL`, a library that fails to load skipped); a later open by name then
//! finds the copy already loaded. [`CudaPlugin::preload_libraries`] does the same, and
//! [`super::Plugin::load`] does it for any plugin that sits in a `jax_plugins/xla_cudaNN/`
//! folder. XLA finds `ptxas` and libdevice by itself, relative to the plugin file
//! (`../../nvidia/cu13` or `../../nvidia/cuda_nvcc`), so the plugin is used where it is
//! installed, never copied.
//!
//! [`find_cuda_plugin`] is the search over a given list of site-packages folders (no Python, no
//! GPU); [`locate`] asks a Python interpreter for that list, as JAX would see it.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The value of `STABLEGRAPH_PJRT_PLUGIN` (or of the CLI's `--plugin`) that asks for the CUDA
/// plugin of the installed JAX instead of a path.
pub const CUDA_KEYWORD: &str = "cuda";

/// The plugin's file name inside its package folder.
pub const PLUGIN_FILE: &str = "xla_cuda_plugin.so";

/// The CUDA major versions searched, newest first, with their package folder.
const PACKAGES: [(u32, &str); 2] = [(13, "xla_cuda13"), (12, "xla_cuda12")];

/// The libraries loaded before the plugin, in order: a file name and the folders under
/// `site-packages/nvidia/` that may hold it, preferred first (each folder's `lib/`). The list is
/// JAX's (`_load_nvidia_libraries`), with `libcublasLt` before `libcublas`, which needs it. JAX
/// looks for CUDA 13's libraries in `nvidia/cu13` only; the per-component folders after it are
/// also tried.
const CUDA13_LIBRARIES: &[(&str, &[&str])] = &[
    ("libcudart.so.13", &["cu13", "cuda_runtime"]),
    ("libnvrtc.so.13", &["cu13", "cuda_nvrtc"]),
    ("libcublasLt.so.13", &["cu13", "cublas"]),
    ("libcublas.so.13", &["cu13", "cublas"]),
    ("libnccl.so.2", &["nccl"]),
    ("libcupti.so.13", &["cu13", "cuda_cupti"]),
    ("libcusparse.so.12", &["cu13", "cusparse"]),
    ("libcusolver.so.12", &["cu13", "cusolver"]),
    ("libcufft.so.12", &["cu13", "cufft"]),
    ("libnvshmem_host.so.3", &["nvshmem"]),
    ("libcudnn.so.9", &["cudnn"]),
];

/// CUDA 12's libraries, as [`CUDA13_LIBRARIES`].
const CUDA12_LIBRARIES: &[(&str, &[&str])] = &[
    ("libcudart.so.12", &["cuda_runtime"]),
    ("libnvrtc.so.12", &["cuda_nvrtc"]),
    ("libcublasLt.so.12", &["cublas"]),
    ("libcublas.so.12", &["cublas"]),
    ("libnccl.so.2", &["nccl"]),
    ("libcupti.so.12", &["cuda_cupti"]),
    ("libcusparse.so.12", &["cusparse"]),
    ("libcusolver.so.11", &["cusolver"]),
    ("libcufft.so.11", &["cufft"]),
    ("libnvshmem_host.so.3", &["nvshmem"]),
    ("libcudnn.so.9", &["cudnn"]),
];

/// An installed CUDA PJRT plugin and the NVIDIA libraries to load before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaPlugin {
    /// `.../site-packages/jax_plugins/xla_cudaNN/xla_cuda_plugin.so`.
    pub plugin: PathBuf,
    /// The CUDA major version the plugin is built for (13 or 12), from its package name.
    pub cuda_major: u32,
    /// The NVIDIA libraries found, by full path, in the order they are loaded.
    pub libraries: Vec<PathBuf>,
}

impl CudaPlugin {
    /// The folders that hold [`CudaPlugin::libraries`], each once, in load order.
    pub fn library_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for dir in self.libraries.iter().filter_map(|l| l.parent()) {
            if !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_path_buf());
            }
        }
        dirs
    }

    /// The plugin at `path` when it sits in a `jax_plugins/xla_cudaNN/` package folder, with the
    /// libraries of the site-packages folder that holds that package; `None` for any other file.
    pub fn beside(path: &Path) -> Option<CudaPlugin> {
        let package = path.parent()?;
        let plugins = package.parent()?;
        let site = plugins.parent()?;
        let (major, _) = PACKAGES
            .iter()
            .find(|(_, name)| package.file_name().is_some_and(|n| n == *name))?;
        if path.file_name()? != PLUGIN_FILE || plugins.file_name()? != "jax_plugins" {
            return None;
        }
        Some(CudaPlugin {
            plugin: path.to_path_buf(),
            cuda_major: *major,
            libraries: nvidia_libraries(*major, &[site.to_path_buf()]),
        })
    }

    /// Loads each of [`CudaPlugin::libraries`] (`dlopen`, `RTLD_NOW | RTLD_LOCAL`, as JAX's
    /// ctypes does) unless a library of the same file name was loaded before, and keeps them
    /// loaded for the life of the process. A library that fails to load is skipped, as JAX
    /// skips it; the returned lines say which and why (empty when all loaded).
    pub fn preload_libraries(&self) -> Vec<String> {
        preload(&self.libraries)
    }

    /// Preloads the libraries, then loads the plugin ([`super::Plugin::load`]).
    pub fn load(&self) -> Result<super::Plugin> {
        self.preload_libraries();
        super::Plugin::load(&self.plugin)
    }
}

/// The CUDA plugin in `site_packages` (searched in order): the first
/// `jax_plugins/xla_cuda13/xla_cuda_plugin.so`, else the first `xla_cuda12` one, with the NVIDIA
/// libraries for its CUDA version (looked for in the plugin's own site-packages first, then in
/// the others). Only reads the file system.
pub fn find_cuda_plugin(site_packages: &[PathBuf]) -> Option<CudaPlugin> {
    for (major, package) in PACKAGES {
        for site in site_packages {
            let plugin = site.join("jax_plugins").join(package).join(PLUGIN_FILE);
            if !plugin.is_file() {
                continue;
            }
            let mut sites = vec![site.clone()];
            sites.extend(site_packages.iter().filter(|s| *s != site).cloned());
            return Some(CudaPlugin {
                plugin,
                cuda_major: major,
                libraries: nvidia_libraries(major, &sites),
            });
        }
    }
    None
}

/// The NVIDIA libraries of CUDA `major` found under `sites`, in load order: for each library,
/// the first of its folders (in preference order) that holds it in any site, sites in order.
fn nvidia_libraries(major: u32, sites: &[PathBuf]) -> Vec<PathBuf> {
    let table = if major == 13 {
        CUDA13_LIBRARIES
    } else {
        CUDA12_LIBRARIES
    };
    table
        .iter()
        .filter_map(|(file, folders)| {
            folders.iter().find_map(|folder| {
                sites
                    .iter()
                    .map(|s| s.join("nvidia").join(folder).join("lib").join(file))
                    .find(|p| p.is_file())
            })
        })
        .collect()
}

/// Asks `python` where its packages live, as JAX would find a plugin: the folders above the
/// `jax_plugins` namespace package's paths (when it imports), the user site (when enabled) and
/// `site.getsitepackages()`, in that order, each once.
pub fn site_packages(python: &Path) -> Result<Vec<PathBuf>> {
    const SCRIPT: &str = "import os, site\n\
        dirs = []\n\
        try:\n    import jax_plugins\n    dirs += [os.path.dirname(p) for p in jax_plugins.__path__]\n\
        except Exception:\n    pass\n\
        if site.ENABLE_USER_SITE:\n    dirs.append(site.getusersitepackages())\n\
        dirs += getattr(site, 'getsitepackages', lambda: [])()\n\
        print('\\n'.join(dirs))\n";
    let shown = python.display();
    let output = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            Error::PluginSearch(format!(
                "cannot run `{shown}` to find the CUDA PJRT plugin ({e}): set STABLEGRAPH_PYTHON \
                 to the Python that has JAX's CUDA plugin, or set STABLEGRAPH_PJRT_PLUGIN to the \
                 plugin's .so"
            ))
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        return Err(Error::PluginSearch(format!(
            "`{shown}` failed ({}) when asked for its package directories: {}",
            output.status,
            last.unwrap_or("no message").trim()
        )));
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let dir = PathBuf::from(line.trim_end_matches('\r'));
        if !line.trim().is_empty() && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    Ok(dirs)
}

/// The CUDA plugin of `python`'s packages ([`site_packages`], then [`find_cuda_plugin`]), or one
/// line that says what to install.
pub fn locate(python: &Path) -> Result<CudaPlugin> {
    let sites = site_packages(python)?;
    find_cuda_plugin(&sites).ok_or_else(|| not_found(python, &sites))
}

/// The Python interpreter `STABLEGRAPH_PYTHON` names, default `python3`.
pub fn python_from_env() -> PathBuf {
    std::env::var_os("STABLEGRAPH_PYTHON")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

fn not_found(python: &Path, sites: &[PathBuf]) -> Error {
    let looked: Vec<String> = sites.iter().map(|s| s.display().to_string()).collect();
    let looked = match looked.is_empty() {
        true => "it lists no package directories".to_string(),
        false => format!(
            "looked in {} for jax_plugins/xla_cuda13/{PLUGIN_FILE} and xla_cuda12",
            looked.join(", ")
        ),
    };
    Error::PluginSearch(format!(
        "no CUDA PJRT plugin found for {} ({looked}): install jax[cuda13] (pip install \
         \"jax[cuda13]\") into that Python, set STABLEGRAPH_PYTHON to the Python that has it, or \
         set STABLEGRAPH_PJRT_PLUGIN to the plugin's .so",
        python.display()
    ))
}

/// The file names of the libraries preloaded so far (each is loaded once per process).
static PRELOADED: Mutex<Option<HashSet<OsString>>> = Mutex::new(None);

/// Loads `libraries` in order, skipping a file name already loaded; returns the failures.
fn preload(libraries: &[PathBuf]) -> Vec<String> {
    let mut loaded = PRELOADED.lock().unwrap_or_else(|p| p.into_inner());
    let loaded = loaded.get_or_insert_with(HashSet::new);
    let mut failures = Vec::new();
    for library in libraries {
        let Some(name) = library.file_name() else {
            continue;
        };
        if loaded.contains(name) {
            continue;
        }
        match open_for_good(library) {
            Ok(()) => {
                loaded.insert(name.to_os_string());
            }
            Err(message) => failures.push(format!("{}: {message}", name.to_string_lossy())),
        }
    }
    failures
}

/// Opens the shared object at `path` and never closes it.
#[cfg(unix)]
fn open_for_good(path: &Path) -> std::result::Result<(), String> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: loading a shared object runs its initialisers; these are the NVIDIA libraries the
    // plugin would load itself, from the wheels installed beside it, as JAX loads them.
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) };
    // Kept loaded for the life of the process, like the plugin that needs it.
    library
        .map(|l| {
            let _ = l.into_raw();
        })
        .map_err(|e| e.to_string())
}

/// Elsewhere the CUDA plugin does not exist; nothing is preloaded.
#[cfg(not(unix))]
fn open_for_good(_path: &Path) -> std::result::Result<(), String> {
    Err("preloading is only done on Unix".into())
}

/// Preloads the libraries of a plugin at `path` that sits in a `jax_plugins/xla_cudaNN/`
/// folder (nothing for any other plugin); returns the failures.
pub(crate) fn prepare_to_load(path: &Path) -> Vec<String> {
    CudaPlugin::beside(path)
        .map(|p| p.preload_libraries())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"").unwrap();
    }

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("stablegraph-cuda-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn cuda13_is_preferred_over_cuda12_in_any_site() {
        let root = temp("prefer");
        let (a, b) = (root.join("a"), root.join("b"));
        touch(&a.join("jax_plugins/xla_cuda12").join(PLUGIN_FILE));
        touch(&b.join("jax_plugins/xla_cuda13").join(PLUGIN_FILE));
        touch(&b.join("nvidia/cu13/lib/libcudart.so.13"));
        touch(&a.join("nvidia/cuda_runtime/lib/libcudart.so.12"));
        let found = find_cuda_plugin(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(
            found.plugin,
            b.join("jax_plugins/xla_cuda13").join(PLUGIN_FILE)
        );
        assert_eq!(found.cuda_major, 13);
        assert_eq!(
            found.libraries,
            vec![b.join("nvidia/cu13/lib/libcudart.so.13")]
        );
        fs::remove_dir_all(b.join("jax_plugins")).unwrap();
        let found = find_cuda_plugin(&[a.clone(), b]).unwrap();
        assert_eq!(found.cuda_major, 12);
        assert_eq!(
            found.library_dirs(),
            vec![a.join("nvidia/cuda_runtime/lib")]
        );
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn libraries_come_in_load_order_from_the_plugins_site_first() {
        let root = temp("order");
        let (other, own) = (root.join("other"), root.join("own"));
        touch(&own.join("jax_plugins/xla_cuda13").join(PLUGIN_FILE));
        for lib in ["libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13"] {
            touch(&other.join("nvidia/cu13/lib").join(lib));
        }
        touch(&own.join("nvidia/cublas/lib/libcublas.so.13"));
        touch(&own.join("nvidia/cudnn/lib/libcudnn.so.9"));
        touch(&own.join("nvidia/cudnn/lib/libcudnn.so.8"));
        let found = find_cuda_plugin(&[other.clone(), own.clone()]).unwrap();
        // cu13 is preferred over the component folder, whichever site holds it; within a
        // folder, the plugin's own site comes first.
        assert_eq!(
            found.libraries,
            vec![
                other.join("nvidia/cu13/lib/libcudart.so.13"),
                other.join("nvidia/cu13/lib/libcublasLt.so.13"),
                other.join("nvidia/cu13/lib/libcublas.so.13"),
                own.join("nvidia/cudnn/lib/libcudnn.so.9"),
            ]
        );
        let beside = CudaPlugin::beside(&found.plugin).unwrap();
        assert_eq!(
            beside.libraries,
            vec![
                own.join("nvidia/cublas/lib/libcublas.so.13"),
                own.join("nvidia/cudnn/lib/libcudnn.so.9"),
            ]
        );
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn only_a_plugin_in_a_jax_plugins_package_is_beside_libraries() {
        let site = Path::new("/site-packages");
        for path in [
            "/site-packages/jax_plugins/xla_cuda13/other.so",
            "/site-packages/elsewhere/xla_cuda13/xla_cuda_plugin.so",
            "/site-packages/jax_plugins/xla_cuda11/xla_cuda_plugin.so",
            "/xla_cuda_plugin.so",
            "",
        ] {
            assert_eq!(CudaPlugin::beside(Path::new(path)), None, "{path}");
        }
        let p = site.join("jax_plugins/xla_cuda12").join(PLUGIN_FILE);
        let beside = CudaPlugin::beside(&p).unwrap();
        assert_eq!((beside.cuda_major, beside.libraries.len()), (12, 0));
    }

    #[test]
    fn nothing_found_says_where_it_looked_and_what_to_install() {
        let sites = [PathBuf::from("/a/site-packages"), PathBuf::from("/b")];
        assert_eq!(find_cuda_plugin(&sites), None);
        let message = not_found(Path::new("python3"), &sites).to_string();
        assert!(!message.contains('\n'), "{message}");
        assert!(
            message.starts_with(
                "no CUDA PJRT plugin found for python3 (looked in /a/site-packages, /b"
            ),
            "{message}"
        );
        assert!(message.contains("pip install \"jax[cuda13]\""), "{message}");
        assert!(message.contains("STABLEGRAPH_PJRT_PLUGIN"), "{message}");
        let none = not_found(Path::new("py"), &[]).to_string();
        assert!(none.contains("it lists no package directories"), "{none}");
    }

    #[test]
    fn a_library_that_fails_to_load_is_skipped_and_reported() {
        let root = temp("preload");
        let bad = root.join("nvidia/cu13/lib/libstablegraph_not_a_library.so.13");
        touch(&bad);
        let failures = preload(std::slice::from_ref(&bad));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].starts_with("libstablegraph_not_a_library.so.13: "),
            "{failures:?}"
        );
        let _ = fs::remove_dir_all(&root);
    }
}
