//! Bamba, Granite 4.0-H and Nemotron-H as the training module differentiates them: the logits
//! (every expert run, the unchosen ones weighing 0, as transformers routes them) and the
//! router loss a config asks for, as a graph of the weights; where each weight lives in the
//! checkpoint.

use super::graph::{forward_all, Step};
use super::weights::checkpoint_pieces;
use super::Hybrid;
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::models::engine::attention::Positions;
use crate::models::mamba2::Remat;
use crate::models::training::{named_types, router_balance_loss, Forward, Pieces, Trainable};
use crate::ops::Tensor;
use crate::tree::Tree;

impl Trainable for Hybrid {
    fn weight_types(&self) -> Vec<(String, TensorType)> {
        named_types(self.types())
    }

    fn checkpoint_pieces(&self) -> Result<Vec<Pieces>> {
        checkpoint_pieces(self.config())
    }

    fn chunk(&self) -> usize {
        self.config().mamba.chunk_size
    }

    fn training_forward(
        &self,
        weights: Vec<Tensor>,
        tokens: &Tensor,
        mask: &Tensor,
        chunk: usize,
        remat: Remat,
    ) -> Result<Forward> {
        let cfg = self.config();
        let w = self.types().unflatten(weights)?;
        let g = tokens.graph();
        let (b, len) = (tokens.dims()[0], tokens.dims()[1]);
        // Each row's real tokens take rotary positions 0, 1, ...; the padding 0.
        let rotary = mask.cumsum(1)?.sub(1.0)?.mul(mask)?.convert(DType::I32)?;
        let column = g.scalar(0.0, DType::I32)?;
        // Each real column holds its position plus one, as the caches' `valid` does.
        let valid = rotary.astype(DType::F32)?.add(1.0)?.mul(mask)?;
        let states = self
            .empty_state(b, len)?
            .sublayers
            .iter()
            .map(|s| {
                let mut dims = s.tensors().into_iter().map(|t| t.dims().to_vec());
                s.rebuild(&mut || g.zeros(DType::F32, &dims.next().unwrap_or_default()))
            })
            .collect::<Result<Vec<_>>>()?;
        let step = Step {
            tokens,
            mask,
            at: Positions {
                rotary: &rotary,
                column: &column,
                valid: &valid,
            },
            decode: false,
            gather: false,
            chunk,
            remat: remat == Remat::PerLayer,
            last_only: false,
        };
        let out = forward_all(&step, &states, &w, cfg)?;
        let aux = match cfg.moe.and_then(|m| Some((m, m.router_aux_loss?))) {
            Some((m, coef)) if !out.router_logits.is_empty() => {
                let flat = mask.reshape(&[-1])?;
                let loss = router_balance_loss(&out.router_logits, &flat, m.num_experts, m.top_k)?;
                Some((loss, coef))
            }
            _ => None,
        };
        Ok(Forward {
            logits: out.logits,
            aux,
        })
    }
}
