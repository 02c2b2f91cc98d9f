//! Where Mamba-2 weights come from: safetensors checkpoints (one file, or shards with an index;
//! f32, bf16 or f16 on disk; HF or `mamba_ssm` names) and a deterministic random initialisation.

use crate::tree::Tree;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::weights::{check_matmul_dtype, quantize_layer};
use super::{LayerWeights, Mamba2Config, Mamba2Weights};
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::quant;
use crate::rng::SplitMix64;

/// The single-file checkpoint.
const SINGLE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
const INDEX: &str = "model.safetensors.index.json";
/// The HF and `mamba_ssm` names of the embedding.
const EMBEDDING_NAMES: [&str; 2] = ["backbone.embeddings.weight", "backbone.embedding.weight"];

/// Options of [`Mamba2Weights::load_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Accept tensors that hold NaN or infinite values (for debugging such weights). By
    /// default a checkpoint with any is refused, naming each such tensor and its count.
    pub allow_nonfinite: bool,
}

impl Mamba2Weights<HostArray> {
    /// Loads a safetensors checkpoint from `dir`: `model.safetensors`, else
    /// `model.safetensors.index.json` and the shards its `weight_map` names, else the one
    /// `*.safetensors` file the directory holds.
    ///
    /// Tensors may be f32, bf16, f16 or f64 on disk, under HF names
    /// (`backbone.embeddings.weight`, `backbone.layers.{i}.mixer.in_proj.weight`, ...) or
    /// `mamba_ssm`'s (`backbone.embedding.weight`). They are converted as
    /// [`Mamba2Weights::types`] says: the matrices to `matmul_dtype` (F32 or BF16, rounding to
    /// nearest even; or read as F32 and quantized to 8 bits, [`Mamba2Weights::to_8bit`]),
    /// everything else to F32; the conv weight `[conv_dim, 1, K]` is stored as
    /// `[conv_dim, K]`. With a tied config, a `lm_head.weight` in the file (as `mamba_ssm`
    /// saves it) has its shape checked and is otherwise ignored: the head is the embedding.
    ///
    /// Missing, unexpected, duplicated or mis-shaped tensors, unsupported dtypes, and tensors
    /// holding NaN or infinite values (after the conversion, so an f64 value too large for f32
    /// counts) are one [`Error::InvalidArgument`] naming the directory and listing every
    /// problem, sorted; a non-finite tensor is listed with its count of bad values. An
    /// unreadable or corrupt file is an error naming the file. A config that
    /// [`Mamba2Config::validate`] rejects is an error before any file is read.
    ///
    /// [`Mamba2Weights::load_with`] takes [`LoadOptions`], to accept non-finite values.
    pub fn load(dir: &Path, config: &Mamba2Config, matmul_dtype: DType) -> Result<Self> {
        Mamba2Weights::load_with(dir, config, matmul_dtype, &LoadOptions::default())
    }

    /// [`Mamba2Weights::load`] with options: `allow_nonfinite` accepts NaN and infinite values
    /// (and skips the scan for them).
    pub fn load_with(
        dir: &Path,
        config: &Mamba2Config,
        matmul_dtype: DType,
        options: &LoadOptions,
    ) -> Result<Self> {
        if matmul_dtype == quant::QUANTIZED {
            config.validate()?;
            return Mamba2Weights::load_with(dir, config, DType::F32, options)?.to_8bit();
        }
        let types = Mamba2Weights::<TensorType>::types(config, matmul_dtype)?;
        let mut loader = Loader::new(&types, config, options);
        let index = loader.read_dir(dir)?;
        loader.finish(dir, &types, index.as_ref())
    }

    /// A deterministic random model with magnitudes like HF's initialisation: the embedding
    /// ~ N(0, 0.02); `in_proj`, `out_proj` and an untied `lm_head` ~ U(±1/sqrt(fan_in)), with
    /// `out_proj` further divided by sqrt(num_layers) as HF's `rescale_prenorm_residual` does;
    /// the conv weight and bias ~ U(±1/sqrt(K)) (PyTorch's `Conv1d` default); `dt_bias` the
    /// inverse softplus of `dt` log-uniform in `[time_step_min, time_step_max]` (at least
    /// `time_step_floor`); `A_log = ln U(1, 16)`; `D = 1`;
    /// the block and gated norm weights 1 + U(±0.1) and `norm_f` 1; `in_proj`/`out_proj`
    /// biases ~ U(±0.02) (HF zeroes them; small non-zero values exercise them).
    ///
    /// Types are those of [`Mamba2Weights::types`], which also says what is an error (a
    /// `matmul_dtype` other than F32, BF16 or 8-bit, a config that [`Mamba2Config::validate`]
    /// rejects). 8-bit weights are the f32 draw quantized ([`Mamba2Weights::to_8bit`]). Each tensor draws from its own stream, seeded by `seed` and its name, so a
    /// tensor does not change when the config changes the others.
    pub fn random(config: &Mamba2Config, matmul_dtype: DType, seed: u64) -> Result<Self> {
        check_matmul_dtype(matmul_dtype)?;
        config.validate()?;
        // 8-bit: each matrix drawn in f32 and quantized at once (one f32 matrix at a time).
        let eight_bit = matmul_dtype == quant::QUANTIZED;
        let m = if eight_bit { DType::F32 } else { matmul_dtype };
        let c = config;
        let (h, di, k) = (c.hidden_size, c.d_inner(), c.conv_kernel);
        let fan = |n: usize| 1.0 / (n.max(1) as f64).sqrt();
        let conv = fan(k);
        let gen = |key: &str, dtype: DType, dims: &[usize], f: &dyn Fn(&mut Rng) -> f64| {
            random_tensor(seed, key, dtype, dims, f)
        };
        let uniform = |a: f64| move |r: &mut Rng| r.uniform(-a, a);
        let near_one = |r: &mut Rng| 1.0 + r.uniform(-0.1, 0.1);
        let layers = (0..c.num_layers)
            .map(|i| {
                let key = |f: &str| format!("layers.{i}.{f}");
                let f32s = |f: &str, dims: &[usize], s: &dyn Fn(&mut Rng) -> f64| {
                    gen(&key(f), DType::F32, dims, s)
                };
                let layer = LayerWeights {
                    norm: f32s("norm", &[h], &near_one),
                    in_proj: gen(
                        &key("mixer.in_proj"),
                        m,
                        &[c.in_proj_dim(), h],
                        &uniform(fan(h)),
                    ),
                    in_proj_scale: None,
                    in_proj_bias: c
                        .use_bias
                        .then(|| f32s("mixer.in_proj_bias", &[c.in_proj_dim()], &uniform(0.02))),
                    conv_weight: f32s("mixer.conv1d", &[c.conv_dim(), k], &uniform(conv)),
                    conv_bias: c
                        .use_conv_bias
                        .then(|| f32s("mixer.conv1d_bias", &[c.conv_dim()], &uniform(conv))),
                    dt_bias: f32s("mixer.dt_bias", &[c.num_heads], &|r| {
                        let (dt_min, dt_max, floor) = c.time_step_init;
                        let dt = r.uniform(dt_min.ln(), dt_max.ln()).exp().max(floor);
                        // softplus(dt + ln(1 - e^-dt)) = dt.
                        dt + (-(-dt).exp_m1()).ln()
                    }),
                    a_log: f32s("mixer.A_log", &[c.num_heads], &|r| {
                        r.uniform(1.0, 16.0).ln()
                    }),
                    d: f32s("mixer.D", &[c.num_heads], &|_| 1.0),
                    gated_norm: f32s("mixer.norm", &[di], &near_one),
                    out_proj: gen(&key("mixer.out_proj"), m, &[h, di], &|r| {
                        r.uniform(-fan(di), fan(di)) / (c.num_layers as f64).sqrt()
                    }),
                    out_proj_scale: None,
                    out_proj_bias: c
                        .use_bias
                        .then(|| f32s("mixer.out_proj_bias", &[h], &uniform(0.02))),
                };
                if eight_bit {
                    quantize_layer(layer, i)
                } else {
                    Ok(layer)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let quantized = |name: &str, a: HostArray| -> Result<(HostArray, Option<HostArray>)> {
            if !eight_bit {
                return Ok((a, None));
            }
            let (values, scale) = quant::quantize_matrix(name, &a)?;
            Ok((values, Some(scale)))
        };
        let (embedding, embedding_scale) = quantized(
            "embedding",
            gen("embedding", m, &[c.vocab_size, h], &|r| 0.02 * r.normal()),
        )?;
        let head = (!c.tie_word_embeddings)
            .then(|| {
                let head = gen("lm_head", m, &[c.vocab_size, h], &uniform(fan(h)));
                quantized("lm_head", head)
            })
            .transpose()?;
        let (lm_head, lm_head_scale) = head.map_or((None, None), |(h, s)| (Some(h), s));
        Ok(Mamba2Weights {
            embedding,
            embedding_scale,
            layers,
            norm_f: gen("norm_f", DType::F32, &[h], &|_| 1.0),
            lm_head,
            lm_head_scale,
        })
    }
}

/// The files of a checkpoint.
pub(crate) struct Files {
    /// The safetensors files to read, by name in the directory.
    pub(crate) shards: Vec<String>,
    /// The index's `weight_map` (tensor → shard) when the checkpoint is sharded.
    pub(crate) index: Option<BTreeMap<String, String>>,
}

/// Finds the checkpoint's files in `dir`.
fn checkpoint_files(dir: &Path) -> Result<Files> {
    if dir.join(SINGLE).is_file() {
        return Ok(Files {
            shards: vec![SINGLE.to_string()],
            index: None,
        });
    }
    let index_path = dir.join(INDEX);
    if index_path.is_file() {
        let text = std::fs::read_to_string(&index_path)
            .map_err(|e| Error::io(format!("reading {}", index_path.display()), e))?;
        return sharded_files(dir, &index_path, &text, |s| dir.join(s).is_file());
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") && entry.path().is_file() {
            found.push(name);
        }
    }
    found.sort();
    match found.len() {
        1 => Ok(Files {
            shards: found,
            index: None,
        }),
        0 => Err(Error::InvalidArgument(format!(
            "{} holds no safetensors checkpoint (expected {SINGLE}, {INDEX} with its shards, or \
             one *.safetensors file)",
            dir.display()
        ))),
        _ => Err(Error::InvalidArgument(format!(
            "{} holds several safetensors files ({}) and no {INDEX} saying how they fit together",
            dir.display(),
            found.join(", ")
        ))),
    }
}

/// The files of the sharded checkpoint in `dir` whose index, at `index_path`, reads `text`;
/// `exists` says whether `dir` holds the shard of that name.
pub(crate) fn sharded_files(
    dir: &Path,
    index_path: &Path,
    text: &str,
    exists: impl Fn(&str) -> bool,
) -> Result<Files> {
    let weight_map = read_index(index_path, text)?;
    let mut shards: Vec<String> = weight_map.values().cloned().collect();
    shards.sort();
    shards.dedup();
    let absent: Vec<&str> = shards
        .iter()
        .filter(|s| !exists(s))
        .map(String::as_str)
        .collect();
    if !absent.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{} names shards that {} lacks: {}",
            index_path.display(),
            dir.display(),
            absent.join(", ")
        )));
    }
    Ok(Files {
        shards,
        index: Some(weight_map),
    })
}

/// Reads the `weight_map` of a sharded checkpoint's index, `text`, read from `path`.
pub(crate) fn read_index(path: &Path, text: &str) -> Result<BTreeMap<String, String>> {
    let bad = |what: &str| Error::InvalidArgument(format!("{}: {what}", path.display()));
    let v: Value =
        serde_json::from_str(text).map_err(|e| bad(&format!("not a JSON index ({e})")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no \"weight_map\" object"))?;
    map.iter()
        .map(|(name, shard)| match shard.as_str() {
            // A plain file name: no directory part, so no shard is read from outside the
            // checkpoint's directory ("../x", "/etc/x", "sub/x", "." and ".." are refused).
            Some(s) if Path::new(s).file_name().and_then(|f| f.to_str()) == Some(s) => {
                Ok((name.clone(), s.to_string()))
            }
            Some(s) => Err(bad(&format!(
                "the shard of {name}, {s:?}, is not a file name in the checkpoint's directory"
            ))),
            None => Err(bad(&format!("the shard of {name} is not a file name"))),
        })
        .collect()
}

/// Where a checkpoint tensor goes.
#[derive(Clone, Copy)]
enum Target {
    /// Into slot `i`.
    Slot(usize),
    /// Nowhere: the `lm_head.weight` of a tied model (shape-checked, then ignored).
    TiedHead,
}

/// One expected tensor.
struct Slot {
    /// Its name by [`crate::tree::Tree::named`].
    key: String,
    /// The checkpoint names it may have (the first is the one reported when missing).
    names: Vec<String>,
    /// The type it is converted to.
    ty: TensorType,
    /// Its shape on disk.
    disk_dims: Vec<usize>,
    /// The checkpoint name and file it came from, once read.
    found: Option<(String, String)>,
}

/// One tensor a checkpoint must hold.
pub(crate) struct Expected {
    /// Its key in the model's weights (what [`Loader::finish_values`] returns it under).
    pub(crate) key: String,
    /// The checkpoint names it may have (the first is the one reported when missing).
    pub(crate) names: Vec<String>,
    /// The type it is converted to.
    pub(crate) ty: TensorType,
    /// Its shape on disk (or `ty`'s, which is accepted too).
    pub(crate) disk_dims: Vec<usize>,
}

/// Matches the tensors of a checkpoint's files with the expected ones, collecting problems.
pub(crate) struct Loader {
    /// The model family, for messages ("Mamba-2").
    family: &'static str,
    slots: Vec<Slot>,
    targets: HashMap<String, Target>,
    tied_head_dims: Vec<usize>,
    values: HashMap<String, HostArray>,
    /// Every tensor seen, with its file.
    seen: HashMap<String, String>,
    problems: Vec<String>,
    /// Whether NaN and infinite values are accepted (not counted).
    allow_nonfinite: bool,
    /// How many tensors were refused for NaN or infinite values.
    nonfinite_tensors: usize,
}

impl Loader {
    /// A loader expecting the tensors of `types` (made from `config`), checked as `options` say.
    pub(crate) fn new(
        types: &Mamba2Weights<TensorType>,
        config: &Mamba2Config,
        options: &LoadOptions,
    ) -> Loader {
        let expected = types
            .named()
            .into_iter()
            .map(|(key, ty)| {
                let disk_dims = if key.ends_with("mixer.conv1d") {
                    vec![config.conv_dim(), 1, config.conv_kernel]
                } else {
                    ty.dims.clone()
                };
                Expected {
                    names: checkpoint_names(&key),
                    key,
                    ty: ty.clone(),
                    disk_dims,
                }
            })
            .collect();
        let tied_head = config
            .tie_word_embeddings
            .then(|| vec![config.vocab_size, config.hidden_size]);
        Loader::expecting("Mamba-2", expected, tied_head, options)
    }

    /// A loader for a `family`'s checkpoint expecting the tensors `expected`; with
    /// `tied_head`, a `lm_head.weight` of those dims is accepted and ignored.
    pub(crate) fn expecting(
        family: &'static str,
        expected: Vec<Expected>,
        tied_head: Option<Vec<usize>>,
        options: &LoadOptions,
    ) -> Loader {
        let mut slots = Vec::new();
        let mut targets = HashMap::new();
        for e in expected {
            for n in &e.names {
                targets.insert(n.clone(), Target::Slot(slots.len()));
            }
            slots.push(Slot {
                key: e.key,
                names: e.names,
                ty: e.ty,
                disk_dims: e.disk_dims,
                found: None,
            });
        }
        if tied_head.is_some() {
            targets.insert("lm_head.weight".to_string(), Target::TiedHead);
        }
        Loader {
            family,
            slots,
            targets,
            tied_head_dims: tied_head.unwrap_or_default(),
            values: HashMap::new(),
            seen: HashMap::new(),
            problems: Vec::new(),
            allow_nonfinite: options.allow_nonfinite,
            nonfinite_tensors: 0,
        }
    }

    /// Reads every file of the checkpoint in `dir` (as [`checkpoint_files`] finds them);
    /// returns the index's `weight_map` of a sharded checkpoint, for [`Loader::finish`].
    pub(crate) fn read_dir(&mut self, dir: &Path) -> Result<Option<BTreeMap<String, String>>> {
        let files = checkpoint_files(dir)?;
        for shard in &files.shards {
            let path = dir.join(shard);
            let bytes = std::fs::read(&path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            self.read(&path, shard, &bytes)?;
        }
        Ok(files.index)
    }

    /// Reads the file `shard` (at `path`, holding `bytes`), converting the tensors it expects.
    pub(crate) fn read(&mut self, path: &Path, shard: &str, bytes: &[u8]) -> Result<()> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| {
            Error::InvalidArgument(format!(
                "{} is not a valid safetensors file: {e}",
                path.display()
            ))
        })?;
        let mut tensors: Vec<(&str, TensorView<'_>)> = st.iter().collect();
        tensors.sort_by(|a, b| a.0.cmp(b.0));
        for (name, view) in tensors {
            self.take(name, &view, shard)?;
        }
        Ok(())
    }

    fn take(&mut self, name: &str, view: &TensorView<'_>, shard: &str) -> Result<()> {
        if let Some(previous) = self.seen.insert(name.to_string(), shard.to_string()) {
            self.problems
                .push(format!("{name}: in both {previous} and {shard}"));
            return Ok(());
        }
        let slot = match self.targets.get(name) {
            None => {
                self.problems.push(format!("{name}: unexpected"));
                return Ok(());
            }
            Some(Target::TiedHead) => {
                let dims = self.tied_head_dims.clone();
                self.check(name, view, &dims, &dims);
                return Ok(());
            }
            Some(&Target::Slot(i)) => i,
        };
        let s = &self.slots[slot];
        if let Some((other, file)) = &s.found {
            self.problems.push(format!(
                "{name} (in {shard}): a second copy of {other} (in {file})"
            ));
            return Ok(());
        }
        let (disk_dims, ty) = (s.disk_dims.clone(), s.ty.clone());
        if self.check(name, view, &disk_dims, &ty.dims) {
            let (value, nonfinite) = convert(view, &ty, !self.allow_nonfinite)
                .map_err(|e| Error::InvalidArgument(format!("{name} in {shard}: {e}")))?;
            if nonfinite > 0 {
                self.problems.push(format!(
                    "{name}: {nonfinite} of {} values are NaN or infinite (as {})",
                    ty.element_count(),
                    ty.dtype
                ));
                self.nonfinite_tensors += 1;
            }
            let s = &mut self.slots[slot];
            s.found = Some((name.to_string(), shard.to_string()));
            self.values.insert(s.key.clone(), value);
        } else {
            // Found, though unusable: reported as such rather than as missing.
            self.slots[slot].found = Some((name.to_string(), shard.to_string()));
        }
        Ok(())
    }

    /// Checks the dtype and shape (`dims`, or `alt_dims`); records problems; true if fine.
    fn check(
        &mut self,
        name: &str,
        view: &TensorView<'_>,
        dims: &[usize],
        alt_dims: &[usize],
    ) -> bool {
        let mut wrong = Vec::new();
        if !matches!(
            view.dtype(),
            Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F64
        ) {
            wrong.push(format!(
                "dtype {}, expected F32, BF16, F16 or F64",
                view.dtype()
            ));
        }
        if view.shape() != dims && view.shape() != alt_dims {
            wrong.push(format!("shape {:?}, expected {dims:?}", view.shape()));
        }
        if wrong.is_empty() {
            true
        } else {
            self.problems.push(format!("{name}: {}", wrong.join("; ")));
            false
        }
    }

    /// Reports what is missing or inconsistent, or assembles the weights.
    pub(crate) fn finish(
        self,
        dir: &Path,
        types: &Mamba2Weights<TensorType>,
        index: Option<&BTreeMap<String, String>>,
    ) -> Result<Mamba2Weights<HostArray>> {
        let mut values = self.finish_values(dir, index)?;
        types.try_map(|key, _| {
            values
                .remove(key)
                .ok_or_else(|| Error::InvalidArgument(format!("{key} was not loaded")))
        })
    }

    /// Reports what is missing or inconsistent, or returns every expected tensor by its key.
    pub(crate) fn finish_values(
        mut self,
        dir: &Path,
        index: Option<&BTreeMap<String, String>>,
    ) -> Result<HashMap<String, HostArray>> {
        let empty = BTreeMap::new();
        let index = index.unwrap_or(&empty);
        for slot in &self.slots {
            if slot.found.is_none() {
                let names = slot.names.join(" or ");
                let hint = slot
                    .names
                    .iter()
                    .find_map(|n| index.get(n))
                    .map(|s| format!(" (the index places it in {s})"))
                    .unwrap_or_default();
                self.problems.push(format!(
                    "{names}: missing{hint}, expected shape {:?}",
                    slot.disk_dims
                ));
            }
        }
        for (name, shard) in index {
            match self.seen.get(name) {
                Some(file) if file == shard => {}
                Some(file) => self.problems.push(format!(
                    "{name}: the index places it in {shard}, but it is in {file}"
                )),
                None if !self.targets.contains_key(name) => self
                    .problems
                    .push(format!("{name}: listed in the index, absent from {shard}")),
                None => {} // reported as missing
            }
        }
        if !self.problems.is_empty() {
            self.problems.sort();
            self.problems.dedup();
            let what = if self.nonfinite_tensors == 0 {
                "does not fit the config"
            } else if self.nonfinite_tensors == self.problems.len() {
                "holds NaN or infinite values (LoadOptions::allow_nonfinite accepts them)"
            } else {
                "does not fit the config and holds NaN or infinite values"
            };
            return Err(Error::InvalidArgument(format!(
                "the {} checkpoint in {} {what} ({} problems):\n  {}",
                self.family,
                dir.display(),
                self.problems.len(),
                self.problems.join("\n  ")
            )));
        }
        Ok(self.values)
    }
}

/// The checkpoint names of the tensor named `key` by [`crate::tree::Tree::named`].
pub(crate) fn checkpoint_names(key: &str) -> Vec<String> {
    match key {
        "embedding" => EMBEDDING_NAMES.iter().map(|s| s.to_string()).collect(),
        "norm_f" => vec!["backbone.norm_f.weight".to_string()],
        "lm_head" => vec!["lm_head.weight".to_string()],
        _ => {
            let Some((i, field)) = key
                .strip_prefix("layers.")
                .and_then(|rest| rest.split_once('.'))
            else {
                return vec![key.to_string()];
            };
            let field = match field {
                "mixer.in_proj_bias" => "mixer.in_proj.bias".to_string(),
                "mixer.conv1d_bias" => "mixer.conv1d.bias".to_string(),
                "mixer.out_proj_bias" => "mixer.out_proj.bias".to_string(),
                "mixer.dt_bias" | "mixer.A_log" | "mixer.D" => field.to_string(),
                _ => format!("{field}.weight"),
            };
            vec![format!("backbone.layers.{i}.{field}")]
        }
    }
}

/// Decodes little-endian elements of `N` bytes with `f`; with `count`, also counts the decoded
/// values that `finite` says are not finite. Blocks of a few thousand elements are decoded, then
/// counted while they are still in the cache: two tight loops that vectorise, where one loop
/// doing both did not (it made loading the 130M shape up to 50% slower).
fn decode<const N: usize, T>(
    bytes: &[u8],
    f: impl Fn([u8; N]) -> T,
    count: bool,
    finite: impl Fn(&T) -> bool,
) -> (Vec<T>, usize) {
    let element = |c: &[u8]| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        f(a)
    };
    let mut values = Vec::with_capacity(bytes.len() / N);
    let mut bad = 0usize;
    for block in bytes.chunks(N * 4096) {
        let start = values.len();
        values.extend(block.chunks_exact(N).map(element));
        if count {
            // A u32 sum of 0/1 (a block is far below u32::MAX) vectorises in narrow lanes;
            // `filter(..).count()` did not.
            let block_bad: u32 = values[start..].iter().map(|x| u32::from(!finite(x))).sum();
            bad += block_bad as usize;
        }
    }
    (values, bad)
}

/// Converts a checked (float, right-sized) tensor to `ty` (F32 or BF16); with `count_nonfinite`,
/// also returns how many converted values are NaN or infinite (else 0), counted as they are
/// converted (so an f64 too large for the target counts).
fn convert(
    view: &TensorView<'_>,
    ty: &TensorType,
    count_nonfinite: bool,
) -> Result<(HostArray, usize)> {
    let (bytes, count) = (view.data(), count_nonfinite);
    let shape = IxDyn(&ty.dims);
    let bad = |e: ndarray::ShapeError| Error::InvalidArgument(format!("shape {:?}: {e}", ty.dims));
    match ty.dtype {
        DType::BF16 => {
            let ok = |x: &bf16| x.is_finite();
            let (v, nonfinite) = match view.dtype() {
                Dtype::BF16 => decode(bytes, bf16::from_le_bytes, count, ok),
                Dtype::F64 => decode(bytes, |a| bf16::from_f64(f64::from_le_bytes(a)), count, ok),
                Dtype::F16 => decode(
                    bytes,
                    |a| bf16::from_f32(f16::from_le_bytes(a).to_f32()),
                    count,
                    ok,
                ),
                _ => decode(bytes, |a| bf16::from_f32(f32::from_le_bytes(a)), count, ok),
            };
            let a = ArrayD::from_shape_vec(shape, v).map_err(bad)?;
            Ok((HostArray::BF16(a), nonfinite))
        }
        _ => {
            let ok = |x: &f32| x.is_finite();
            let (v, nonfinite) = match view.dtype() {
                Dtype::F32 => decode(bytes, f32::from_le_bytes, count, ok),
                Dtype::BF16 => decode(bytes, |a| bf16::from_le_bytes(a).to_f32(), count, ok),
                Dtype::F16 => decode(bytes, |a| f16::from_le_bytes(a).to_f32(), count, ok),
                _ => decode(bytes, |a| f64::from_le_bytes(a) as f32, count, ok),
            };
            let a = ArrayD::from_shape_vec(shape, v).map_err(bad)?;
            Ok((HostArray::F32(a), nonfinite))
        }
    }
}

/// A [`SplitMix64`] stream per tensor (with Box–Muller's spare normal).
pub(crate) struct Rng(SplitMix64, Option<f64>);

impl Rng {
    /// A stream for the tensor `key` of the model seeded by `seed`.
    fn new(seed: u64, key: &str) -> Rng {
        // FNV-1a of the name, mixed with the seed.
        let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let mut r = Rng(SplitMix64::new(seed ^ h.rotate_left(17)), None);
        r.next_u64();
        r
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[lo, hi)`.
    pub(crate) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0.uniform(lo, hi)
    }

    /// Standard normal (Box–Muller, both values used).
    pub(crate) fn normal(&mut self) -> f64 {
        if let Some(z) = self.1.take() {
            return z;
        }
        let u1 = 1.0 - self.uniform(0.0, 1.0); // in (0, 1]
        let u2 = self.uniform(0.0, 1.0);
        let (r, (sin, cos)) = (
            (-2.0 * u1.ln()).sqrt(),
            (std::f64::consts::TAU * u2).sin_cos(),
        );
        self.1 = Some(r * sin);
        r * cos
    }
}

/// A tensor of `dims` in `dtype` (BF16, else F32) whose elements `sample` draws, in row-major
/// order, from the stream of `key`.
pub(crate) fn random_tensor(
    seed: u64,
    key: &str,
    dtype: DType,
    dims: &[usize],
    sample: &dyn Fn(&mut Rng) -> f64,
) -> HostArray {
    let mut rng = Rng::new(seed, key);
    let mut a = ArrayD::<f32>::zeros(IxDyn(dims));
    // `iter_mut` visits a standard-layout array in row-major order.
    a.iter_mut().for_each(|x| *x = sample(&mut rng) as f32);
    match dtype {
        DType::BF16 => HostArray::BF16(a.mapv(bf16::from_f32)),
        _ => HostArray::F32(a),
    }
}
