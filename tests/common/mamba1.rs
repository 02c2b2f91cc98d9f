//! The Mamba-1 fixtures' directories, and the tiny one in `mamba_ssm`'s layout.

use std::path::PathBuf;

/// The fixture `name` of `tests/fixtures/mamba1/` (`tiny`: `mamba`; `falcon`: `falcon_mamba`).
pub fn fixture(name: &str) -> PathBuf {
    super::fixtures_dir().join("mamba1").join(name)
}

/// The tiny fixture in `mamba_ssm`'s layout: its config form and `backbone.embedding.weight`,
/// with the tied head saved as `mamba_ssm` saves it (removed when dropped).
pub fn as_mamba_ssm() -> super::TempDir {
    let dir = super::TempDir::new("mamba1-ssm");
    let config = r#"{"d_model": 32, "n_layer": 2, "vocab_size": 90, "ssm_cfg": {"d_state": 8},
        "rms_norm": true, "residual_in_fp32": true, "fused_add_norm": true,
        "pad_vocab_size_multiple": 16, "tie_embeddings": true}"#;
    std::fs::write(dir.join("config.json"), config).unwrap();
    let bytes = std::fs::read(fixture("tiny").join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n.replace("backbone.embeddings.", "backbone.embedding."), t))
        .collect();
    let embedding = st.tensor("backbone.embeddings.weight").unwrap();
    tensors.push(("lm_head.weight".to_string(), embedding));
    safetensors::serialize_to_file(tensors, None, &dir.join("model.safetensors")).unwrap();
    dir
}
