//! What a generation call is asked for, the same for every family.

use crate::sampling::{Penalties, Sampling};

/// Options of generation, the same for every family (`CausalLm::generate`,
/// [`Mamba2::generate`](crate::models::mamba2::Mamba2::generate) and the others).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// How many tokens to generate per row (at most [`MAX_NEW_TOKENS`]).
    pub max_new_tokens: usize,
    /// Token choice.
    pub sampling: Sampling,
    /// A row stops at this token (it is emitted; later positions repeat it).
    pub eos: Option<u32>,
    /// Penalties on tokens the context (the prompt and the tokens generated) already holds,
    /// applied before the token is picked, greedy or sampled ([`Penalties::NONE`]: none). When
    /// generation continues from a state (`generate_from`), the context is this
    /// call's prompt and tokens: what made the state is not part of it.
    pub penalties: Penalties,
}

impl Default for GenerateOptions {
    /// 16 new tokens, greedy, no `eos`, no penalties.
    fn default() -> Self {
        GenerateOptions::greedy(16)
    }
}

impl GenerateOptions {
    /// `max_new_tokens` greedy tokens per row, no `eos`, no penalties.
    pub fn greedy(max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens,
            sampling: Sampling::Greedy,
            eos: None,
            penalties: Penalties::NONE,
        }
    }

    /// `max_new_tokens` tokens per row drawn with `temperature` (0: greedy), `top_k` (0, or
    /// the vocabulary or more: off), `top_p` (1: off) and `seed`, no `eos`, no penalties.
    pub fn sampled(
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
    ) -> GenerateOptions {
        let sampling = match temperature == 0.0 {
            true => Sampling::Greedy,
            false => Sampling::Sample {
                temperature,
                top_k,
                top_p,
                seed,
            },
        };
        GenerateOptions {
            sampling,
            ..GenerateOptions::greedy(max_new_tokens)
        }
    }

    /// The same options with `max_new_tokens`.
    pub fn with_max_new_tokens(self, max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens,
            ..self
        }
    }

    /// The same options stopping a row at `eos`.
    pub fn with_eos(self, eos: Option<u32>) -> GenerateOptions {
        GenerateOptions { eos, ..self }
    }

    /// The same options with `penalties`.
    pub fn with_penalties(self, penalties: Penalties) -> GenerateOptions {
        GenerateOptions { penalties, ..self }
    }
}

/// The most new tokens one `generate` call makes per row (2^24).
pub const MAX_NEW_TOKENS: usize = 1 << 24;

/// The compiled capacity for `max_new_tokens`: the next power of two, at least 16. Every
/// request up to it runs in the same program, the count being a runtime input.
pub(crate) fn generate_capacity(max_new_tokens: usize) -> usize {
    max_new_tokens.next_power_of_two().max(16)
}
