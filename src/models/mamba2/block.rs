//! The Mamba-2 block and model as graph functions: prefill over a (left-padded) prompt through
//! the chunked SSD, and one decode step through the recurrence.
//!
//! Precision: the matrices (`in_proj`, `out_proj`, the embedding and the head) may be bf16;
//! their products are converted to f32 at once. The norms, the residual stream and the states are
//! f32 always; `A`, the exponentials and the cumulative sums of the SSD are in the config's
//! `scan_dtype` (f32 unless changed for a precision ablation).

use super::config::Mamba2Config;
use super::ssd::{groups_to_heads, ssd_chunked, ssd_step};
use super::weights::named_differences;
use super::weights::{layer_types, LayerWeights, Mamba2Weights};
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::layers::{linear_scaled, remembered_inputs, rms, LayerState};
use crate::models::common::materialize::{materialized, window_sum};
use crate::models::quant;
use crate::ops::{Graph, Tensor};
use crate::tree::Tree;

/// An error of the builder `op` about its argument `arg`.
fn bad_arg(op: &str, arg: &str, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{op}: argument `{arg}` {why}"))
}

/// Checks that the argument `arg` of `op` has the shape `want` (described by `names`) and the
/// dtype `dtype` (any integer type when `None`).
fn check_arg(
    op: &str,
    arg: &str,
    t: &Tensor,
    want: &[usize],
    names: &str,
    dtype: Option<DType>,
) -> Result<()> {
    let dtype_ok = dtype.map_or(t.dtype().is_int(), |d| t.dtype() == d);
    if t.dims() != want || !dtype_ok {
        let ty = dtype.map_or_else(|| "integer".to_string(), |d| d.to_string());
        return Err(bad_arg(
            op,
            arg,
            format!("is {}, expected {ty} {names} = {want:?}", t.ty()),
        ));
    }
    Ok(())
}

/// Appends to `problems` how the tensors `got` differ in shape from `want` (by name); dtypes
/// are left to the ops, which name them.
fn shape_problems(
    prefix: &str,
    got: Vec<(String, &Tensor)>,
    want: Vec<(String, &TensorType)>,
    problems: &mut Vec<String>,
) {
    let found = named_differences(&got, &want, |t, ty| {
        (t.dims() != ty.dims).then(|| format!("is {}, expected shape {:?}", t.ty(), ty.dims))
    });
    problems.extend(found.into_iter().map(|p| format!("{prefix}{p}")));
}

/// The error of `op` listing `problems` with the weights argument `arg`, if any.
fn weight_error(op: &str, arg: &str, problems: Vec<String>) -> Result<()> {
    if problems.is_empty() {
        return Ok(());
    }
    Err(bad_arg(
        op,
        arg,
        format!("does not fit the config: {}", problems.join("; ")),
    ))
}

/// Checks one block's weight shapes against a validated config.
fn check_layer(op: &str, w: &LayerWeights<Tensor>, cfg: &Mamba2Config) -> Result<()> {
    let want = layer_types(cfg, w.in_proj.dtype());
    let mut problems = Vec::new();
    shape_problems("", w.named(), want.named(), &mut problems);
    weight_error(op, "w", problems)
}

/// Checks every weight shape against a validated config.
fn check_weights(op: &str, w: &Mamba2Weights<Tensor>, cfg: &Mamba2Config) -> Result<()> {
    let mut problems = Vec::new();
    if w.layers.len() != cfg.num_layers {
        problems.push(format!(
            "{} layers, the config has num_layers = {}",
            w.layers.len(),
            cfg.num_layers
        ));
    }
    let head = [cfg.vocab_size, cfg.hidden_size];
    let vocab = [cfg.vocab_size];
    let untied = !cfg.tie_word_embeddings;
    let eight_bit = w.embedding.dtype() == quant::QUANTIZED;
    let tying = (
        "tie_word_embeddings is false",
        "tie_word_embeddings is true",
    );
    let scaled = ("the embedding is 8-bit", "the embedding is not 8-bit");
    for (name, t, want, (why_missing, why_present)) in [
        ("embedding", Some(&w.embedding), Some(&head[..]), tying),
        (
            "embedding_scale",
            w.embedding_scale.as_ref(),
            eight_bit.then_some(&vocab[..]),
            scaled,
        ),
        (
            "norm_f",
            Some(&w.norm_f),
            Some(&[cfg.hidden_size][..]),
            tying,
        ),
        (
            "lm_head",
            w.lm_head.as_ref(),
            untied.then_some(&head[..]),
            tying,
        ),
        (
            "lm_head_scale",
            w.lm_head_scale.as_ref(),
            (untied && eight_bit).then_some(&vocab[..]),
            scaled,
        ),
    ] {
        match (t, want) {
            (Some(t), Some(want)) if t.dims() != want => {
                problems.push(format!("{name} is {}, expected shape {want:?}", t.ty()))
            }
            (None, Some(_)) => problems.push(format!("{name} is missing ({why_missing})")),
            (Some(_), None) => problems.push(format!("{name} is present, but {why_present}")),
            _ => {}
        }
    }
    let want = layer_types(cfg, w.embedding.dtype());
    for (i, layer) in w.layers.iter().enumerate() {
        shape_problems(
            &format!("layers.{i}."),
            layer.named(),
            want.named(),
            &mut problems,
        );
    }
    weight_error(op, "w", problems)
}

/// RMSNorm over the last axis: `x * rsqrt(mean(x^2) + eps) * w`.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    rms(x, eps)?.mul(w)
}

/// Gated RMSNorm: `rms(y * silu(z)) * w` normalised over each group of `d_inner / n_groups`
/// channels (as current transformers and mamba_ssm do); with `norm_before_gate`,
/// `rms(y) * w * silu(z)`.
fn gated_rms_norm(y: &Tensor, z: &Tensor, w: &Tensor, cfg: &Mamba2Config) -> Result<Tensor> {
    if cfg.norm_before_gate {
        return group_rms(y, w, cfg)?.mul(&z.silu()?);
    }
    group_rms(&y.mul(&z.silu()?)?, w, cfg)
}

/// RMS-normalises each group of `d_inner / n_groups` channels, times `w`.
fn group_rms(h: &Tensor, w: &Tensor, cfg: &Mamba2Config) -> Result<Tensor> {
    let dims = h.dims().to_vec();
    let mut grouped: Vec<isize> = dims[..dims.len() - 1].iter().map(|&d| d as isize).collect();
    grouped.extend([
        cfg.n_groups as isize,
        (cfg.d_inner() / cfg.n_groups) as isize,
    ]);
    let hg = h.reshape(&grouped)?;
    let var = hg.square()?.mean_keepdims(&[-1])?;
    let normed = hg.mul(&var.add(cfg.norm_eps)?.rsqrt()?)?;
    let back: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
    normed.reshape(&back)?.mul(w)
}

/// `softplus(dt + dt_bias)` clamped to the config's `time_step_limit`.
fn time_step(dt: &Tensor, bias: &Tensor, cfg: &Mamba2Config) -> Result<Tensor> {
    let dt = dt.add(bias)?.softplus()?;
    let (lo, hi) = cfg.time_step_limit;
    if lo > 0.0 || hi.is_finite() {
        dt.clamp(lo, if hi.is_finite() { hi } else { f64::MAX })
    } else {
        Ok(dt)
    }
}

/// Splits the `in_proj` output `[..., in_proj_dim]` into `z`, `xBC` and `dt`.
fn split_in_proj(zxbcdt: &Tensor, cfg: &Mamba2Config) -> Result<(Tensor, Tensor, Tensor)> {
    let di = cfg.d_inner();
    let z = zxbcdt.narrow(-1, 0, di)?;
    let xbc = zxbcdt.narrow(-1, di, cfg.conv_dim())?;
    let dt = zxbcdt.narrow(-1, di + cfg.conv_dim(), cfg.num_heads)?;
    Ok((z, xbc, dt))
}

/// Splits convolved `[..., conv_dim]` into `x` `[..., H, P]`, `B` and `C` `[..., G, N]`.
fn split_xbc(xbc: &Tensor, cfg: &Mamba2Config) -> Result<(Tensor, Tensor, Tensor)> {
    let (di, gn) = (cfg.d_inner(), cfg.n_groups * cfg.state_size);
    let lead: Vec<isize> = xbc.dims()[..xbc.rank() - 1]
        .iter()
        .map(|&d| d as isize)
        .collect();
    let shape = |a: usize, b: usize| -> Vec<isize> {
        let mut v = lead.clone();
        v.extend([a as isize, b as isize]);
        v
    };
    let x = xbc
        .narrow(-1, 0, di)?
        .reshape(&shape(cfg.num_heads, cfg.head_dim))?;
    let b = xbc
        .narrow(-1, di, gn)?
        .reshape(&shape(cfg.n_groups, cfg.state_size))?;
    let c = xbc
        .narrow(-1, di + gn, gn)?
        .reshape(&shape(cfg.n_groups, cfg.state_size))?;
    Ok((x, b, c))
}

/// The start of a block, shared by prefill and step: RMSNorm, `in_proj`, and its split into
/// `z`, `xBC` and `dt`.
pub(super) fn mixer_inputs(
    hidden: &Tensor,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<(Tensor, Tensor, Tensor)> {
    let normed = rms_norm(hidden, &w.norm, cfg.norm_eps)?;
    let zxbcdt = linear_scaled(
        &normed,
        &w.in_proj,
        w.in_proj_scale.as_ref(),
        w.in_proj_bias.as_ref(),
    )?;
    split_in_proj(&zxbcdt, cfg)
}

/// The end of a mixer, shared by prefill and step: the `D` skip added to the SSD output `y`
/// (`[..., H, P]`, like `x`), the gated norm with `z`, and `out_proj` (the residual is the
/// caller's).
pub(super) fn mixer_output(
    y: &Tensor,
    x: &Tensor,
    z: &Tensor,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<Tensor> {
    let y = y.add(&x.mul(&w.d.expand_dims(-1)?)?)?;
    let mut flat: Vec<isize> = z.dims().iter().map(|&d| d as isize).collect();
    if let Some(last) = flat.last_mut() {
        *last = cfg.d_inner() as isize;
    }
    let y = gated_rms_norm(&y.reshape(&flat)?, z, &w.gated_norm, cfg)?;
    linear_scaled(
        &y,
        &w.out_proj,
        w.out_proj_scale.as_ref(),
        w.out_proj_bias.as_ref(),
    )
}

/// Checks that the argument `arg` of `op` has one layer state per layer of the config.
fn check_layer_count(op: &str, arg: &str, count: usize, cfg: &Mamba2Config) -> Result<()> {
    if count == cfg.num_layers {
        return Ok(());
    }
    Err(bad_arg(
        op,
        arg,
        format!(
            "has {count} layer states, the config has num_layers = {}",
            cfg.num_layers
        ),
    ))
}

/// Checks a batch's layer state against the config.
fn check_state(
    op: &str,
    arg: &str,
    state: &LayerState<Tensor>,
    batch: usize,
    cfg: &Mamba2Config,
) -> Result<()> {
    let (conv_dims, ssm_dims) = state_dims(batch, cfg);
    let f32 = Some(DType::F32);
    check_arg(
        op,
        &format!("{arg}.conv"),
        &state.conv,
        &conv_dims,
        "[b, conv_dim, conv_kernel]",
        f32,
    )?;
    check_arg(
        op,
        &format!("{arg}.ssm"),
        &state.ssm,
        &ssm_dims,
        "[b, H, P, N]",
        f32,
    )
}

/// One block over a whole left-padded sequence. `hidden`: `[b, L, hidden]` f32 (`L` a multiple
/// of the chunk), `mask`: `[b, L]` f32, 1 for real tokens and 0 for padding, `init`: the state
/// before the sequence (zero when `None`). Padded steps get `x = 0` and `dt = 0`, so they
/// neither feed nor decay the state; their convolution inputs are zero, or, just before a
/// row's first real token, the inputs `init` remembers, so the real tokens see the same history
/// as without padding. A config that [`Mamba2Config::validate`] rejects, or an argument of the
/// wrong shape, is an error naming it.
pub fn block_prefill(
    hidden: &Tensor,
    mask: &Tensor,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
    init: Option<&LayerState<Tensor>>,
) -> Result<(Tensor, LayerState<Tensor>)> {
    let (out, state) = mixer_prefill(hidden, mask, w, cfg, init)?;
    Ok((hidden.add(&out)?, state))
}

/// [`block_prefill`] without the residual: the mixer's output (`out_proj`'s, f32 `[b, L,
/// hidden]`) and the state, for models that scale it before adding it.
pub(crate) fn mixer_prefill(
    hidden: &Tensor,
    mask: &Tensor,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
    init: Option<&LayerState<Tensor>>,
) -> Result<(Tensor, LayerState<Tensor>)> {
    let op = "block_prefill";
    cfg.validate()?;
    let [batch, len] = match *hidden.dims() {
        [b, l, h] if h == cfg.hidden_size && hidden.dtype() == DType::F32 => [b, l],
        _ => {
            return Err(bad_arg(
                op,
                "hidden",
                format!(
                    "is {}, expected f32 [b, L, hidden_size = {}]",
                    hidden.ty(),
                    cfg.hidden_size
                ),
            ))
        }
    };
    if !len.is_multiple_of(cfg.chunk_size) {
        return Err(bad_arg(
            op,
            "hidden",
            format!(
                "has L = {len} positions, not a multiple of chunk_size ({})",
                cfg.chunk_size
            ),
        ));
    }
    check_arg(op, "mask", mask, &[batch, len], "[b, L]", Some(DType::F32))?;
    if let Some(init) = init {
        check_state(op, "init", init, batch, cfg)?;
    }
    check_layer(op, w, cfg)?;
    let (z, xbc, dt) = mixer_inputs(hidden, w, cfg)?;
    let (y, x, state) = prefill_core(&xbc, &dt, mask, w, cfg, init)?;
    Ok((mixer_output(&y, &x, &z, w, cfg)?, state))
}

/// The prefill's mixer between `in_proj` and [`mixer_output`]: the convolution and the SSD
/// over `xbc` `[b, L, conv_dim]` and `dt` `[b, L, H]` (the split `in_proj`), padded steps
/// masked out as [`block_prefill`] says. Returns the SSD output `y` and its input `x` (both
/// `[b, L, H, P]`) and the state after the sequence.
pub(super) fn prefill_core(
    xbc: &Tensor,
    dt: &Tensor,
    mask: &Tensor,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
    init: Option<&LayerState<Tensor>>,
) -> Result<(Tensor, Tensor, LayerState<Tensor>)> {
    let (k, len) = (cfg.conv_kernel, mask.dims()[1]);
    let m = mask.expand_dims(-1)?; // [b, L, 1]
    let xbc = xbc.mul(&m)?;

    // The inputs the convolution sees: k - 1 earlier ones (zero, or from `init`), then xbc.
    let mut history = xbc.pad(&[0, k as isize - 1, 0], &[0, 0, 0], &[0, 0, 0], 0.0)?;
    if let Some(init) = init.filter(|_| k > 1) {
        history = history.add(&remembered_inputs(init, mask, k, len)?)?;
    }
    // The convolution state after the prompt: its last k inputs, oldest first.
    let conv_state = history.narrow(1, len - 1, k)?.transpose(&[0, 2, 1])?; // [b, C, k]
    let conv = history
        .causal_conv1d(&w.conv_weight, w.conv_bias.as_ref())?
        .narrow(1, k - 1, len)?
        .silu()?;
    // Read by the SSD's fusions; materialized, not recomputed in each (on the CPU platform,
    // ~30% more prefill tokens/s at 512 tokens).
    let conv = materialized(&conv)?;
    let (x, b, c) = split_xbc(&conv, cfg)?;
    let x = x.mul(&m.expand_dims(-1)?)?;
    let dt = time_step(dt, &w.dt_bias, cfg)?.mul(&m)?;
    let a = w.a_log.exp()?.neg()?.astype(cfg.scan_dtype)?;
    let b = groups_to_heads(&b, cfg.num_heads)?;
    let c = groups_to_heads(&c, cfg.num_heads)?;
    let (y, ssm) = ssd_chunked(&x, &dt, &a, &b, &c, init.map(|s| &s.ssm), cfg.chunk_size)?;
    let state = LayerState {
        conv: conv_state,
        ssm,
    };
    Ok((y, x, state))
}

/// One block for one new token per row. `hidden`: `[b, hidden]` f32; `state` as
/// [`LayerState`] says, f32. A config that [`Mamba2Config::validate`] rejects, or an argument
/// of the wrong shape, is an error naming it.
pub fn block_step(
    hidden: &Tensor,
    state: &LayerState<Tensor>,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<(Tensor, LayerState<Tensor>)> {
    let (out, state) = mixer_step(hidden, state, w, cfg)?;
    Ok((hidden.add(&out)?, state))
}

/// [`block_step`] without the residual: the mixer's output (f32 `[b, hidden]`) and the state.
pub(crate) fn mixer_step(
    hidden: &Tensor,
    state: &LayerState<Tensor>,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<(Tensor, LayerState<Tensor>)> {
    let op = "block_step";
    cfg.validate()?;
    let batch = match *hidden.dims() {
        [b, h] if h == cfg.hidden_size && hidden.dtype() == DType::F32 => b,
        _ => {
            return Err(bad_arg(
                op,
                "hidden",
                format!(
                    "is {}, expected f32 [b, hidden_size = {}]",
                    hidden.ty(),
                    cfg.hidden_size
                ),
            ))
        }
    };
    check_state(op, "state", state, batch, cfg)?;
    check_layer(op, w, cfg)?;
    let (z, xbc, dt) = mixer_inputs(hidden, w, cfg)?;
    let (y, x, state) = step_core(&xbc, &dt, state, w, cfg)?;
    Ok((mixer_output(&y, &x, &z, w, cfg)?, state))
}

/// The step's mixer between `in_proj` and [`mixer_output`]: the convolution and the SSD for
/// one token per row (`xbc` `[b, conv_dim]`, `dt` `[b, H]`) after `state`. Returns the SSD
/// output `y` and its input `x` (both `[b, H, P]`) and the next state.
pub(super) fn step_core(
    xbc: &Tensor,
    dt: &Tensor,
    state: &LayerState<Tensor>,
    w: &LayerWeights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<(Tensor, Tensor, LayerState<Tensor>)> {
    let k = cfg.conv_kernel;
    // Shift the convolution inputs left and append the new one.
    let conv_state = Tensor::concat(&[&state.conv.narrow(2, 1, k - 1)?, &xbc.expand_dims(2)?], 2)?;
    let mut conv = window_sum(&conv_state, &w.conv_weight)?;
    if let Some(bias) = &w.conv_bias {
        conv = conv.add(bias)?;
    }
    let conv = conv.silu()?;
    let (x, b, c) = split_xbc(&conv, cfg)?; // [b, H, P], [b, G, N]
    let dt = time_step(dt, &w.dt_bias, cfg)?;
    let a = w.a_log.exp()?.neg()?.astype(cfg.scan_dtype)?;
    let b = groups_to_heads(&b.expand_dims(1)?, cfg.num_heads)?.squeeze(&[1])?;
    let c = groups_to_heads(&c.expand_dims(1)?, cfg.num_heads)?.squeeze(&[1])?;
    let (y, ssm) = ssd_step(&x, &dt, &a, &b, &c, &state.ssm)?;
    let state = LayerState {
        conv: conv_state,
        ssm,
    };
    Ok((y, x, state))
}

/// The shapes of a batch's [`LayerState`] for a validated config: `conv`, `ssm`.
fn state_dims(batch: usize, cfg: &Mamba2Config) -> ([usize; 3], [usize; 4]) {
    (
        [batch, cfg.conv_dim(), cfg.conv_kernel],
        [batch, cfg.num_heads, cfg.head_dim, cfg.state_size],
    )
}

/// The head: final norm and logits (f32) of `hidden` `[..., hidden]` (f32). A config that
/// [`Mamba2Config::validate`] rejects, or an argument of the wrong shape, is an error naming it.
pub fn head(hidden: &Tensor, w: &Mamba2Weights<Tensor>, cfg: &Mamba2Config) -> Result<Tensor> {
    cfg.validate()?;
    if hidden.dims().last() != Some(&cfg.hidden_size) || hidden.dtype() != DType::F32 {
        return Err(bad_arg(
            "head",
            "hidden",
            format!(
                "is {}, expected f32 [..., hidden_size = {}]",
                hidden.ty(),
                cfg.hidden_size
            ),
        ));
    }
    check_weights("head", w, cfg)?;
    let normed = rms_norm(hidden, &w.norm_f, cfg.norm_eps)?;
    let (matrix, scale) = match &w.lm_head {
        Some(head) => (head, w.lm_head_scale.as_ref()),
        None => (&w.embedding, w.embedding_scale.as_ref()),
    };
    linear_scaled(&normed, matrix, scale, None)
}

/// Embeds integer token ids (any shape) as f32 `[..., hidden]`. Non-integer `tokens`, or an
/// embedding that is not `[vocab, hidden]`, are an error naming them.
pub fn embed(tokens: &Tensor, w: &Mamba2Weights<Tensor>) -> Result<Tensor> {
    if !tokens.dtype().is_int() {
        return Err(bad_arg(
            "embed",
            "tokens",
            format!("is {}, expected integers", tokens.ty()),
        ));
    }
    if w.embedding.rank() != 2 {
        return Err(bad_arg(
            "embed",
            "w",
            format!(
                "has the embedding {}, expected [vocab, hidden]",
                w.embedding.ty()
            ),
        ));
    }
    match &w.embedding_scale {
        Some(scale) => quant::embed_8bit(tokens, &w.embedding, scale),
        None => w.embedding.take(tokens)?.astype(DType::F32),
    }
}

/// The whole model over a left-padded prompt: returns the final hidden states `[b, L, hidden]`
/// and each layer's state after the prompt. `tokens`: `[b, L]` integers (`L` a multiple of the
/// chunk), `mask`: `[b, L]` f32, `init`: one state per layer to continue from (zero when
/// `None`; see [`block_prefill`]). A config that [`Mamba2Config::validate`] rejects, weights
/// that do not fit it, or an argument of the wrong shape, are an error naming it.
pub fn prefill(
    tokens: &Tensor,
    mask: &Tensor,
    w: &Mamba2Weights<Tensor>,
    cfg: &Mamba2Config,
    init: Option<&[LayerState<Tensor>]>,
) -> Result<(Tensor, Vec<LayerState<Tensor>>)> {
    prefill_with(tokens, mask, w, cfg, init, Remat::Off)
}

/// Whether a graph that is differentiated keeps each layer's intermediates for the backward
/// pass or recomputes them there ([`Graph::checkpoint`](crate::ops::Graph::checkpoint) around
/// every layer: less memory, the forward work twice).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Remat {
    /// Keep every intermediate.
    #[default]
    Off,
    /// Keep each layer's input only and recompute the layer in the backward pass.
    PerLayer,
}

/// [`prefill`], each layer checkpointed as `remat` says.
pub fn prefill_with(
    tokens: &Tensor,
    mask: &Tensor,
    w: &Mamba2Weights<Tensor>,
    cfg: &Mamba2Config,
    init: Option<&[LayerState<Tensor>]>,
    remat: Remat,
) -> Result<(Tensor, Vec<LayerState<Tensor>>)> {
    cfg.validate()?;
    let fits = matches!(*tokens.dims(), [_, len] if len.is_multiple_of(cfg.chunk_size));
    if !fits || !tokens.dtype().is_int() {
        return Err(bad_arg(
            "prefill",
            "tokens",
            format!(
                "is {}, expected integers [batch, len] with len a multiple of the chunk ({})",
                tokens.ty(),
                cfg.chunk_size
            ),
        ));
    }
    check_arg(
        "prefill",
        "mask",
        mask,
        tokens.dims(),
        "[b, L]",
        Some(DType::F32),
    )?;
    check_weights("prefill", w, cfg)?;
    if let Some(init) = init {
        check_layer_count("prefill", "init", init.len(), cfg)?;
    }
    let mut hidden = embed(tokens, w)?;
    let mut states = Vec::with_capacity(w.layers.len());
    for (i, layer) in w.layers.iter().enumerate() {
        let run = |h: &Tensor| {
            let (h, s) = block_prefill(h, mask, layer, cfg, init.map(|s| &s[i]))?;
            Ok((h, s.conv, s.ssm))
        };
        let (h, conv, ssm) = match remat {
            Remat::Off => run(&hidden)?,
            Remat::PerLayer => hidden.graph().checkpoint(&hidden, run)?,
        };
        hidden = h;
        states.push(LayerState { conv, ssm });
    }
    Ok((hidden, states))
}

/// The whole model for one token per row (`tokens`: `[b]` integers, `states`: one per layer):
/// returns the logits `[b, vocab]` and the new states. A config that
/// [`Mamba2Config::validate`] rejects, weights that do not fit it, or an argument of the wrong
/// shape or length, are an error naming it.
pub fn step(
    tokens: &Tensor,
    states: &[LayerState<Tensor>],
    w: &Mamba2Weights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<(Tensor, Vec<LayerState<Tensor>>)> {
    cfg.validate()?;
    if tokens.rank() != 1 || !tokens.dtype().is_int() {
        return Err(bad_arg(
            "step",
            "tokens",
            format!("is {}, expected integers [b]", tokens.ty()),
        ));
    }
    check_layer_count("step", "states", states.len(), cfg)?;
    check_weights("step", w, cfg)?;
    let mut hidden = embed(tokens, w)?;
    let mut next = Vec::with_capacity(states.len());
    for (layer, state) in w.layers.iter().zip(states) {
        let (h, s) = block_step(&hidden, state, layer, cfg)?;
        hidden = h;
        next.push(s);
    }
    Ok((head(&hidden, w, cfg)?, next))
}

/// Adds the weights to `g` as parameters named after them (`embedding`, `layers.0.mixer.D`,
/// ...), in tree order ([`crate::tree::Tree`]), with the given types.
pub fn weight_parameters(
    g: &Graph,
    types: &Mamba2Weights<crate::dtype::TensorType>,
) -> Result<Mamba2Weights<Tensor>> {
    types.try_map(|name, ty| g.parameter(&format!("w.{name}"), ty.dtype, &ty.dims))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::HostArray;

    /// Both gate orders against the formula, with two groups.
    #[test]
    fn gated_norm_per_group_in_both_orders() {
        let mut cfg = Mamba2Config::mamba2_130m();
        cfg.num_heads = 2;
        cfg.head_dim = 2;
        cfg.n_groups = 2;
        let y = [0.5f32, -1.0, 2.0, 0.25];
        let z = [1.0f32, -0.5, 0.3, 2.0];
        let w = [1.5f32, 0.5, -1.0, 2.0];
        let silu = |v: f32| v / (1.0 + (-v).exp());
        let rms = |v: &[f32]| {
            let ms = v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32;
            v.iter()
                .map(|x| x / (ms + cfg.norm_eps as f32).sqrt())
                .collect::<Vec<_>>()
        };
        for before in [false, true] {
            cfg.norm_before_gate = before;
            let g = Graph::new();
            let ty = g.parameter("y", DType::F32, &[4]).unwrap();
            let tz = g.parameter("z", DType::F32, &[4]).unwrap();
            let tw = g.parameter("w", DType::F32, &[4]).unwrap();
            let out = gated_rms_norm(&ty, &tz, &tw, &cfg).unwrap();
            g.set_outputs(&[&out]).unwrap();
            let arr = |v: &[f32]| HostArray::from_vec(&[4], v.to_vec()).unwrap();
            let got = g.evaluate(&[arr(&y), arr(&z), arr(&w)]).unwrap()[0].to_f64_vec();
            let mut want = Vec::new();
            for grp in 0..2 {
                let ys = &y[grp * 2..grp * 2 + 2];
                let zs = &z[grp * 2..grp * 2 + 2];
                let gated: Vec<f32> = ys.iter().zip(zs).map(|(a, b)| a * silu(*b)).collect();
                let v = if before {
                    rms(ys).iter().zip(zs).map(|(a, b)| a * silu(*b)).collect()
                } else {
                    rms(&gated)
                };
                want.extend(v);
            }
            for k in 0..4 {
                let want = f64::from(want[k] * w[k]);
                assert!(
                    (got[k] - want).abs() < 1e-5,
                    "before={before} [{k}] {} vs {want}",
                    got[k]
                );
            }
        }
    }
}
