//! Hybrid weights: each sublayer's tensors in the layout the programs read, and where each
//! comes from in a family's checkpoint (Bamba's separate gate and up projections are joined
//! into one matrix, Nemotron-H's per-expert matrices stacked into one per kind).

use crate::tree::Tree;
use std::collections::HashMap;
use std::path::Path;

use super::config::{Activation, HybridConfig, HybridFamily, MlpConfig, MoeConfig, SublayerKind};
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::checkpoint::{random_tensor, Expected, Loader, Rng};
use crate::models::common::{by_name, check_matrix_dtype, quantized_like, LoadOptions, Matrix};
use crate::models::mamba2::LayerWeights;

pub use crate::models::engine::attention::{AttentionBiases, AttentionWeights};
use crate::models::quant;
use crate::models::training::Pieces;
use crate::runtime::{Buffer, Client};

/// An MLP (or, with a leading experts axis, every expert of a mixture).
#[derive(Tree, Debug, Clone)]
pub struct MlpWeights<T> {
    /// `[(2 *) intermediate, hidden]`: for [`Activation::SwiGlu`] the gate's rows, then up's.
    pub up: Matrix<T>,
    /// `[hidden, intermediate]`.
    pub down: Matrix<T>,
    /// The projections' biases, when the config has them (never for experts).
    pub biases: Option<MlpBiases<T>>,
}

/// An MLP's biases (named `up_bias` and `down_bias` in the tree).
#[derive(Tree, Debug, Clone)]
pub struct MlpBiases<T> {
    /// `[(2 *) intermediate]`, in the order of `up`'s rows.
    #[tree(rename = "up_bias")]
    pub up: T,
    /// `[hidden]`.
    #[tree(rename = "down_bias")]
    pub down: T,
}

/// A mixture of experts.
#[derive(Tree, Debug, Clone)]
pub struct MoeWeights<T> {
    /// Router, `[experts, hidden]` (f32).
    pub router: T,
    /// Nemotron-H's score correction bias, `[experts]` (f32).
    pub correction: Option<T>,
    /// The routed experts, `up` `[experts, (2 *) intermediate, hidden]`, `down`
    /// `[experts, hidden, intermediate]`.
    pub experts: MlpWeights<T>,
    /// The shared expert, if any.
    pub shared: Option<MlpWeights<T>>,
}

/// One sublayer: its RMS norm and what follows it. In the tree, the norm is `norm` and what
/// follows adds its own names (`q`, `up`, `router`, `mixer.in_proj`, ...) beside it.
#[derive(Tree, Debug, Clone)]
pub enum Sublayer<T> {
    /// A Mamba-2 mixer (its `norm` is the sublayer's).
    Mamba(LayerWeights<T>),
    /// Self-attention.
    Attention {
        /// RMS norm weight, `[hidden]`.
        norm: T,
        /// Projections.
        #[tree(rename = "")]
        attn: AttentionWeights<T>,
        /// The RMS norm of the output, `[hidden]` (Gemma 2's post norms).
        post_norm: Option<T>,
    },
    /// A dense MLP.
    Mlp {
        /// RMS norm weight, `[hidden]`.
        norm: T,
        /// The MLP.
        #[tree(rename = "")]
        mlp: MlpWeights<T>,
        /// The RMS norm of the output, `[hidden]` (Gemma 2's post norms).
        post_norm: Option<T>,
    },
    /// A mixture of experts.
    Moe {
        /// RMS norm weight, `[hidden]`.
        norm: T,
        /// The experts.
        #[tree(rename = "")]
        moe: MoeWeights<T>,
    },
}

/// All weights of a hybrid model: a [`Tree`] with leaves named like `embedding`,
/// `sublayers.3.q`, `sublayers.1.mixer.in_proj`, in the programs' parameter order.
#[derive(Tree, Debug, Clone)]
pub struct HybridWeights<T> {
    /// Token embedding, `[vocab, hidden]`.
    pub embedding: Matrix<T>,
    /// The sublayers, in order.
    pub sublayers: Vec<Sublayer<T>>,
    /// Final RMS norm weight, `[hidden]`.
    pub norm_f: T,
    /// The head, `[vocab, hidden]`; `None` when tied to the embedding.
    pub lm_head: Option<Matrix<T>>,
}

/// Where a tensor comes from: checkpoint tensors joined along the first axis (one, or a
/// matrix's parts, or one per expert), each with its shape on disk and as read.
#[derive(Debug, Clone)]
struct Source {
    ty: TensorType,
    pieces: Vec<(String, Vec<usize>, Vec<usize>)>,
    /// The scales of an 8-bit matrix: made as its pieces are quantized, not read.
    scales: bool,
}

/// Builds the [`Source`]s of one config, matrices in `m`.
struct Layout<'a> {
    c: &'a HybridConfig,
    m: DType,
}

impl Layout<'_> {
    fn one(&self, name: String, dtype: DType, dims: &[usize]) -> Source {
        Source {
            ty: TensorType::new(dtype, dims),
            pieces: vec![(name, dims.to_vec(), dims.to_vec())],
            scales: false,
        }
    }
    fn matrix(&self, name: String, dims: &[usize]) -> Matrix<Source> {
        self.matrix_of(self.one(name, self.m, dims))
    }
    /// The matrix `values` (in the matrices' dtype), with its scales' source when 8-bit: one
    /// per piece, under the piece's name with `.scale` added.
    fn matrix_of(&self, values: Source) -> Matrix<Source> {
        let rows = |d: &[usize]| d[..d.len().saturating_sub(1)].to_vec();
        let scale = (self.m == quant::QUANTIZED).then(|| Source {
            ty: TensorType::new(DType::F32, &rows(&values.ty.dims)),
            pieces: values
                .pieces
                .iter()
                .map(|(name, _, dims)| (format!("{name}.scale"), rows(dims), rows(dims)))
                .collect(),
            scales: true,
        });
        Matrix { values, scale }
    }
    fn vector(&self, name: String, n: usize) -> Source {
        self.one(name, DType::F32, &[n])
    }
    /// Parts of `dtype` joined along the first axis, each `part` (`[rows, ...]`).
    fn joined(&self, names: Vec<String>, dtype: DType, part: &[usize], stack: bool) -> Source {
        let n = names.len();
        let mut dims = part.to_vec();
        if stack {
            dims.insert(0, n);
        } else {
            dims[0] *= n;
        }
        Source {
            ty: TensorType::new(dtype, &dims),
            pieces: names
                .into_iter()
                .map(|s| (s, part.to_vec(), part.to_vec()))
                .collect(),
            scales: false,
        }
    }

    fn mamba(&self, p: &str, norm: String) -> LayerWeights<Source> {
        let c = &self.c.mamba;
        let (h, di, conv, k, heads) = (
            c.hidden_size,
            c.d_inner(),
            c.conv_dim(),
            c.conv_kernel,
            c.num_heads,
        );
        let in_proj = self.matrix(format!("{p}in_proj.weight"), &[c.in_proj_dim(), h]);
        let out_proj = self.matrix(format!("{p}out_proj.weight"), &[h, di]);
        LayerWeights {
            norm: self.vector(norm, h),
            in_proj: in_proj.values,
            in_proj_scale: in_proj.scale,
            in_proj_bias: c
                .use_bias
                .then(|| self.vector(format!("{p}in_proj.bias"), c.in_proj_dim())),
            conv_weight: Source {
                ty: TensorType::new(DType::F32, &[conv, k]),
                pieces: vec![(format!("{p}conv1d.weight"), vec![conv, 1, k], vec![conv, k])],
                scales: false,
            },
            conv_bias: c
                .use_conv_bias
                .then(|| self.vector(format!("{p}conv1d.bias"), conv)),
            dt_bias: self.vector(format!("{p}dt_bias"), heads),
            a_log: self.vector(format!("{p}A_log"), heads),
            d: self.vector(format!("{p}D"), heads),
            gated_norm: self.vector(format!("{p}norm.weight"), di),
            out_proj: out_proj.values,
            out_proj_scale: out_proj.scale,
            out_proj_bias: c
                .use_bias
                .then(|| self.vector(format!("{p}out_proj.bias"), h)),
        }
    }

    fn attention(&self, p: &str) -> AttentionWeights<Source> {
        let a = &self.c.attention;
        let (h, q, kv) = (
            self.c.hidden_size,
            a.num_heads * a.head_dim,
            a.num_kv_heads * a.head_dim,
        );
        let name = |x: &str, what: &str| format!("{p}{x}_proj.{what}");
        AttentionWeights {
            q: self.matrix(name("q", "weight"), &[q, h]),
            k: self.matrix(name("k", "weight"), &[kv, h]),
            v: self.matrix(name("v", "weight"), &[kv, h]),
            o: self.matrix(name("o", "weight"), &[h, q]),
            biases: a.qkv_bias.then(|| AttentionBiases {
                q: self.vector(name("q", "bias"), q),
                k: self.vector(name("k", "bias"), kv),
                v: self.vector(name("v", "bias"), kv),
                o: a.o_bias.then(|| self.vector(name("o", "bias"), h)),
            }),
            q_norm: a
                .qk_norm
                .map(|_| self.vector(format!("{p}q_norm.weight"), a.head_dim)),
            k_norm: a
                .qk_norm
                .map(|_| self.vector(format!("{p}k_norm.weight"), a.head_dim)),
        }
    }

    /// An MLP stored as one `up` (Granite's fused `input_linear`, Nemotron-H's `up_proj`) or
    /// as Bamba's `gate_proj` and `up_proj`.
    fn mlp(&self, up: Vec<String>, down: String, m: MlpConfig) -> MlpWeights<Source> {
        let (h, i) = (self.c.hidden_size, m.intermediate);
        let rows = match m.activation {
            Activation::SwiGlu | Activation::GeluTanhGlu => 2 * i,
            Activation::Relu2 => i,
        };
        // A bias is named as its matrix with `.bias` for `.weight`.
        let bias = |name: &String| name.replace(".weight", ".bias");
        let biases = m.bias.then(|| MlpBiases {
            up: self.joined(
                up.iter().map(bias).collect(),
                DType::F32,
                &[rows / up.len()],
                false,
            ),
            down: self.vector(bias(&down), h),
        });
        let up = if up.len() == 1 {
            self.matrix(up.into_iter().next().unwrap_or_default(), &[rows, h])
        } else {
            self.matrix_of(self.joined(up, self.m, &[i, h], false))
        };
        MlpWeights {
            up,
            down: self.matrix(down, &[h, i]),
            biases,
        }
    }

    /// A mixture of experts: Nemotron-H's one tensor per expert (stacked) and `gate`, or
    /// Granite's `block_sparse_moe` with experts already stacked; the shared expert.
    fn moe(&self, p: &str, m: MoeConfig) -> MoeWeights<Source> {
        let h = self.c.hidden_size;
        let (e, i) = (m.num_experts, m.expert.intermediate);
        let rows = match m.expert.activation {
            Activation::SwiGlu | Activation::GeluTanhGlu => 2 * i,
            Activation::Relu2 => i,
        };
        if self.c.family == HybridFamily::NemotronH {
            let each = |x: &str| {
                (0..e)
                    .map(|j| format!("{p}experts.{j}.{x}.weight"))
                    .collect()
            };
            MoeWeights {
                router: self.one(format!("{p}gate.weight"), DType::F32, &[e, h]),
                correction: Some(self.vector(format!("{p}gate.e_score_correction_bias"), e)),
                experts: MlpWeights {
                    up: self.matrix_of(self.joined(each("up_proj"), self.m, &[rows, h], true)),
                    down: self.matrix_of(self.joined(each("down_proj"), self.m, &[h, i], true)),
                    biases: None,
                },
                shared: m.shared.map(|s| {
                    self.mlp(
                        vec![format!("{p}shared_experts.up_proj.weight")],
                        format!("{p}shared_experts.down_proj.weight"),
                        s,
                    )
                }),
            }
        } else {
            let b = format!("{p}block_sparse_moe.");
            MoeWeights {
                router: self.one(format!("{b}router.layer.weight"), DType::F32, &[e, h]),
                correction: None,
                experts: MlpWeights {
                    up: self.matrix(format!("{b}input_linear.weight"), &[e, rows, h]),
                    down: self.matrix(format!("{b}output_linear.weight"), &[e, h, i]),
                    biases: None,
                },
                shared: m.shared.map(|s| {
                    self.mlp(
                        vec![format!("{p}shared_mlp.input_linear.weight")],
                        format!("{p}shared_mlp.output_linear.weight"),
                        s,
                    )
                }),
            }
        }
    }

    fn sublayer(&self, i: usize) -> Result<Sublayer<Source>> {
        let c = self.c;
        let l = c.layer_of[i];
        let kind = c.sublayers[i];
        let h = c.hidden_size;
        let (norm, p) = match (c.family, kind) {
            (HybridFamily::NemotronH, _) => (
                format!("backbone.layers.{l}.norm.weight"),
                format!("backbone.layers.{l}.mixer."),
            ),
            (_, SublayerKind::Mamba) => (
                format!("model.layers.{l}.input_layernorm.weight"),
                format!("model.layers.{l}.mamba."),
            ),
            (_, SublayerKind::Attention) => (
                format!("model.layers.{l}.input_layernorm.weight"),
                format!("model.layers.{l}.self_attn."),
            ),
            (HybridFamily::Bamba, _) => (
                format!("model.layers.{l}.pre_ff_layernorm.weight"),
                format!("model.layers.{l}.feed_forward."),
            ),
            (HybridFamily::Granite, _) => (
                format!("model.layers.{l}.post_attention_layernorm.weight"),
                format!("model.layers.{l}."),
            ),
            (HybridFamily::Gemma2, _) => (
                format!("model.layers.{l}.pre_feedforward_layernorm.weight"),
                format!("model.layers.{l}.mlp."),
            ),
            _ => (
                format!("model.layers.{l}.post_attention_layernorm.weight"),
                format!("model.layers.{l}.mlp."),
            ),
        };
        // Gemma 2 norms each sublayer's output too.
        let post = c.post_norms.then(|| match kind {
            SublayerKind::Attention => format!("model.layers.{l}.post_attention_layernorm.weight"),
            _ => format!("model.layers.{l}.post_feedforward_layernorm.weight"),
        });
        let missing = |what: &str| {
            Error::InvalidArgument(format!(
                "the config has {what} sublayers but no {what} shape"
            ))
        };
        Ok(match kind {
            SublayerKind::Mamba => Sublayer::Mamba(self.mamba(&p, norm)),
            SublayerKind::Attention => Sublayer::Attention {
                norm: self.vector(norm, h),
                attn: self.attention(&p),
                post_norm: post.map(|n| self.vector(n, h)),
            },
            SublayerKind::Mlp => {
                let m = c.mlp.ok_or_else(|| missing("MLP"))?;
                let mlp = match c.family {
                    HybridFamily::Granite => self.mlp(
                        vec![format!("{p}shared_mlp.input_linear.weight")],
                        format!("{p}shared_mlp.output_linear.weight"),
                        m,
                    ),
                    HybridFamily::NemotronH => self.mlp(
                        vec![format!("{p}up_proj.weight")],
                        format!("{p}down_proj.weight"),
                        m,
                    ),
                    // Bamba and the transformers: a gate and an up projection, joined.
                    _ => self.mlp(
                        vec![format!("{p}gate_proj.weight"), format!("{p}up_proj.weight")],
                        format!("{p}down_proj.weight"),
                        m,
                    ),
                };
                Sublayer::Mlp {
                    norm: self.vector(norm, h),
                    mlp,
                    post_norm: post.map(|n| self.vector(n, h)),
                }
            }
            SublayerKind::Moe => {
                let m = c.moe.ok_or_else(|| missing("experts"))?;
                Sublayer::Moe {
                    norm: self.vector(norm, h),
                    moe: self.moe(&p, m),
                }
            }
        })
    }

    fn weights(&self) -> Result<HybridWeights<Source>> {
        let c = self.c;
        let (embedding, norm_f) = match c.family {
            HybridFamily::Bamba => ("model.embed_tokens.weight", "model.final_layernorm.weight"),
            HybridFamily::Granite => ("model.embed_tokens.weight", "model.norm.weight"),
            HybridFamily::NemotronH => ("backbone.embeddings.weight", "backbone.norm_f.weight"),
            _ => ("model.embed_tokens.weight", "model.norm.weight"),
        };
        let (v, h) = (c.vocab_size, c.hidden_size);
        Ok(HybridWeights {
            embedding: self.matrix(embedding.into(), &[v, h]),
            sublayers: (0..c.sublayers.len())
                .map(|i| self.sublayer(i))
                .collect::<Result<_>>()?,
            norm_f: self.vector(norm_f.into(), h),
            lm_head: (!c.tie_word_embeddings)
                .then(|| self.matrix("lm_head.weight".into(), &[v, h])),
        })
    }
}

/// Where every tensor of `config`'s model comes from, matrices in `matmul_dtype`.
fn sources(config: &HybridConfig, matmul_dtype: DType) -> Result<HybridWeights<Source>> {
    check_matrix_dtype("hybrid", matmul_dtype)?;
    config.validate()?;
    Layout {
        c: config,
        m: matmul_dtype,
    }
    .weights()
}

/// Where each weight of `config`'s model (f32, in tree order) lives in the checkpoint: its
/// pieces' names and shapes on disk, joined along the first axis.
pub(super) fn checkpoint_pieces(config: &HybridConfig) -> Result<Vec<Pieces>> {
    let sources = sources(config, DType::F32)?;
    let mut out = Vec::new();
    let _ = sources.try_map(|_, s| {
        out.push(
            s.pieces
                .iter()
                .map(|(n, disk, _)| (n.clone(), disk.clone()))
                .collect(),
        );
        Ok(())
    })?;
    Ok(out)
}

impl HybridWeights<TensorType> {
    /// The type of every tensor of `config`'s model: matrices (embedding, projections,
    /// experts, head) in `matmul_dtype` (F32, BF16, or [`quant::QUANTIZED`] for 8 bits with a
    /// scale per row, per expert); norms, routers and the Mamba-2 mixers' vectors F32.
    pub fn types(config: &HybridConfig, matmul_dtype: DType) -> Result<Self> {
        sources(config, matmul_dtype)?.try_map(|_, s| Ok(s.ty.clone()))
    }
}

impl HybridWeights<HostArray> {
    /// Loads the checkpoint in `dir` (`model.safetensors`, or an index and its shards) as
    /// transformers writes it for `config`'s family, converting as [`HybridWeights::types`]
    /// says. Missing, unexpected, mis-shaped or non-finite tensors are one error listing every
    /// problem by its checkpoint name.
    pub fn load(
        dir: &Path,
        config: &HybridConfig,
        matmul_dtype: DType,
        options: &LoadOptions,
    ) -> Result<Self> {
        let sources = sources(config, matmul_dtype)?;
        let mut expected = Vec::new();
        let _ = sources.try_map(|_, s| {
            for (name, disk, dims) in s.pieces.iter().filter(|_| !s.scales) {
                let eight_bit = s.ty.dtype == quant::QUANTIZED;
                expected.push(Expected {
                    key: name.clone(),
                    names: vec![name.clone()],
                    ty: TensorType::new(s.ty.dtype, dims),
                    disk_dims: disk.clone(),
                    scale_key: eight_bit.then(|| format!("{name}.scale")),
                });
            }
            Ok(())
        });
        let tied = config
            .tie_word_embeddings
            .then(|| vec![config.vocab_size, config.hidden_size]);
        let family = config.family.name();
        let mut loader = Loader::expecting(family, expected, tied, options);
        let index = loader.read_dir(dir)?;
        let mut values: HashMap<String, HostArray> = loader.finish_values(dir, index.as_ref())?;
        sources.try_map(|key, s| {
            let mut bytes = Vec::new();
            for (name, _, _) in &s.pieces {
                let a = values.remove(name).ok_or_else(|| {
                    Error::InvalidArgument(format!("{name} (for {key}) was not loaded"))
                })?;
                bytes.extend(a.to_bytes());
            }
            HostArray::from_bytes(&s.ty, &bytes)
        })
    }

    /// A deterministic random model with HF-like magnitudes: matrices ~ N(0, 0.02) (the
    /// output projections further divided by sqrt(2 * sublayers)), norms 1, the Mamba-2 mixers'
    /// `A_log = ln(1..=heads)`, `D = 1` and `dt` bias the inverse softplus of a `dt`
    /// log-uniform in [0.001, 0.1]. Each tensor draws from its own stream, seeded by `seed` and
    /// its name.
    pub fn random(config: &HybridConfig, matmul_dtype: DType, seed: u64) -> Result<Self> {
        let types = HybridWeights::<TensorType>::types(config, matmul_dtype)?;
        if matmul_dtype == quant::QUANTIZED {
            let floats = HybridWeights::random(config, DType::F32, seed)?;
            return quantized_like(&types, by_name(floats)?);
        }
        let out_scale = 0.02 / ((2 * config.sublayers.len()) as f64).sqrt();
        let heads = config.mamba.num_heads;
        types.try_map(|name, ty| {
            let field = name.rsplit('.').next().unwrap_or(name);
            if field == "A_log" {
                let v: Vec<f32> = (1..=heads).map(|i| (i as f32).ln()).collect();
                return HostArray::from_vec(&[heads], v);
            }
            let sample: Box<dyn Fn(&mut Rng) -> f64> = match field {
                "norm" | "norm_f" | "D" => Box::new(|_: &mut Rng| 1.0),
                "dt_bias" => Box::new(|r: &mut Rng| {
                    let dt = r.uniform(0.001f64.ln(), 0.1f64.ln()).exp().max(1e-4);
                    dt + (-(-dt).exp_m1()).ln()
                }),
                "out_proj" | "o" | "down" => Box::new(move |r: &mut Rng| out_scale * r.normal()),
                _ if ty.dims.len() >= 2 => Box::new(|r: &mut Rng| 0.02 * r.normal()),
                _ => Box::new(|_: &mut Rng| 0.0),
            };
            Ok(random_tensor(seed, name, ty.dtype, &ty.dims, &*sample))
        })
    }

    /// Uploads every tensor to `client`'s first device.
    pub fn upload(&self, client: &Client) -> Result<HybridWeights<Buffer>> {
        self.try_map(|_, a| client.buffer_from_host_array(a))
    }
}
