//! A fake JAX CUDA install for the plugin-discovery tests: a site-packages folder with
//! `jax_plugins/xla_cuda13/xla_cuda_plugin.so` (an empty file) and NVIDIA library folders
//! (`nvidia/cuda_runtime/lib`, `nvidia/cublas/lib`, holding empty files), and a fake `python`
//! (a shell script) that prints that folder as its one package directory, whatever it is asked.

use std::fs;
use std::path::{Path, PathBuf};

use super::TempDir;

/// The fake install: `site` is its site-packages, `python` its interpreter.
pub struct FakeJax {
    /// Removed with everything in it when dropped.
    pub root: TempDir,
    /// The site-packages folder the fake python names.
    pub site: PathBuf,
    /// The fake interpreter, for `STABLEGRAPH_PYTHON` or `PluginResolver::python`.
    pub python: PathBuf,
}

impl FakeJax {
    /// Where the plugin is (or would be).
    pub fn plugin(&self) -> PathBuf {
        self.site.join("jax_plugins/xla_cuda13/xla_cuda_plugin.so")
    }

    /// The library folders the layout holds, in load order.
    pub fn library_dirs(&self) -> Vec<PathBuf> {
        vec![
            self.site.join("nvidia/cuda_runtime/lib"),
            self.site.join("nvidia/cublas/lib"),
        ]
    }
}

fn touch(path: &Path) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, b"").unwrap();
}

/// A fake install named for `what`; with `installed` false the site-packages folder is empty
/// (nothing installed).
pub fn fake_jax(what: &str, installed: bool) -> FakeJax {
    let root = TempDir::new(&format!("fake-jax-{what}"));
    let site = root.join("lib/python3.12/site-packages");
    fs::create_dir_all(&site).unwrap();
    let python = root.join("bin/python3");
    fs::create_dir_all(python.parent().unwrap()).unwrap();
    let script = format!("#!/bin/sh\nprintf '%s\\n' '{}'\n", site.display());
    fs::write(&python, script).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&python, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let fake = FakeJax { root, site, python };
    if installed {
        touch(&fake.plugin());
        touch(&fake.site.join("nvidia/cuda_runtime/lib/libcudart.so.13"));
        touch(&fake.site.join("nvidia/cublas/lib/libcublasLt.so.13"));
        touch(&fake.site.join("nvidia/cublas/lib/libcublas.so.13"));
    }
    fake
}
