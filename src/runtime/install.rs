//! Finding the XLA CPU PJRT plugin, and installing it into a per-user cache on first use.
//!
//! Resolution order: an explicit path (given to [`PluginResolver::explicit`] or
//! [`crate::runtime::Plugin::load`]); the `STABLEGRAPH_PJRT_PLUGIN` environment variable (a path,
//! or `cuda` for JAX's CUDA plugin, found as [`super::cuda`] says); the
//! per-user cache; and, when none is found, a one-time fetch of a pinned plugin wheel from the
//! Python package index with `python3 -m pip download --no-deps`, verified by size and SHA-256,
//! whose one shared object is unpacked into the cache.
//!
//! The fetch happens here, at run time, and not in `build.rs`: a build script's output lives in
//! one checkout's `target/` directory, so every clone and every `cargo clean` would download the
//! ~60 MB wheel again, and builds would need the network (breaking offline and vendored builds and
//! users who only run a GPU plugin). At run time the plugin goes to one cache shared by every
//! checkout of every project of the same user, is fetched only when a CPU client is actually
//! asked for, and can be pointed elsewhere or forbidden (`STABLEGRAPH_OFFLINE=1`).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// A pinned plugin wheel on the Python package index and the shared object inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginWheel {
    /// The package name.
    pub package: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// The wheel's file name, as pip saves it.
    pub wheel_file: &'static str,
    /// The wheel's size in bytes.
    pub wheel_size: u64,
    /// The wheel's SHA-256, lowercase hex.
    pub wheel_sha256: &'static str,
    /// The shared object's path inside the wheel.
    pub member: &'static str,
    /// The shared object's size in bytes (checked on every cache hit).
    pub so_size: u64,
}

impl PluginWheel {
    /// The file name of the shared object.
    pub fn so_name(&self) -> &'static str {
        self.member.rsplit('/').next().unwrap_or(self.member)
    }

    /// The cache subdirectory for this exact version.
    fn dir_name(&self) -> String {
        format!("{}-{}", self.package, self.version)
    }

    /// `package==version`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// `lammps-jax-pjrt-cpu` 0.11.2: XLA CPU from 2026-10, PJRT C API 0.115. The default (see the
/// `docs/performance.md` for the measurements behind the choice).
pub const LAMMPS_JAX_PJRT_CPU: PluginWheel = PluginWheel {
    package: "lammps-jax-pjrt-cpu",
    version: "0.11.2",
    wheel_file: "lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
    wheel_size: 62_711_338,
    wheel_sha256: "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1",
    member: "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
    so_size: 201_600_336,
};

/// `xla-cpu-pjrt` 0.0.1: the OpenXLA CPU plugin from 2025-11, PJRT C API 0.81.
pub const XLA_CPU_PJRT: PluginWheel = PluginWheel {
    package: "xla-cpu-pjrt",
    version: "0.0.1",
    wheel_file: "xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_x86_64.whl",
    wheel_size: 63_461_052,
    wheel_sha256: "55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc",
    member: "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
    so_size: 259_284_552,
};

/// The pinned CPU plugins, the default first.
pub const CPU_PLUGINS: [PluginWheel; 2] = [LAMMPS_JAX_PJRT_CPU, XLA_CPU_PJRT];

/// Where a resolved plugin came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginSource {
    /// A path given through the API.
    Explicit,
    /// The `STABLEGRAPH_PJRT_PLUGIN` environment variable.
    Environment,
    /// `STABLEGRAPH_PJRT_PLUGIN=cuda`: JAX's CUDA plugin, found through the Python
    /// ([`super::cuda::locate`]).
    Cuda,
    /// The per-user cache, already unpacked.
    Cache,
    /// A wheel already in the cache directory, unpacked without the network.
    CachedWheel,
    /// Fetched with pip just now.
    Fetched,
}

/// The inputs of plugin resolution. [`PluginResolver::from_env`] reads them from the environment;
/// every field can be set directly (tests do, so they never touch the process environment).
#[derive(Debug, Clone)]
pub struct PluginResolver {
    /// A path chosen by the caller; wins over everything else.
    pub explicit: Option<PathBuf>,
    /// The value of `STABLEGRAPH_PJRT_PLUGIN`: a path, or exactly `cuda` for JAX's CUDA plugin
    /// of [`PluginResolver::python`].
    pub env_plugin: Option<PathBuf>,
    /// The per-user plugin cache: `STABLEGRAPH_PLUGIN_DIR`, else
    /// `$XDG_CACHE_HOME/stablegraph/plugins`, else `$HOME/.cache/stablegraph/plugins`.
    pub cache_dir: Option<PathBuf>,
    /// `STABLEGRAPH_OFFLINE=1`: never run pip.
    pub offline: bool,
    /// The Python interpreter that runs pip, and whose packages hold the CUDA plugin
    /// (`STABLEGRAPH_PYTHON`, default `python3`).
    pub python: PathBuf,
    /// Which pinned wheel to use (`STABLEGRAPH_CPU_PLUGIN` names one of [`CPU_PLUGINS`] by package).
    pub wheel: PluginWheel,
    /// Whether to say on stderr what is happening during a fetch (and, when stderr is a
    /// terminal, to draw progress bars of the download and the unpacking).
    pub verbose: bool,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .map(|v| !matches!(v.trim(), "" | "0" | "false" | "no" | "off"))
        .unwrap_or(false)
}

/// The default per-user plugin cache directory, from the environment.
pub fn default_cache_dir() -> Option<PathBuf> {
    env_path("STABLEGRAPH_PLUGIN_DIR")
        .or_else(|| env_path("XDG_CACHE_HOME").map(|d| d.join("stablegraph").join("plugins")))
        .or_else(|| env_path("HOME").map(|h| h.join(".cache").join("stablegraph").join("plugins")))
}

impl PluginResolver {
    /// The resolver configured by the environment variables described on each field.
    pub fn from_env() -> Result<PluginResolver> {
        let wheel = match std::env::var("STABLEGRAPH_CPU_PLUGIN") {
            Ok(name) if !name.trim().is_empty() => *CPU_PLUGINS
                .iter()
                .find(|w| w.package == name.trim())
                .ok_or_else(|| {
                    let known: Vec<_> = CPU_PLUGINS.iter().map(|w| w.package).collect();
                    Error::PluginInstall(format!(
                        "STABLEGRAPH_CPU_PLUGIN={name} names no pinned plugin; known: {}",
                        known.join(", ")
                    ))
                })?,
            _ => CPU_PLUGINS[0],
        };
        Ok(PluginResolver {
            explicit: None,
            env_plugin: env_path("STABLEGRAPH_PJRT_PLUGIN"),
            cache_dir: default_cache_dir(),
            offline: env_flag("STABLEGRAPH_OFFLINE"),
            python: env_path("STABLEGRAPH_PYTHON").unwrap_or_else(|| PathBuf::from("python3")),
            wheel,
            verbose: true,
        })
    }

    /// Where the unpacked shared object lives in the cache.
    pub fn cached_plugin_path(&self) -> Option<PathBuf> {
        self.cache_dir
            .as_ref()
            .map(|d| d.join(self.wheel.dir_name()).join(self.wheel.so_name()))
    }

    /// Resolves the plugin path, fetching into the cache if needed.
    pub fn resolve(&self) -> Result<(PathBuf, PluginSource)> {
        if let Some(p) = &self.explicit {
            return Ok((p.clone(), PluginSource::Explicit));
        }
        if let Some(p) = &self.env_plugin {
            if p.as_os_str() == super::cuda::CUDA_KEYWORD {
                let found = super::cuda::locate(&self.python)?;
                return Ok((found.plugin, PluginSource::Cuda));
            }
            return Ok((p.clone(), PluginSource::Environment));
        }
        let cache = self.cache_dir.clone().ok_or_else(|| {
            Error::PluginInstall(
                "no cache directory: neither STABLEGRAPH_PLUGIN_DIR, XDG_CACHE_HOME nor HOME is \
                 set. Set one of them, or set STABLEGRAPH_PJRT_PLUGIN to a plugin .so"
                    .into(),
            )
        })?;
        let dir = cache.join(self.wheel.dir_name());
        let so = dir.join(self.wheel.so_name());
        if self.cache_hit(&so) {
            return Ok((so, PluginSource::Cache));
        }
        if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
            return Err(Error::PluginInstall(format!(
                "the pinned CPU plugin wheel ({}) is built for x86_64 Linux, and this is {}. Set \
                 STABLEGRAPH_PJRT_PLUGIN to a PJRT plugin built for this platform",
                self.wheel.requirement(),
                env!("STABLEGRAPH_BUILD_TARGET")
            )));
        }
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating the plugin cache {}", dir.display()), e))?;
        // One process at a time fetches and unpacks; the others wait here and then find the
        // plugin in the cache. Files are published by rename, so readers never see half a file.
        let lock_path = dir.join(".lock");
        let lock = fs::File::create(&lock_path)
            .map_err(|e| Error::io(format!("creating {}", lock_path.display()), e))?;
        lock.lock()
            .map_err(|e| Error::io(format!("locking {}", lock_path.display()), e))?;
        if self.cache_hit(&so) {
            return Ok((so, PluginSource::Cache));
        }
        let wheel = dir.join(self.wheel.wheel_file);
        let source = if wheel.is_file() && self.verify_wheel(&wheel).is_ok() {
            PluginSource::CachedWheel
        } else if self.offline {
            return Err(Error::PluginInstall(format!(
                "STABLEGRAPH_OFFLINE is set and the plugin is not in the cache ({}). Fetch it \
                 once with: {} -m pip download --no-deps {} -d {}",
                so.display(),
                self.python.display(),
                self.wheel.requirement(),
                dir.display()
            )));
        } else {
            self.fetch(&dir)?;
            PluginSource::Fetched
        };
        self.unpack(&wheel, &so)?;
        let _ = fs::remove_file(&wheel);
        Ok((so, source))
    }

    fn cache_hit(&self, so: &Path) -> bool {
        fs::metadata(so)
            .map(|m| m.is_file() && m.len() == self.wheel.so_size)
            .unwrap_or(false)
    }

    fn say(&self, message: &str) {
        if self.verbose {
            eprintln!("stablegraph: {message}");
        }
    }

    /// Runs `python -m pip download` into `dir` and verifies the wheel.
    fn fetch(&self, dir: &Path) -> Result<()> {
        self.check_python()?;
        let python = self.python.display().to_string();
        self.say(&format!(
            "fetching the XLA CPU PJRT plugin {} (about {} MB) with pip into {}; this happens \
             once per user",
            self.wheel.requirement(),
            self.wheel.wheel_size / 1_000_000,
            dir.display()
        ));
        let wheel = dir.join(self.wheel.wheel_file);
        // pip 23 reports no machine-readable progress: it writes the wheel into a directory of
        // its own under TMPDIR and then copies it into `dir`. Pointing TMPDIR at a fresh
        // directory of ours lets the bar follow the bytes written there.
        let tmp = dir.join(format!(".pip-tmp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp)
            .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
        let bar = self.bytes_bar(
            &format!("downloading {}", self.wheel.requirement()),
            self.wheel.wheel_size,
        );
        let mut pip = Command::new(&self.python);
        pip.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .args(["--disable-pip-version-check", "--no-input", "--quiet"])
            .arg(self.wheel.requirement())
            .arg("-d")
            .arg(dir)
            .env("TMPDIR", &tmp);
        let output = run_watched(&mut pip, &bar, || {
            largest_file(&tmp, 4).max(file_size(&wheel))
        });
        bar.finish_and_clear();
        let _ = fs::remove_dir_all(&tmp);
        let output = output
            .map_err(|e| Error::PluginInstall(format!("cannot run `{python} -m pip`: {e}")))?;
        if !output.status.success() {
            return Err(Error::PluginInstall(format!(
                "`{python} -m pip download --no-deps {}` failed ({}): {}",
                self.wheel.requirement(),
                output.status,
                tail(&String::from_utf8_lossy(&output.stderr), 1500)
            )));
        }
        if !wheel.is_file() {
            return Err(Error::PluginInstall(format!(
                "pip reported success but {} is not there",
                wheel.display()
            )));
        }
        if let Err(e) = self.verify_wheel(&wheel) {
            let _ = fs::remove_file(&wheel);
            return Err(e);
        }
        Ok(())
    }

    /// An error that says what to install unless `python --version` and `python -m pip
    /// --version` both work.
    fn check_python(&self) -> Result<()> {
        let python = self.python.display().to_string();
        match status_of(
            Command::new(&self.python)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        ) {
            Ok(status) if status.success() => {}
            Ok(status) => {
                return Err(Error::PluginInstall(format!(
                    "`{python} --version` failed ({status}). Install Python 3 with pip (Debian: \
                     apt-get install python3 python3-pip), or set STABLEGRAPH_PJRT_PLUGIN to a \
                     PJRT plugin .so"
                )))
            }
            Err(e) => {
                return Err(Error::PluginInstall(format!(
                    "cannot run `{python}` ({e}). The CPU plugin is fetched with pip: install \
                     Python 3 with pip (Debian: apt-get install python3 python3-pip), set \
                     STABLEGRAPH_PYTHON to an interpreter, or set STABLEGRAPH_PJRT_PLUGIN to a \
                     PJRT plugin .so"
                )))
            }
        }
        let pip_ok = status_of(
            Command::new(&self.python)
                .args(["-m", "pip", "--version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .map(|s| s.success())
        .unwrap_or(false);
        if !pip_ok {
            return Err(Error::PluginInstall(format!(
                "`{python} -m pip` is not available. Install pip (Debian: apt-get install \
                 python3-pip, or `{python} -m ensurepip`), or set STABLEGRAPH_PJRT_PLUGIN to a \
                 PJRT plugin .so"
            )));
        }
        Ok(())
    }

    /// A progress bar of `total` bytes on stderr, labelled `what`, with the rate and the time
    /// left. It draws nothing unless [`PluginResolver::verbose`] is set and stderr is a
    /// terminal (indicatif's stderr target hides itself otherwise), so logs and pipes get the
    /// plain lines only.
    fn bytes_bar(&self, what: &str, total: u64) -> ProgressBar {
        if !self.verbose {
            return ProgressBar::hidden();
        }
        let style = ProgressStyle::with_template(
            "stablegraph: {msg} [{wide_bar}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
            .with_style(style)
            .with_message(what.to_string())
    }

    /// Checks the wheel's size and SHA-256 against the pinned values.
    fn verify_wheel(&self, wheel: &Path) -> Result<()> {
        let size = fs::metadata(wheel)
            .map_err(|e| Error::io(format!("reading {}", wheel.display()), e))?
            .len();
        if size != self.wheel.wheel_size {
            return Err(Error::PluginInstall(format!(
                "{} is {size} bytes, the pinned {} is {} bytes; refusing it",
                wheel.display(),
                self.wheel.requirement(),
                self.wheel.wheel_size
            )));
        }
        let digest = sha256_file(wheel)?;
        if digest != self.wheel.wheel_sha256 {
            return Err(Error::PluginInstall(format!(
                "{} has SHA-256 {digest}, the pinned {} has {}; refusing it",
                wheel.display(),
                self.wheel.requirement(),
                self.wheel.wheel_sha256
            )));
        }
        Ok(())
    }

    /// Extracts the shared object from the verified wheel into `so`, atomically.
    fn unpack(&self, wheel: &Path, so: &Path) -> Result<()> {
        self.say(&format!(
            "unpacking {} to {}",
            self.wheel.so_name(),
            so.display()
        ));
        let partial = so.with_extension(format!("partial-{}", std::process::id()));
        // A wheel is a zip file; Python's zipfile (already required for pip) extracts the member
        // and checks its CRC-32, which keeps a zip implementation out of our dependencies.
        let script = "import shutil, sys, zipfile\n\
                      with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, \
                      open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst, 1 << 20)\n";
        let bar = self.bytes_bar(
            &format!("unpacking {}", self.wheel.so_name()),
            self.wheel.so_size,
        );
        let mut python = Command::new(&self.python);
        python
            .arg("-c")
            .arg(script)
            .arg(wheel)
            .arg(self.wheel.member)
            .arg(&partial);
        let output = run_watched(&mut python, &bar, || file_size(&partial));
        bar.finish_and_clear();
        let output = output.map_err(|e| {
            Error::PluginInstall(format!("cannot run `{}`: {e}", self.python.display()))
        })?;
        let result = if !output.status.success() {
            Err(Error::PluginInstall(format!(
                "unpacking {} from {} failed: {}",
                self.wheel.member,
                wheel.display(),
                tail(&String::from_utf8_lossy(&output.stderr), 1500)
            )))
        } else if fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) != self.wheel.so_size {
            Err(Error::PluginInstall(format!(
                "the unpacked {} does not have the pinned size of {} bytes",
                self.wheel.so_name(),
                self.wheel.so_size
            )))
        } else {
            fs::rename(&partial, so)
                .map_err(|e| Error::io(format!("moving the plugin to {}", so.display()), e))
        };
        if result.is_err() {
            let _ = fs::remove_file(&partial);
        }
        result
    }
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) to its end, meanwhile moving `bar` to
/// `progress()` (capped at the bar's length) ten times a second.
fn run_watched(
    cmd: &mut Command,
    bar: &ProgressBar,
    progress: impl Fn() -> u64,
) -> std::io::Result<Output> {
    let child = retry_busy(|| {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    })?;
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let len = bar.length().unwrap_or(u64::MAX);
    while !waiter.is_finished() {
        bar.set_position(progress().min(len));
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.set_position(progress().min(len));
    waiter
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the thread waiting for it panicked")))
}

/// `cmd`'s exit status, started as [`retry_busy`] says.
fn status_of(cmd: &mut Command) -> std::io::Result<std::process::ExitStatus> {
    retry_busy(|| cmd.status())
}

/// Runs `start` again, up to ten times over about a second, while it fails because the program
/// is "text file busy" (`ETXTBSY`): a script that was just written (a virtual environment's
/// interpreter, say) can still be open for writing in a child that another thread of this
/// process forked before that child's `exec` closed it, and the kernel refuses to execute a file
/// open for writing. The window is short, so trying again is the usual cure.
fn retry_busy<T>(mut start: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let mut attempt = 0;
    loop {
        match start() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempt < 10 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(20 * attempt));
            }
            result => return result,
        }
    }
}

/// The size of the file at `path`, 0 when there is none.
fn file_size(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The size of the largest file under `dir`, looking `depth` directories down; 0 when there is
/// none.
fn largest_file(dir: &Path, depth: usize) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() && depth > 0 => largest_file(&e.path(), depth - 1),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// Resolves the CPU plugin from the environment, fetching it on first use. Returns its path.
pub fn resolve_cpu_plugin() -> Result<PathBuf> {
    PluginResolver::from_env()?.resolve().map(|(path, _)| path)
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file =
        fs::File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut chunk)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&chunk[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn tail(s: &str, max: usize) -> &str {
    let s = s.trim();
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// The bar follows a file a child writes in steps, in a directory below the one watched,
    /// and ends at the file's final size (capped at the bar's length).
    #[test]
    fn a_watched_child_moves_the_bar_with_the_bytes_written() {
        let dir = std::env::temp_dir().join(format!("stablegraph-watch-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("pip-unpack-x")).unwrap();
        let file = dir.join("pip-unpack-x").join("a.whl");
        fs::write(dir.join("small"), [0u8; 10]).unwrap();
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg("head -c 3000 /dev/zero > \"$1\"; sleep 1; head -c 4000 /dev/zero >> \"$1\"")
            .arg("sh")
            .arg(&file);
        let bar = ProgressBar::hidden();
        bar.set_length(10_000);
        let seen = std::sync::Mutex::new(Vec::new());
        let out = run_watched(&mut sh, &bar, || {
            let n = largest_file(&dir, 2);
            seen.lock().unwrap().push(n);
            n
        })
        .unwrap();
        assert!(out.status.success());
        assert_eq!(bar.position(), 7000);
        let seen = seen.into_inner().unwrap();
        assert!(seen.contains(&3000), "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        let capped = ProgressBar::hidden();
        capped.set_length(5000);
        run_watched(&mut Command::new("true"), &capped, || largest_file(&dir, 2)).unwrap();
        assert_eq!(capped.position(), 5000);
        assert_eq!(largest_file(&dir, 0), 10, "not looking into subdirectories");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_busy_program_is_started_again_and_other_errors_are_not() {
        use std::io::{Error, ErrorKind};
        let mut calls = 0;
        let r = retry_busy(|| {
            calls += 1;
            if calls < 3 {
                Err(Error::from(ErrorKind::ExecutableFileBusy))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
        let mut calls = 0;
        let r: std::io::Result<()> = retry_busy(|| {
            calls += 1;
            Err(Error::from(ErrorKind::NotFound))
        });
        assert_eq!((r.unwrap_err().kind(), calls), (ErrorKind::NotFound, 1));
        let mut calls = 0;
        let r: std::io::Result<()> = retry_busy(|| {
            calls += 1;
            Err(Error::from(ErrorKind::ExecutableFileBusy))
        });
        assert_eq!(
            (r.unwrap_err().kind(), calls),
            (ErrorKind::ExecutableFileBusy, 11)
        );
    }
}
