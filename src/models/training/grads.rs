//! The loss of prompts and its gradient for every weight of any family, under the
//! checkpoint's names ([`loss_and_grads`], [`Gradients`]).

use std::path::Path;

use super::{check_f32, check_tokens, next_token_loss, padding, Pieces, Trainable};
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::write_tensors;
use crate::models::engine::{call, host_input};
use crate::models::mamba2::Remat;
use crate::ops::{Graph, Tensor};
use crate::runtime::ShardedBuffer;
use crate::sharding::Sharding;
use crate::target::Target;

/// The loss of some prompts and its gradient with respect to every weight of a model.
#[derive(Debug, Clone)]
pub struct Gradients {
    /// The loss, in nats per predicted token: the mean next-token cross-entropy, plus the
    /// router load-balancing loss times its coefficient when the config asks for one.
    pub loss: f32,
    /// The router load-balancing loss alone (before its coefficient), when the config asks
    /// for one (transformers' `output_router_logits` with `router_aux_loss_coef`), as
    /// transformers reports it (`aux_loss`).
    pub aux_loss: Option<f32>,
    /// The tokens predicted (each prompt of `T` tokens predicts `T - 1`).
    pub predicted: usize,
    /// `d loss / d weight` for every tensor of the checkpoint, f32, under its name and in its
    /// shape there (a tied head's gradient is in the embedding's).
    pub tensors: Vec<(String, HostArray)>,
}

impl Gradients {
    /// The global L2 norm of all gradients.
    pub fn norm(&self) -> f64 {
        self.tensors
            .iter()
            .flat_map(|(_, g)| g.to_f64_vec())
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt()
    }

    /// Writes the gradients to the safetensors file `path`, f32, under the checkpoint's names
    /// (written beside `path` and renamed: a failed write leaves nothing under `path`).
    pub fn save(&self, path: &Path) -> Result<()> {
        write_tensors(path, &self.tensors)
    }
}

/// The tensors of `values` (one per weight, in the order of `pieces`) as the checkpoint holds
/// them: each split along its first axis into its pieces, each in its shape on disk.
pub(crate) fn to_checkpoint(
    values: Vec<HostArray>,
    pieces: &[Pieces],
) -> Result<Vec<(String, HostArray)>> {
    if values.len() != pieces.len() {
        return Err(Error::InvalidArgument(format!(
            "{} tensors for {} weights",
            values.len(),
            pieces.len()
        )));
    }
    let mut out = Vec::new();
    for (a, parts) in values.into_iter().zip(pieces) {
        let bytes = a.to_bytes();
        let size = a.dtype().size_in_bytes();
        let mut at = 0;
        for (name, dims) in parts {
            let n = dims.iter().product::<usize>() * size;
            let chunk = bytes.get(at..at + n).ok_or_else(|| {
                Error::InvalidArgument(format!("{name}: the weight is smaller than its pieces"))
            })?;
            out.push((
                name.clone(),
                HostArray::from_bytes(&TensorType::new(a.dtype(), dims), chunk)?,
            ));
            at += n;
        }
        if at != bytes.len() {
            return Err(Error::InvalidArgument(format!(
                "{}: the weight is larger than its pieces",
                parts.first().map_or("?", |p| p.0.as_str())
            )));
        }
    }
    Ok(out)
}

/// Prompts left-padded to `len` positions, row-major `[b, len]`: the ids, each position's next
/// token, 1 for real tokens (`mask`) and 1 where a next token is predicted (`weights`).
pub(crate) struct Packed {
    pub(crate) ids: Vec<i32>,
    pub(crate) targets: Vec<i32>,
    pub(crate) mask: Vec<f32>,
    pub(crate) weights: Vec<f32>,
}

/// `prompts` (none longer than `len`) packed as [`Packed`] says; an error naming `op` when
/// their positions do not fit an i32 (the programs index them so).
pub(crate) fn pack(op: &str, prompts: &[Vec<u32>], len: usize) -> Result<Packed> {
    let total = prompts
        .len()
        .checked_mul(len)
        .filter(|&n| i32::try_from(n).is_ok())
        .ok_or_else(|| {
            Error::InvalidArgument(format!("{op}: the prompts are too many to address"))
        })?;
    let (mut ids, mut targets) = (vec![0i32; total], vec![0i32; total]);
    let (mut mask, mut lw) = (vec![0f32; total], vec![0f32; total]);
    for (r, p) in prompts.iter().enumerate() {
        let start = r * len + len - p.len();
        for (k, &t) in p.iter().enumerate() {
            ids[start + k] = t as i32;
            mask[start + k] = 1.0;
            if let Some(&next) = p.get(k + 1) {
                targets[start + k] = next as i32;
                lw[start + k] = 1.0;
            }
        }
    }
    Ok(Packed {
        ids,
        targets,
        mask,
        weights: lw,
    })
}

/// The weights of `f` as parameters of `g`, named `w.<name>`, in order.
pub(crate) fn weight_parameters(g: &Graph, types: &[(String, TensorType)]) -> Result<Vec<Tensor>> {
    types
        .iter()
        .map(|(name, ty)| g.parameter(&format!("w.{name}"), ty.dtype, &ty.dims))
        .collect()
}

/// The loss of `f` over `tokens`/`targets`/`weights`/`mask` (`[b, L]` each) and the router
/// loss alone, before its coefficient (when the config adds one).
pub(crate) fn loss_of<F: Trainable + ?Sized>(
    f: &F,
    w: Vec<Tensor>,
    [tokens, targets, weights, mask]: [&Tensor; 4],
    chunk: usize,
    remat: Remat,
) -> Result<(Tensor, Option<Tensor>)> {
    let out = f.training_forward(w, tokens, mask, chunk, remat)?;
    let ce = next_token_loss(&out.logits, targets, weights, f.vocab_size())?;
    match out.aux {
        Some((aux, coef)) => Ok((ce.add(&aux.mul(coef)?)?, Some(aux))),
        None => Ok((ce, None)),
    }
}

/// The mean next-token cross-entropy of `f` over `prompts` (plus the router loss its config
/// asks for) and its gradient for every checkpoint tensor, in one program on the model's
/// device. Each prompt of `T` tokens predicts `T - 1`; the mean is over all predictions of
/// all prompts. Prompts are left-padded, the padding masked out of the model and the loss.
/// No prompt of two tokens or more, an id outside the vocabulary, weights that are not f32,
/// or a model over several devices, are an error naming them.
pub(crate) fn loss_and_grads<F: Trainable + ?Sized>(
    f: &F,
    prompts: &[Vec<u32>],
) -> Result<Gradients> {
    let op = format!("{} loss_and_grads", f.family());
    let types = f.weight_types();
    check_f32(f.family(), &types)?;
    if prompts.iter().all(|p| p.len() < 2) {
        return Err(Error::InvalidArgument(format!(
            "{op}: no prompt has 2 or more tokens: there is nothing to predict"
        )));
    }
    check_tokens(&op, prompts.iter().flatten().copied(), f.vocab_size())?;
    let buffers = f.weight_buffers();
    if buffers.iter().any(|b| *b.sharding() != Sharding::single()) {
        return Err(Error::InvalidArgument(format!(
            "{op}: the model spans several devices; load it on one to differentiate it"
        )));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let (len, chunk) = padding(f.chunk(), longest);
    let b = prompts.len();
    let Packed {
        ids,
        targets,
        mask,
        weights: lw,
    } = pack(&op, prompts, len)?;
    let g = Graph::with_target(Target::of(f.client()));
    let w = weight_parameters(&g, &types)?;
    let dims = [b, len];
    let names = ["tokens", "targets", "weights", "mask"];
    let dtypes = [DType::I32, DType::I32, DType::F32, DType::F32];
    let inputs = names
        .iter()
        .zip(dtypes)
        .map(|(n, d)| g.parameter(n, d, &dims))
        .collect::<Result<Vec<_>>>()?;
    let refs = [&inputs[0], &inputs[1], &inputs[2], &inputs[3]];
    let (loss, aux) = loss_of(f, w.clone(), refs, chunk, Remat::Off)?;
    let grads = loss.grad(&w.iter().collect::<Vec<_>>())?;
    let mut outs = vec![&loss];
    outs.extend(aux.as_ref());
    outs.extend(grads.iter());
    g.set_outputs(&outs)?;
    let program = g.compile(f.client())?;
    let values = vec![
        host_input("tokens", HostArray::from_vec(&dims, ids)?),
        host_input("targets", HostArray::from_vec(&dims, targets)?),
        host_input("weights", HostArray::from_vec(&dims, lw)?),
        host_input("mask", HostArray::from_vec(&dims, mask)?),
    ];
    let outs = call(f.client(), &program, &buffers, values)?;
    let mut outs = outs.iter().map(ShardedBuffer::to_host_array);
    let mut scalar = || -> Result<f32> {
        let a = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument(format!("{op}: too few outputs")))??;
        Ok(a.to_f64_vec().first().copied().unwrap_or(f64::NAN) as f32)
    };
    let loss = scalar()?;
    let aux_loss = match aux {
        Some(_) => Some(scalar()?),
        None => None,
    };
    let values = outs.collect::<Result<Vec<_>>>()?;
    Ok(Gradients {
        loss,
        aux_loss,
        predicted: prompts.iter().map(|p| p.len().saturating_sub(1)).sum(),
        tensors: to_checkpoint(values, &f.checkpoint_pieces()?)?,
    })
}
