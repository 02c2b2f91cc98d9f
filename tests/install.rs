//! Plugin resolution and installation, exercised with a small fake wheel and a fake `python3`
//! whose `pip download` copies that wheel (so these tests need no network and never touch the
//! real cache). The wheel is built and hashed by Python's own zipfile and hashlib. JAX's CUDA
//! plugin is found in a fake site-packages named by a fake `python` (`common::cuda`).
#![cfg(unix)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::cuda::fake_jax;
use stablegraph::runtime::{cuda, Client, ClientOptions, Plugin};
use stablegraph::runtime::{PluginResolver, PluginSource, PluginWheel};
use stablegraph::Error;

const MEMBER: &str = "fakepkg/libfake_pjrt.so";

struct Fixture {
    root: PathBuf,
    wheel_src: PathBuf,
    spec: PluginWheel,
    so_bytes: Vec<u8>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A temp directory with a fake wheel (a zip holding one member) and its pinned description.
fn fixture(name: &str) -> Fixture {
    let root =
        std::env::temp_dir().join(format!("stablegraph-install-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(root.join("src")).unwrap();
    let so_bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
    let so_path = root.join("src").join("payload.so");
    fs::write(&so_path, &so_bytes).unwrap();
    let wheel_file = "fakepkg-1.0-py3-none-any.whl";
    let wheel_src = root.join("src").join(wheel_file);
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import hashlib, os, sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:\n    z.write(sys.argv[2], sys.argv[3])\n\
             data = open(sys.argv[1], 'rb').read()\n\
             print(len(data), hashlib.sha256(data).hexdigest())",
        )
        .arg(&wheel_src)
        .arg(&so_path)
        .arg(MEMBER)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut parts = stdout.split_whitespace();
    let size: u64 = parts.next().unwrap().parse().unwrap();
    let sha = parts.next().unwrap().to_string();
    let spec = PluginWheel {
        package: "fakepkg",
        version: "1.0",
        wheel_file,
        wheel_size: size,
        wheel_sha256: leak(sha),
        member: MEMBER,
        so_size: so_bytes.len() as u64,
    };
    Fixture {
        root,
        wheel_src,
        spec,
        so_bytes,
    }
}

/// Writes a fake `python3`: `--version` works; `-m pip --version` works unless `no_pip`;
/// `-m pip download ... -d DIR` appends a line to `count_file` and copies `wheel` into DIR (or
/// fails with a pip-like message if `wheel` is None); anything else runs the real python3.
fn fake_python(dir: &Path, wheel: Option<&Path>, no_pip: bool, count_file: &Path) -> PathBuf {
    let download = match wheel {
        Some(w) => format!("cp '{}' \"$dest/\"; exit 0", w.display()),
        None => "echo 'ERROR: No matching distribution found for fakepkg==1.0' >&2; exit 1".into(),
    };
    let script = format!(
        "#!/bin/bash\n\
         if [ \"$1\" = --version ]; then echo 'Python 3 (fake)'; exit 0; fi\n\
         if [ \"$1 $2\" = '-m pip' ]; then\n\
           if [ \"$3\" = --version ]; then exit {pip_status}; fi\n\
           if [ \"$3\" = download ]; then\n\
             echo fetch >> '{count}'\n\
             dest=''; prev=''\n\
             for a in \"$@\"; do if [ \"$prev\" = -d ]; then dest=\"$a\"; fi; prev=\"$a\"; done\n\
             {download}\n\
           fi\n\
         fi\n\
         exec python3 \"$@\"\n",
        pip_status = if no_pip { 1 } else { 0 },
        count = count_file.display(),
    );
    let path = dir.join(format!(
        "fake-python-{}",
        if no_pip { "nopip" } else { "ok" }
    ));
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn resolver(f: &Fixture, python: PathBuf, offline: bool) -> PluginResolver {
    PluginResolver {
        explicit: None,
        env_plugin: None,
        cache_dir: Some(f.root.join("cache")),
        offline,
        python,
        wheel: f.spec,
        verbose: false,
    }
}

fn fetch_count(path: &Path) -> usize {
    fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn explicit_beats_environment_beats_cache() {
    let f = fixture("order");
    let mut r = resolver(&f, "/nonexistent/python3".into(), true);
    r.explicit = Some("/explicit.so".into());
    r.env_plugin = Some("/from-env.so".into());
    assert_eq!(
        r.resolve().unwrap(),
        (PathBuf::from("/explicit.so"), PluginSource::Explicit)
    );
    r.explicit = None;
    assert_eq!(
        r.resolve().unwrap(),
        (PathBuf::from("/from-env.so"), PluginSource::Environment)
    );
}

#[test]
fn fetched_once_then_reused_from_the_cache() {
    let f = fixture("once");
    let count = f.root.join("fetches");
    let python = fake_python(&f.root, Some(&f.wheel_src), false, &count);
    let (path, source) = resolver(&f, python.clone(), false).resolve().unwrap();
    assert_eq!(source, PluginSource::Fetched);
    assert_eq!(fs::read(&path).unwrap(), f.so_bytes);
    assert_eq!(
        path,
        resolver(&f, python.clone(), false)
            .cached_plugin_path()
            .unwrap()
    );
    // The wheel is not kept once unpacked.
    assert!(!path.with_file_name(f.spec.wheel_file).exists());

    // A second resolver (as in a second clone or process) finds it without fetching, even offline
    // and without any python.
    let (again, source) = resolver(&f, python, false).resolve().unwrap();
    assert_eq!((again.clone(), source), (path.clone(), PluginSource::Cache));
    let (offline, source) = resolver(&f, "/nonexistent/python3".into(), true)
        .resolve()
        .unwrap();
    assert_eq!((offline, source), (path, PluginSource::Cache));
    assert_eq!(fetch_count(&count), 1);
}

#[test]
fn concurrent_resolves_fetch_once() {
    let f = fixture("concurrent");
    let count = f.root.join("fetches");
    let python = fake_python(&f.root, Some(&f.wheel_src), false, &count);
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| resolver(&f, python.clone(), false).resolve().unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(fetch_count(&count), 1);
    let fetched = results
        .iter()
        .filter(|(_, s)| *s == PluginSource::Fetched)
        .count();
    assert_eq!(fetched, 1, "{results:?}");
    assert!(results
        .iter()
        .all(|(p, _)| fs::read(p).unwrap() == f.so_bytes));
}

#[test]
fn a_truncated_cached_plugin_is_replaced() {
    let f = fixture("truncated");
    let count = f.root.join("fetches");
    let python = fake_python(&f.root, Some(&f.wheel_src), false, &count);
    let r = resolver(&f, python, false);
    let so = r.cached_plugin_path().unwrap();
    fs::create_dir_all(so.parent().unwrap()).unwrap();
    fs::write(&so, &f.so_bytes[..100]).unwrap();
    let (path, source) = r.resolve().unwrap();
    assert_eq!(source, PluginSource::Fetched);
    assert_eq!(fs::read(path).unwrap(), f.so_bytes);
}

#[test]
fn offline_without_a_cached_plugin_names_the_command_to_run() {
    let f = fixture("offline");
    let count = f.root.join("fetches");
    let python = fake_python(&f.root, Some(&f.wheel_src), false, &count);
    match resolver(&f, python, true).resolve() {
        Err(Error::PluginInstall(msg)) => {
            assert!(msg.contains("STABLEGRAPH_OFFLINE"), "{msg}");
            assert!(
                msg.contains("-m pip download --no-deps fakepkg==1.0 -d "),
                "{msg}"
            );
        }
        other => panic!("expected PluginInstall, got {other:?}"),
    }
    assert_eq!(fetch_count(&count), 0, "offline must not run pip");
}

#[test]
fn offline_with_the_wheel_in_the_cache_unpacks_it() {
    // What a user gets after running the command the offline error gives.
    let f = fixture("offline-wheel");
    let r = resolver(&f, "python3".into(), true);
    let dir = r
        .cached_plugin_path()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    fs::create_dir_all(&dir).unwrap();
    fs::copy(&f.wheel_src, dir.join(f.spec.wheel_file)).unwrap();
    let (path, source) = r.resolve().unwrap();
    assert_eq!(source, PluginSource::CachedWheel);
    assert_eq!(fs::read(path).unwrap(), f.so_bytes);
}

#[test]
fn missing_python_is_an_error_that_says_what_to_install() {
    let f = fixture("nopython");
    match resolver(&f, "/nonexistent/bin/python3".into(), false).resolve() {
        Err(Error::PluginInstall(msg)) => {
            assert!(msg.contains("/nonexistent/bin/python3"), "{msg}");
            assert!(msg.contains("install Python 3 with pip"), "{msg}");
            assert!(msg.contains("STABLEGRAPH_PJRT_PLUGIN"), "{msg}");
        }
        other => panic!("expected PluginInstall, got {other:?}"),
    }
}

#[test]
fn python_without_pip_is_an_error_that_says_what_to_install() {
    let f = fixture("nopip");
    let count = f.root.join("fetches");
    let python = fake_python(&f.root, Some(&f.wheel_src), true, &count);
    match resolver(&f, python, false).resolve() {
        Err(Error::PluginInstall(msg)) => {
            assert!(msg.contains("-m pip` is not available"), "{msg}");
            assert!(msg.contains("python3-pip"), "{msg}");
        }
        other => panic!("expected PluginInstall, got {other:?}"),
    }
}

#[test]
fn a_failing_pip_reports_its_message() {
    let f = fixture("pipfail");
    let count = f.root.join("fetches");
    let python = fake_python(&f.root, None, false, &count);
    match resolver(&f, python, false).resolve() {
        Err(Error::PluginInstall(msg)) => {
            assert!(msg.contains("No matching distribution"), "{msg}");
        }
        other => panic!("expected PluginInstall, got {other:?}"),
    }
}

#[test]
fn a_wheel_with_the_wrong_hash_or_size_is_refused() {
    let f = fixture("badhash");
    // Same size, one byte changed.
    let mut bytes = fs::read(&f.wheel_src).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    let corrupt = f.root.join("src").join("corrupt").join(f.spec.wheel_file);
    fs::create_dir_all(corrupt.parent().unwrap()).unwrap();
    fs::write(&corrupt, &bytes).unwrap();
    let count = f.root.join("fetches");
    let python = fake_python(&f.root, Some(&corrupt), false, &count);
    match resolver(&f, python.clone(), false).resolve() {
        Err(Error::PluginInstall(msg)) => assert!(msg.contains("SHA-256"), "{msg}"),
        other => panic!("expected PluginInstall, got {other:?}"),
    }
    // The refused wheel is not left in the cache.
    let dir = resolver(&f, python.clone(), false)
        .cached_plugin_path()
        .unwrap();
    assert!(!dir.with_file_name(f.spec.wheel_file).exists());

    fs::write(&corrupt, &bytes[..100]).unwrap();
    match resolver(&f, python, false).resolve() {
        Err(Error::PluginInstall(msg)) => assert!(msg.contains("100 bytes"), "{msg}"),
        other => panic!("expected PluginInstall, got {other:?}"),
    }
}

#[test]
fn no_cache_directory_is_an_error() {
    let f = fixture("nocache");
    let mut r = resolver(&f, "python3".into(), false);
    r.cache_dir = None;
    let err = r.resolve().unwrap_err().to_string();
    assert!(err.contains("STABLEGRAPH_PLUGIN_DIR"), "{err}");
}

#[test]
fn the_cuda_plugin_and_its_library_folders_are_found_through_the_python() {
    let jax = fake_jax("found", true);
    assert_eq!(
        cuda::site_packages(&jax.python).unwrap(),
        vec![jax.site.clone()]
    );
    let found = cuda::locate(&jax.python).unwrap();
    assert_eq!(found.plugin, jax.plugin());
    assert_eq!(found.cuda_major, 13);
    assert_eq!(found.library_dirs(), jax.library_dirs());
    let names: Vec<_> = found
        .libraries
        .iter()
        .map(|l| l.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"]
    );
    // `STABLEGRAPH_PJRT_PLUGIN=cuda` resolves to it; any other value stays a path.
    let f = fixture("cuda-keyword");
    let mut r = resolver(&f, jax.python.clone(), true);
    r.env_plugin = Some("cuda".into());
    assert_eq!(r.resolve().unwrap(), (jax.plugin(), PluginSource::Cuda));
    r.env_plugin = Some("./cuda".into());
    let path = PathBuf::from("./cuda");
    assert_eq!(r.resolve().unwrap(), (path, PluginSource::Environment));
}

/// The fake plugin is an empty file: loading it (and preloading its empty libraries) fails with
/// errors that name the files, and nothing panics.
#[test]
fn a_cuda_plugin_that_does_not_load_is_a_clear_error() {
    let jax = fake_jax("unloadable", true);
    let found = cuda::locate(&jax.python).unwrap();
    let failed = found.preload_libraries();
    assert_eq!(failed.len(), 3, "{failed:?}");
    assert!(failed[0].starts_with("libcudart.so.13: "), "{failed:?}");
    match found.load() {
        Err(Error::PluginLoad { path, message }) => {
            assert_eq!(path, jax.plugin().canonicalize().unwrap());
            assert!(
                message.contains("failed to preload: libcudart.so.13"),
                "{message}"
            );
        }
        other => panic!("expected PluginLoad, got {other:?}"),
    }
    let message = Plugin::load(jax.plugin()).unwrap_err().to_string();
    assert!(message.starts_with("cannot load "), "{message}");
    assert!(message.contains("xla_cuda_plugin.so"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    let options = ClientOptions::new().preallocate(false);
    let loaded = Plugin::load(jax.plugin()).and_then(|p| Client::with_options(&p, &options));
    assert!(
        matches!(loaded, Err(Error::PluginLoad { .. })),
        "{loaded:?}"
    );
}

#[test]
fn no_cuda_plugin_installed_is_one_line_naming_what_to_install() {
    let jax = fake_jax("missing", false);
    let want = format!(
        "no CUDA PJRT plugin found for {} (looked in {} for \
         jax_plugins/xla_cuda13/xla_cuda_plugin.so and xla_cuda12): install jax[cuda13] (pip \
         install \"jax[cuda13]\") into that Python, set STABLEGRAPH_PYTHON to the Python that has \
         it, or set STABLEGRAPH_PJRT_PLUGIN to the plugin's .so",
        jax.python.display(),
        jax.site.display()
    );
    match cuda::locate(&jax.python) {
        Err(e @ Error::PluginSearch(_)) => assert_eq!(e.to_string(), want),
        other => panic!("expected PluginSearch, got {other:?}"),
    }
    let f = fixture("cuda-missing");
    let mut r = resolver(&f, jax.python.clone(), true);
    r.env_plugin = Some("cuda".into());
    assert_eq!(r.resolve().unwrap_err().to_string(), want);
    // A Python that cannot be run says which, and what to set instead.
    let gone = cuda::locate("/nonexistent/bin/python3".as_ref())
        .unwrap_err()
        .to_string();
    assert!(
        gone.starts_with("cannot run `/nonexistent/bin/python3`"),
        "{gone}"
    );
    assert!(gone.contains("STABLEGRAPH_PYTHON"), "{gone}");
}

/// The question put to the Python runs on a real interpreter (the one these tests already use)
/// and lists folders that exist.
#[test]
fn a_real_python_lists_its_package_directories() {
    let dirs = cuda::site_packages("python3".as_ref()).unwrap();
    assert!(!dirs.is_empty());
    assert!(dirs.iter().any(|d| d.is_dir()), "{dirs:?}");
}
