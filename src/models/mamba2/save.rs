//! Writing Mamba-2 checkpoints: `config.json` in HF transformers' `Mamba2Config` form and
//! `model.safetensors` under HF names, all f32, so that [`Mamba2Weights::load`] and HF's
//! `Mamba2ForCausalLM.from_pretrained` both read them.

use super::weights::named_differences;
use crate::tree::Tree;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use super::tune::checkpoint_pieces;
use super::{Mamba2Config, Mamba2Weights};
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::write_tensors;
use crate::models::training::to_checkpoint;

/// The file name of the config in a checkpoint directory.
const CONFIG: &str = "config.json";
/// The file name of the weights in a single-file checkpoint.
const WEIGHTS: &str = "model.safetensors";

impl Mamba2Config {
    /// The config as an HF transformers `config.json` (`model_type` `"mamba2"`, architecture
    /// `Mamba2ForCausalLM`), with the fields [`Mamba2Config::from_json`] reads, so that reading
    /// the text back gives this config (except [`Mamba2Config::scan_dtype`], which no config
    /// file holds: it reads back as F32). Keys are sorted, as transformers writes them.
    ///
    /// An infinite end of `time_step_limit` is written `Infinity`, as HF checkpoints hold it
    /// (Python's `json` reads it; strict JSON parsers do not, [`Mamba2Config::from_json`] does).
    /// The vocabulary is written as it is (already padded: `pad_vocab_size_multiple` 1).
    ///
    /// Fails for a config that [`Mamba2Config::validate`] rejects, and when `d_inner` is not a
    /// multiple of `hidden_size` (HF derives `d_inner` as the integer `expand * hidden_size`).
    pub fn to_json(&self) -> Result<String> {
        self.validate()?;
        let d_inner = self.d_inner();
        if !d_inner.is_multiple_of(self.hidden_size) {
            return Err(Error::InvalidArgument(format!(
                "the config's d_inner ({d_inner} = num_heads {} * head_dim {}) is not a multiple \
                 of hidden_size ({}), so no integer expand describes it in an HF config",
                self.num_heads, self.head_dim, self.hidden_size
            )));
        }
        let (dt_min, dt_max, dt_floor) = self.time_step_init;
        let fields: Vec<(&str, Value)> = vec![
            ("architectures", json!(["Mamba2ForCausalLM"])),
            ("chunk_size", json!(self.chunk_size)),
            ("conv_kernel", json!(self.conv_kernel)),
            ("dtype", json!("float32")),
            // No end-of-sequence token: HF's default (2) would stop generation at that id.
            ("eos_token_id", Value::Null),
            ("expand", json!(d_inner / self.hidden_size)),
            ("head_dim", json!(self.head_dim)),
            ("hidden_act", json!("silu")),
            ("hidden_size", json!(self.hidden_size)),
            ("layer_norm_epsilon", json!(self.norm_eps)),
            ("model_type", json!("mamba2")),
            ("n_groups", json!(self.n_groups)),
            ("norm_before_gate", json!(self.norm_before_gate)),
            ("num_heads", json!(self.num_heads)),
            ("num_hidden_layers", json!(self.num_layers)),
            ("pad_vocab_size_multiple", json!(1)),
            ("residual_in_fp32", json!(self.residual_in_fp32)),
            ("rms_norm", json!(true)),
            ("state_size", json!(self.state_size)),
            ("tie_word_embeddings", json!(self.tie_word_embeddings)),
            ("time_step_floor", json!(dt_floor)),
            ("time_step_limit", Value::Null), // written by hand below
            ("time_step_max", json!(dt_max)),
            ("time_step_min", json!(dt_min)),
            ("use_bias", json!(self.use_bias)),
            ("use_conv_bias", json!(self.use_conv_bias)),
            ("vocab_size", json!(self.vocab_size)),
        ];
        let mut out = String::from("{\n");
        for (i, (key, value)) in fields.iter().enumerate() {
            let text = if *key == "time_step_limit" {
                let (lo, hi) = self.time_step_limit;
                format!("[{}, {}]", python_float(lo), python_float(hi))
            } else {
                value.to_string()
            };
            let comma = if i + 1 < fields.len() { "," } else { "" };
            let _ = writeln!(out, "  \"{key}\": {text}{comma}");
        }
        out.push_str("}\n");
        Ok(out)
    }
}

/// A float as Python's `json` writes it: `Infinity`, `-Infinity`, or a JSON number with a
/// decimal point or exponent (so it reads back as a float).
fn python_float(x: f64) -> String {
    if x == f64::INFINITY {
        "Infinity".into()
    } else if x == f64::NEG_INFINITY {
        "-Infinity".into()
    } else {
        // Finite: validate() refuses NaN in the fields this writes.
        let text = json!(x).to_string();
        if text.contains(['.', 'e', 'E']) {
            text
        } else {
            text + ".0"
        }
    }
}

impl Mamba2Weights<HostArray> {
    /// Writes a checkpoint of `config` with these weights into `dir` (created, with its
    /// parents, if missing): `config.json` ([`Mamba2Config::to_json`]) and `model.safetensors`
    /// ([`Mamba2Weights::save_tensors`]). [`Mamba2Weights::load`] reads it back to the same
    /// values (bit for bit in f32; BF16 matrices load back exactly as BF16), and HF
    /// transformers' `Mamba2ForCausalLM.from_pretrained(dir)` loads it.
    ///
    /// The weights must fit the config: every tensor of [`Mamba2Weights::types`] present with
    /// its shape (`lm_head` exactly when the config is untied), else an error naming the
    /// tensors; nothing is written then. Errors writing name the path.
    pub fn save(&self, dir: &Path, config: &Mamba2Config) -> Result<()> {
        let text = config.to_json()?;
        self.refuse_8bit()?;
        self.check_fits(config)?;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let path = dir.join(CONFIG);
        std::fs::write(&path, text)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        self.save_tensors(&dir.join(WEIGHTS))
    }

    /// An error when the weights are 8-bit: checkpoints hold f32, and the quantized values
    /// would not read back as the weights they came from.
    fn refuse_8bit(&self) -> Result<()> {
        match self.named().iter().find(|(k, _)| k.ends_with("_scale")) {
            Some((key, _)) => Err(Error::InvalidArgument(format!(
                "{key}: 8-bit weights are not written (checkpoints hold f32); save the weights \
                 they were quantized from"
            ))),
            None => Ok(()),
        }
    }

    /// Writes every tensor to the safetensors file `path` under its HF checkpoint name
    /// (`backbone.embeddings.weight`, `backbone.layers.{i}.mixer.in_proj.weight`,
    /// `backbone.layers.{i}.mixer.conv1d.weight` as `[conv_dim, 1, K]`, `...mixer.A_log`,
    /// `backbone.norm_f.weight`, `lm_head.weight` when present, ...), as f32 (BF16, F16 and F64
    /// converted), with the metadata `{"format": "pt"}` that transformers looks for.
    ///
    /// Any structure of this shape may be written, not only weights: gradients, for example,
    /// under the names of the weights they belong to. The file's directory is created if
    /// missing; the file is written to a temporary name beside `path` and renamed, so a failed
    /// write leaves no partial file under `path`. A
    /// tensor of a non-float dtype (8-bit weights among them), or a failed write, is an error
    /// naming the tensor or path.
    pub fn save_tensors(&self, path: &Path) -> Result<()> {
        self.refuse_8bit()?;
        let types = self.try_map(|_, a| Ok(a.ty()))?;
        let tensors = to_checkpoint(self.flatten(), &checkpoint_pieces(&types))?;
        write_tensors(path, &tensors)
    }

    /// Checks that the weights have the tensors and shapes of `config` (dtypes aside).
    fn check_fits(&self, config: &Mamba2Config) -> Result<()> {
        let want = Mamba2Weights::<TensorType>::types(config, DType::F32)?;
        let want: Vec<(String, Vec<usize>)> = want
            .named()
            .into_iter()
            .map(|(k, t)| (k, t.dims.clone()))
            .collect();
        let have: Vec<(String, Vec<usize>)> = self
            .named()
            .into_iter()
            .map(|(k, a)| (k, a.dims().to_vec()))
            .collect();
        let problems = named_differences(&have, &want, |d, dims| {
            (d != dims).then(|| format!("has shape {d:?}, expected {dims:?}"))
        });
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "the weights do not fit the config: {}",
                problems.join("; ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::Dtype;

    fn tiny(tied: bool) -> Mamba2Config {
        Mamba2Config {
            hidden_size: 16,
            num_layers: 2,
            state_size: 8,
            head_dim: 8,
            num_heads: 4,
            n_groups: 2,
            conv_kernel: 4,
            chunk_size: 8,
            vocab_size: 40,
            tie_word_embeddings: tied,
            use_bias: !tied,
            ..Mamba2Config::mamba2_130m()
        }
    }

    /// A test's scratch directory, removed with what is in it when dropped.
    struct Scratch(std::path::PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A scratch path for one test, of its own (tests run in parallel: a directory shared by
    /// several, removed when one of them ends, could vanish under another), and its guard.
    fn scratch(name: &str) -> (Scratch, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("stablegraph-save-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (Scratch(dir.clone()), dir)
    }

    #[test]
    fn saved_checkpoints_load_back_identical() {
        for (tied, dtype) in [
            (true, DType::F32),
            (false, DType::F32),
            (false, DType::BF16),
        ] {
            let config = tiny(tied);
            let weights = Mamba2Weights::random(&config, dtype, 7).unwrap();
            // A directory that does not exist yet, two levels deep.
            let (_guard, dir) = scratch(&format!("{tied}-{dtype}"));
            let dir = dir.join("nested");
            weights.save(&dir, &config).unwrap();
            let read = Mamba2Config::from_file(dir.join("config.json")).unwrap();
            assert_eq!(read, config, "tied {tied}");
            let loaded = Mamba2Weights::load(&dir, &read, dtype).unwrap();
            let (a, b) = (weights.named(), loaded.named());
            assert_eq!(a.len(), b.len());
            for ((ka, va), (kb, vb)) in a.iter().zip(&b) {
                assert_eq!(ka, kb);
                assert_eq!(va, vb, "{ka} (tied {tied}, {dtype})");
            }
            assert_eq!(loaded.lm_head.is_some(), !tied);
        }
    }

    #[test]
    fn the_file_holds_hf_names_and_shapes_in_f32() {
        let config = tiny(false);
        let weights = Mamba2Weights::random(&config, DType::BF16, 1).unwrap();
        let (_guard, dir) = scratch("names");
        weights.save(&dir, &config).unwrap();
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        let mut want = vec![
            "backbone.embeddings.weight".to_string(),
            "backbone.norm_f.weight".to_string(),
            "lm_head.weight".to_string(),
        ];
        for i in 0..2 {
            for f in [
                "norm.weight",
                "mixer.in_proj.weight",
                "mixer.in_proj.bias",
                "mixer.conv1d.weight",
                "mixer.conv1d.bias",
                "mixer.dt_bias",
                "mixer.A_log",
                "mixer.D",
                "mixer.norm.weight",
                "mixer.out_proj.weight",
                "mixer.out_proj.bias",
            ] {
                want.push(format!("backbone.layers.{i}.{f}"));
            }
        }
        want.sort();
        assert_eq!(names, want);
        for name in &names {
            assert_eq!(st.tensor(name).unwrap().dtype(), Dtype::F32, "{name}");
        }
        let conv = st.tensor("backbone.layers.1.mixer.conv1d.weight").unwrap();
        assert_eq!(conv.shape(), [config.conv_dim(), 1, 4]);
        // The config is the HF form.
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        assert!(text.contains("\"model_type\": \"mamba2\""), "{text}");
        assert!(
            text.contains("\"architectures\": [\"Mamba2ForCausalLM\"]"),
            "{text}"
        );
        assert!(
            text.contains("\"time_step_limit\": [0.0, Infinity]"),
            "{text}"
        );
        assert!(text.contains("\"expand\": 2"), "{text}");
        assert!(!dir.join("model.safetensors.partial").exists());
    }

    /// The tiny fixture, written by HF transformers: loaded and saved again, every tensor has
    /// HF's name, shape and f32 bytes, and the config every field HF wrote that we write.
    #[test]
    fn resaving_the_hf_fixture_gives_its_tensors_and_fields() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mamba2/tiny");
        let config = Mamba2Config::from_file(fixture.join("config.json")).unwrap();
        let weights = Mamba2Weights::load(&fixture, &config, DType::F32).unwrap();
        let (_guard, dir) = scratch("fixture");
        weights.save(&dir, &config).unwrap();
        let theirs = std::fs::read(fixture.join("model.safetensors")).unwrap();
        let ours = std::fs::read(dir.join("model.safetensors")).unwrap();
        let (theirs, ours) = (
            safetensors::SafeTensors::deserialize(&theirs).unwrap(),
            safetensors::SafeTensors::deserialize(&ours).unwrap(),
        );
        let mut names: Vec<&str> = theirs.names().into_iter().collect();
        names.sort();
        let mut our_names: Vec<&str> = ours.names().into_iter().collect();
        our_names.sort();
        assert_eq!(our_names, names);
        for name in names {
            let (a, b) = (theirs.tensor(name).unwrap(), ours.tensor(name).unwrap());
            assert_eq!(a.dtype(), Dtype::F32, "{name}");
            assert_eq!(b.shape(), a.shape(), "{name}");
            assert_eq!(b.data(), a.data(), "{name}");
        }
        let parse = |p: &Path| -> Value {
            let text = std::fs::read_to_string(p).unwrap();
            // Both spellings of infinity, as strict JSON, to compare the other fields.
            let text = text
                .replace("Infinity", "\"inf\"")
                .replace("{\n      \"__float__\": \"\"inf\"\"\n    }", "\"inf\"");
            serde_json::from_str(&text).unwrap()
        };
        let (theirs, ours) = (
            parse(&fixture.join("config.json")),
            parse(&dir.join("config.json")),
        );
        let ours = ours.as_object().unwrap();
        for (key, value) in theirs.as_object().unwrap() {
            if let Some(mine) = ours.get(key) {
                assert_eq!(mine, value, "{key}");
            }
        }
        for key in [
            "model_type",
            "architectures",
            "num_heads",
            "head_dim",
            "expand",
        ] {
            assert!(ours.contains_key(key), "{key}");
        }
    }

    #[test]
    fn mismatched_weights_and_unwritable_paths_are_errors() {
        let config = tiny(true);
        let weights = Mamba2Weights::random(&config, DType::F32, 1).unwrap();
        let (_guard, dir) = scratch("mismatch");
        let e = weights.save(&dir, &tiny(false)).unwrap_err().to_string();
        assert!(e.contains("lm_head is missing"), "{e}");
        assert!(!dir.exists(), "nothing is written");
        let mut wider = config.clone();
        wider.hidden_size = 24;
        wider.num_heads = 6;
        let e = weights.save(&dir, &wider).unwrap_err().to_string();
        assert!(e.contains("embedding has shape [40, 16]"), "{e}");

        // A file where the directory should be: the error names the path.
        let (_guard, blocked) = scratch("blocker");
        let file = blocked.join("file");
        std::fs::create_dir_all(&blocked).unwrap();
        std::fs::write(&file, b"x").unwrap();
        let e = weights.save(&file, &config).unwrap_err().to_string();
        assert!(e.contains(&file.display().to_string()), "{e}");

        let mut odd = config.clone();
        odd.num_heads = 3; // d_inner 24, not a multiple of 16
        odd.n_groups = 1;
        let e = odd.to_json().unwrap_err().to_string();
        assert!(e.contains("not a multiple of hidden_size"), "{e}");
    }

    #[test]
    fn finite_and_infinite_limits_read_back() {
        let mut c = tiny(true);
        c.time_step_limit = (0.001, 0.5);
        assert_eq!(Mamba2Config::from_json(&c.to_json().unwrap()).unwrap(), c);
        c.time_step_limit = (0.0, f64::INFINITY);
        assert_eq!(Mamba2Config::from_json(&c.to_json().unwrap()).unwrap(), c);
    }
}
