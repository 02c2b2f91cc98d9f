//! Sizes and repetitions of a run: the full run or `--quick`.

use stablegraph::models::mamba2::Mamba2Config;

/// Sizes and repetitions: the full run or `--quick`.
pub struct Plan {
    /// Whether this is the `--quick` plan.
    pub quick: bool,
    /// Prompt lengths of the prefill table.
    pub prefill_lens: Vec<usize>,
    /// Batch 8 only up to this prompt length.
    pub batch8_max_len: usize,
    /// Device loop `(batch, generated tokens, timed runs)`.
    pub device_loops: Vec<(usize, usize, usize)>,
    /// Contexts of the host-loop and recomputation table.
    pub contexts: Vec<usize>,
    /// SSD chunk lengths tried in the ablation (the model's first).
    pub ssd_chunks: Vec<usize>,
    /// Sequence lengths of the SSD ablation.
    pub ssd_lens: Vec<usize>,
    /// Prompt length and decode steps of the precision comparison.
    pub precision_len: usize,
    /// See `precision_len`.
    pub precision_steps: usize,
    /// Generated tokens of each memory child.
    pub memory_tokens: Vec<usize>,
    /// The sizes of the sizes section (`Mamba2Config::sized` names).
    pub sizes: Vec<&'static str>,
    /// The sizes section's decode: `(short, long)` generated tokens (one compiled capacity:
    /// the same power of two), and prefill repetitions.
    pub sizes_decode: (usize, usize, usize),
    /// Matrix-vector `(in, out)` and matmul `n` of the ceilings.
    pub matvec: (usize, usize),
    /// See `matvec`.
    pub matmul: usize,
}

impl Plan {
    /// The full plan, or the `--quick` one.
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                prefill_lens: vec![128, 512],
                batch8_max_len: 128,
                device_loops: vec![(1, 32, 3), (8, 16, 2)],
                contexts: vec![256, 512],
                ssd_chunks: vec![256, 128, 64],
                ssd_lens: vec![256, 512],
                precision_len: 256,
                precision_steps: 8,
                memory_tokens: vec![32, 128, 512],
                sizes: vec!["130m", "370m"],
                sizes_decode: (17, 32, 1),
                matvec: (2048, 4096),
                matmul: 512,
            }
        } else {
            Plan {
                quick,
                prefill_lens: vec![128, 512, 2048],
                batch8_max_len: 2048,
                device_loops: vec![(1, 128, 8), (8, 64, 4)],
                contexts: vec![256, 1024, 4096],
                ssd_chunks: vec![256, 128, 64],
                ssd_lens: vec![512, 2048],
                precision_len: 512,
                precision_steps: 32,
                memory_tokens: vec![128, 1024, 4096],
                sizes: Mamba2Config::SIZES.to_vec(),
                sizes_decode: (65, 128, 2),
                matvec: (8192, 16384),
                matmul: 2048,
            }
        }
    }

    /// Timed repetitions of a prefill of `tokens` (padded) tokens in all, and whether to run
    /// it once untimed first.
    pub fn prefill_reps(&self, tokens: usize) -> (usize, bool) {
        let reps = match tokens {
            t if t <= 512 => 7,
            t if t <= 2048 => 5,
            t if t <= 4096 => 3,
            _ => 1,
        };
        let reps = if self.quick { reps.min(3) } else { reps };
        (reps, tokens < 4096)
    }

    /// Recomputed tokens measured at a context.
    pub fn recompute_tokens(&self, context: usize) -> usize {
        match context {
            c if c <= 512 => 5,
            c if c <= 2048 => 4,
            _ => 3,
        }
    }
}
