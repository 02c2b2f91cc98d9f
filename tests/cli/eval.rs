//! `eval`: its loss on the shipped model is `grad`'s (the training graph's cross-entropy) on the
//! same windows; bf16 and 8-bit weights stay near it; bad settings are one-line errors.

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
