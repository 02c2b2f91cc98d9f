//! `eval`: its loss on the shipped model is `grad`'s (the training graph's cross-entropy) on the
//! same windows; bf16 and 8-bit weights stay near it; every family scores a text as transformers'
//! logits do; bad settings are one-line errors.

use serde_json::Value;

use crate::{check_run_facts, error_line, run_ok, scratch};

const SHIPPED: &str = "models/mamba2-bytes";

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn eval_loss_is_the_training_loss_on_the_same_windows() {
    let dir = scratch("eval");
    let text = "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n".repeat(4);
    let text = &text.as_bytes()[..200];
    let data = dir.join("text.md");
    std::fs::write(&data, text).unwrap();
    let eval = |dtype: &str| {
        let json = dir.join(format!("eval-{dtype}.json"));
        let args = ["eval", "--data", data.to_str().unwrap(), "--window", "64"];
        run_ok(
            &[
                &args[..],
                &["--dtype", dtype, "--json", json.to_str().unwrap()],
            ]
            .concat(),
        );
        read_json(&json)
    };
    let f32 = eval("f32");
    // 200 bytes: three windows of 64, the 8-byte tail left out; 63 predictions each.
    assert_eq!(
        (f32["windows"].as_u64(), f32["predictions"].as_u64()),
        (Some(3), Some(189))
    );
    check_run_facts(&f32, SHIPPED, "f32");
    let loss = f32["loss_nats"].as_f64().unwrap();
    let perplexity = f32["perplexity"].as_f64().unwrap();
    assert!((perplexity - loss.exp()).abs() < 1e-9 * perplexity, "{f32}");
    // The same windows as grad's prompts: its loss is the mean over the same predictions.
    let prompts: Vec<String> = text
        .chunks_exact(64)
        .map(|w| {
            w.iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    let grads = dir.join("grads.safetensors");
    let grad_json = dir.join("grad.json");
    run_ok(&[
        "grad",
        "--prompt-ids",
        &prompts.join(";"),
        "--dump-grads",
        grads.to_str().unwrap(),
        "--json",
        grad_json.to_str().unwrap(),
    ]);
    let want = read_json(&grad_json)["loss_nats"].as_f64().unwrap();
    assert!(
        (loss - want).abs() < 1e-4 * want,
        "eval {loss} vs grad {want}"
    );
    for dtype in ["bf16", "int8"] {
        let low = eval(dtype);
        check_run_facts(&low, SHIPPED, dtype);
        let l = low["loss_nats"].as_f64().unwrap();
        assert!((l - loss).abs() < 0.03 * loss, "{dtype}: {l} vs f32 {loss}");
    }
    let line = error_line(&["eval", "--data", data.to_str().unwrap(), "--window", "500"]);
    assert!(line.contains("fewer than one --window of 500"), "{line}");
    let line = error_line(&["eval", "--data", dir.join("missing").to_str().unwrap()]);
    assert!(line.contains("missing"), "{line}");
}

/// The mean next-token cross-entropy (nats) of `ids` under `logits` (`[n, vocab]`, position
/// `t` predicting token `t + 1`), in f64.
fn reference_loss(logits: &[f64], vocab: usize, ids: &[u32]) -> f64 {
    let mut nll = 0.0;
    for t in 0..ids.len() - 1 {
        let row = &logits[t * vocab..(t + 1) * vocab];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        nll += lse - row[ids[t + 1] as usize];
    }
    nll / (ids.len() - 1) as f64
}

/// Case 1's logits in the fixture `dir`.
fn cases_logits(dir: &str) -> crate::common::Stored {
    let mut cases =
        crate::common::read_safetensors(&std::path::Path::new(dir).join("cases.safetensors"));
    cases.remove("case1.logits").unwrap()
}

#[test]
fn eval_scores_every_family_as_transformers_logits_do() {
    // Each family's fixture with a character tokenizer, and a text whose tokens are case 1's
    // first prompt: eval's loss over that one window equals the cross-entropy of HF's logits.
    let fixtures = [
        "tests/fixtures/mamba2/tiny",
        "tests/fixtures/mamba1/tiny",
        "tests/fixtures/mamba1/falcon",
        "tests/fixtures/hybrid/bamba",
        "tests/fixtures/hybrid/granite",
        "tests/fixtures/hybrid/nemotron",
        "tests/fixtures/transformers/llama",
        "tests/fixtures/transformers/qwen2",
        "tests/fixtures/transformers/qwen3",
        "tests/fixtures/transformers/mistral",
        "tests/fixtures/transformers/gemma2",
    ];
    for fixture in fixtures {
        let name = fixture.replace('/', "-");
        let dir = scratch(&format!("eval-{name}"));
        let model = dir.join("model");
        std::fs::create_dir_all(&model).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(std::path::Path::new(fixture).join(f), model.join(f)).unwrap();
        }
        let logits = &cases_logits(fixture);
        let (len, vocab) = (logits.shape[1], logits.shape[2]);
        std::fs::write(
            model.join("tokenizer.json"),
            crate::char_tokenizer(vocab as u32),
        )
        .unwrap();
        let cases = crate::common::read_safetensors(
            &std::path::Path::new(fixture).join("cases.safetensors"),
        );
        let prompt = &crate::common::fixture_prompts(&cases, 1)[0];
        let text: String = prompt
            .iter()
            .map(|&t| char::from_u32(0x100 + t).unwrap())
            .collect();
        let data = dir.join("text.txt");
        std::fs::write(&data, text).unwrap();
        // Row 0's prompt fills the last positions of its padded length.
        let start = (len - prompt.len()) * vocab;
        let want = reference_loss(&logits.values[start..len * vocab], vocab, prompt);
        let json = dir.join("eval.json");
        let window = prompt.len().to_string();
        let stdout = run_ok(&[
            "eval",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--window",
            &window,
            "--json",
            json.to_str().unwrap(),
        ]);
        let out = read_json(&json);
        let loss = out["loss_nats"].as_f64().unwrap();
        let perplexity = out["perplexity"].as_f64().unwrap();
        assert!(perplexity.is_finite(), "{fixture}: {out}");
        assert!(
            (loss - want).abs() < 1e-4,
            "{fixture}: {loss} against {want}\n{stdout}"
        );
        assert_eq!(out["predictions"], prompt.len() - 1, "{fixture}");
        // 8-bit matrices: the same text scores within 5% of the f32 loss.
        run_ok(&[
            "eval",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--window",
            &window,
            "--dtype",
            "int8",
            "--json",
            json.to_str().unwrap(),
        ]);
        let eight = read_json(&json);
        check_run_facts(&eight, fixture, "int8");
        let loss8 = eight["loss_nats"].as_f64().unwrap();
        eprintln!("{fixture}: loss {loss:.5} nats in f32, {loss8:.5} with 8-bit matrices");
        assert!(
            (loss8 - loss).abs() < 0.05 * loss,
            "{fixture}: 8-bit {loss8} against f32 {loss}"
        );
    }
}

#[test]
fn eval_without_a_tokenizer_or_bytes_is_one_line() {
    let data = scratch("eval-no-tokenizer").join("text.txt");
    std::fs::write(&data, "some text to score").unwrap();
    for fixture in [
        "tests/fixtures/hybrid/bamba",
        "tests/fixtures/mamba1/falcon",
    ] {
        let e = error_line(&["eval", "--model", fixture, "--data", data.to_str().unwrap()]);
        assert!(
            e.contains("no tokenizer.json") && e.contains("96 tokens") && e.contains(fixture),
            "{e}"
        );
    }
}
