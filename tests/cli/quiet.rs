//! XLA's own log stays off stderr by default: a plain `generate` over two devices (the case that
//! made the CPU plugin log a line per client and a Shardy warning per sharded compile) prints
//! no absl/TSL line, and `STABLEGRAPH_LOG=info` or `--verbose` brings them back (so this test
//! sees them when they are there).

use std::process::{Command, Output};

use crate::binary;

/// `generate` of the shipped model over two devices, compiling every program (a memory-only
/// compile cache), with `env` set and every other logging variable removed; returns stderr.
fn generate(extra: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(binary());
    cmd.args(["generate", "--devices", "2", "--prompt-len", "16"])
        .args(["--max-new-tokens", "2", "--temperature", "0", "--no-stream"])
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("STABLEGRAPH_CACHE", "memory")
        .env_remove("STABLEGRAPH_LOG")
        .env_remove("TF_CPP_MIN_LOG_LEVEL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out: Output = cmd.output().expect("running the mamba2 example");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "mamba2 generate failed\nstdout:\n{}\nstderr:\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// The lines of `stderr` that XLA's logging wrote: absl/TSL's `I0000 00:00:...` style prefix
/// (severity letter, month and day) and absl's note before `InitializeLog`.
fn xla_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|line| {
            let b = line.as_bytes();
            let prefixed = b.len() > 5
                && b"IWEF".contains(&b[0])
                && b[1..5].iter().all(u8::is_ascii_digit)
                && b[5] == b' ';
            prefixed || line.starts_with("WARNING: All log messages before absl::InitializeLog()")
        })
        .collect()
}

#[test]
fn generate_prints_no_xla_log_unless_asked() {
    let quiet = generate(&[], &[]);
    assert!(
        xla_lines(&quiet).is_empty(),
        "XLA log lines on stderr by default:\n{quiet}"
    );
    // Our own stage lines are still there.
    assert!(quiet.contains("mamba2: loading the PJRT plugin"), "{quiet}");

    for (extra, env) in [
        (&[][..], &[("STABLEGRAPH_LOG", "info")][..]),
        (&["--verbose"][..], &[][..]),
    ] {
        let loud = generate(extra, env);
        let lines = xla_lines(&loud);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("WARNING: All log messages")),
            "{extra:?} {env:?}: no absl note in:\n{loud}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with('I') || l.starts_with('W')),
            "{extra:?} {env:?}: no XLA info or warning line in:\n{loud}"
        );
    }
}
