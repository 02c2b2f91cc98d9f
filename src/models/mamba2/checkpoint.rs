//! Where Mamba-2 weights come from: safetensors checkpoints (one file, or shards with an index;
//! f32, bf16 or f16 on disk; HF or `mamba_ssm` names) and a deterministic random initialisation.

use crate::tree::Tree;
use std::path::Path;

use super::weights::{check_matmul_dtype, quantize_layer};
use super::{LayerWeights, Mamba2Config, Mamba2Weights};
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::models::common::checkpoint::{random_tensor, Expected, LoadOptions, Loader, Rng};
use crate::models::common::scaled_matrix;
use crate::models::quant;

/// The HF and `mamba_ssm` names of the embedding.
const EMBEDDING_NAMES: [&str; 2] = ["backbone.embeddings.weight", "backbone.embedding.weight"];

impl Mamba2Weights<HostArray> {
    /// Loads a safetensors checkpoint from `dir`: `model.safetensors`, else
    /// `model.safetensors.index.json` and the shards its `weight_map` names, else the one
    /// `*.safetensors` file the directory holds.
    ///
    /// Tensors may be f32, bf16, f16 or f64 on disk, under HF names
    /// (`backbone.embeddings.weight`, `backbone.layers.{i}.mixer.in_proj.weight`, ...) or
    /// `mamba_ssm`'s (`backbone.embedding.weight`). They are converted as
    /// [`Mamba2Weights::types`] says: the matrices to `matmul_dtype` (F32 or BF16, rounding to
    /// nearest even; or read as F32 and quantized to 8 bits as [`Mamba2Weights::to_8bit`]
    /// does, one tensor at a time, so that loading never holds the model in f32),
    /// everything else to F32; the conv weight `[conv_dim, 1, K]` is stored as
    /// `[conv_dim, K]`. With a tied config, a `lm_head.weight` in the file (as `mamba_ssm`
    /// saves it) has its shape checked and is otherwise ignored: the head is the embedding.
    ///
    /// Missing, unexpected, duplicated or mis-shaped tensors, unsupported dtypes, and tensors
    /// holding NaN or infinite values (after the conversion, so an f64 value too large for f32
    /// counts) are one [`crate::Error::InvalidArgument`] naming the directory and listing every
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
        let types = Mamba2Weights::<TensorType>::types(config, matmul_dtype)?;
        let mut loader = mamba2_loader(&types, config, options);
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

/// A loader expecting the tensors of a Mamba-2 model's `types` (made from `config`), checked as
/// `options` say.
pub(crate) fn mamba2_loader(
    types: &Mamba2Weights<TensorType>,
    config: &Mamba2Config,
    options: &LoadOptions,
) -> Loader {
    // An 8-bit matrix's scales are made as it is read (`{key}_scale`), not read.
    let expected = types
        .named()
        .into_iter()
        .filter(|(key, _)| scaled_matrix(key).is_none())
        .map(|(key, ty)| {
            let disk_dims = if key.ends_with("mixer.conv1d") {
                vec![config.conv_dim(), 1, config.conv_kernel]
            } else {
                ty.dims.clone()
            };
            Expected {
                names: checkpoint_names(&key),
                scale_key: (ty.dtype == quant::QUANTIZED).then(|| format!("{key}_scale")),
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
