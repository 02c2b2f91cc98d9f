//! `generate --model DIR` on the fixtures of every family but Mamba-2 (Mamba-1, Falcon-Mamba,
//! Bamba, Granite 4.0-H with and without experts, Nemotron-H): tokens and prompt logits against
//! HF transformers for a batch of two and a left-padded ragged batch, a `mamba_ssm`-layout
//! checkpoint, and the flags and model types it refuses.

use std::path::Path;

use crate::common::{max_abs, read_safetensors};
use crate::{check_run_facts, error_line, read_npy, run_ok, scratch, TINY};

/// Case `k` of the fixture in `dir` through the CLI: `--json` tokens equal HF's greedy tokens,
/// `--dump-logits` HF's prompt logits within 1e-4 at every real position (rows of different
/// lengths are left-padded in both), and the model line names `family`.
fn check(dir: &Path, k: usize, family: &str) {
    check_with(dir, k, family, &[]);
}

/// [`check`] with `extra` flags (several devices, say).
fn check_with(dir: &Path, k: usize, family: &str, extra: &[&str]) {
    let cases = read_safetensors(&dir.join("cases.safetensors"));
    let fixture = dir.to_str().unwrap().to_string();
    let ids = &cases[&format!("case{k}.input_ids")];
    let mask = &cases[&format!("case{k}.attention_mask")].values;
    let (rows, len) = (ids.shape[0], ids.shape[1]);
    let real = |r: usize| (0..len).filter(move |&t| mask[r * len + t] == 1.0);
    let prompt_ids: Vec<String> = (0..rows)
        .map(|r| {
            real(r)
                .map(|t| (ids.values[r * len + t] as u32).to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    let name = dir.file_name().unwrap().to_str().unwrap();
    let out_dir = scratch(&format!("family-{name}-{k}-{}", extra.join("")));
    let (json, npy) = (out_dir.join("out.json"), out_dir.join("logits.npy"));
    let greedy = &cases[&format!("case{k}.greedy")];
    let new = greedy.shape[1];
    let (ids, new_tokens) = (prompt_ids.join(";"), new.to_string());
    let mut args = vec![
        "generate",
        "--model",
        &fixture,
        "--prompt-ids",
        &ids,
        "--max-new-tokens",
        &new_tokens,
        "--json",
        json.to_str().unwrap(),
        "--dump-logits",
        npy.to_str().unwrap(),
    ];
    args.extend(extra);
    let stdout = run_ok(&args);
    assert!(stdout.contains(&format!("({family})")), "{stdout}");
    let out: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for r in 0..rows {
        let ours: Vec<u64> = out["tokens"][r]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        let hf: Vec<u64> = greedy.values[r * new..(r + 1) * new]
            .iter()
            .map(|&t| t as u64)
            .collect();
        assert_eq!(ours, hf, "{name} case {k} row {r}");
    }
    let (shape, logits) = read_npy(&npy);
    let want = &cases[&format!("case{k}.logits")];
    assert_eq!(shape, want.shape, "{name} case {k}");
    let vocab = shape[2];
    for r in 0..rows {
        for t in real(r) {
            let at = (r * len + t) * vocab;
            let ours: Vec<f64> = logits[at..at + vocab]
                .iter()
                .map(|&x| f64::from(x))
                .collect();
            let d = max_abs(&ours, &want.values[at..at + vocab]);
            assert!(
                d < 1e-4,
                "{name} case {k} row {r} position {t}: logits differ by {d}"
            );
        }
    }
}

#[test]
fn generate_runs_mamba_checkpoints_as_transformers_does() {
    check(&crate::common::mamba1::fixture("tiny"), 2, "Mamba-1");
}

#[test]
fn generate_runs_falcon_mamba_checkpoints_as_transformers_does() {
    check(&crate::common::mamba1::fixture("falcon"), 2, "Falcon-Mamba");
}

#[test]
fn generate_runs_the_hybrids_as_transformers_does() {
    for (name, family) in [
        ("bamba", "Bamba"),
        ("granite", "Granite 4.0-H"),
        ("granite_dense", "Granite 4.0-H"),
        ("nemotron", "Nemotron-H"),
    ] {
        let dir = crate::common::hybrid::fixture(name);
        check(&dir, 3, family);
    }
    check(&crate::common::hybrid::fixture("nemotron"), 1, "Nemotron-H");
}

#[test]
fn every_family_over_two_devices_is_transformers() {
    for (dir, family) in [
        (crate::common::mamba1::fixture("falcon"), "Falcon-Mamba"),
        (crate::common::hybrid::fixture("granite"), "Granite 4.0-H"),
    ] {
        for how in ["heads", "batch"] {
            check_with(&dir, 3, family, &["--devices", "2", "--parallel", how]);
        }
    }
}

#[test]
fn what_only_mamba2_takes_yet_is_a_one_line_error() {
    let e = error_line(&[
        "generate",
        "--model",
        "tests/fixtures/mamba1/tiny",
        "--bf16-dots",
        "on",
        "--prefill-chunk",
        "64",
    ]);
    assert!(e.contains("Mamba-1 checkpoints do not take"), "{e}");
    assert!(
        e.contains("--bf16-dots") && e.contains("--prefill-chunk"),
        "{e}"
    );
    // Devices that do not divide the heads: one line naming them; the progress lines before
    // it name the family.
    let args = [
        "generate",
        "--model",
        "tests/fixtures/hybrid/bamba",
        "--devices",
        "3",
        "--parallel",
        "heads",
    ];
    let e = error_line(&args);
    assert!(e.contains("do not divide into 3 equal parts"), "{e}");
    let stderr = crate::text(&crate::run(&args).stderr);
    assert!(stderr.contains("bamba: loading weights from"), "{stderr}");
    // grad: every family, every checkpoint tensor's gradient under its name and shape.
    let out = crate::scratch("family-grads");
    for dir in ["mamba1/falcon", "hybrid/nemotron", "hybrid/granite"] {
        let model = format!("tests/fixtures/{dir}");
        let path = out.join("grads.safetensors");
        let stdout = crate::run_ok(&[
            "grad",
            "--model",
            &model,
            "--prompt-ids",
            "5,6,7,8;9,10,11",
            "--dump-grads",
            path.to_str().unwrap(),
        ]);
        assert!(stdout.contains("mean over 5 predicted tokens"), "{stdout}");
        let weights = crate::common::read_safetensors(&Path::new(&model).join("model.safetensors"));
        let grads = crate::common::read_safetensors(&path);
        assert_eq!(grads.len(), weights.len(), "{dir}");
        for (name, w) in &weights {
            assert_eq!(grads[name].shape, w.shape, "{dir}: {name}");
            assert!(
                grads[name].values.iter().all(|v| v.is_finite()),
                "{dir}: {name}"
            );
        }
    }
}

#[test]
fn every_family_streams_what_it_generates() {
    let dir = "tests/fixtures/hybrid/nemotron";
    let args = |stream: &'static str| {
        [
            "generate",
            "--model",
            dir,
            "--prompt-ids",
            "5,6,7",
            "--max-new-tokens",
            "20",
            "--temperature",
            "0.8",
            "--seed",
            "4",
            stream,
        ]
    };
    let streamed = run_ok(&args("--stream"));
    assert!(
        streamed.contains("streamed in segments of 16"),
        "{streamed}"
    );
    let whole = run_ok(&args("--no-stream"));
    let row = whole
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("row 0")
        .trim();
    assert!(
        streamed.starts_with(&format!("{row},")),
        "{streamed}\nagainst\n{whole}"
    );
}

#[test]
fn every_family_emits_and_benches() {
    let out = scratch("family-emit");
    let stdout = run_ok(&[
        "emit",
        "--model",
        "tests/fixtures/hybrid/granite",
        "--prompt-ids",
        "5,6,7;8,9",
        "--max-new-tokens",
        "8",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    assert!(stdout.contains("Granite 4.0-H"), "{stdout}");
    let generate = std::fs::read_to_string(out.join("generate.mlir")).unwrap();
    // One program: the decode loop, the KV caches updated in place inside it.
    assert!(
        generate.contains("stablehlo.while"),
        "no loop in generate.mlir"
    );
    assert!(
        generate.contains("dynamic_update_slice"),
        "no in-place cache update"
    );
    for name in ["prefill", "step"] {
        let text = std::fs::read_to_string(out.join(format!("{name}.mlir"))).unwrap();
        assert!(text.contains("func.func"), "{name}.mlir: {text:.200}");
    }
    let json = out.join("bench.json");
    let stdout = run_ok(&[
        "bench",
        "--model",
        "tests/fixtures/mamba1/falcon",
        "--prompt-ids",
        "5,6,7",
        "--max-new-tokens",
        "8",
        "--repeat",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(stdout.contains("median"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(
        v["median"]["prefill_tokens_per_s"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert_eq!(v["runs"].as_array().unwrap().len(), 2, "{v}");
    check_run_facts(&v, "tests/fixtures/mamba1/falcon", "f32");
    // With bf16 or 8-bit matrices the weights take fewer bytes, and the JSON says so; 8-bit
    // matrices run for every family.
    let dirs = [
        TINY,
        "tests/fixtures/mamba1/falcon",
        "tests/fixtures/hybrid/granite",
        "tests/fixtures/hybrid/nemotron",
    ];
    for (dtype, dir) in dirs.iter().flat_map(|d| [("bf16", *d), ("int8", *d)]) {
        run_ok(&[
            "generate",
            "--model",
            dir,
            "--prompt-ids",
            "5,6,7",
            "--max-new-tokens",
            "4",
            "--dtype",
            dtype,
            "--json",
            json.to_str().unwrap(),
        ]);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        check_run_facts(&v, dir, dtype);
        assert_eq!(
            v["tokens"][0].as_array().unwrap().len(),
            4,
            "{dir} {dtype}: {v}"
        );
    }
}

#[test]
fn every_family_continues_from_a_state_file() {
    for dir in [
        "tests/fixtures/hybrid/granite",
        "tests/fixtures/mamba1/tiny",
    ] {
        let out = scratch(&format!("state-{}", dir.replace('/', "-")));
        let (state, json) = (out.join("state.safetensors"), out.join("out.json"));
        let tokens = |args: &[&str]| {
            let mut all = vec!["generate", "--model", dir, "--temperature", "0"];
            all.extend(args);
            all.extend(["--json", json.to_str().unwrap()]);
            let stdout = run_ok(&all);
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            let row: Vec<u64> = v["tokens"][0]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .collect();
            (stdout, row)
        };
        let first = ["--prompt-ids", "5,6,7", "--max-new-tokens", "4"];
        let (stdout, made) =
            tokens(&[&first[..], &["--state-out", state.to_str().unwrap()]].concat());
        assert!(stdout.contains("state     written to"), "{stdout}");
        let rest = ["--prompt-ids", "8,9", "--max-new-tokens", "5"];
        let (stdout, continued) =
            tokens(&[&rest[..], &["--state-in", state.to_str().unwrap()]].concat());
        assert!(stdout.contains("state     continued from"), "{stdout}");
        let whole: Vec<String> = [5, 6, 7]
            .iter()
            .chain(&made)
            .chain(&[8, 9])
            .map(|t| t.to_string())
            .collect();
        let (_, direct) = tokens(&["--prompt-ids", &whole.join(","), "--max-new-tokens", "5"]);
        assert_eq!(continued, direct, "{dir}");
    }
}

#[test]
fn every_family_samples_with_the_flags_mamba2_takes() {
    for dir in [
        "tests/fixtures/hybrid/bamba",
        "tests/fixtures/mamba1/falcon",
    ] {
        let out = scratch(&format!("sample-{}", dir.replace('/', "-")));
        let run = |seed: &str, file: &str| {
            let json = out.join(file);
            let stdout = run_ok(&[
                "generate",
                "--model",
                dir,
                "--prompt-ids",
                "5,6,7;8,9",
                "--max-new-tokens",
                "12",
                "--temperature",
                "0.9",
                "--top-k",
                "40",
                "--top-p",
                "0.95",
                "--repeat-penalty",
                "1.3",
                "--seed",
                seed,
                "--json",
                json.to_str().unwrap(),
            ]);
            assert!(stdout.contains("sampled: temperature 0.9"), "{stdout}");
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            assert_eq!(v["settings"]["sampling"]["mode"], "sample", "{v}");
            v["tokens"].clone()
        };
        let a = run("1", "a.json");
        assert_eq!(
            a,
            run("1", "b.json"),
            "{dir}: the same seed drew differently"
        );
        let others: Vec<_> = ["2", "3", "4"].iter().map(|s| run(s, "c.json")).collect();
        assert!(others.iter().any(|o| o != &a), "{dir}: every seed drew {a}");
    }
}

#[test]
fn an_unknown_model_type_is_a_one_line_error_listing_the_supported_ones() {
    let dir = scratch("gpt2");
    std::fs::write(dir.join("config.json"), r#"{"model_type": "gpt2"}"#).unwrap();
    let e = error_line(&["generate", "--model", dir.to_str().unwrap()]);
    assert!(e.contains("\"gpt2\" is not supported"), "{e}");
    for t in [
        "mamba2",
        "falcon_mamba",
        "bamba",
        "granitemoehybrid",
        "nemotron_h",
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
        "gemma2",
    ] {
        assert!(e.contains(t), "{e}");
    }
}

#[test]
fn generate_runs_a_mamba_ssm_checkpoint_as_mamba1() {
    let dir = crate::common::mamba1::as_mamba_ssm();
    let stdout = run_ok(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-new-tokens",
        "4",
    ]);
    assert!(stdout.contains("(Mamba-1)"), "{stdout}");
}
