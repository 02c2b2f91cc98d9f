//! Mamba-1 and Falcon-Mamba as the training module differentiates them: the logits as a graph
//! of the weights and where each weight lives in an HF checkpoint.

use super::block::{block_prefill, head, Scan};
use super::Mamba1;
use crate::dtype::TensorType;
use crate::error::Result;
use crate::models::mamba2::Remat;
use crate::models::training::{named_types, Forward, Pieces, Trainable};
use crate::ops::Tensor;
use crate::tree::Tree;

impl Trainable for Mamba1 {
    fn weight_types(&self) -> Vec<(String, TensorType)> {
        named_types(self.types())
    }

    fn checkpoint_pieces(&self) -> Result<Vec<Pieces>> {
        let named = self.types().named();
        Ok(named
            .into_iter()
            .map(|(name, t)| {
                let mut dims = t.dims.clone();
                if name.ends_with("mixer.conv1d.weight") && dims.len() == 2 {
                    dims.insert(1, 1);
                }
                vec![(name, dims)]
            })
            .collect())
    }

    fn chunk(&self) -> usize {
        1
    }

    /// Each block recomputed in the backward pass runs the associative scan (a checkpointed
    /// region holds no loop); otherwise the model's own scan runs.
    fn training_forward(
        &self,
        weights: Vec<Tensor>,
        tokens: &Tensor,
        mask: &Tensor,
        _chunk: usize,
        remat: Remat,
    ) -> Result<Forward> {
        let w = self.types().unflatten(weights)?;
        let cfg = self.config();
        let mut hidden = w.embedding.rows(tokens)?;
        for layer in &w.layers {
            hidden = match remat {
                Remat::Off => block_prefill(&hidden, mask, layer, cfg, self.scan(), None)?.0,
                Remat::PerLayer => hidden.graph().checkpoint(&hidden, |h| {
                    Ok(block_prefill(h, mask, layer, cfg, Scan::Associative, None)?.0)
                })?,
            };
        }
        Ok(Forward {
            logits: head(&hidden, &w, cfg)?,
            aux: None,
        })
    }
}
