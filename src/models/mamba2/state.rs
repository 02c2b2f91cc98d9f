//! The recurrent state of a batch on the device, and its safetensors file: what a conversation or
//! a long document carries from one piece to the next, in O(1) memory.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use super::block::LayerState;
use super::config::Mamba2Config;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::{Client, ShardedBuffer};

/// The recurrent state of a batch on the device: one [`LayerState`] per layer.
#[derive(Debug)]
pub struct Mamba2State {
    /// Per layer: convolution inputs `[b, conv_dim, conv_kernel]` and SSM state `[b, H, P, N]`.
    pub layers: Vec<LayerState<ShardedBuffer>>,
}

impl Mamba2State {
    /// The number of rows (0 for a state without layers).
    pub fn batch(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.ssm.dims().first().copied())
            .unwrap_or(0)
    }

    /// Checks that the state is a `batch`-row state of `config`: one f32 layer state per layer
    /// of the right shapes. The error names the first tensor that differs.
    pub fn check(&self, config: &Mamba2Config, batch: usize) -> Result<()> {
        if self.layers.len() != config.num_layers {
            return Err(Error::InvalidArgument(format!(
                "state: {} layers, the model has {}",
                self.layers.len(),
                config.num_layers
            )));
        }
        let conv = [batch, config.conv_dim(), config.conv_kernel];
        let ssm = [batch, config.num_heads, config.head_dim, config.state_size];
        for (i, l) in self.layers.iter().enumerate() {
            for (name, b, want) in [("conv", &l.conv, &conv[..]), ("ssm", &l.ssm, &ssm[..])] {
                if b.dims() != want || b.dtype() != DType::F32 {
                    return Err(Error::InvalidArgument(format!(
                        "state: layers.{i}.{name} is {}{:?}, expected f32{want:?} ({batch} rows)",
                        b.dtype(),
                        b.dims()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Writes the state to `path` as safetensors: `layers.{i}.conv` and `layers.{i}.ssm`, f32.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut data = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            for (name, b) in [("conv", &l.conv), ("ssm", &l.ssm)] {
                data.push((
                    format!("layers.{i}.{name}"),
                    b.dims().to_vec(),
                    b.to_host_array()?.to_bytes(),
                ));
            }
        }
        let views = data
            .iter()
            .map(|(name, dims, bytes)| {
                let view = TensorView::new(Dtype::F32, dims.clone(), bytes)
                    .map_err(|e| Error::InvalidArgument(format!("state: {name}: {e}")))?;
                Ok((name.clone(), view))
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::serialize_to_file(views, None, path).map_err(|e| {
            Error::InvalidArgument(format!("writing the state to {}: {e}", path.display()))
        })
    }

    /// Reads a state written by [`Mamba2State::save`] onto `client`'s device 0. A file that is
    /// not such a state (unreadable, not safetensors, a missing, extra or non-f32 tensor) is an
    /// error naming the file and the tensor; [`Mamba2State::check`] compares it with a model.
    pub fn load(path: &Path, client: &Client) -> Result<Mamba2State> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading the state {}", path.display()), e))?;
        let bad = |why: String| Error::InvalidArgument(format!("state {}: {why}", path.display()));
        let file = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{e}")))?;
        let mut tensors: HashMap<String, TensorView<'_>> = file.tensors().into_iter().collect();
        let mut layers = Vec::new();
        while tensors.contains_key(&format!("layers.{}.ssm", layers.len())) {
            let i = layers.len();
            let mut take = |name: &str| -> Result<ShardedBuffer> {
                let key = format!("layers.{i}.{name}");
                let t = tensors
                    .remove(&key)
                    .ok_or_else(|| bad(format!("{key} is missing")))?;
                if t.dtype() != Dtype::F32 {
                    return Err(bad(format!("{key} is {:?}, expected F32", t.dtype())));
                }
                ShardedBuffer::from_buffer(client.buffer_from_bytes(
                    DType::F32,
                    t.shape(),
                    t.data(),
                    0,
                )?)
            };
            let (conv, ssm) = (take("conv")?, take("ssm")?);
            layers.push(LayerState { conv, ssm });
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(bad(format!(
                "unexpected tensor {extra} (after {} layers)",
                layers.len()
            )));
        }
        if layers.is_empty() {
            return Err(bad("no layers.0.ssm".into()));
        }
        Ok(Mamba2State { layers })
    }
}
