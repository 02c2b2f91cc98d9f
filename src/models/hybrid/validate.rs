//! Whether a [`HybridConfig`] is one the stack can run: sizes, heads, rotary width, experts,
//! windows; one error naming every problem.

use super::config::{HybridConfig, Routing, SublayerKind};
use crate::error::{Error, Result};
use crate::models::mamba2::Mamba2Config;

impl HybridConfig {
    /// Checks the sizes (none 0, heads that tile, rotary within a head, experts that fit the
    /// routing) and that every present sublayer kind has its shape. One error lists every
    /// problem, naming the fields.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.count(SublayerKind::Mamba) > 0 {
            if let Err(e) = self.mamba.validate() {
                problems.push(e.to_string());
            }
        }
        problems.extend(self.attention_problems());
        for (kind, shape, what) in [
            (
                SublayerKind::Mlp,
                self.mlp.map(|m| m.intermediate),
                "the MLP",
            ),
            (
                SublayerKind::Moe,
                self.moe.map(|m| m.expert.intermediate),
                "the experts",
            ),
        ] {
            if self.count(kind) > 0 && shape.is_none_or(|i| i == 0 || i > 1 << 24) {
                problems.push(format!(
                    "{what}' intermediate size is 0, absent or too large"
                ));
            }
        }
        problems.extend(self.moe_problems());
        if self.sliding.len() != self.sublayers.len() {
            problems.push(format!(
                "{} sliding flags for {} sublayers",
                self.sliding.len(),
                self.sublayers.len()
            ));
        }
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("vocab_size", self.vocab_size),
            ("num_hidden_layers", self.sublayers.len()),
        ] {
            if v == 0 {
                problems.push(format!("{name} is 0"));
            }
        }
        if self.hidden_size > 1 << 24 || i32::try_from(self.vocab_size).is_err() {
            problems.push("hidden_size or vocab_size is too large".into());
        }
        if self.sublayers.len() > 2 * Mamba2Config::MAX_LAYERS {
            problems.push(format!(
                "{} layers are more than {}",
                self.sublayers.len(),
                Mamba2Config::MAX_LAYERS
            ));
        }
        for (name, x) in [
            ("rms_norm_eps", self.norm_eps),
            ("embedding_multiplier", self.embedding_multiplier),
            ("residual_multiplier", self.residual_multiplier),
            ("logits_scaling", self.logits_scaling),
        ] {
            if !x.is_finite() || (name != "residual_multiplier" && x <= 0.0) {
                problems.push(format!("{name} ({x}) is not a finite positive number"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "inconsistent {} config: {}",
                self.family.model_type(),
                problems.join("; ")
            )))
        }
    }
    /// What is wrong with the attention shape, if the model has attention sublayers.
    fn attention_problems(&self) -> Vec<String> {
        let a = &self.attention;
        let mut problems = Vec::new();
        if self.count(SublayerKind::Attention) > 0 {
            for (name, v) in [
                ("num_attention_heads", a.num_heads),
                ("num_key_value_heads", a.num_kv_heads),
                ("head_dim", a.head_dim),
            ] {
                if v == 0 {
                    problems.push(format!("{name} is 0"));
                }
            }
            if a.num_kv_heads > 0 && !a.num_heads.is_multiple_of(a.num_kv_heads) {
                problems.push(format!(
                    "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                    a.num_heads, a.num_kv_heads
                ));
            }
            if a.sliding_window == Some(0) {
                problems.push("sliding_window is 0".into());
            }
            if a.rotary_dim > a.head_dim || !a.rotary_dim.is_multiple_of(2) {
                problems.push(format!(
                    "the rotary width ({}) is odd or wider than head_dim ({})",
                    a.rotary_dim, a.head_dim
                ));
            }
            if a.num_heads
                .checked_mul(a.head_dim)
                .is_none_or(|w| w > 1 << 24)
            {
                problems.push("num_attention_heads * head_dim is too large".into());
            }
        }
        problems
    }

    /// What is wrong with the experts' shape and routing, if the model has experts.
    fn moe_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(m) = self.moe.filter(|_| self.count(SublayerKind::Moe) > 0) {
            let bytes = [2 * m.expert.intermediate, self.hidden_size, 4]
                .iter()
                .try_fold(m.num_experts, |n, &d| n.checked_mul(d));
            if bytes.is_none_or(|b| isize::try_from(b).is_err()) {
                problems.push(format!(
                    "{} experts are too large to address",
                    m.num_experts
                ));
            }
            if m.top_k == 0 || m.top_k > m.num_experts {
                problems.push(format!(
                    "num_experts_per_tok ({}) is not within 1..={} experts",
                    m.top_k, m.num_experts
                ));
            }
            if let Routing::SigmoidGrouped {
                n_group,
                topk_group,
                ..
            } = m.routing
            {
                if n_group == 0 || !m.num_experts.is_multiple_of(n_group) {
                    problems.push(format!(
                        "n_group ({n_group}) does not divide the {} experts",
                        m.num_experts
                    ));
                } else if m.num_experts / n_group < 2 || topk_group == 0 || topk_group > n_group {
                    problems.push(format!(
                        "topk_group ({topk_group}) is not within 1..={n_group} groups of at \
                     least two experts"
                    ));
                }
            }
        }
        problems
    }
}
