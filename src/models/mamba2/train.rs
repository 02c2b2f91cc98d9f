//! Training a Mamba-2 language model: the next-token loss as a graph ([`lm_loss`]), its
//! gradients by reverse-mode autodiff ([`Tensor::grad`]), and [`Trainer`], which compiles a
//! whole training step (loss, gradients, global-norm clipping if asked, an AdamW update, optionally
//! several such steps in one device-side loop) into ONE program whose weights and optimizer
//! state stay on the device and are updated in place.
//!
//! [`loss_and_grads`] computes the loss and every weight's gradient for a list of prompts, for
//! inspection and comparison with other frameworks.

use super::weights::named_differences;
use crate::tree::{self, Tree};
use std::sync::Mutex;
use std::time::Instant;

use super::block::{self, Remat};
use super::config::Mamba2Config;
use super::weights::Mamba2Weights;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::training::{next_token_loss, pack, Packed};
use crate::ops::{Graph, Tensor};
use crate::optim::{AdamW, AdamWTree};
use crate::runtime::{Buffer, Client};
use crate::target::Target;

/// An error of `op` about its argument `arg`.
fn bad_arg(op: &str, arg: &str, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{op}: argument `{arg}` {why}"))
}

/// The mean next-token cross-entropy, in nats, of a Mamba-2 over a batch: a rank-0 f32 tensor,
/// `sum(ce * weights) / sum(weights)`, where `ce[r, j] = -log softmax(logits[r, j])[targets[r,
/// j]]` and `logits` are the model's after `inputs[r, ..= j]`.
///
/// - `inputs`: `[b, L]` integer token ids, `L` a multiple of `cfg.chunk_size`, left-padded
///   where rows are shorter (see `mask`).
/// - `targets`: `[b, L]` integer ids, the token that should follow each position (usually
///   `inputs` shifted left by one). An id outside the vocabulary matches no logit and adds 0
///   to the sum (check ids on the host).
/// - `weights`: `[b, L]` f32, how much each position counts (0 for padding and for positions
///   without a target). All zero gives NaN (0 / 0).
/// - `mask`: `[b, L]` f32, 1 for real tokens and 0 for the left padding, as
///   [`block::prefill`] takes it.
///
/// With `targets` = `inputs` shifted left, `weights` 1 but on the last position and `mask` 1,
/// this is HF's `Mamba2ForCausalLM(input_ids, labels=input_ids).loss`. The logits are the
/// model's f32 logits ([`block::head`]) and the log-softmax is the stable one
/// ([`Tensor::log_softmax`]); the target's entry is picked with a one-hot product (as cheap
/// as the logits, forward and backward, for a byte vocabulary). Arguments of the wrong shape
/// or dtype, weights that do not fit the config, or a config that [`Mamba2Config::validate`] rejects are an error naming them.
pub fn lm_loss(
    inputs: &Tensor,
    targets: &Tensor,
    weights: &Tensor,
    mask: &Tensor,
    w: &Mamba2Weights<Tensor>,
    cfg: &Mamba2Config,
) -> Result<Tensor> {
    lm_loss_with(inputs, targets, weights, mask, w, cfg, Remat::Off)
}

/// [`lm_loss`] with each layer checkpointed as `remat` says (the same value; a gradient of it
/// holds less memory with [`Remat::PerLayer`]).
pub fn lm_loss_with(
    inputs: &Tensor,
    targets: &Tensor,
    weights: &Tensor,
    mask: &Tensor,
    w: &Mamba2Weights<Tensor>,
    cfg: &Mamba2Config,
    remat: Remat,
) -> Result<Tensor> {
    let op = "lm_loss";
    cfg.validate()?;
    let dims = match *inputs.dims() {
        [b, l] if inputs.dtype().is_int() => [b, l],
        _ => {
            return Err(bad_arg(
                op,
                "inputs",
                format!("is {}, expected integers [b, L]", inputs.ty()),
            ))
        }
    };
    if targets.dims() != dims || !targets.dtype().is_int() {
        return Err(bad_arg(
            op,
            "targets",
            format!(
                "is {}, expected integers {dims:?} like inputs",
                targets.ty()
            ),
        ));
    }
    for (name, t) in [("weights", weights), ("mask", mask)] {
        if t.dims() != dims || t.dtype() != DType::F32 {
            return Err(bad_arg(
                op,
                name,
                format!("is {}, expected f32 {dims:?} like inputs", t.ty()),
            ));
        }
    }
    let (hidden, _) = block::prefill_with(inputs, mask, w, cfg, None, remat)?;
    let logits = block::head(&hidden, w, cfg)?; // [b, L, vocab] f32
    next_token_loss(&logits, targets, weights, cfg.vocab_size)
}

/// Whether [`Trainer`] applies weight decay to a weight of this type: the matrices (rank 2:
/// the embedding, `in_proj`, `out_proj`, `lm_head` and the depthwise convolution's weight),
/// not the vectors (norm weights, biases, `A_log`, `D`, `dt_bias`). This is the common
/// `p.dim() >= 2` rule applied to PyTorch's Mamba-2 parameters (whose `conv1d.weight` is
/// `[conv_dim, 1, k]`), and it leaves out `A_log` and `D`, which mamba_ssm marks
/// `_no_weight_decay`.
pub fn decays(ty: &TensorType) -> bool {
    ty.dims.len() >= 2
}

/// The weights' types when they fit `cfg` as [`Mamba2Weights::types`]`(cfg, dtype)` gives
/// them for one of `dtypes`, else an error of `op` listing every difference.
fn checked_types(
    op: &str,
    weights: &Mamba2Weights<HostArray>,
    cfg: &Mamba2Config,
    dtypes: &[DType],
) -> Result<Mamba2Weights<TensorType>> {
    let got = weights.try_map(|_, a| Ok(a.ty()))?;
    let dtype = got.embedding.dtype;
    if !dtypes.contains(&dtype) {
        return Err(bad_arg(
            op,
            "weights",
            format!("has a {dtype} embedding; this needs the matrices in one of {dtypes:?}"),
        ));
    }
    let want = Mamba2Weights::<TensorType>::types(cfg, dtype)?;
    let problems = named_differences(&got.named(), &want.named(), |t, ty| {
        (t != ty).then(|| format!("is {t}, expected {ty}"))
    });
    if problems.is_empty() {
        Ok(got)
    } else {
        Err(bad_arg(
            op,
            "weights",
            format!("does not fit the config: {}", problems.join("; ")),
        ))
    }
}

/// An error of `op` unless every token is in the vocabulary of `cfg`; it names the first bad id
/// and its position.
fn check_tokens(op: &str, tokens: impl Iterator<Item = u32>, cfg: &Mamba2Config) -> Result<()> {
    crate::models::training::check_tokens(op, tokens, cfg.vocab_size)
}

/// What one optimizer step in a graph reads besides the weights, moments and step count.
struct StepIn<'a> {
    cfg: &'a Mamba2Config,
    opt: &'a AdamW,
    lr: &'a Tensor,
    remat: Remat,
}

/// The weights and AdamW's state in a graph.
type Params = (
    Mamba2Weights<Tensor>,
    AdamWTree<Mamba2Weights<Tensor>, Tensor>,
);

/// What one step in a graph returns: the loss, the gradients' global norm (before clipping),
/// and the next weights and optimizer state.
struct StepOut {
    loss: Tensor,
    norm: Tensor,
    next: Params,
}

impl StepIn<'_> {
    /// One optimizer step on `tokens` `[b, L + 1]` (inputs: the first `L`, targets: the last
    /// `L`) from `state`: the loss before the update, the gradients' norm, and the next state.
    fn run(&self, tokens: &Tensor, (w, state): &Params) -> Result<StepOut> {
        let [b, l1] = *tokens.dims() else {
            return Err(Error::InvalidArgument(format!(
                "a training step's tokens are {}, expected [b, L + 1]",
                tokens.ty()
            )));
        };
        let len = l1.saturating_sub(1);
        let loss = batch_loss(tokens, w, self.cfg, [b, len], self.remat)?;
        let grads = loss.grad_tree(w)?;
        let (w, state, norm) = self.opt.apply_with_norm(w, &grads, state, Some(self.lr))?;
        Ok(StepOut {
            loss,
            norm,
            next: (w, state),
        })
    }
}

/// [`lm_loss`] of full rows `tokens` `[b, len + 1]`: every position counts.
fn batch_loss(
    tokens: &Tensor,
    w: &Mamba2Weights<Tensor>,
    cfg: &Mamba2Config,
    [b, len]: [usize; 2],
    remat: Remat,
) -> Result<Tensor> {
    let inputs = tokens.narrow(1, 0, len)?;
    let targets = tokens.narrow(1, 1, len)?;
    let ones = tokens.graph().ones(DType::F32, &[b, len])?;
    lm_loss_with(&inputs, &targets, &ones, &ones, w, cfg, remat)
}

/// A Mamba-2 training loop on one device: the weights, AdamW's moments and the step count live
/// in device buffers, and [`Trainer::step`] runs ONE compiled program that computes the loss,
/// its gradients, clips them (when the [`AdamW`] options ask: the `train` example clips at a
/// global norm of 1) and updates everything in place (the buffers are donated). With
/// `micro_steps > 1` that program runs `micro_steps` optimizer steps in a device-side loop over
/// as many batches, with no host round trip between them.
///
/// Each batch is `batch` rows of `seq_len + 1` tokens: the model reads the first `seq_len` and
/// predicts the last `seq_len`; the loss is the mean cross-entropy over all of them (as
/// [`lm_loss`]). `seq_len` must be a multiple of the config's `chunk_size` (the SSD's block
/// size, an algorithm choice, not part of the weights: set it in the config passed here).
/// Weight decay applies to the matrices only (see [`decays`]).
///
/// Speed on XLA's CPU plugin (measured on a 2-vCPU KVM machine, shared, with the
/// `byte_level(4, 128)` shape, batches of 8 x 256): each execution maps its temporaries afresh
/// (about 77k page faults, 300 MB, per call here), a cost paid once per call, so `micro_steps
/// = 4` ran about 25% faster per optimizer step than single steps; running the process with
/// `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (transparent huge pages for the plugin's large
/// allocations, where the kernel's THP mode is `madvise`) cut the faults to about 1k and single
/// steps by about a third (about 350 to 240 ms).
pub struct Trainer {
    client: Client,
    cfg: Mamba2Config,
    types: Mamba2Weights<TensorType>,
    batch: usize,
    seq_len: usize,
    micro_steps: usize,
    opt: AdamW,
    remat: Remat,
    step_program: CompiledGraph,
    eval_program: Mutex<Option<CompiledGraph>>,
    weights: Mamba2Weights<Buffer>,
    state: AdamWTree<Mamba2Weights<Buffer>, Buffer>,
    steps_done: u64,
    grad_norm: Option<f32>,
    compile_seconds: Mutex<f64>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("config", &self.cfg)
            .field("batch", &self.batch)
            .field("seq_len", &self.seq_len)
            .field("micro_steps", &self.micro_steps)
            .field("steps_done", &self.steps_done)
            .finish()
    }
}

/// The shape of a [`Trainer`]'s step: `batch` rows of `seq_len + 1` tokens, `micro_steps`
/// optimizer steps per call, and whether each layer is recomputed in the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainOptions {
    /// Rows per batch (at least 1).
    pub batch: usize,
    /// Tokens per row fed to the model (a positive multiple of the chunk); each row holds one
    /// more, the last target.
    pub seq_len: usize,
    /// Optimizer steps per [`Trainer::step`] call (at least 1), in one device loop.
    pub micro_steps: usize,
    /// Rematerialisation of the layers in the backward pass ([`Remat::PerLayer`]: less memory
    /// for more compute).
    pub remat: Remat,
}

impl Trainer {
    /// [`Trainer::with_options`] without rematerialisation: batches of `batch` rows of
    /// `seq_len + 1` tokens, `micro_steps` optimizer steps per call.
    pub fn new(
        client: &Client,
        cfg: &Mamba2Config,
        weights: Mamba2Weights<HostArray>,
        opt: AdamW,
        batch: usize,
        seq_len: usize,
        micro_steps: usize,
    ) -> Result<Trainer> {
        let options = TrainOptions {
            batch,
            seq_len,
            micro_steps,
            remat: Remat::Off,
        };
        Trainer::with_options(client, cfg, weights, opt, options)
    }

    /// Uploads `weights` (f32, as [`Mamba2Weights::types`]`(cfg, F32)` gives them) to device 0
    /// of `client`, with AdamW moments at zero, and compiles the training step of `options`
    /// once. `opt` is used as given: gradients are clipped only when `opt.clip_norm` is set
    /// ([`AdamW::default`], like PyTorch's, does not clip; the `train` example and its
    /// benchmark ask for `Some(1.0)`). A config that [`Mamba2Config::validate`] rejects,
    /// weights that do not fit it (or are not f32), optimizer settings that
    /// [`AdamW::validate`] rejects, a zero `batch` or `micro_steps`, or a `seq_len` that is zero
    /// or not a multiple of the chunk, are an error naming them.
    pub fn with_options(
        client: &Client,
        cfg: &Mamba2Config,
        weights: Mamba2Weights<HostArray>,
        opt: AdamW,
        options: TrainOptions,
    ) -> Result<Trainer> {
        let op = "Trainer::new";
        let TrainOptions {
            batch,
            seq_len,
            micro_steps,
            remat,
        } = options;
        cfg.validate()?;
        opt.validate()?;
        let types = checked_types(op, &weights, cfg, &[DType::F32])?;
        if batch == 0 {
            return Err(bad_arg(op, "batch", "is 0; it needs at least one row"));
        }
        if micro_steps == 0 {
            return Err(bad_arg(op, "micro_steps", "is 0; it needs at least 1"));
        }
        if seq_len == 0 || !seq_len.is_multiple_of(cfg.chunk_size) {
            return Err(bad_arg(
                op,
                "seq_len",
                format!(
                    "is {seq_len}, expected a positive multiple of the config's chunk_size ({})",
                    cfg.chunk_size
                ),
            ));
        }
        let too_big = || bad_arg(op, "batch", "times seq_len + 1 and micro_steps overflows");
        let count = micro_steps
            .checked_mul(batch)
            .and_then(|n| n.checked_mul(seq_len.checked_add(1)?))
            .ok_or_else(too_big)?;
        if i32::try_from(cfg.vocab_size).is_err() || i32::try_from(count).is_err() {
            return Err(too_big());
        }
        let start = Instant::now();
        let shape = [batch, seq_len, micro_steps];
        let graph = step_graph(Target::of(client), cfg, &opt, &types, shape, remat)?;
        let step_program = graph.compile(client)?;
        let compile_seconds = start.elapsed().as_secs_f64();
        let state = tree::upload(client, &opt.init(&weights)?)?;
        let weights = tree::upload(client, &weights)?;
        Ok(Trainer {
            client: client.clone(),
            cfg: cfg.clone(),
            types,
            batch,
            seq_len,
            micro_steps,
            opt,
            remat,
            step_program,
            eval_program: Mutex::new(None),
            weights,
            state,
            steps_done: 0,
            grad_norm: None,
            compile_seconds: Mutex::new(compile_seconds),
        })
    }

    /// The same trainer with its step program rebuilt to recompute each layer in the backward
    /// pass ([`Remat::PerLayer`]) or not: less memory for more compute, the same steps
    /// (compiles the step program again when `remat` changes it; to compile it once, give
    /// [`TrainOptions::remat`] to [`Trainer::with_options`]).
    pub fn with_remat(mut self, remat: Remat) -> Result<Trainer> {
        if remat == self.remat {
            return Ok(self);
        }
        let start = Instant::now();
        let shape = [self.batch, self.seq_len, self.micro_steps];
        let target = Target::of(&self.client);
        let graph = step_graph(target, &self.cfg, &self.opt, &self.types, shape, remat)?;
        self.step_program = graph.compile(&self.client)?;
        self.remat = remat;
        *self
            .compile_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner()) += start.elapsed().as_secs_f64();
        Ok(self)
    }

    /// How many tokens [`Trainer::step`] takes: `micro_steps * batch * (seq_len + 1)`.
    pub fn tokens_per_call(&self) -> usize {
        self.micro_steps * self.batch * (self.seq_len + 1)
    }

    /// Runs `micro_steps` optimizer steps at learning rate `lr` (for all of them) on `tokens`,
    /// row-major `[micro_steps, batch, seq_len + 1]` ids; returns the mean loss (nats per
    /// token) of those steps, each measured before its update. The weights, moments and step
    /// count are updated in place on the device. A wrong number of tokens, an id outside the
    /// vocabulary (named with its position) or a negative or non-finite `lr` is an error, and
    /// nothing is updated. (Should the execution itself fail on the device after taking the
    /// donated buffers, the trainer cannot step again: make a new one from the last
    /// [`Trainer::weights`] and [`Trainer::moments`] downloaded.)
    pub fn step(&mut self, tokens: &[u32], lr: f64) -> Result<f32> {
        let op = "Trainer::step";
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(bad_arg(
                op,
                "lr",
                format!("is {lr}, expected finite and >= 0"),
            ));
        }
        let dims = [self.micro_steps, self.batch, self.seq_len + 1];
        let tokens = self.token_array(op, tokens, &dims)?;
        let tokens = self.client.buffer_from_host_array(&tokens)?;
        let lr = self
            .client
            .buffer_from_host_array(&HostArray::scalar(lr as f32))?;
        let mut args = self.weights.leaves();
        args.extend(self.state.leaves());
        args.extend([&lr, &tokens]);
        let outs = self.step_program.run_buffers(&args)?;
        drop(args);
        let n = self.weights.leaf_count();
        let mut outs = outs.into_iter();
        let mut scalar = || outs.next().map(|b| b.to_scalar::<f32>()).transpose();
        let (loss, norm) = (scalar()?, scalar()?);
        let rest: Vec<Buffer> = outs.collect();
        if rest.len() != n + self.state.leaf_count() {
            return Err(Error::InvalidArgument(format!(
                "{op}: the step program returned {} weights and optimizer tensors, expected {}",
                rest.len(),
                n + self.state.leaf_count()
            )));
        }
        let mut rest = rest.into_iter();
        self.weights = self.weights.unflatten(rest.by_ref().take(n))?;
        self.state = self.state.unflatten(rest)?;
        self.grad_norm = norm;
        self.steps_done += self.micro_steps as u64;
        loss.ok_or_else(|| Error::InvalidArgument(format!("{op}: no loss returned")))
    }

    /// The loss (nats per token) of the current weights on `tokens`, without updating
    /// anything: one or more batches, row-major `[k, batch, seq_len + 1]` ids for any `k >= 1`;
    /// returns the mean over all of them. Runs a separate forward-only program (compiled on
    /// first use) over the same weight buffers. A number of tokens that is not a positive
    /// multiple of `batch * (seq_len + 1)`, or an id outside the vocabulary, is an error.
    pub fn eval_loss(&self, tokens: &[u32]) -> Result<f32> {
        let op = "Trainer::eval_loss";
        let per_batch = self.batch * (self.seq_len + 1);
        if tokens.is_empty() || !tokens.len().is_multiple_of(per_batch) {
            return Err(bad_arg(
                op,
                "tokens",
                format!(
                    "has {} ids, expected a positive multiple of batch * (seq_len + 1) = {} * {} \
                     = {per_batch}",
                    tokens.len(),
                    self.batch,
                    self.seq_len + 1
                ),
            ));
        }
        check_tokens(op, tokens.iter().copied(), &self.cfg)?;
        let program = self.eval_program()?;
        let dims = [self.batch, self.seq_len + 1];
        let mut total = 0.0f64;
        let batches = tokens.chunks(per_batch);
        let count = batches.len();
        for chunk in batches {
            let ids = chunk.iter().map(|&t| t as i32).collect();
            let ids = self
                .client
                .buffer_from_host_array(&HostArray::from_vec(&dims, ids)?)?;
            let mut args = self.weights.leaves();
            args.push(&ids);
            let outs = program.run_buffers(&args)?;
            let loss = outs
                .first()
                .ok_or_else(|| Error::InvalidArgument(format!("{op}: no loss returned")))?;
            total += f64::from(loss.to_scalar::<f32>()?);
        }
        Ok((total / count as f64) as f32)
    }

    /// The forward-only loss program, compiled on first use.
    fn eval_program(&self) -> Result<CompiledGraph> {
        let mut slot = self.eval_program.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        let start = Instant::now();
        let g = Graph::with_target(Target::of(&self.client));
        let w = block::weight_parameters(&g, &self.types)?;
        let dims = [self.batch, self.seq_len + 1];
        let tokens = g.parameter("tokens", DType::I32, &dims)?;
        let rows = [self.batch, self.seq_len];
        let loss = batch_loss(&tokens, &w, &self.cfg, rows, Remat::Off)?;
        g.set_outputs(&[&loss])?;
        let program = g.compile(&self.client)?;
        *self
            .compile_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner()) += start.elapsed().as_secs_f64();
        *slot = Some(program.clone());
        Ok(program)
    }

    /// Checks `tokens` (length and vocabulary) and makes them an i32 array of `dims`.
    fn token_array(&self, op: &str, tokens: &[u32], dims: &[usize]) -> Result<HostArray> {
        let want: usize = dims.iter().product();
        if tokens.len() != want {
            return Err(bad_arg(
                op,
                "tokens",
                format!(
                    "has {} ids, expected micro_steps * batch * (seq_len + 1) = {} * {} * {} = \
                     {want}",
                    tokens.len(),
                    dims[0],
                    dims[1],
                    dims[2]
                ),
            ));
        }
        check_tokens(op, tokens.iter().copied(), &self.cfg)?;
        HostArray::from_vec(dims, tokens.iter().map(|&t| t as i32).collect())
    }

    /// The current weights, downloaded.
    pub fn weights(&self) -> Result<Mamba2Weights<HostArray>> {
        tree::download(&self.weights)
    }

    /// AdamW's first and second moments (`m`, `v`), downloaded, in the weights' structure.
    pub fn moments(&self) -> Result<(Mamba2Weights<HostArray>, Mamba2Weights<HostArray>)> {
        Ok((
            tree::download(&self.state.m)?,
            tree::download(&self.state.v)?,
        ))
    }

    /// Seconds spent compiling so far: the step program, and the eval program once
    /// [`Trainer::eval_loss`] has run.
    pub fn compile_seconds(&self) -> f64 {
        *self
            .compile_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Optimizer steps done (each micro step counts).
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// The global L2 norm of the gradients before clipping (as `clip_grad_norm_` returns it) in
    /// the last [`Trainer::step`], averaged over its micro steps; `None` before the first.
    pub fn last_grad_norm(&self) -> Option<f32> {
        self.grad_norm
    }

    /// Replaces AdamW's moments and the step count (as [`Trainer::moments`] and
    /// [`Trainer::steps_done`] gave them, say from a checkpoint), to resume training where it
    /// stopped: with the weights of that moment passed to [`Trainer::new`], the next steps are
    /// those the first trainer would have taken. Moments of other types than the weights, or a
    /// step count beyond `i32::MAX`, are an error naming them, and nothing is replaced.
    pub fn restore_optimizer(
        &mut self,
        m: &Mamba2Weights<HostArray>,
        v: &Mamba2Weights<HostArray>,
        steps_done: u64,
    ) -> Result<()> {
        let op = "Trainer::restore_optimizer";
        let step = i32::try_from(steps_done)
            .map_err(|_| bad_arg(op, "steps_done", format!("({steps_done}) exceeds i32::MAX")))?;
        let want = self.types.named();
        let upload = |arg: &str, x: &Mamba2Weights<HostArray>| -> Result<Mamba2Weights<Buffer>> {
            let got = x.named();
            let problems = named_differences(&got, &want, |a, ty| {
                (a.ty() != **ty).then(|| format!("is {}, expected {ty}", a.ty()))
            });
            if !problems.is_empty() {
                return Err(bad_arg(
                    op,
                    arg,
                    format!("does not fit the weights: {}", problems.join("; ")),
                ));
            }
            tree::upload(&self.client, x)
        };
        let (m, v) = (upload("m", m)?, upload("v", v)?);
        let step = self
            .client
            .buffer_from_host_array(&HostArray::scalar(step))?;
        self.state = AdamWTree { m, v, step };
        self.steps_done = steps_done;
        Ok(())
    }

    /// The compiled training-step program, for inspection. Its parameters: every weight, then
    /// every `m`, every `v` (each in tree order ([`crate::tree::Tree`]), named `w.*`, `m.*`,
    /// `v.*`), the step count (i32, donated like the previous ones), `lr` (f32) and `tokens`
    /// (i32); its outputs: the mean loss and gradient norm, then the new weights, `m`, `v` and
    /// step count, each written over its donated parameter.
    pub fn step_program(&self) -> &CompiledGraph {
        &self.step_program
    }

    /// The configuration.
    pub fn config(&self) -> &Mamba2Config {
        &self.cfg
    }
}

/// The training-step graph of [`Trainer`] (see [`Trainer::step_program`]), for programs that
/// run on `target`.
fn step_graph(
    target: Target,
    cfg: &Mamba2Config,
    opt: &AdamW,
    types: &Mamba2Weights<TensorType>,
    [batch, seq_len, micro_steps]: [usize; 3],
    remat: Remat,
) -> Result<Graph> {
    let g = Graph::with_target(target);
    let params = |prefix: &str| -> Result<Mamba2Weights<Tensor>> {
        types.try_map(|name, ty| {
            let t = g.parameter(&format!("{prefix}.{name}"), ty.dtype, &ty.dims)?;
            g.donate(&t)?;
            Ok(t)
        })
    };
    let (w, m, v) = (params("w")?, params("m")?, params("v")?);
    let step = g.parameter("step", DType::I32, &[])?;
    g.donate(&step)?;
    let lr = g.parameter("lr", DType::F32, &[])?;
    let tokens = g.parameter("tokens", DType::I32, &[micro_steps, batch, seq_len + 1])?;
    let state = (w, AdamWTree { m, v, step });
    let one = StepIn {
        cfg,
        opt,
        lr: &lr,
        remat,
    };
    let rows = [batch as isize, seq_len as isize + 1];
    let out = if micro_steps == 1 {
        one.run(&tokens.reshape(&rows)?, &state)?
    } else {
        let zero = g.scalar(0.0, DType::F32)?;
        let init = (state, (zero.clone(), zero));
        let (state, (loss_sum, norm_sum)) = g.fori_loop(
            0,
            micro_steps as i64,
            &init,
            |i, (state, (loss_sum, norm_sum))| {
                let zero = g.scalar(0.0, i.dtype())?;
                let batch_i = tokens
                    .dynamic_slice(&[i, &zero, &zero], &[1, batch, seq_len + 1])?
                    .reshape(&rows)?;
                let out = one.run(&batch_i, state)?;
                let sums = (loss_sum.add(&out.loss)?, norm_sum.add(&out.norm)?);
                Ok((out.next, sums))
            },
        )?;
        StepOut {
            loss: loss_sum.div(micro_steps as f64)?,
            norm: norm_sum.div(micro_steps as f64)?,
            next: state,
        }
    };
    let mut outs: Vec<&Tensor> = vec![&out.loss, &out.norm];
    outs.extend(out.next.0.leaves());
    outs.extend(out.next.1.leaves());
    g.set_outputs(&outs)?;
    Ok(g)
}

/// The mean next-token cross-entropy (nats) of `weights` over `prompts` and its gradient with
/// respect to every weight (same structure and types as `weights`), computed in one compiled
/// program on device 0 of `client`. Each prompt of length `T` contributes its `T - 1`
/// predictions; the mean is over all predictions of all prompts (what HF's
/// `Mamba2ForCausalLM(input_ids, labels=input_ids).loss` gives for one prompt, and for several
/// of one length). Prompts are left-padded to a multiple of the config's chunk, the padding
/// masked out of the model and of the loss. No prompts, no prediction at all (every prompt
/// shorter than 2 tokens), an id outside the vocabulary, or weights that do not fit the config
/// are an error naming them.
pub fn loss_and_grads(
    client: &Client,
    cfg: &Mamba2Config,
    weights: &Mamba2Weights<HostArray>,
    prompts: &[Vec<u32>],
) -> Result<(f32, Mamba2Weights<HostArray>)> {
    let op = "loss_and_grads";
    cfg.validate()?;
    let types = checked_types(op, weights, cfg, &[DType::F32, DType::BF16])?;
    if prompts.iter().all(|p| p.len() < 2) {
        return Err(bad_arg(
            op,
            "prompts",
            "has no prompt of 2 or more tokens: there is nothing to predict",
        ));
    }
    check_tokens(op, prompts.iter().flatten().copied(), cfg)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let len = longest
        .div_ceil(cfg.chunk_size)
        .checked_mul(cfg.chunk_size)
        .ok_or_else(|| bad_arg(op, "prompts", "are too long to pad"))?;
    let b = prompts.len();
    let Packed {
        ids,
        targets,
        mask,
        weights: lw,
    } = pack(op, prompts, len)?;
    let g = Graph::with_target(Target::of(client));
    let w = block::weight_parameters(&g, &types)?;
    let dims = [b, len];
    let t_ids = g.parameter("tokens", DType::I32, &dims)?;
    let t_targets = g.parameter("targets", DType::I32, &dims)?;
    let t_mask = g.parameter("mask", DType::F32, &dims)?;
    let t_lw = g.parameter("weights", DType::F32, &dims)?;
    let loss = lm_loss(&t_ids, &t_targets, &t_lw, &t_mask, &w, cfg)?;
    let grads = loss.grad_tree(&w)?;
    let mut outs = vec![&loss];
    outs.extend(grads.leaves());
    g.set_outputs(&outs)?;
    let program = g.compile(client)?;
    let mut inputs = weights.flatten();
    inputs.push(HostArray::from_vec(&dims, ids)?);
    inputs.push(HostArray::from_vec(&dims, targets)?);
    inputs.push(HostArray::from_vec(&dims, mask)?);
    inputs.push(HostArray::from_vec(&dims, lw)?);
    let outs = program.run(&inputs)?;
    let (first, rest) = outs
        .split_first()
        .ok_or_else(|| Error::InvalidArgument(format!("{op}: the program returned nothing")))?;
    let loss = first.to_f64_vec().first().copied().unwrap_or(f64::NAN) as f32;
    Ok((loss, types.unflatten(rest.iter().cloned())?))
}
