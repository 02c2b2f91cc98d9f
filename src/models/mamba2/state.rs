//! The recurrent state of a batch on the device, and its safetensors file: what a conversation or
//! a long document carries from one piece to the next, in O(1) memory.

use std::path::Path;

use super::config::Mamba2Config;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::{LayerState, ModelState};
use crate::runtime::{Client, ShardedBuffer};

/// The family name a Mamba-2 state carries.
const FAMILY: &str = "Mamba-2";

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

    /// The state on the host as named tensors (`layers.{i}.conv`, `layers.{i}.ssm`), for
    /// [`crate::models::family::CausalLm`] and state files.
    pub fn to_model_state(&self) -> Result<ModelState> {
        let mut named = Vec::with_capacity(2 * self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            named.push((format!("layers.{i}.conv"), l.conv.to_host_array()?));
            named.push((format!("layers.{i}.ssm"), l.ssm.to_host_array()?));
        }
        Ok(ModelState::new(FAMILY, named))
    }

    /// A Mamba-2 state from named tensors onto `client`'s device 0. Another family's state,
    /// a missing, extra or non-f32 tensor is an error naming it; [`Mamba2State::check`]
    /// compares the state with a model.
    pub fn from_model_state(state: ModelState, client: &Client) -> Result<Mamba2State> {
        state.check_family(FAMILY)?;
        let mut tensors = state.into_map();
        let bad = |why: String| Error::InvalidArgument(format!("the state: {why}"));
        let mut layers = Vec::new();
        while tensors.contains_key(&format!("layers.{}.ssm", layers.len())) {
            let i = layers.len();
            let mut take = |name: &str| -> Result<ShardedBuffer> {
                let key = format!("layers.{i}.{name}");
                let t = tensors
                    .remove(&key)
                    .ok_or_else(|| bad(format!("{key} is missing")))?;
                if t.dtype() != DType::F32 {
                    return Err(bad(format!("{key} is {}, expected f32", t.dtype())));
                }
                ShardedBuffer::from_buffer(client.buffer_from_host_array(&t)?)
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

    /// Writes the state to `path` as safetensors ([`ModelState::save`]): `layers.{i}.conv`
    /// and `layers.{i}.ssm`, f32.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.to_model_state()?.save(path)
    }

    /// Reads a state written by [`Mamba2State::save`] onto `client`'s device 0. A file that is
    /// not such a state (unreadable, not safetensors, another family's, a missing, extra or
    /// non-f32 tensor) is an error naming the file and the tensor; [`Mamba2State::check`]
    /// compares it with a model.
    pub fn load(path: &Path, client: &Client) -> Result<Mamba2State> {
        let state = ModelState::load(path, FAMILY)?;
        Mamba2State::from_model_state(state, client)
            .map_err(|e| Error::InvalidArgument(format!("state {}: {e}", path.display())))
    }
}
