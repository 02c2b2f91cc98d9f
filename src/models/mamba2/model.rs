//! A Mamba-2 model on a device: weights uploaded once, and compiled programs for prefill, the
//! streaming step, and whole-sequence generation (prefill plus a `while` loop of recurrent steps
//! in one program).

use std::collections::HashMap;
use std::sync::Mutex;

use super::block::{self, LayerState};
use super::config::Mamba2Config;
use super::weights::Mamba2Weights;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ops::{Carry, Graph, Tensor};
use crate::runtime::{Buffer, Client};

impl Carry for LayerState<Tensor> {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.push(self.conv.clone());
        out.push(self.ssm.clone());
    }
    fn unflatten(_: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        Some(LayerState {
            conv: values.next()?,
            ssm: values.next()?,
        })
    }
}

/// The recurrent state of a batch on the device: one [`LayerState`] per layer.
#[derive(Debug)]
pub struct Mamba2State {
    /// Per layer: convolution inputs `[b, conv_dim, conv_kernel]` and SSM state `[b, H, P, N]`.
    pub layers: Vec<LayerState<Buffer>>,
}

/// What a prefill returns.
#[derive(Debug)]
pub struct Prefill {
    /// Logits at every position of the padded batch, `[b, L, vocab]` f32; row `r`'s prompt
    /// occupies its last `prompt_len[r]` positions (prompts are left-padded).
    pub logits: HostArray,
    /// Each row's prompt length.
    pub prompt_len: Vec<usize>,
    /// The state after the prompts, ready for [`Mamba2::step`].
    pub state: Mamba2State,
}

/// How generation picks tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token.
    Greedy,
    /// A random token from the logits scaled by `1 / temperature`, restricted to the `top_k`
    /// most likely (0: no limit) and to the smallest set whose probability reaches `top_p`
    /// (1: no limit). Reproducible for a given `seed`.
    Sample {
        /// Softmax temperature (> 0).
        temperature: f32,
        /// Keep only the k most likely tokens (0 keeps all).
        top_k: usize,
        /// Nucleus threshold in (0, 1].
        top_p: f32,
        /// Random seed.
        seed: u64,
    },
}

/// Options of [`Mamba2::generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// How many tokens to generate per row.
    pub max_new_tokens: usize,
    /// Token choice.
    pub sampling: Sampling,
    /// A row stops at this token (it is emitted; later positions repeat it).
    pub eos: Option<u32>,
}

/// A Mamba-2 model whose weights live on one client's device.
pub struct Mamba2 {
    config: Mamba2Config,
    client: Client,
    weights: Mamba2Weights<Buffer>,
    types: Mamba2Weights<TensorType>,
    programs: Mutex<HashMap<String, CompiledGraph>>,
}

impl std::fmt::Debug for Mamba2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mamba2")
            .field("config", &self.config)
            .finish()
    }
}

impl Mamba2 {
    /// Uploads `weights` to `client`'s device 0. A config that [`Mamba2Config::validate`]
    /// rejects, or weights whose names, dtypes or shapes differ from
    /// [`Mamba2Weights::types`]`(config, dtype of the embedding)`, are an error listing every
    /// difference.
    pub fn new(
        client: &Client,
        config: Mamba2Config,
        weights: &Mamba2Weights<HostArray>,
    ) -> Result<Mamba2> {
        config.validate()?;
        let types = weights.try_map(|_, a| Ok(a.ty()))?;
        check_weight_types(&types, &config)?;
        let buffers = weights
            .try_map(|_, a| client.buffer_from_bytes(a.dtype(), a.dims(), &a.to_bytes(), 0))?;
        Ok(Mamba2 {
            config,
            client: client.clone(),
            weights: buffers,
            types,
            programs: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Mamba2Config {
        &self.config
    }

    /// The dtype of the matrices (f32 or bf16).
    pub fn matmul_dtype(&self) -> DType {
        self.types.embedding.dtype
    }

    /// The weights on the device, in [`Mamba2Weights::try_map`] order. With
    /// [`block::weight_parameters`] and [`Mamba2Weights::types`] they let a custom program (say,
    /// a benchmark's variant of prefill) run on this model's weights without a second upload.
    pub fn weights(&self) -> &Mamba2Weights<Buffer> {
        &self.weights
    }

    fn weight_args(&self) -> Vec<&Buffer> {
        self.weights.named().into_iter().map(|(_, b)| b).collect()
    }

    /// Compiles (once per key) the program `build` makes.
    fn program(&self, key: &str, build: impl FnOnce() -> Result<Graph>) -> Result<CompiledGraph> {
        let mut programs = self.programs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = programs.get(key) {
            return Ok(p.clone());
        }
        let compiled = build()?.compile(&self.client)?;
        programs.insert(key.to_string(), compiled.clone());
        Ok(compiled)
    }

    /// The StableHLO text of the prefill, step and generate programs for a batch shape (for
    /// reading and for `emit`): `batch` rows (at least 1) of prompts padded to `bucket`
    /// positions (a positive multiple of the chunk). Wrong sizes or options are an error naming
    /// them.
    pub fn stablehlo(
        &self,
        batch: usize,
        bucket: usize,
        options: &GenerateOptions,
    ) -> Result<[String; 3]> {
        let chunk = self.config.chunk_size;
        if batch == 0 {
            return Err(Error::InvalidArgument(
                "Mamba2::stablehlo: batch is 0; it needs at least one row".into(),
            ));
        }
        if bucket == 0 || !bucket.is_multiple_of(chunk) {
            return Err(Error::InvalidArgument(format!(
                "Mamba2::stablehlo: bucket ({bucket}) is not a positive multiple of the chunk \
                 ({chunk})"
            )));
        }
        self.check_options(options)?;
        Ok([
            self.prefill_graph(batch, bucket)?.to_stablehlo()?,
            self.step_graph(batch)?.to_stablehlo()?,
            self.generate_graph(batch, bucket, options)?
                .to_stablehlo()?,
        ])
    }

    fn state_types(&self, batch: usize) -> (TensorType, TensorType) {
        let c = &self.config;
        (
            TensorType::new(DType::F32, &[batch, c.conv_dim(), c.conv_kernel]),
            TensorType::new(DType::F32, &[batch, c.num_heads, c.head_dim, c.state_size]),
        )
    }

    fn prefill_graph(&self, batch: usize, bucket: usize) -> Result<Graph> {
        let g = Graph::new();
        let w = block::weight_parameters(&g, &self.types)?;
        let tokens = g.parameter("tokens", DType::I32, &[batch, bucket])?;
        let mask = g.parameter("mask", DType::F32, &[batch, bucket])?;
        let (hidden, states) = block::prefill(&tokens, &mask, &w, &self.config)?;
        let logits = block::head(&hidden, &w, &self.config)?;
        let mut outs = vec![logits];
        for s in states {
            outs.push(s.conv);
            outs.push(s.ssm);
        }
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        Ok(g)
    }

    fn step_graph(&self, batch: usize) -> Result<Graph> {
        let g = Graph::new();
        let w = block::weight_parameters(&g, &self.types)?;
        let token = g.parameter("token", DType::I32, &[batch])?;
        let (conv_t, ssm_t) = self.state_types(batch);
        let mut states = Vec::new();
        for i in 0..self.config.num_layers {
            let conv = g.parameter(&format!("conv.{i}"), conv_t.dtype, &conv_t.dims)?;
            let ssm = g.parameter(&format!("ssm.{i}"), ssm_t.dtype, &ssm_t.dims)?;
            g.donate(&conv)?;
            g.donate(&ssm)?;
            states.push(LayerState { conv, ssm });
        }
        let (logits, next) = block::step(&token, &states, &w, &self.config)?;
        let mut outs = Vec::new();
        for s in next {
            outs.push(s.conv);
            outs.push(s.ssm);
        }
        outs.push(logits);
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        Ok(g)
    }

    /// Left-pads the prompts to a multiple of the chunk: token ids and the real-token mask.
    fn pad_prompts(
        &self,
        prompts: &[Vec<u32>],
    ) -> Result<(usize, HostArray, HostArray, Vec<usize>)> {
        if prompts.is_empty() || prompts.iter().any(|p| p.is_empty()) {
            return Err(Error::InvalidArgument(
                "give at least one prompt, and no empty prompt".into(),
            ));
        }
        let vocab = self.config.vocab_size;
        if let Some(bad) = prompts.iter().flatten().find(|&&t| t as usize >= vocab) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
        let chunk = self.config.chunk_size;
        let too_long = || {
            Error::InvalidArgument(format!(
                "prompts: {} rows padded to {longest} tokens are too many to address",
                prompts.len()
            ))
        };
        let bucket = longest
            .div_ceil(chunk)
            .checked_mul(chunk)
            .ok_or_else(too_long)?;
        let total = prompts.len().checked_mul(bucket).ok_or_else(too_long)?;
        let mut ids = vec![0i32; total];
        let mut mask = vec![0f32; total];
        for (r, p) in prompts.iter().enumerate() {
            let start = r * bucket + bucket - p.len();
            for (k, &t) in p.iter().enumerate() {
                ids[start + k] = t as i32;
                mask[start + k] = 1.0;
            }
        }
        let b = prompts.len();
        Ok((
            bucket,
            HostArray::from_vec(&[b, bucket], ids)?,
            HostArray::from_vec(&[b, bucket], mask)?,
            prompts.iter().map(Vec::len).collect(),
        ))
    }

    fn upload(&self, a: &HostArray) -> Result<Buffer> {
        self.client
            .buffer_from_bytes(a.dtype(), a.dims(), &a.to_bytes(), 0)
    }

    /// Runs the prompts (left-padded to a common multiple of the chunk) through the chunked
    /// SSD; returns the logits at every position and the state for [`Mamba2::step`].
    pub fn prefill(&self, prompts: &[Vec<u32>]) -> Result<Prefill> {
        let (bucket, ids, mask, prompt_len) = self.pad_prompts(prompts)?;
        let batch = prompts.len();
        let program = self.program(&format!("prefill b{batch} l{bucket}"), || {
            self.prefill_graph(batch, bucket)
        })?;
        let (ids, mask) = (self.upload(&ids)?, self.upload(&mask)?);
        let mut args = self.weight_args();
        args.push(&ids);
        args.push(&mask);
        let mut outs = program.run_buffers(&args)?.into_iter();
        let logits = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("prefill returned nothing".into()))?;
        let logits = HostArray::from_bytes(
            &TensorType::new(DType::F32, logits.dims()),
            &logits.to_bytes()?,
        )?;
        let mut layers = Vec::new();
        while let (Some(conv), Some(ssm)) = (outs.next(), outs.next()) {
            layers.push(LayerState { conv, ssm });
        }
        Ok(Prefill {
            logits,
            prompt_len,
            state: Mamba2State { layers },
        })
    }

    /// Feeds one token per row and returns the logits `[b, vocab]` and the next state. The
    /// state's buffers are donated: the step updates them in place.
    pub fn step(&self, tokens: &[u32], state: Mamba2State) -> Result<(HostArray, Mamba2State)> {
        let batch = tokens.len();
        if state.layers.len() != self.config.num_layers
            || state
                .layers
                .iter()
                .any(|l| l.ssm.dims().first() != Some(&batch))
        {
            return Err(Error::InvalidArgument(format!(
                "the state does not fit {batch} tokens and {} layers",
                self.config.num_layers
            )));
        }
        if let Some(bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let program = self.program(&format!("step b{batch}"), || self.step_graph(batch))?;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let token = self.client.buffer_from_slice(&ids, &[batch])?;
        let mut args = self.weight_args();
        args.push(&token);
        for l in &state.layers {
            args.push(&l.conv);
            args.push(&l.ssm);
        }
        let outs = program.run_buffers(&args)?;
        drop(args);
        drop(state);
        let mut outs = outs.into_iter();
        let mut layers = Vec::new();
        for _ in 0..self.config.num_layers {
            match (outs.next(), outs.next()) {
                (Some(conv), Some(ssm)) => layers.push(LayerState { conv, ssm }),
                _ => {
                    return Err(Error::InvalidArgument(
                        "step returned too few outputs".into(),
                    ))
                }
            }
        }
        let logits = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("step returned no logits".into()))?;
        let logits = HostArray::from_bytes(
            &TensorType::new(DType::F32, logits.dims()),
            &logits.to_bytes()?,
        )?;
        Ok((logits, Mamba2State { layers }))
    }

    fn generate_graph(&self, batch: usize, bucket: usize, o: &GenerateOptions) -> Result<Graph> {
        let cfg = &self.config;
        let g = Graph::new();
        let w = block::weight_parameters(&g, &self.types)?;
        let tokens = g.parameter("tokens", DType::I32, &[batch, bucket])?;
        let mask = g.parameter("mask", DType::F32, &[batch, bucket])?;
        let key = g.parameter("key", DType::U32, &[2])?;
        let (hidden, states) = block::prefill(&tokens, &mask, &w, cfg)?;
        let last = hidden
            .narrow(1, bucket - 1, 1)?
            .reshape(&[batch as isize, cfg.hidden_size as isize])?;
        let logits = block::head(&last, &w, cfg)?;
        // Positions after a row's EOS (also those the loop skips once every row has stopped)
        // hold the EOS.
        let fill = o.eos.map_or(0.0, f64::from);
        let out = g.full(fill, DType::I32, &[batch, o.max_new_tokens])?;
        let done = g.full(0.0, DType::Pred, &[batch])?;
        let i = g.scalar(0.0, DType::I64)?;
        let max_new = g.scalar(o.max_new_tokens as f64, DType::I64)?;
        let zero = g.scalar(0.0, DType::I64)?;
        let eos = o
            .eos
            .map(|e| g.scalar(f64::from(e), DType::I32))
            .transpose()?;
        let init = (i, logits, states, (out, done, key));
        let (_, _, _, (out, _, _)) = g.while_loop(
            &init,
            |(i, _, _, (_, done, _))| {
                let more = i.lt(&max_new)?;
                let open = done.not()?.convert(DType::I32)?.max(&[0], false)?.gt(0.0)?;
                more.and(&open)
            },
            |(i, logits, states, (out, done, key))| {
                let (token, key) = pick(logits, key, &o.sampling)?;
                let token = match &eos {
                    Some(e) => token.where_(&done.not()?, e)?,
                    None => token,
                };
                let out = out.dynamic_update_slice(&token.expand_dims(1)?, &[&zero, i])?;
                let done = match &eos {
                    Some(e) => done.or(&token.eq(e)?)?,
                    None => done.clone(),
                };
                let (logits, states) = block::step(&token, states, &w, cfg)?;
                Ok((i.add(1.0)?, logits, states, (out, done, key)))
            },
        )?;
        g.set_outputs(&[&out])?;
        Ok(g)
    }

    /// Generates up to `max_new_tokens` tokens per prompt in ONE execution: prefill and a
    /// device-side `while` loop of recurrent steps, with no host round trip per token. Prompts
    /// of different lengths are left-padded and masked; each row equals its prompt alone. A
    /// row that emits `eos` stops (its later positions repeat `eos`); the loop ends early when
    /// all rows have stopped. Returns the new tokens of each row (without the prompt).
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<u32>>> {
        self.check_options(options)?;
        let (bucket, ids, mask, _) = self.pad_prompts(prompts)?;
        if options.max_new_tokens == 0 {
            return Ok(vec![Vec::new(); prompts.len()]);
        }
        let batch = prompts.len();
        let seed = match options.sampling {
            Sampling::Sample { seed, .. } => seed,
            Sampling::Greedy => 0,
        };
        let key_id = format!(
            "generate b{batch} l{bucket} n{} {:?} eos{:?}",
            options.max_new_tokens,
            match options.sampling {
                Sampling::Sample {
                    temperature,
                    top_k,
                    top_p,
                    ..
                } => format!("t{temperature} k{top_k} p{top_p}"),
                Sampling::Greedy => "greedy".into(),
            },
            options.eos
        );
        let program = self.program(&key_id, || self.generate_graph(batch, bucket, options))?;
        let key = self
            .client
            .buffer_from_slice(&[seed as u32, (seed >> 32) as u32], &[2])?;
        let (ids, mask) = (self.upload(&ids)?, self.upload(&mask)?);
        let mut args = self.weight_args();
        args.push(&ids);
        args.push(&mask);
        args.push(&key);
        let out = program.run_buffers(&args)?;
        let tokens = out
            .first()
            .ok_or_else(|| Error::InvalidArgument("generate returned nothing".into()))?
            .to_vec::<i32>()?;
        Ok(tokens
            .chunks(options.max_new_tokens.max(1))
            .take(batch)
            .map(|row| row.iter().map(|&t| t as u32).collect())
            .collect())
    }

    /// Checks generation options against the model: sampling settings in range, `eos` in the
    /// vocabulary.
    fn check_options(&self, options: &GenerateOptions) -> Result<()> {
        if let Sampling::Sample {
            temperature,
            top_p,
            top_k,
            ..
        } = options.sampling
        {
            if temperature.is_nan()
                || temperature <= 0.0
                || !(top_p > 0.0 && top_p <= 1.0)
                || top_k > self.config.vocab_size
            {
                return Err(Error::InvalidArgument(format!(
                    "options.sampling needs temperature > 0, top_p in (0, 1] and top_k <= vocab; got {:?}",
                    options.sampling
                )));
            }
        }
        if let Some(e) = options.eos {
            if e as usize >= self.config.vocab_size {
                return Err(Error::InvalidArgument(format!(
                    "options.eos ({e}) is outside the vocabulary of {}",
                    self.config.vocab_size
                )));
            }
        }
        Ok(())
    }
}

/// Checks that the types of some weights are those [`Mamba2Weights::types`] gives `config` with
/// the embedding's dtype as the matmul dtype; one error lists every difference.
fn check_weight_types(types: &Mamba2Weights<TensorType>, config: &Mamba2Config) -> Result<()> {
    let want = Mamba2Weights::<TensorType>::types(config, types.embedding.dtype)
        .map_err(|e| Error::InvalidArgument(format!("Mamba2::new: argument `weights`: {e}")))?;
    let (got, want) = (types.named(), want.named());
    let mut problems = Vec::new();
    for (name, ty) in &want {
        match got.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("{name} is missing")),
            Some((_, t)) if t != ty => problems.push(format!("{name} is {t}, expected {ty}")),
            Some(_) => {}
        }
    }
    for (name, _) in &got {
        if !want.iter().any(|(n, _)| n == name) {
            problems.push(format!("{name} is present, the config has none"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "Mamba2::new: argument `weights` does not fit the config: {}",
            problems.join("; ")
        )))
    }
}

/// Picks one token per row from `logits` `[b, vocab]`; returns the tokens (`i32`) and the next
/// key.
fn pick(logits: &Tensor, key: &Tensor, sampling: &Sampling) -> Result<(Tensor, Tensor)> {
    let g = logits.graph();
    match *sampling {
        Sampling::Greedy => Ok((logits.argmax(-1, false)?.convert(DType::I32)?, key.clone())),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
            ..
        } => {
            let vocab = logits.dims()[1];
            let mut l = logits.div(f64::from(temperature))?;
            if top_k > 0 && top_k < vocab {
                let (values, _) = l.top_k(top_k)?;
                let kth = values.narrow(-1, top_k - 1, 1)?;
                l = l.masked_fill(&l.lt(&kth)?, f64::NEG_INFINITY)?;
            }
            if top_p < 1.0 {
                let sorted = l.sort(-1, true)?;
                let probs = sorted.sub(&sorted.logsumexp(&[-1], true)?)?.exp()?;
                let before = probs.cumsum(-1, true, false)?;
                let kept = sorted.where_(&before.lt(f64::from(top_p))?, f64::INFINITY)?;
                let threshold = kept.min(&[-1], true)?;
                l = l.masked_fill(&l.lt(&threshold)?, f64::NEG_INFINITY)?;
            }
            let dims = logits.dims().to_vec();
            let u = g.random_uniform(key, DType::F32, &dims)?.maximum(1e-20)?;
            let gumbel = u.log()?.neg()?.log()?.neg()?;
            let token = l.add(&gumbel)?.argmax(-1, false)?.convert(DType::I32)?;
            // The next key comes from a separate stream (the key xor a constant), so it is
            // independent of this step's draws.
            let tweak = g.constant(&HostArray::from_vec(
                &[2],
                vec![0x9E37_79B9u32, 0x7F4A_7C15],
            )?)?;
            let next_key = g.random_bits(&key.xor(&tweak)?, &[2])?;
            Ok((token, next_key))
        }
    }
}
