//! `mamba2 generate`'s sampling and penalty settings as a user sets them: the shipped model's
//! generation_config.json as the defaults, flags overriding it key by key, `--temperature 0`
//! greedy without it, a checkpoint without one greedy, the settings recorded in `--json`, and
//! one-line errors naming the flag or the file and key.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{error_line, run, scratch, text, TINY};

/// Runs `generate` with `args` and `--json`, asserting success; returns the JSON.
fn generate_json(name: &str, args: &[&str]) -> Value {
    let dir = scratch(name);
    let json = dir.join("out.json");
    let mut all = vec!["generate", "--no-stream", "--json", json.to_str().unwrap()];
    all.extend(args);
    let out = run(&all);
    assert!(
        out.status.success(),
        "mamba2 {all:?} failed\nstdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

fn shipped() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/mamba2-bytes");
    if dir.join("generation_config.json").is_file() {
        Some(dir)
    } else {
        eprintln!("skipped: {} has no generation_config.json", dir.display());
        None
    }
}

#[test]
fn the_shipped_generation_config_sets_the_defaults_and_flags_override_it() {
    let Some(dir) = shipped() else { return };
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("generation_config.json")).unwrap())
            .unwrap();
    let prompt = ["--prompt", "fn main() {", "--max-new-tokens", "24"];
    let v = generate_json("shipped", &prompt);
    let s = &v["settings"];
    assert_eq!(file["do_sample"], true, "the shipped model samples");
    assert_eq!(s["sampling"]["mode"], "sample");
    assert_eq!(s["sampling"]["seed"], 0);
    for key in ["temperature", "top_k", "top_p"] {
        assert_eq!(s["sampling"][key], file[key], "{key}");
    }
    for key in ["repetition_penalty", "no_repeat_ngram_size"] {
        assert_eq!(s["penalties"][key], file[key], "{key}");
    }
    assert!(s["generation_config"]
        .as_str()
        .unwrap()
        .ends_with("models/mamba2-bytes/generation_config.json"));
    // The fixed default seed makes the default output reproducible.
    assert_eq!(
        v["tokens"],
        generate_json("shipped-again", &prompt)["tokens"]
    );

    // Flags win key by key; the rest still comes from the file.
    let mut args = prompt.to_vec();
    args.extend([
        "--temperature",
        "0.9",
        "--top-k",
        "5",
        "--repeat-penalty",
        "1.25",
    ]);
    let s = &generate_json("override", &args)["settings"];
    assert_eq!(s["sampling"]["temperature"], 0.9);
    assert_eq!(s["sampling"]["top_k"], 5);
    assert_eq!(s["sampling"]["top_p"], file["top_p"]);
    assert_eq!(s["penalties"]["repetition_penalty"], 1.25);
    assert_eq!(
        s["penalties"]["no_repeat_ngram_size"],
        file["no_repeat_ngram_size"]
    );

    // --temperature 0: greedy, the file unread; only penalty flags given apply.
    let mut args = prompt.to_vec();
    args.extend(["--temperature", "0"]);
    let s = &generate_json("greedy", &args)["settings"];
    assert_eq!(s["sampling"]["mode"], "greedy");
    assert_eq!(s["penalties"]["repetition_penalty"], 1.0);
    assert_eq!(s["penalties"]["no_repeat_ngram_size"], 0);
    assert_eq!(s["generation_config"], Value::Null);
    args.extend(["--no-repeat-ngram-size", "3", "--repeat-last-n", "-1"]);
    let s = &generate_json("greedy-ngram", &args)["settings"];
    assert_eq!(s["sampling"]["mode"], "greedy");
    assert_eq!(s["penalties"]["no_repeat_ngram_size"], 3);
    assert_eq!(s["penalties"]["repeat_last_n"], Value::Null);
}

#[test]
fn a_checkpoint_without_generation_config_is_greedy_and_flags_apply() {
    let ids = "5,17,5,17,5,3,9";
    let base = [
        "--model",
        TINY,
        "--prompt-ids",
        ids,
        "--max-new-tokens",
        "20",
    ];
    let s = &generate_json("tiny", &base)["settings"];
    assert_eq!(s["sampling"]["mode"], "greedy");
    assert_eq!(s["penalties"]["repetition_penalty"], 1.0);
    assert_eq!(s["penalties"]["repeat_last_n"], Value::Null);
    assert_eq!(s["generation_config"], Value::Null);
    // The penalties reach the program: with 1-grams banned, no token of the context repeats.
    let mut args = base.to_vec();
    args.extend(["--no-repeat-ngram-size", "1", "--repeat-last-n", "4"]);
    let v = generate_json("tiny-ngram", &args);
    assert_eq!(v["settings"]["penalties"]["repeat_last_n"], 4);
    let mut seen: Vec<u64> = ids.split(',').map(|t| t.parse().unwrap()).collect();
    for t in v["tokens"][0].as_array().unwrap() {
        let t = t.as_u64().unwrap();
        assert!(!seen.contains(&t), "{t} repeats: {}", v["tokens"]);
        seen.push(t);
    }
}

#[test]
fn a_checkpoints_own_generation_config_is_read_and_checked() {
    let dir = scratch("model");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(Path::new(TINY).join(f), dir.join(f)).unwrap();
    }
    let config = dir.join("generation_config.json");
    std::fs::write(
        &config,
        r#"{"do_sample": true, "temperature": 0.5, "top_k": 500, "num_beams": 4,
            "no_repeat_ngram_size": 2, "repeat_last_n": 16, "pad_token_id": null}"#,
    )
    .unwrap();
    let model = dir.to_str().unwrap();
    let args = [
        "--model",
        model,
        "--prompt-ids",
        "1,2,3",
        "--max-new-tokens",
        "8",
    ];
    let s = &generate_json("own", &args)["settings"];
    assert_eq!(s["sampling"]["mode"], "sample");
    assert_eq!(s["sampling"]["temperature"], 0.5);
    // top_k beyond the vocabulary (100) is the vocabulary, as in transformers.
    assert_eq!(s["sampling"]["top_k"], 100);
    assert_eq!(s["sampling"]["top_p"], 1.0);
    assert_eq!(s["penalties"]["no_repeat_ngram_size"], 2);
    assert_eq!(s["penalties"]["repeat_last_n"], 16);
    std::fs::write(&config, r#"{"do_sample": true, "top_p": 1.5}"#).unwrap();
    let e = error_line(&["generate", "--model", model, "--prompt-ids", "1,2,3"]);
    assert!(
        e.contains("generation_config.json") && e.contains("top_p"),
        "{e}"
    );
}

#[test]
fn bad_penalty_flags_are_one_line_errors_naming_the_flag() {
    let base = ["generate", "--model", TINY, "--prompt-ids", "1,2,3"];
    for (flag, value) in [
        ("--repeat-penalty", "0"),
        ("--repeat-penalty", "-1.5"),
        ("--repeat-penalty", "NaN"),
        ("--presence-penalty", "inf"),
        ("--frequency-penalty", "NaN"),
        ("--repeat-last-n", "-2"),
        ("--no-repeat-ngram-size", "99999999"),
    ] {
        let mut args = base.to_vec();
        args.extend([flag, value]);
        let e = error_line(&args);
        assert!(e.contains(flag), "{flag} {value}: {e}");
    }
}
