//! Mamba-1 weights: their names and types, and loading them from an HF checkpoint.

use std::collections::HashMap;
use std::path::Path;

use super::Mamba1Config;
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::mamba2::checkpoint::{random_tensor, Expected, Loader, Rng};
use crate::models::mamba2::LoadOptions;
use crate::runtime::{Buffer, Client};

/// One block's weights (HF's names under `backbone.layers.{i}.`), matrices `[out, in]`.
#[derive(Debug, Clone)]
pub struct Mamba1Layer<T> {
    /// `norm.weight` `[hidden]`.
    pub norm: T,
    /// `mixer.in_proj.weight` `[2 d_inner, hidden]`: `x` then the gate `z`.
    pub in_proj: T,
    /// `mixer.in_proj.bias` `[2 d_inner]` (with `use_bias`).
    pub in_proj_bias: Option<T>,
    /// `mixer.conv1d.weight`, `[d_inner, 1, K]` on disk, held as `[d_inner, K]`.
    pub conv_weight: T,
    /// `mixer.conv1d.bias` `[d_inner]` (with `use_conv_bias`).
    pub conv_bias: Option<T>,
    /// `mixer.x_proj.weight` `[rank + 2 N, d_inner]`: `dt`, `B`, `C`.
    pub x_proj: T,
    /// `mixer.dt_proj.weight` `[d_inner, rank]`.
    pub dt_proj: T,
    /// `mixer.dt_proj.bias` `[d_inner]`.
    pub dt_proj_bias: T,
    /// `mixer.A_log` `[d_inner, N]`: `A = -exp(A_log)`.
    pub a_log: T,
    /// `mixer.D` `[d_inner]`: the skip.
    pub d: T,
    /// `mixer.out_proj.weight` `[hidden, d_inner]`.
    pub out_proj: T,
    /// `mixer.out_proj.bias` `[hidden]` (with `use_bias`).
    pub out_proj_bias: Option<T>,
}

/// A Mamba-1 model's weights.
#[derive(Debug, Clone)]
pub struct Mamba1Weights<T> {
    /// `backbone.embeddings.weight` `[vocab, hidden]`.
    pub embedding: T,
    /// The blocks.
    pub layers: Vec<Mamba1Layer<T>>,
    /// `backbone.norm_f.weight` `[hidden]`.
    pub norm_f: T,
    /// `lm_head.weight` `[vocab, hidden]`, absent when tied to the embedding.
    pub lm_head: Option<T>,
}

impl<T> Mamba1Layer<T> {
    /// The tensors with their names relative to the block, in a fixed order.
    fn named(&self) -> Vec<(&'static str, &T)> {
        let mut v = vec![
            ("norm.weight", &self.norm),
            ("mixer.in_proj.weight", &self.in_proj),
        ];
        if let Some(b) = &self.in_proj_bias {
            v.push(("mixer.in_proj.bias", b));
        }
        v.push(("mixer.conv1d.weight", &self.conv_weight));
        if let Some(b) = &self.conv_bias {
            v.push(("mixer.conv1d.bias", b));
        }
        v.extend([
            ("mixer.x_proj.weight", &self.x_proj),
            ("mixer.dt_proj.weight", &self.dt_proj),
            ("mixer.dt_proj.bias", &self.dt_proj_bias),
            ("mixer.A_log", &self.a_log),
            ("mixer.D", &self.d),
            ("mixer.out_proj.weight", &self.out_proj),
        ]);
        if let Some(b) = &self.out_proj_bias {
            v.push(("mixer.out_proj.bias", b));
        }
        v
    }

    /// `f(name, tensor)` applied to each tensor, in the order of [`Self::named`].
    fn try_map<U>(&self, f: &mut impl FnMut(&str, &T) -> Result<U>) -> Result<Mamba1Layer<U>> {
        let opt = |name: &str, t: &Option<T>, f: &mut dyn FnMut(&str, &T) -> Result<U>| {
            t.as_ref().map(|t| f(name, t)).transpose()
        };
        Ok(Mamba1Layer {
            norm: f("norm.weight", &self.norm)?,
            in_proj: f("mixer.in_proj.weight", &self.in_proj)?,
            in_proj_bias: opt("mixer.in_proj.bias", &self.in_proj_bias, f)?,
            conv_weight: f("mixer.conv1d.weight", &self.conv_weight)?,
            conv_bias: opt("mixer.conv1d.bias", &self.conv_bias, f)?,
            x_proj: f("mixer.x_proj.weight", &self.x_proj)?,
            dt_proj: f("mixer.dt_proj.weight", &self.dt_proj)?,
            dt_proj_bias: f("mixer.dt_proj.bias", &self.dt_proj_bias)?,
            a_log: f("mixer.A_log", &self.a_log)?,
            d: f("mixer.D", &self.d)?,
            out_proj: f("mixer.out_proj.weight", &self.out_proj)?,
            out_proj_bias: opt("mixer.out_proj.bias", &self.out_proj_bias, f)?,
        })
    }
}

impl<T> Mamba1Weights<T> {
    /// Every tensor with its HF checkpoint name, in a fixed order (the programs' parameter
    /// order).
    pub fn named(&self) -> Vec<(String, &T)> {
        let mut v = vec![("backbone.embeddings.weight".to_string(), &self.embedding)];
        for (i, layer) in self.layers.iter().enumerate() {
            v.extend(
                layer
                    .named()
                    .into_iter()
                    .map(|(n, t)| (format!("backbone.layers.{i}.{n}"), t)),
            );
        }
        v.push(("backbone.norm_f.weight".to_string(), &self.norm_f));
        if let Some(h) = &self.lm_head {
            v.push(("lm_head.weight".to_string(), h));
        }
        v
    }

    /// The same weights with `f(name, tensor)` applied to each, in the order and with the
    /// names of [`Self::named`].
    pub fn try_map<U>(&self, mut f: impl FnMut(&str, &T) -> Result<U>) -> Result<Mamba1Weights<U>> {
        let embedding = f("backbone.embeddings.weight", &self.embedding)?;
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                l.try_map(&mut |n: &str, t: &T| f(&format!("backbone.layers.{i}.{n}"), t))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Mamba1Weights {
            embedding,
            layers,
            norm_f: f("backbone.norm_f.weight", &self.norm_f)?,
            lm_head: self
                .lm_head
                .as_ref()
                .map(|h| f("lm_head.weight", h))
                .transpose()?,
        })
    }
}

impl Mamba1Weights<TensorType> {
    /// The type of every tensor of `config`'s model: the matrices (embedding, projections,
    /// head) in `matmul_dtype` (F32 or BF16), the rest F32.
    pub fn types(config: &Mamba1Config, matmul_dtype: DType) -> Result<Self> {
        crate::models::engine::check_float_matrices("Mamba-1", matmul_dtype)?;
        config.validate()?;
        let c = config;
        let m = |dims: &[usize]| TensorType::new(matmul_dtype, dims);
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
