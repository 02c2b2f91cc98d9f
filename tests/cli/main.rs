//! The `mamba2` example run as a user runs it, one file per topic: the subcommands
//! ([`subcommands`]: one-line errors, `generate` on the tiny fixture model checked against HF
//! transformers' fixtures, JSON and `.npy` outputs, tokenizers, state files, streams, two
//! devices, `emit`, `bench`, `train` and `grad`), the sampling and penalty settings
//! ([`generation_config`]), Mamba-1 checkpoints ([`mamba1`]), the quiet stderr ([`quiet`]), and
//! the HTTP server ([`serve`]), its chat completions ([`chat`]) and two of its replicas behind
//! nginx, one killed under load ([`nginx`]); `--plugin cuda` over a fake JAX install
//! ([`plugin`]); and the `digits` example ([`digits`]).
//!
//! An example binary is built first with `cargo build --example NAME` (a no-op when fresh),
//! in the profile and target directory of this test binary.

#[path = "../common/mod.rs"]
mod common;

mod chat;
mod digits;
mod eval;
mod families;
mod generation_config;
mod nginx;
mod plugin;
mod quiet;
mod serve;
mod subcommands;
mod tune;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The example binary, built on first use.
pub fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_example("mamba2"))
}

/// Builds the example `name` with `cargo build --example` (a no-op when fresh) in this test
/// binary's profile and target directory; returns its path.
pub fn build_example(name: &str) -> PathBuf {
    // This test runs from <target>/<profile>/deps/cli-<hash>.
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary in <target>/<profile>/deps");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "--example", name]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    if let Some(target_dir) = profile_dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    let status = cmd.status().expect("running cargo build --example");
    assert!(status.success(), "cargo build --example {name} failed");
    let bin = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.is_file(), "{} was not built", bin.display());
    bin
}

pub fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("running the mamba2 example")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the example, asserting success.
pub fn run_ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "mamba2 {args:?} failed\nstdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

pub const TINY: &str = "tests/fixtures/mamba2/tiny";

/// The bytes the tensors of the checkpoint in `dir` (`model.safetensors`) take in f32, read
/// from its header: what `--json`'s `weight_bytes` must say for an f32 run.
pub fn f32_checkpoint_bytes(dir: &str) -> u64 {
    let bytes = std::fs::read(Path::new(dir).join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let elements: usize = tensors
        .tensors()
        .iter()
        .map(|(_, t)| t.shape().iter().product::<usize>())
        .sum();
    4 * elements as u64
}

/// Checks the figures every `--json` reports: the matrices' `dtype`, `weight_bytes` (for f32,
/// the checkpoint's tensors in f32; for bf16, fewer; for int8, under half) and `peak_rss_mb`.
pub fn check_run_facts(json: &serde_json::Value, dir: &str, dtype: &str) {
    assert_eq!(json["dtype"], dtype, "{json}");
    let (got, f32_bytes) = (
        json["weight_bytes"].as_u64().unwrap(),
        f32_checkpoint_bytes(dir),
    );
    match dtype {
        "f32" => assert_eq!(got, f32_bytes, "{json}"),
        "bf16" => assert!(
            got < f32_bytes && got > f32_bytes / 2,
            "{got} of {f32_bytes}"
        ),
        _ => assert!(got < f32_bytes / 2, "{dtype}: {got} of {f32_bytes}"),
    }
    assert!(json["peak_rss_mb"].as_f64().unwrap() > 0.0, "{json}");
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cli")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the example expecting failure; returns its one `error:` line (and checks it did not
/// panic).
pub fn error_line(args: &[&str]) -> String {
    let out = run(args);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
    errors[0].to_string()
}

/// Reads a `.npy` v1.0 float32 file: its shape and data, checking header, alignment and size.
pub fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "magic and version");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + header_len) % 64, 0, "header not aligned to 64");
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(header.ends_with('\n'));
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_text = header.split("'shape': (").nth(1).unwrap();
    let shape: Vec<usize> = shape_text[..shape_text.find(')').unwrap()]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data = &bytes[10 + header_len..];
    assert_eq!(data.len(), 4 * shape.iter().product::<usize>(), "data size");
    let values = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (shape, values)
}

/// A character-level `tokenizer.json` for a vocabulary of `size` tokens: token `i` is the
/// character U+0100 + i (letters of Latin Extended-A and B, one token each).
pub fn char_tokenizer(size: u32) -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..size)
        .map(|i| {
            (
                char::from_u32(0x100 + i).unwrap().to_string(),
                serde_json::Value::from(i),
            )
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": "."},
            "behavior": "Isolated",
            "invert": false
        },
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "\u{100}"}
    })
    .to_string()
}
