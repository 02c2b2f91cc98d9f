//! `train --model DIR`: fine-tuning a checkpoint of every family with its `tokenizer.json`
//! (a character-level one over the fixtures' 96 tokens), the written checkpoint loaded back by
//! `generate`; the bad inputs each one line, with nothing written.

use std::path::{Path, PathBuf};

use crate::{char_tokenizer, error_line, run_ok, scratch};

/// `fixture` (under tests/fixtures) copied into `dir` with a character-level tokenizer.json.
fn with_tokenizer(fixture: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture);
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), model.join(f)).unwrap();
    }
    std::fs::write(model.join("tokenizer.json"), char_tokenizer(96)).unwrap();
    model
}

/// A learnable text of `n` characters the tokenizer knows: words of a small vocabulary.
fn text(n: usize) -> String {
    let words = [
        "\u{105}\u{10a}\u{140}",
        "\u{11f}\u{103}",
        "\u{150}\u{15a}\u{12c}\u{107}",
    ];
    let mut out = String::new();
    let mut k = 0usize;
    while out.chars().count() < n {
        out.push_str(words[(k * 7 + k / 3) % words.len()]);
        k += 1;
    }
    out
}

#[test]
fn train_fine_tunes_every_family_and_generate_loads_the_result() {
    let fixtures = [
        "mamba2/tiny",
        "mamba1/tiny",
        "mamba1/falcon",
        "hybrid/bamba",
        "hybrid/granite",
        "hybrid/nemotron",
    ];
    for fixture in fixtures {
        let dir = scratch(&format!("tune-{}", fixture.replace('/', "-")));
        let model = with_tokenizer(fixture, &dir);
        let data = dir.join("data.txt");
        std::fs::write(&data, text(6000)).unwrap();
        let out = dir.join("out");
        let json = run_ok(&[
            "train",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--steps",
            "40",
            "--seq-len",
            "64",
            "--batch",
            "4",
            "--eval-every",
            "20",
            "--lr",
            "3e-3",
            "--out",
            out.to_str().unwrap(),
            "--json",
        ]);
        let summary: serde_json::Value = serde_json::from_str(&json).unwrap();
        let (first, last) = (
            summary["first_train_bits"].as_f64().unwrap(),
            summary["final_train_bits"].as_f64().unwrap(),
        );
        assert!(
            last < 0.6 * first,
            "{fixture}: train loss {first} -> {last}"
        );
        assert_eq!(summary["unit"], "token", "{fixture}");
        for f in [
            "config.json",
            "tokenizer.json",
            "model.safetensors",
            "loss.csv",
            "loss.svg",
        ] {
            assert!(out.join(f).is_file(), "{fixture}: {f} missing");
        }
        let csv = std::fs::read_to_string(out.join("loss.csv")).unwrap();
        assert!(csv.starts_with("step,train_bpt,val_bpt\n"), "{csv}");
        assert_eq!(csv.lines().count(), 11, "{fixture}: {csv}");
        let stdout = run_ok(&[
            "generate",
            "--model",
            out.to_str().unwrap(),
            "--prompt",
            "\u{105}\u{10a}",
            "--max-new-tokens",
            "6",
        ]);
        assert!(stdout.contains("decode"), "{fixture}: {stdout}");
    }
}

#[test]
fn bad_fine_tuning_input_is_one_line_and_writes_nothing() {
    let dir = scratch("tune-bad");
    let model = with_tokenizer("hybrid/bamba", &dir);
    let data = dir.join("data.txt");
    std::fs::write(&data, text(3000)).unwrap();
    let out = dir.join("out");
    let train = |model: &Path, data: &Path, seq: &str| {
        error_line(&[
            "train",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--steps",
            "4",
            "--seq-len",
            seq,
            "--out",
            out.to_str().unwrap(),
        ])
    };
    // Data shorter than one window.
    let e = train(&model, &data, "400");
    assert!(
        e.contains("fewer than one window of --seq-len + 1 = 401"),
        "{e}"
    );
    // A vocabulary that is neither a tokenizer's nor bytes.
    let bare = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid/bamba");
    let e = train(&bare, &data, "32");
    assert!(
        e.contains("no tokenizer.json") && e.contains("96 tokens"),
        "{e}"
    );
    // A checkpoint with a tensor missing.
    let broken = dir.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(model.join(f), broken.join(f)).unwrap();
    }
    let bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "model.layers.0.mamba.D")
        .collect();
    safetensors::serialize_to_file(kept, None, &broken.join("model.safetensors")).unwrap();
    let e = train(&broken, &data, "32");
    assert!(e.contains("model.layers.0.mamba.D"), "{e}");
    assert!(!out.exists(), "a failed run wrote {}", out.display());
}

/// `--devices 2` splits each batch over two devices: the same losses as one device within
/// float32 rounding, for a family with attention (Bamba) and one without (Falcon-Mamba).
#[test]
fn two_devices_train_as_one() {
    for fixture in ["hybrid/bamba", "mamba1/falcon"] {
        let dir = scratch(&format!("tune-devices-{}", fixture.replace('/', "-")));
        let model = with_tokenizer(fixture, &dir);
        let data = dir.join("data.txt");
        std::fs::write(&data, text(4000)).unwrap();
        let losses: Vec<Vec<f64>> = ["1", "2"]
            .iter()
            .map(|devices| {
                let out = dir.join(format!("out{devices}"));
                run_ok(&[
                    "train",
                    "--model",
                    model.to_str().unwrap(),
                    "--data",
                    data.to_str().unwrap(),
                    "--steps",
                    "8",
                    "--micro-steps",
                    "2",
                    "--seq-len",
                    "32",
                    "--batch",
                    "4",
                    "--eval-every",
                    "4",
                    "--devices",
                    devices,
                    "--out",
                    out.to_str().unwrap(),
                ]);
                let csv = std::fs::read_to_string(out.join("loss.csv")).unwrap();
                csv.lines()
                    .skip(1)
                    .flat_map(|l| l.split(',').skip(1).filter(|v| !v.is_empty()))
                    .map(|v| v.parse().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(losses[0].len(), 6, "{fixture}: {losses:?}");
        for (a, b) in losses[0].iter().zip(&losses[1]) {
            assert!((a - b).abs() < 1e-5 * a, "{fixture}: {a} vs {b}");
        }
    }
}
