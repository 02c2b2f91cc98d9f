//! What the sections share: the models of a run (made on first use), prefill times, recorded
//! figures, prompts and small helpers on logits.

use std::time::Instant;

use anyhow::{Context, Result};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights, Penalties, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::runtime::Client;
use stablegraph::{DType, HostArray};

use crate::common::{median, progress, secs_since, timed};
use crate::plan::Plan;
use crate::SEED;

/// A deterministic prompt of `len` token ids (row `row` of a batch).
pub fn prompt(len: usize, row: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + row * 104_729 + 17) % 50_000) as u32)
        .collect()
}

/// Greedy generation of `max_new_tokens` tokens, no end token.
pub fn greedy(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        sampling: Sampling::Greedy,
        eos: None,
        penalties: Penalties::NONE,
    }
}

/// The index of the largest value of each row of `logits` `[b, vocab]`.
pub fn argmax_rows(logits: &HostArray) -> Result<Vec<u32>> {
    let a = logits.as_array::<f32>()?;
    let vocab = *a.shape().last().context("logits without axes")?;
    let flat = a.as_slice().context("logits not contiguous")?;
    Ok(flat.chunks(vocab).map(|row| argmax(row) as u32).collect())
}

/// The index of the first largest value of `v`.
pub fn argmax<T: PartialOrd>(v: &[T]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// The largest absolute difference of two series.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The largest absolute value of a series.
pub fn max_abs(a: &[f64]) -> f64 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// The models of a run (made on first use), prefill times and figures.
pub struct Ctx {
    /// Sizes and repetitions.
    pub plan: Plan,
    /// The client every section uses (memory cache only).
    pub client: Client,
    /// The 130M shape.
    pub cfg: Mamba2Config,
    models: Vec<(DType, Mamba2)>,
    /// Median seconds of prefill programs: (dtype, batch, bucket) -> seconds.
    pub prefill_secs: Vec<((DType, usize, usize), f64)>,
    /// Figures the utilisation and plot read: key -> value.
    figures: Vec<(String, f64)>,
}

impl Ctx {
    /// A context for `plan` on `client`, with no model made yet.
    pub fn new(plan: Plan, client: Client) -> Ctx {
        Ctx {
            plan,
            client,
            cfg: Mamba2Config::mamba2_130m(),
            models: Vec::new(),
            prefill_secs: Vec::new(),
            figures: Vec::new(),
        }
    }

    /// The model of `dtype` (random weights, seed [`SEED`]), made and uploaded on first use.
    pub fn model(&mut self, dtype: DType) -> Result<&Mamba2> {
        if let Some(i) = self.models.iter().position(|(d, _)| *d == dtype) {
            return Ok(&self.models[i].1);
        }
        let t = Instant::now();
        let weights = Mamba2Weights::random(&self.cfg, dtype, SEED)?;
        let model = Mamba2::new(&self.client, self.cfg.clone(), &weights)?;
        progress::note(format!(
            "  {} model: random weights + upload {:.1}s",
            dtype.name(),
            secs_since(t)
        ));
        self.models.push((dtype, model));
        Ok(&self.models.last().expect("pushed").1)
    }

    /// A model already made by [`Ctx::model`].
    pub fn get(&self, dtype: DType) -> &Mamba2 {
        &self
            .models
            .iter()
            .find(|(d, _)| *d == dtype)
            .expect("model made")
            .1
    }

    /// A figure a section recorded.
    pub fn figure(&self, key: &str) -> Option<f64> {
        self.figures.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// Records (or replaces) a figure.
    pub fn set_figure(&mut self, key: impl Into<String>, v: f64) {
        let key = key.into();
        self.figures.retain(|(k, _)| *k != key);
        self.figures.push((key, v));
    }

    /// Median seconds of `Mamba2::prefill` (what `generate` runs before its loop: states and
    /// the last position's logits) of `batch` prompts of `len` tokens, measured on first use;
    /// and the prompt bucket.
    pub fn prefill_time(&mut self, dtype: DType, batch: usize, len: usize) -> Result<(f64, usize)> {
        self.model(dtype)?;
        let bucket = self
            .get(dtype)
            .prompt_bucket(len)
            .context("prompt too long")?;
        if let Some((_, s)) = self
            .prefill_secs
            .iter()
            .find(|(k, _)| *k == (dtype, batch, bucket))
        {
            return Ok((*s, bucket));
        }
        let model = self.get(dtype);
        let prompts: Vec<Vec<u32>> = (0..batch).map(|r| prompt(len, r)).collect();
        let t = Instant::now();
        model.prefill(&prompts)?;
        progress::note(format!(
            "  prefill {} b{batch} l{bucket} (chunk {}): first call (compile + run) {:.1}s",
            dtype.name(),
            model.prefill_chunk(len),
            secs_since(t)
        ));
        let (reps, warm_up) = self.plan.prefill_reps(batch * bucket);
        if warm_up {
            model.prefill(&prompts)?;
        }
        let (times, _) = timed(reps, || Ok(model.prefill(&prompts)?))?;
        let s = median(&times);
        self.prefill_secs.push(((dtype, batch, bucket), s));
        Ok((s, bucket))
    }
}
