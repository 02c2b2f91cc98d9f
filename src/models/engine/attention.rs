//! The engine's attention and its key/value cache: causal grouped-query self-attention whose
//! keys and values are written in place into caches preallocated to the program's capacity, at
//! each row's column; left padding and unwritten columns are never attended. Rotary embeddings
//! (with `linear` and `llama3` frequency scaling), biases, per-head query and key RMS norms,
//! logit soft-capping and sliding windows (masked by position, so padding between the pieces
//! of a prompt does not narrow them; their caches are rings of the window, [`ring`]) are
//! options of the config. A prompt over a long cache attends in blocks ([`QUERY_BLOCK`] of its
//! queries by [`KEY_BLOCK`] keys) with a running softmax, skipping the key blocks a query block
//! cannot see ([`blocks`]), so its memory grows with the cache, not with the cache times the
//! prompt.

mod blocks;
mod ring;

use crate::tree::Tree;

use serde_json::Value;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::json::number;
use crate::models::common::layers::rms;
use crate::models::common::materialize::materialized;
use crate::models::common::Matrix;
use crate::ops::Tensor;

/// The score of a position a query may not see: finite, so a row that sees nothing (a padded
/// position) gets a uniform softmax rather than NaN.
const HIDDEN: f64 = -1e30;

/// A prompt over a cache of more columns than this attends in blocks of this many keys.
pub(crate) const KEY_BLOCK: usize = 512;

/// The queries of a prompt attended together when it attends in blocks.
const QUERY_BLOCK: usize = 512;

/// How rotary frequencies are scaled for contexts beyond the trained one (transformers'
/// `rope_scaling` / `rope_parameters`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// `theta^(-2i / rotary_dim)` as they are.
    None,
    /// Every frequency divided by `factor` (positions interpolated).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, the band between
    /// interpolated smoothly.
    Llama3 {
        /// The divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are divided.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The trained context (`original_max_position_embeddings`).
        original: f64,
    },
}

/// The attention sublayers' shape and numerics.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionConfig {
    /// Query heads.
    pub num_heads: usize,
    /// Key and value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Leading channels of each head that rotary embeddings turn (0: no rotary).
    pub rotary_dim: usize,
    /// Rotary base `theta`.
    pub rope_theta: f64,
    /// How the rotary frequencies are scaled.
    pub rope_scaling: RopeScaling,
    /// The factor on `q . k` (`head_dim^-0.5`, Granite's `attention_multiplier`, Gemma 2's
    /// `query_pre_attn_scalar^-0.5`).
    pub scale: f64,
    /// Biases on the query, key and value projections.
    pub qkv_bias: bool,
    /// A bias on the output projection.
    pub o_bias: bool,
    /// Per-head RMS norms of the queries and keys before the rotary embedding, with this
    /// epsilon (Qwen 3).
    pub qk_norm: Option<f64>,
    /// Scores soft-capped to `cap * tanh(score / cap)` before the mask (Gemma 2).
    pub softcap: Option<f64>,
    /// The window of the sliding layers: a query sees the keys less than this many positions
    /// before it (which layers slide is the family's to say).
    pub sliding_window: Option<usize>,
}

impl AttentionConfig {
    /// The inverse frequencies of the rotary channel pairs, scaled as the config says.
    pub fn inv_freq(&self) -> Vec<f64> {
        let r = self.rotary_dim;
        let base = (0..r / 2).map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / r as f64));
        match self.rope_scaling {
            RopeScaling::None => base.collect(),
            RopeScaling::Linear { factor } => base.map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: lo,
                high_freq_factor: hi,
                original,
            } => base
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < original / hi {
                        f
                    } else if wavelen > original / lo {
                        f / factor
                    } else {
                        let smooth = (original / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect(),
        }
    }
}

/// The rotary base and scaling of a transformers `config.json`: from `rope_parameters`
/// (transformers 5) or from `rope_theta` and `rope_scaling` (older and published configs).
/// A scaling other than `default`, `linear` or `llama3`, or one that lacks a number it needs,
/// is an error naming the field.
pub(crate) fn rope_from_config(v: &Value) -> Result<(f64, RopeScaling)> {
    let (section, name) = match v.get("rope_parameters").filter(|p| p.is_object()) {
        Some(p) => (Some(p), "rope_parameters"),
        None => (
            v.get("rope_scaling").filter(|p| p.is_object()),
            "rope_scaling",
        ),
    };
    let theta = section
        .and_then(|p| p.get("rope_theta"))
        .or_else(|| v.get("rope_theta"))
        .and_then(number)
        .unwrap_or(10000.0);
    let kind = section
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let need = |field: &str| {
        section
            .and_then(|p| p.get(field))
            .or_else(|| v.get(field))
            .and_then(number)
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{name}.{field} is missing or not a positive number (rope_type {kind:?} needs it)"
                ))
            })
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original: need("original_max_position_embeddings")?,
        },
        other => {
            return Err(Error::InvalidArgument(format!(
                "{name}.rope_type {other:?} is not supported (supported: default, linear, llama3)"
            )))
        }
    };
    Ok((theta, scaling))
}

/// Which of `layers` layers attend within a sliding window: as `layer_types` says
/// (`sliding_attention` or `full_attention`, transformers 5) when the config has it, else
/// `default(layer)`. A list of another length or with another entry is an error naming it.
pub(crate) fn sliding_layers(
    v: &Value,
    layers: usize,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>> {
    let Some(types) = v.get("layer_types").and_then(Value::as_array) else {
        return Ok((0..layers).map(default).collect());
    };
    if types.len() != layers {
        return Err(Error::InvalidArgument(format!(
            "layer_types has {} entries for {layers} layers",
            types.len()
        )));
    }
    types
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(Error::InvalidArgument(format!(
                "layer_types[{i}] is {t}: expected \"sliding_attention\" or \"full_attention\""
            ))),
        })
        .collect()
}

/// An attention sublayer's projections, `[out, in]`, and its optional parts.
#[derive(Tree, Debug, Clone)]
pub struct AttentionWeights<T> {
    /// Queries, `[heads * head_dim, hidden]`.
    pub q: Matrix<T>,
    /// Keys, `[kv_heads * head_dim, hidden]`.
    pub k: Matrix<T>,
    /// Values, `[kv_heads * head_dim, hidden]`.
    pub v: Matrix<T>,
    /// Output, `[hidden, heads * head_dim]`.
    pub o: Matrix<T>,
    /// The biases, when the config has them.
    #[tree(rename = "")]
    pub biases: Option<AttentionBiases<T>>,
    /// The per-head query norm's weight, `[head_dim]` (Qwen 3).
    pub q_norm: Option<T>,
    /// The per-head key norm's weight, `[head_dim]` (Qwen 3).
    pub k_norm: Option<T>,
}

/// An attention sublayer's biases (named `q_bias`, ... in the tree).
#[derive(Tree, Debug, Clone)]
pub struct AttentionBiases<T> {
    /// `[heads * head_dim]`.
    #[tree(rename = "q_bias")]
    pub q: T,
    /// `[kv_heads * head_dim]`.
    #[tree(rename = "k_bias")]
    pub k: T,
    /// `[kv_heads * head_dim]`.
    #[tree(rename = "v_bias")]
    pub v: T,
    /// `[hidden]`, when the output projection has one.
    #[tree(rename = "o_bias")]
    pub o: Option<T>,
}

/// Rotary embedding of the first `cfg.rotary_dim` channels of each head of `x` (`[b, L, heads,
/// head_dim]`) at `positions` (`[b, L]` integers): HF's `rotate_half` convention, at the
/// frequencies of [`AttentionConfig::inv_freq`]; the other channels pass unchanged.
pub(crate) fn rotary(x: &Tensor, positions: &Tensor, cfg: &AttentionConfig) -> Result<Tensor> {
    let r = cfg.rotary_dim;
    if r == 0 {
        return Ok(x.clone());
    }
    let g = x.graph();
    let half = r / 2;
    let inv: Vec<f32> = cfg.inv_freq().iter().map(|&f| f as f32).collect();
    let inv = g.constant(&crate::array::HostArray::from_vec(&[half], inv)?)?;
    let angles = positions.astype(DType::F32)?.expand_dims(-1)?.mul(&inv)?; // [b, L, half]
    let both = Tensor::concat(&[&angles, &angles], -1)?.expand_dims(2)?; // [b, L, 1, r]
    let (cos, sin) = (both.cos()?, both.sin()?);
    let turned = x.narrow(-1, 0, r)?;
    let rotated = Tensor::concat(
        &[
            &turned.narrow(-1, half, half)?.neg()?,
            &turned.narrow(-1, 0, half)?,
        ],
        -1,
    )?;
    let out = turned.mul(&cos)?.add(&rotated.mul(&sin)?)?;
    if r == cfg.head_dim {
        return Ok(out);
    }
    Tensor::concat(&[&out, &x.narrow(-1, r, cfg.head_dim - r)?], -1)
}

/// What attention reads besides its input: where the new positions go in the cache and
/// which cache columns hold real tokens.
pub(crate) struct Positions<'a> {
    /// Rotary positions of the new tokens, `[b, L]` integers.
    pub rotary: &'a Tensor,
    /// The cache column of the first new token: a scalar `i32` (the same for every row), or
    /// one per row (`[b]` `i32`: served slots, each at its own point).
    pub column: &'a Tensor,
    /// `[b, C]` f32: 0 where a cache column holds no real token, else that token's position
    /// plus one (the new ones included).
    pub valid: &'a Tensor,
}

/// Causal self-attention of `x` (`[b, L, hidden]` f32, normalised) whose keys and values are
/// written into the caches `k` (`[b, kv_heads, head_dim, C]` f32) and `v` (`[b, kv_heads, C,
/// head_dim]`) at `at.column` (the layouts the score and value products read without a
/// transpose): new token `i` sees the cache columns `at.valid` marks whose positions are not
/// after its own. With `window`, a query sees only the keys less than `window` positions before
/// it, and `k` and `v` are rings (see [`ring`]): position `p` at column `p mod R`. Returns the
/// output `[b, L, hidden]` and the updated caches.
pub(crate) fn attention(
    x: &Tensor,
    at: &Positions<'_>,
    k: &Tensor,
    v: &Tensor,
    w: &AttentionWeights<Tensor>,
    cfg: &AttentionConfig,
    window: Option<usize>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, len) = (x.dims()[0], x.dims()[1]);
    let (h, kvh, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let biases = w.biases.as_ref();
    let split = |t: Tensor, heads: usize, norm: Option<&Tensor>| -> Result<Tensor> {
        let t = t.reshape(&[b as isize, len as isize, heads as isize, hd as isize])?;
        match (norm, cfg.qk_norm) {
            (Some(n), Some(eps)) => rms(&t, eps)?.mul(n),
            _ => Ok(t),
        }
    };
    let q = w.q.apply(x, biases.map(|bs| &bs.q))?;
    let q = rotary(&split(q, h, w.q_norm.as_ref())?, at.rotary, cfg)?;
    let kn = w.k.apply(x, biases.map(|bs| &bs.k))?;
    let kn = rotary(&split(kn, kvh, w.k_norm.as_ref())?, at.rotary, cfg)?;
    let vn = split(w.v.apply(x, biases.map(|bs| &bs.v))?, kvh, None)?;
    // The new keys and values in the caches' layouts: [b, g, d, L] and [b, g, L, d].
    let (kn, vn) = (kn.transpose(&[0, 2, 3, 1])?, vn.transpose(&[0, 2, 1, 3])?);
    let rep = h / kvh;
    let q = q.reshape(&[
        b as isize,
        len as isize,
        kvh as isize,
        rep as isize,
        hd as isize,
    ])?;
    let read = Read {
        q: &q,
        rotary: at.rotary,
        cfg,
        window,
    };
    let (out, k, v) = match window {
        Some(_) => ring::attend(&read, at, k, v, &kn, &vn)?,
        None => {
            let (mut k, mut v) = write_cache(k, v, &kn, &vn, at.column)?;
            if len == 1 {
                // A decode step's updated caches, materialized once: otherwise XLA's CPU
                // backend fuses the in-place update into the products that read it too, and
                // copies each cache twice per step to do both (decode after 2,048 tokens ran
                // at half the speed).
                (k, v) = (materialized(&k)?, materialized(&v)?);
            }
            (read.attend(&k, &v, at.valid)?, k, v)
        }
    };
    let out = out.reshape(&[b as isize, len as isize, (h * hd) as isize])?;
    let o_bias = biases.and_then(|bs| bs.o.as_ref());
    Ok((w.o.apply(&out, o_bias)?, k, v))
}

/// The queries and what decides which keys they see.
struct Read<'a> {
    /// `[b, L, kv_heads, rep, head_dim]`.
    q: &'a Tensor,
    /// The queries' positions, `[b, L]` integers.
    rotary: &'a Tensor,
    cfg: &'a AttentionConfig,
    window: Option<usize>,
}

impl Read<'_> {
    /// Attention over the keys `k` (`[b, g, d, n]`) and values `v` (`[b, g, n, d]`) that `valid`
    /// (`[b, n]`, position + 1, 0 for none) marks: `[b, L, g, r, d]`; a prompt over more than
    /// [`KEY_BLOCK`] keys in blocks.
    fn attend(&self, k: &Tensor, v: &Tensor, valid: &Tensor) -> Result<Tensor> {
        let len = self.q.dims()[1];
        match len > 1 && v.dims()[2] > KEY_BLOCK {
            true => self.blocked(k, v, valid, (QUERY_BLOCK, KEY_BLOCK)),
            false => self.whole(k, v, valid),
        }
    }

    /// The scores `[b, g, r, L, n]` of the queries against `n` keys (`[b, g, d, n]`) whose
    /// positions plus one `valid` (`[b, n]`) holds; capped, and hidden where a query may not
    /// look: a key of no token, after the query's position or (with a window) too far before.
    fn scores(&self, keys: &Tensor, valid: &Tensor) -> Result<Tensor> {
        let mut s = Tensor::einsum("blgrd,bgdc->bgrlc", &[self.q, keys])?.mul(self.cfg.scale)?;
        if let Some(cap) = self.cfg.softcap {
            s = s.div(cap)?.tanh()?.mul(cap)?;
        }
        let key = valid.sub(1.0)?.expand_dims(1)?; // [b, 1, n]
        let query = self.rotary.astype(DType::F32)?.expand_dims(-1)?; // [b, L, 1]
        let mut visible = valid.expand_dims(1)?.gt(0.5)?.and(&key.le(&query)?)?; // [b, L, n]
        if let Some(w) = self.window {
            visible = visible.and(&query.sub(&key)?.lt(w as f64)?)?;
        }
        let visible = visible
            .expand_dims(1)?
            .expand_dims(1)?
            .broadcast_to(s.dims())?;
        visible.select(&s, HIDDEN)
    }

    /// Attention over every key at once: `[b, L, g, r, d]`.
    fn whole(&self, k: &Tensor, v: &Tensor, valid: &Tensor) -> Result<Tensor> {
        let p = self.scores(k, valid)?.softmax(-1)?;
        Tensor::einsum("bgrlc,bgcd->blgrd", &[&p, v])
    }
}

/// `column` (a scalar, or `[b]` one per row) shaped to broadcast over `rank` axes, rows first.
fn per_row(column: &Tensor, rank: usize) -> Result<Tensor> {
    if column.rank() == 0 {
        return Ok(column.clone());
    }
    let mut dims = vec![1isize; rank];
    dims[0] = column.dims()[0] as isize;
    column.reshape(&dims)
}

/// The caches `k` (`[b, kv_heads, head_dim, C]`) and `v` (`[b, kv_heads, C, head_dim]`) with the
/// new keys (`[b, kv_heads, head_dim, L]`) and values (`[b, kv_heads, L, head_dim]`) written
/// from `column` on: in place at a scalar column; at one column per row (one new position
/// each, a served decode step) by selecting that column.
fn write_cache(
    k: &Tensor,
    v: &Tensor,
    kn: &Tensor,
    vn: &Tensor,
    column: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let g = k.graph();
    if column.rank() == 0 {
        let zero = g.scalar(0.0, DType::I32)?;
        return Ok((
            k.dynamic_update_slice(kn, &[&zero, &zero, &zero, column])?,
            v.dynamic_update_slice(vn, &[&zero, &zero, column, &zero])?,
        ));
    }
    let (b, cap) = (v.dims()[0], v.dims()[2]);
    let at = |dims: [usize; 4], axis: isize| -> Result<Tensor> {
        g.iota(DType::I32, &dims, axis)?.eq(&per_row(column, 4)?)
    };
    let (hot_k, hot_v) = (at([b, 1, 1, cap], 3)?, at([b, 1, cap, 1], 2)?);
    Ok((
        hot_k
            .broadcast_to(k.dims())?
            .select(&kn.broadcast_to(k.dims())?, k)?,
        hot_v
            .broadcast_to(v.dims())?
            .select(&vn.broadcast_to(v.dims())?, v)?,
    ))
}

/// `valid` (`[b, C]` f32) with the column of one new token per row marked with its position
/// plus one (`positions`, `[b]` i32): `column` a scalar (the same for every row) or `[b]` (one
/// per row).
pub(crate) fn mark_valid(valid: &Tensor, column: &Tensor, positions: &Tensor) -> Result<Tensor> {
    let g = valid.graph();
    let (b, cap) = (valid.dims()[0], valid.dims()[1]);
    let mark = positions
        .astype(DType::F32)?
        .add(1.0)?
        .reshape(&[b as isize, 1])?;
    if column.rank() == 0 {
        let zero = g.scalar(0.0, DType::I32)?;
        return valid.dynamic_update_slice(&mark, &[&zero, column]);
    }
    let hot = g
        .iota(DType::I32, &[b, cap], 1)?
        .eq(&column.reshape(&[b as isize, 1])?)?;
    hot.select(&mark.broadcast_to(&[b, cap])?, valid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::HostArray;
    use crate::ops::Graph;
    use crate::rng::SplitMix64;

    fn config(window: Option<usize>, softcap: Option<f64>) -> AttentionConfig {
        AttentionConfig {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 4,
            rotary_dim: 4,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            scale: 0.5,
            qkv_bias: false,
            o_bias: false,
            qk_norm: None,
            softcap,
            sliding_window: window,
        }
    }

    fn uniform(dims: &[usize], seed: u64) -> HostArray {
        let mut rng = SplitMix64::new(seed);
        let n = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
        HostArray::from_vec(dims, v).unwrap()
    }

    /// Two rows over a cache of `cap` columns whose last `len` are the new tokens at `column`:
    /// row 0 left-padded by `pad` columns, row 1 by none; `valid` holds position + 1.
    fn inputs(len: usize, cap: usize, pad: usize) -> (HostArray, HostArray, usize) {
        let column = cap - len - 2;
        let (mut valid, mut rotary) = (vec![0f32; 2 * cap], vec![0i32; 2 * len]);
        for r in 0..2 {
            let pad = if r == 0 { pad } else { 0 };
            for c in pad..column + len {
                valid[r * cap + c] = (c - pad) as f32 + 1.0;
            }
            for i in 0..len {
                rotary[r * len + i] = (column + i - pad) as i32;
            }
        }
        let valid = HostArray::from_vec(&[2, cap], valid).unwrap();
        (
            valid,
            HostArray::from_vec(&[2, len], rotary).unwrap(),
            column,
        )
    }

    /// The largest difference within the pairs `pairs` gives (over the queries, keys, values
    /// and `valid` of one graph), row 0 padded by `pad`.
    fn worst(
        (len, cap, pad): (usize, usize, usize),
        cfg: &AttentionConfig,
        pairs: impl Fn(&Read<'_>, &Tensor, &Tensor, &Tensor) -> Vec<(Tensor, Tensor)>,
    ) -> f64 {
        let g = Graph::new();
        let q = g.parameter("q", DType::F32, &[2, len, 2, 2, 4]).unwrap();
        let k = g.parameter("k", DType::F32, &[2, 2, 4, cap]).unwrap();
        let v = g.parameter("v", DType::F32, &[2, 2, cap, 4]).unwrap();
        let valid = g.parameter("valid", DType::F32, &[2, cap]).unwrap();
        let rotary = g.parameter("rotary", DType::I32, &[2, len]).unwrap();
        let (valid_in, rotary_in, _) = inputs(len, cap, pad);
        let read = Read {
            q: &q,
            rotary: &rotary,
            cfg,
            window: cfg.sliding_window,
        };
        let outs: Vec<Tensor> = pairs(&read, &k, &v, &valid)
            .into_iter()
            .flat_map(|(a, b)| [a, b])
            .collect();
        g.set_outputs(&outs.iter().collect::<Vec<_>>()).unwrap();
        let got = crate::interp::evaluate(
            &g,
            &[
                uniform(&[2, len, 2, 2, 4], 1),
                uniform(&[2, 2, 4, cap], 2),
                uniform(&[2, 2, cap, 4], 3),
                valid_in,
                rotary_in,
            ],
        )
        .unwrap();
        got.chunks(2)
            .flat_map(|pair| {
                assert_eq!(pair[0].dims(), pair[1].dims());
                let (a, b) = (pair[0].to_f64_vec(), pair[1].to_f64_vec());
                a.iter()
                    .zip(&b)
                    .map(|(a, b)| (a - b).abs())
                    .collect::<Vec<_>>()
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn blocks_with_a_running_softmax_equal_the_whole_cache() {
        // Row 0 padded by 3 (rows at different positions) and by none (block edges exact).
        let cases = [(None, None), (Some(3), None), (None, Some(1.5))];
        for ((window, softcap), pad) in cases.into_iter().flat_map(|c| [(c, 3), (c, 0)]) {
            let cfg = config(window, softcap);
            let d = worst((6, 23, pad), &cfg, |read, k, v, valid| {
                // Keys: 4 divides nothing (a tail of 3); 23 is one block; 5 leaves a tail of 3.
                // Queries: all 6 at once; 2 divides them; 4 leaves a tail of 2.
                let whole = read.whole(k, v, valid).unwrap();
                [(6, 4), (6, 23), (6, 5), (6, 1), (2, 4), (4, 5), (1, 3)]
                    .map(|b| (whole.clone(), read.blocked(k, v, valid, b).unwrap()))
                    .to_vec()
            });
            assert!(
                d < 1e-5,
                "{window:?} {softcap:?} {pad}: blocked differs by {d}"
            );
        }
    }

    #[test]
    fn blocks_differentiate_as_the_whole_cache() {
        let cfg = config(Some(3), None);
        // The gradients of the output's weighted sum with respect to the queries, keys and
        // values: through the loops over query and key blocks and the skipping conditionals.
        let grads = |read: &Read<'_>, k: &Tensor, v: &Tensor, out: &Tensor| {
            let w = read.q.graph().iota(DType::F32, out.dims(), 1).unwrap();
            let loss = out.mul(w.cos().unwrap()).unwrap().sum_all().unwrap();
            loss.grad(&[read.q, k, v]).unwrap()
        };
        let d = worst((6, 23, 0), &cfg, |read, k, v, valid| {
            let whole = grads(read, k, v, &read.whole(k, v, valid).unwrap());
            let blocked = grads(read, k, v, &read.blocked(k, v, valid, (4, 5)).unwrap());
            whole.into_iter().zip(blocked).collect()
        });
        assert!(d < 1e-5, "the gradients differ by {d}");
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let mut cfg = config(None, None);
        cfg.rotary_dim = 64;
        cfg.head_dim = 64;
        cfg.rope_theta = 500000.0;
        let plain = cfg.inv_freq();
        cfg.rope_scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original: 8192.0,
        };
        let scaled = cfg.inv_freq();
        // Wavelength 2 pi / f: below 8192 / 4 kept, above 8192 divided by 8, smooth between.
        for (p, s) in plain.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f64::consts::PI / p;
            if wavelen < 2048.0 {
                assert_eq!(p, s);
            } else if wavelen > 8192.0 {
                assert!((s - p / 8.0).abs() < 1e-15);
            } else {
                assert!(*s < *p && *s > p / 8.0);
            }
        }
        assert!(plain.iter().zip(&scaled).any(|(p, s)| p != s));
    }
}
