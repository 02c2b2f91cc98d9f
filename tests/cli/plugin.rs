//! `--plugin cuda` and `STABLEGRAPH_PJRT_PLUGIN=cuda` find JAX's CUDA plugin through the Python
//! `STABLEGRAPH_PYTHON` names, here a fake one over a fake install (`common::cuda`): nothing
//! installed, or a plugin file that does not load, is one `error:` line.

use std::process::Command;

use crate::common::cuda::{fake_jax, FakeJax};
use crate::{binary, text, TINY};

/// Runs `generate` on the tiny model with the fake Python and `args`, `env` added; returns the
/// one error line (checking it failed, did not panic, and said nothing else wrong).
fn error_with(jax: &FakeJax, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(binary())
        .args(["generate", "--model", TINY, "--max-new-tokens", "2"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("STABLEGRAPH_PYTHON", &jax.python)
        .env_remove("STABLEGRAPH_PJRT_PLUGIN")
        .envs(env.iter().copied())
        .output()
        .expect("running the mamba2 example");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
    errors[0].to_string()
}

#[test]
fn cuda_with_nothing_installed_names_what_to_install() {
    let jax = fake_jax("cli-missing", false);
    let by_flag = error_with(&jax, &["--plugin", "cuda"], &[]);
    let by_env = error_with(&jax, &[], &[("STABLEGRAPH_PJRT_PLUGIN", "cuda")]);
    for line in [&by_flag, &by_env] {
        let looked = format!(
            "no CUDA PJRT plugin found for {} (looked in {} ",
            jax.python.display(),
            jax.site.display()
        );
        assert!(line.contains(&looked), "{line}");
        assert!(line.contains("pip install \"jax[cuda13]\""), "{line}");
    }
}

#[test]
fn cuda_with_a_plugin_that_does_not_load_is_one_error_line() {
    let jax = fake_jax("cli-unloadable", true);
    let plugin = jax.plugin().canonicalize().unwrap();
    for line in [
        error_with(&jax, &["--plugin", "cuda"], &[]),
        error_with(&jax, &[], &[("STABLEGRAPH_PJRT_PLUGIN", "cuda")]),
    ] {
        let want = format!("cannot load {} as a shared library", plugin.display());
        assert!(line.contains(&want), "{line}");
    }
    // A path stays a path, even one named like the keyword.
    let line = error_with(&jax, &["--plugin", "./cuda"], &[]);
    assert!(line.contains("no PJRT plugin at ./cuda"), "{line}");
}
