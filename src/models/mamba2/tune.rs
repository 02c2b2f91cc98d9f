//! Mamba-2 as the training module differentiates it: its logits as a graph of its weights and
//! where each weight lives in an HF checkpoint.

use super::block::{self, Remat};
use super::checkpoint::checkpoint_names;
use super::{Mamba2, Mamba2Config};
use crate::dtype::TensorType;
use crate::error::Result;
use crate::models::training::{named_types, Forward, Pieces, Trainable};
use crate::ops::Tensor;
use crate::tree::Tree;

/// Where each weight of these types lives in an HF checkpoint: one tensor each, under its HF
/// name, the conv weight `[conv_dim, K]` as `[conv_dim, 1, K]`.
pub(super) fn checkpoint_pieces(types: &impl Tree<TensorType>) -> Vec<Pieces> {
    let named = types.named();
    named
        .into_iter()
        .map(|(key, t)| {
            let mut dims = t.dims.clone();
            if key.ends_with("mixer.conv1d") && dims.len() == 2 {
                dims.insert(1, 1);
            }
            vec![(checkpoint_names(&key).swap_remove(0), dims)]
        })
        .collect()
}

impl Trainable for Mamba2 {
    fn weight_types(&self) -> Vec<(String, TensorType)> {
        named_types(self.types())
    }

    fn checkpoint_pieces(&self) -> Result<Vec<Pieces>> {
        Ok(checkpoint_pieces(self.types()))
    }

    fn chunk(&self) -> usize {
        self.config().chunk_size
    }

    fn training_forward(
        &self,
        weights: Vec<Tensor>,
        tokens: &Tensor,
        mask: &Tensor,
        chunk: usize,
        remat: Remat,
    ) -> Result<Forward> {
        let w = self.types().unflatten(weights)?;
        let cfg = Mamba2Config {
            chunk_size: chunk,
            ..self.config().clone()
        };
        let (hidden, _) = block::prefill_with(tokens, mask, &w, &cfg, None, remat)?;
        Ok(Forward {
            logits: block::head(&hidden, &w, &cfg)?,
            aux: None,
        })
    }
}
