//! Mamba-2 weights: the tensors of a checkpoint in the layout the compiled programs read.
//!
//! The same structure holds host arrays (loaded or randomly initialised), device buffers
//! (uploaded once and shared by every program of a model) and graph parameters (`Tensor`), so
//! the three never disagree on names or order.

use std::borrow::Cow;

use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::runtime::{Buffer, Client};
use crate::tree::Tree;
use crate::with_host_array;

use super::Mamba2Config;
use crate::models::quant;

/// One block's weights, a [`Tree`] whose leaves carry the checkpoint's names (`norm`,
/// `mixer.in_proj`, `mixer.A_log`, ...). Matrices keep the checkpoint's `[out, in]` layout: the programs contract
/// their second axis (`x @ W^T`), which measured as fast as or faster than `[in, out]` for
/// matrix-vector products on XLA CPU (see `docs/performance.md`), so loading never transposes.
#[derive(Tree, Debug, Clone)]
pub struct LayerWeights<T> {
    /// Pre-mixer RMSNorm weight, `[hidden]`.
    pub norm: T,
    /// `in_proj`, `[in_proj_dim, hidden]` (rows: `z`, `x`, `B`, `C`, `dt`).
    #[tree(rename = "mixer.in_proj")]
    pub in_proj: T,
    /// The per-row scales of an 8-bit `in_proj` (`[in_proj_dim]`; see [`crate::models::quant`]),
    /// `None` for f32 and bf16 matrices.
    #[tree(rename = "mixer.in_proj_scale")]
    pub in_proj_scale: Option<T>,
    /// `in_proj` bias, `[in_proj_dim]`, when the config has `use_bias`.
    #[tree(rename = "mixer.in_proj_bias")]
    pub in_proj_bias: Option<T>,
    /// Depthwise convolution weight, `[conv_dim, conv_kernel]`.
    #[tree(rename = "mixer.conv1d")]
    pub conv_weight: T,
    /// Convolution bias, `[conv_dim]`, when the config has `use_conv_bias`.
    #[tree(rename = "mixer.conv1d_bias")]
    pub conv_bias: Option<T>,
    /// `dt` bias, `[num_heads]`.
    #[tree(rename = "mixer.dt_bias")]
    pub dt_bias: T,
    /// `A_log`, `[num_heads]` (`A = -exp(A_log)`).
    #[tree(rename = "mixer.A_log")]
    pub a_log: T,
    /// Skip connection `D`, `[num_heads]`.
    #[tree(rename = "mixer.D")]
    pub d: T,
    /// Gated RMSNorm weight, `[d_inner]`.
    #[tree(rename = "mixer.norm")]
    pub gated_norm: T,
    /// `out_proj`, `[hidden, d_inner]`.
    #[tree(rename = "mixer.out_proj")]
    pub out_proj: T,
    /// The per-row scales of an 8-bit `out_proj` (`[hidden]`), `None` for f32 and bf16.
    #[tree(rename = "mixer.out_proj_scale")]
    pub out_proj_scale: Option<T>,
    /// `out_proj` bias, `[hidden]`, when the config has `use_bias`.
    #[tree(rename = "mixer.out_proj_bias")]
    pub out_proj_bias: Option<T>,
}

/// All weights of a model: a [`Tree`] with the leaves `embedding`, `layers.<i>.<name>` (see
/// [`LayerWeights`]), `norm_f` and `lm_head`, in that order (the order the programs take them).
#[derive(Tree, Debug, Clone)]
pub struct Mamba2Weights<T> {
    /// Token embedding, `[vocab, hidden]`.
    pub embedding: T,
    /// The per-row scales of an 8-bit embedding (`[vocab]`), `None` for f32 and bf16.
    pub embedding_scale: Option<T>,
    /// The blocks, in order.
    pub layers: Vec<LayerWeights<T>>,
    /// Final RMSNorm weight, `[hidden]`.
    pub norm_f: T,
    /// The output head, `[vocab, hidden]`; `None` when tied to the embedding.
    pub lm_head: Option<T>,
    /// The per-row scales of an 8-bit untied head (`[vocab]`).
    pub lm_head_scale: Option<T>,
}

impl Mamba2Weights<TensorType> {
    /// The element type and shape of every tensor of a model with `config`, as [`load`] and
    /// [`random`] produce them and the programs take them: `embedding`, `in_proj`, `out_proj`
    /// and `lm_head` in `matmul_dtype` (F32, BF16, or [`quant::QUANTIZED`] for 8-bit matrices,
    /// each with an f32 scale per row), everything else in F32. `lm_head` is `None` when the
    /// config ties it to the embedding. Fails for any other `matmul_dtype` and for a config that
    /// [`Mamba2Config::validate`] rejects.
    ///
    /// [`load`]: Mamba2Weights::load
    /// [`random`]: Mamba2Weights::random
    pub fn types(config: &Mamba2Config, matmul_dtype: DType) -> Result<Self> {
        check_matmul_dtype(matmul_dtype)?;
        config.validate()?;
        let c = config;
        let m = |dims: &[usize]| TensorType::new(matmul_dtype, dims);
        let scale = |rows: usize| scale_type(matmul_dtype, rows);
        let layer = layer_types(c, matmul_dtype);
        let untied = !c.tie_word_embeddings;
        Ok(Mamba2Weights {
            embedding: m(&[c.vocab_size, c.hidden_size]),
            embedding_scale: scale(c.vocab_size),
            layers: vec![layer; c.num_layers],
            norm_f: TensorType::new(DType::F32, &[c.hidden_size]),
            lm_head: untied.then(|| m(&[c.vocab_size, c.hidden_size])),
            lm_head_scale: scale(c.vocab_size).filter(|_| untied),
        })
    }
}

/// The types of one block's weights (see [`Mamba2Weights::types`]) for a validated config.
pub(crate) fn layer_types(c: &Mamba2Config, matmul_dtype: DType) -> LayerWeights<TensorType> {
    let m = |dims: &[usize]| TensorType::new(matmul_dtype, dims);
    let f = |dims: &[usize]| TensorType::new(DType::F32, dims);
    LayerWeights {
        norm: f(&[c.hidden_size]),
        in_proj: m(&[c.in_proj_dim(), c.hidden_size]),
        in_proj_scale: scale_type(matmul_dtype, c.in_proj_dim()),
        in_proj_bias: c.use_bias.then(|| f(&[c.in_proj_dim()])),
        conv_weight: f(&[c.conv_dim(), c.conv_kernel]),
        conv_bias: c.use_conv_bias.then(|| f(&[c.conv_dim()])),
        dt_bias: f(&[c.num_heads]),
        a_log: f(&[c.num_heads]),
        d: f(&[c.num_heads]),
        gated_norm: f(&[c.d_inner()]),
        out_proj: m(&[c.hidden_size, c.d_inner()]),
        out_proj_scale: scale_type(matmul_dtype, c.hidden_size),
        out_proj_bias: c.use_bias.then(|| f(&[c.hidden_size])),
    }
}

/// How the named values `got` differ from `want`, one message each: a name of `want` that `got`
/// lacks ("is missing"), a name whose values `differ` (its description, such as "is f32[3],
/// expected f32[4]"), and a name of `got` that `want` lacks; empty when they fit.
pub(crate) fn named_differences<G, W>(
    got: &[(String, G)],
    want: &[(String, W)],
    differ: impl Fn(&G, &W) -> Option<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, w) in want {
        match got.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("{name} is missing")),
            Some((_, g)) => {
                if let Some(why) = differ(g, w) {
                    problems.push(format!("{name} {why}"));
                }
            }
        }
    }
    for (name, _) in got {
        if !want.iter().any(|(n, _)| n == name) {
            problems.push(format!("{name} is present, the config has none"));
        }
    }
    problems
}

/// The type of the per-row scales of a `rows`-row matrix in `matmul_dtype`: f32 `[rows]` for
/// 8-bit matrices, none otherwise.
fn scale_type(matmul_dtype: DType, rows: usize) -> Option<TensorType> {
    (matmul_dtype == quant::QUANTIZED).then(|| TensorType::new(DType::F32, &[rows]))
}

/// Fails unless `dtype` is one the programs multiply in (F32, BF16, or 8-bit as
/// [`quant::QUANTIZED`]).
pub(crate) fn check_matmul_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::BF16 | quant::QUANTIZED => Ok(()),
        other => Err(Error::InvalidArgument(format!(
            "the Mamba-2 matmul dtype must be f32, bf16 or u8 (8-bit weights), not {other}"
        ))),
    }
}

impl Mamba2Weights<HostArray> {
    /// The same weights with 8-bit matrices: `in_proj`, `out_proj`, the embedding and an untied
    /// head quantized row by row ([`quant::quantize_rows`]); already 8-bit weights are returned
    /// as they are. A NaN or infinite matrix value is an error naming the tensor and where.
    pub fn to_8bit(&self) -> Result<Self> {
        if self.embedding_scale.is_some() {
            return Ok(self.clone());
        }
        let (embedding, embedding_scale) = quant::quantize_matrix("embedding", &self.embedding)?;
        let head = match &self.lm_head {
            Some(h) => Some(quant::quantize_matrix("lm_head", h)?),
            None => None,
        };
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| quantize_layer(l.clone(), i))
            .collect::<Result<Vec<_>>>()?;
        let (lm_head, lm_head_scale) = head.map_or((None, None), |(h, s)| (Some(h), Some(s)));
        Ok(Mamba2Weights {
            embedding,
            embedding_scale: Some(embedding_scale),
            layers,
            norm_f: self.norm_f.clone(),
            lm_head,
            lm_head_scale,
        })
    }

    /// Copies every tensor to device 0 of `client`, one buffer each, for the programs of a
    /// model to share.
    pub fn upload(&self, client: &Client) -> Result<Mamba2Weights<Buffer>> {
        self.try_map(|_, a| with_host_array!(a, x => client.buffer_from_array(x)))
    }
}

/// Layer `i`'s weights with `in_proj` and `out_proj` quantized to 8 bits (see
/// [`Mamba2Weights::to_8bit`]); each f32 or bf16 matrix is dropped once quantized.
pub(crate) fn quantize_layer(
    mut l: LayerWeights<HostArray>,
    i: usize,
) -> Result<LayerWeights<HostArray>> {
    let (w, s) = quant::quantize_matrix(&format!("layers.{i}.mixer.in_proj"), &l.in_proj)?;
    (l.in_proj, l.in_proj_scale) = (w, Some(s));
    let (w, s) = quant::quantize_matrix(&format!("layers.{i}.mixer.out_proj"), &l.out_proj)?;
    (l.out_proj, l.out_proj_scale) = (w, Some(s));
    Ok(l)
}

/// The host weights [`crate::models::mamba2::Mamba2::new`] takes: borrowed (`&weights`: the
/// caller keeps its copy) or owned (`weights`: each host tensor is freed as soon as it is on the
/// device, so building a model peaks at one copy of the weights instead of two).
pub trait HostWeights<'a> {
    /// The tensors, borrowed or owned.
    fn into_cows(self) -> Result<Mamba2Weights<Cow<'a, HostArray>>>;
}

impl<'a> HostWeights<'a> for &'a Mamba2Weights<HostArray> {
    fn into_cows(self) -> Result<Mamba2Weights<Cow<'a, HostArray>>> {
        self.try_map(|_, t| Ok(Cow::Borrowed(t)))
    }
}

impl HostWeights<'static> for Mamba2Weights<HostArray> {
    fn into_cows(self) -> Result<Mamba2Weights<Cow<'static, HostArray>>> {
        self.try_into_map(|_, t| Ok(Cow::Owned(t)))
    }
}
