//! Mamba-1 weights: their names and types, and loading them from an HF checkpoint.

use std::collections::HashMap;
use std::path::Path;

use super::Mamba1Config;
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::checkpoint::{random_tensor, Expected, Loader, Rng};
use crate::models::common::{
    by_name, check_matrix_dtype, quantized_like, scaled_matrix, LoadOptions, Matrix,
};
use crate::models::quant;
use crate::runtime::{Buffer, Client};
use crate::tree::Tree;

/// One block's weights (a [`Tree`] with HF's names under `backbone.layers.{i}.`), matrices
/// `[out, in]`.
#[derive(Tree, Debug, Clone)]
pub struct Mamba1Layer<T> {
    /// `norm.weight` `[hidden]`.
    #[tree(rename = "norm.weight")]
    pub norm: T,
    /// `mixer.in_proj.weight` `[2 d_inner, hidden]`: `x` then the gate `z`.
    #[tree(rename = "mixer.in_proj.weight")]
    pub in_proj: Matrix<T>,
    /// `mixer.in_proj.bias` `[2 d_inner]` (with `use_bias`).
    #[tree(rename = "mixer.in_proj.bias")]
    pub in_proj_bias: Option<T>,
    /// `mixer.conv1d.weight`, `[d_inner, 1, K]` on disk, held as `[d_inner, K]`.
    #[tree(rename = "mixer.conv1d.weight")]
    pub conv_weight: T,
    /// `mixer.conv1d.bias` `[d_inner]` (with `use_conv_bias`).
    #[tree(rename = "mixer.conv1d.bias")]
    pub conv_bias: Option<T>,
    /// `mixer.x_proj.weight` `[rank + 2 N, d_inner]`: `dt`, `B`, `C`.
    #[tree(rename = "mixer.x_proj.weight")]
    pub x_proj: Matrix<T>,
    /// `mixer.dt_proj.weight` `[d_inner, rank]`.
    #[tree(rename = "mixer.dt_proj.weight")]
    pub dt_proj: Matrix<T>,
    /// `mixer.dt_proj.bias` `[d_inner]`.
    #[tree(rename = "mixer.dt_proj.bias")]
    pub dt_proj_bias: T,
    /// `mixer.A_log` `[d_inner, N]`: `A = -exp(A_log)`.
    #[tree(rename = "mixer.A_log")]
    pub a_log: T,
    /// `mixer.D` `[d_inner]`: the skip.
    #[tree(rename = "mixer.D")]
    pub d: T,
    /// `mixer.out_proj.weight` `[hidden, d_inner]`.
    #[tree(rename = "mixer.out_proj.weight")]
    pub out_proj: Matrix<T>,
    /// `mixer.out_proj.bias` `[hidden]` (with `use_bias`).
    #[tree(rename = "mixer.out_proj.bias")]
    pub out_proj_bias: Option<T>,
}

/// A Mamba-1 model's weights: a [`Tree`] whose leaves carry their HF checkpoint names, in the
/// programs' parameter order.
#[derive(Tree, Debug, Clone)]
pub struct Mamba1Weights<T> {
    /// `backbone.embeddings.weight` `[vocab, hidden]`.
    #[tree(rename = "backbone.embeddings.weight")]
    pub embedding: Matrix<T>,
    /// The blocks.
    #[tree(rename = "backbone.layers")]
    pub layers: Vec<Mamba1Layer<T>>,
    /// `backbone.norm_f.weight` `[hidden]`.
    #[tree(rename = "backbone.norm_f.weight")]
    pub norm_f: T,
    /// `lm_head.weight` `[vocab, hidden]`, absent when tied to the embedding.
    #[tree(rename = "lm_head.weight")]
    pub lm_head: Option<Matrix<T>>,
}

impl Mamba1Weights<TensorType> {
    /// The type of every tensor of `config`'s model: the matrices (embedding, projections,
    /// head) in `matmul_dtype` (F32, BF16, or [`quant::QUANTIZED`] for 8 bits with a scale per
    /// row), the rest F32.
    pub fn types(config: &Mamba1Config, matmul_dtype: DType) -> Result<Self> {
        check_matrix_dtype("Mamba-1", matmul_dtype)?;
        config.validate()?;
        let c = config;
        let m = |dims: &[usize]| Matrix::of(matmul_dtype, dims);
        let f = |dims: &[usize]| TensorType::new(DType::F32, dims);
        let (h, di, n, r) = (c.hidden_size, c.d_inner, c.state_size, c.time_step_rank);
        let layer = Mamba1Layer {
            norm: f(&[h]),
            in_proj: m(&[2 * di, h]),
            in_proj_bias: c.use_bias.then(|| f(&[2 * di])),
            conv_weight: f(&[di, c.conv_kernel]),
            conv_bias: c.use_conv_bias.then(|| f(&[di])),
            x_proj: m(&[r + 2 * n, di]),
            dt_proj: m(&[di, r]),
            dt_proj_bias: f(&[di]),
            a_log: f(&[di, n]),
            d: f(&[di]),
            out_proj: m(&[h, di]),
            out_proj_bias: c.use_bias.then(|| f(&[h])),
        };
        Ok(Mamba1Weights {
            embedding: m(&[c.vocab_size, h]),
            layers: vec![layer; c.num_layers],
            norm_f: f(&[h]),
            lm_head: (!c.tie_word_embeddings).then(|| m(&[c.vocab_size, h])),
        })
    }
}

impl Mamba1Weights<HostArray> {
    /// Loads an HF or `mamba_ssm` checkpoint from `dir` (`model.safetensors`, or an index and
    /// its shards, or the one `*.safetensors` file), converting as [`Mamba1Weights::types`]
    /// says; a tied model's saved `lm_head.weight` is shape-checked and ignored. Missing,
    /// unexpected, mis-shaped or non-finite tensors are one error listing every problem.
    pub fn load(
        dir: &Path,
        config: &Mamba1Config,
        matmul_dtype: DType,
        options: &LoadOptions,
    ) -> Result<Self> {
        let types = Mamba1Weights::<TensorType>::types(config, matmul_dtype)?;
        let expected = types
            .named()
            .into_iter()
            .filter(|(name, _)| scaled_matrix(name).is_none())
            .map(|(name, ty)| {
                let disk_dims = if name.ends_with("mixer.conv1d.weight") {
                    vec![config.d_inner, 1, config.conv_kernel]
                } else {
                    ty.dims.clone()
                };
                // mamba_ssm calls the embedding `backbone.embedding.weight`.
                let mut names = vec![name.clone()];
                if name == "backbone.embeddings.weight" {
                    names.push("backbone.embedding.weight".to_string());
                }
                Expected {
                    names,
                    scale_key: (ty.dtype == quant::QUANTIZED).then(|| format!("{name}.scale")),
                    key: name,
                    ty: ty.clone(),
                    disk_dims,
                }
            })
            .collect();
        let tied = config
            .tie_word_embeddings
            .then(|| vec![config.vocab_size, config.hidden_size]);
        let mut loader = Loader::expecting("Mamba-1", expected, tied, options);
        let index = loader.read_dir(dir)?;
        let mut values: HashMap<String, HostArray> = loader.finish_values(dir, index.as_ref())?;
        types.try_map(|name, _| {
            values
                .remove(name)
                .ok_or_else(|| Error::InvalidArgument(format!("{name} was not loaded")))
        })
    }

    /// A deterministic random model with magnitudes like HF's initialisation: the embedding
    /// ~ N(0, 0.02); `in_proj`, `x_proj`, `out_proj` and an untied head ~ U(±1/sqrt(fan_in))
    /// (`out_proj` further divided by sqrt(num_layers)); the conv ~ U(±1/sqrt(K)); `dt_proj`
    /// ~ U(±rank^-0.5) and its bias the inverse softplus of `dt` log-uniform in [0.001, 0.1];
    /// `A_log = ln(1..=N)` per channel (S4D-real); `D = 1`; norms 1 + U(±0.1). Each tensor
    /// draws from its own stream, seeded by `seed` and its name.
    pub fn random(config: &Mamba1Config, matmul_dtype: DType, seed: u64) -> Result<Self> {
        if matmul_dtype == quant::QUANTIZED {
            let types = Mamba1Weights::<TensorType>::types(config, matmul_dtype)?;
            let floats = Mamba1Weights::random(config, DType::F32, seed)?;
            return quantized_like(&types, by_name(floats)?);
        }
        let types = Mamba1Weights::<TensorType>::types(config, matmul_dtype)?;
        let c = config;
        let fan = |n: usize| 1.0 / (n.max(1) as f64).sqrt();
        types.try_map(|name, ty| {
            // A block's tensors by their name inside the block, the others by their full name.
            let field = match name.split_once("layers.") {
                Some((_, rest)) => rest.split_once('.').map_or(rest, |(_, f)| f),
                None => name,
            };
            let (h, di, n, r, k) = (
                c.hidden_size,
                c.d_inner,
                c.state_size,
                c.time_step_rank,
                c.conv_kernel,
            );
            let out_scale = 1.0 / (c.num_layers as f64).sqrt();
            let sample: Box<dyn Fn(&mut Rng) -> f64> = match field {
                "backbone.embeddings.weight" => Box::new(|r: &mut Rng| 0.02 * r.normal()),
                "mixer.in_proj.weight" | "lm_head.weight" => {
                    Box::new(move |r: &mut Rng| r.uniform(-fan(h), fan(h)))
                }
                "mixer.x_proj.weight" => Box::new(move |r: &mut Rng| r.uniform(-fan(di), fan(di))),
                "mixer.out_proj.weight" => {
                    Box::new(move |r: &mut Rng| r.uniform(-fan(di), fan(di)) * out_scale)
                }
                "mixer.conv1d.weight" | "mixer.conv1d.bias" => {
                    Box::new(move |r: &mut Rng| r.uniform(-fan(k), fan(k)))
                }
                "mixer.dt_proj.weight" => {
                    Box::new(move |rng: &mut Rng| rng.uniform(-fan(r), fan(r)))
                }
                "mixer.dt_proj.bias" => Box::new(|r: &mut Rng| {
                    let dt = r.uniform(0.001f64.ln(), 0.1f64.ln()).exp().max(1e-4);
                    dt + (-(-dt).exp_m1()).ln()
                }),
                "mixer.D" => Box::new(|_: &mut Rng| 1.0),
                "mixer.in_proj.bias" | "mixer.out_proj.bias" => Box::new(|_: &mut Rng| 0.0),
                "norm.weight" | "backbone.norm_f.weight" => {
                    Box::new(|r: &mut Rng| 1.0 + r.uniform(-0.1, 0.1))
                }
                _ => Box::new(|_: &mut Rng| 0.0),
            };
            if field == "mixer.A_log" {
                // S4D-real: A = -(1..=N) in every channel.
                let v: Vec<f32> = (0..di * n).map(|i| ((i % n + 1) as f32).ln()).collect();
                return HostArray::from_vec(&[di, n], v);
            }
            Ok(random_tensor(seed, name, ty.dtype, &ty.dims, &*sample))
        })
    }

    /// Uploads every tensor to `client`'s first device.
    pub fn upload(&self, client: &Client) -> Result<Mamba1Weights<Buffer>> {
        self.try_map(|_, a| client.buffer_from_host_array(a))
    }
}
