//! The layer stack's fixtures' directories (the hybrids' and the transformers'), and copies of
//! them with a config or checkpoint edited.

use std::path::PathBuf;

/// The fixture `name` of `tests/fixtures/hybrid/` (`bamba`, `granite`, `granite_dense`,
/// `nemotron`).
pub fn fixture(name: &str) -> PathBuf {
    super::fixtures_dir().join("hybrid").join(name)
}

/// The fixture `name` of `tests/fixtures/transformers/` (`llama`, `llama_linear`,
/// `llama_mlp_bias`, `qwen2`, `qwen3`, `mistral`, `gemma2`).
pub fn transformer(name: &str) -> PathBuf {
    super::fixtures_dir().join("transformers").join(name)
}

/// The layer stack's fixture `name`: a hybrid's, else a transformer's.
pub fn stack_fixture(name: &str) -> PathBuf {
    let hybrid = fixture(name);
    match hybrid.exists() {
        true => hybrid,
        false => transformer(name),
    }
}

/// A copy of the fixture `name` in a fresh directory named for `case` (removed when dropped), with `edit` applied to
/// its config text and the checkpoint's tensors for which `keep` (given the name) is false
/// left out.
pub fn copy_with(
    name: &str,
    case: &str,
    edit: impl Fn(&str) -> String,
    keep: impl Fn(&str) -> bool,
) -> super::TempDir {
    let dir = super::TempDir::new(&format!("hybrid-{case}"));
    let from = stack_fixture(name);
    let config = std::fs::read_to_string(from.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), edit(&config)).unwrap();
    let bytes = std::fs::read(from.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| keep(n)).collect();
    safetensors::serialize_to_file(tensors, None, &dir.join("model.safetensors")).unwrap();
    dir
}
