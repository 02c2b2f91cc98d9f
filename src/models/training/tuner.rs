//! Fine-tuning a model of any family ([`FineTuner`]): the whole optimizer step (loss,
//! gradients, AdamW) in one program whose weights and moments stay on the devices, the batch
//! split over several devices when asked (data parallel: XLA reduces the gradients), and the
//! checkpoint written back under the names it was read from.

use std::path::Path;
use std::time::Instant;

use super::grads::{loss_of, to_checkpoint, weight_parameters};
use super::{check_f32, check_tokens, padding, Pieces, Trainable};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::write_tensors;
use crate::models::mamba2::{Remat, TrainOptions};
use crate::ops::{Graph, Tensor};
use crate::optim::{AdamW, AdamWTree};
use crate::runtime::{Client, ShardedBuffer};
use crate::sharding::{Mesh, PartitionSpec, Sharding};
use crate::target::Target;
use crate::tree::Tree;

/// The mesh axis the batch is split along.
const AXIS: &str = "batch";

/// A fine-tuning loop over a model of any family: its weights (copied from the model, f32),
/// AdamW's moments and the step count live on the devices, and [`FineTuner::step`] runs ONE
/// compiled program that computes the loss (the mean next-token cross-entropy, plus the
/// router loss a config asks for), its gradients, clips them when `opt.clip_norm` is set, and
/// updates everything in place (the buffers are donated); with `micro_steps > 1`, that many
/// optimizer steps in a device-side loop. Over several devices every device holds all weights
/// and `batch / devices` rows of each batch; XLA all-reduces the gradients, so the steps are
/// one device's up to float rounding.
pub struct FineTuner {
    family: &'static str,
    client: Client,
    vocab: usize,
    options: TrainOptions,
    devices: usize,
    types: Vec<(String, TensorType)>,
    pieces: Vec<Pieces>,
    step_program: CompiledGraph,
    eval_program: CompiledGraph,
    weights: Vec<ShardedBuffer>,
    state: AdamWTree<Vec<ShardedBuffer>, ShardedBuffer>,
    steps_done: u64,
    grad_norm: Option<f32>,
    compile_seconds: f64,
}

impl std::fmt::Debug for FineTuner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FineTuner")
            .field("family", &self.family)
            .field("options", &self.options)
            .field("devices", &self.devices)
            .field("steps_done", &self.steps_done)
            .finish()
    }
}

/// What one step of the step graph reads besides the weights and optimizer state.
struct StepIn<'a, F: ?Sized> {
    f: &'a F,
    opt: &'a AdamW,
    lr: &'a Tensor,
    remat: Remat,
}

/// The weights and AdamW's state in a graph.
type Params = (Vec<Tensor>, AdamWTree<Vec<Tensor>, Tensor>);

impl<F: Trainable + ?Sized> StepIn<'_, F> {
    /// One optimizer step on `rows` `[b, L + 1]`: the loss before it, the gradients' norm, and
    /// the next weights and state.
    fn run(&self, rows: &Tensor, (w, state): &Params) -> Result<(Tensor, Tensor, Params)> {
        let loss = row_loss(self.f, w.clone(), rows, self.remat)?;
        let grads = loss.grad_tree(w)?;
        let (w, state, norm) = self.opt.apply_with_norm(w, &grads, state, Some(self.lr))?;
        Ok((loss, norm, (w, state)))
    }
}

/// The loss of `f` over full rows `[b, L + 1]` (inputs the first `L`, targets the last `L`),
/// left-padded inside the graph to what the family's chunk needs.
fn row_loss<F: Trainable + ?Sized>(
    f: &F,
    w: Vec<Tensor>,
    rows: &Tensor,
    remat: Remat,
) -> Result<Tensor> {
    let g = rows.graph();
    let [b, l1] = *rows.dims() else {
        return Err(Error::InvalidArgument(format!(
            "training rows are {}, expected [b, L + 1]",
            rows.ty()
        )));
    };
    let len = l1 - 1;
    let (padded, chunk) = padding(f.chunk(), len);
    let pad = padded - len;
    let ones = g.ones(DType::F32, &[b, len])?;
    let (mut inputs, mut targets) = (rows.narrow(1, 0, len)?, rows.narrow(1, 1, len)?);
    let mut mask = ones;
    if pad > 0 {
        let zi = g.zeros(rows.dtype(), &[b, pad])?;
        let zf = g.zeros(DType::F32, &[b, pad])?;
        inputs = Tensor::concat(&[&zi, &inputs], 1)?;
        targets = Tensor::concat(&[&zi, &targets], 1)?;
        mask = Tensor::concat(&[&zf, &mask], 1)?;
    }
    let (loss, _) = loss_of(f, w, [&inputs, &targets, &mask, &mask], chunk, remat)?;
    Ok(loss)
}

impl FineTuner {
    /// Copies `f`'s weights (f32) to devices `0..devices` of its client, with AdamW moments at
    /// zero, and compiles the training step of `options` and a forward-only loss program once.
    /// `batch` must split evenly over the devices. Weights that are not f32, optimizer
    /// settings [`AdamW::validate`] rejects, a zero `batch`, `seq_len`, `micro_steps` or
    /// `devices`, or more devices than the client has, are an error naming them.
    pub(crate) fn new<F: Trainable + ?Sized>(
        f: &F,
        opt: AdamW,
        options: TrainOptions,
        devices: usize,
    ) -> Result<FineTuner> {
        let op = format!("{} fine-tuning", f.family());
        let types = f.weight_types();
        check_f32(f.family(), &types)?;
        opt.validate()?;
        let TrainOptions {
            batch,
            seq_len,
            micro_steps,
            ..
        } = options;
        let sizes = [
            ("batch", batch),
            ("seq_len", seq_len),
            ("micro_steps", micro_steps),
            ("devices", devices),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, n)| *n == 0) {
            return Err(Error::InvalidArgument(format!("{op}: {name} is 0")));
        }
        if !batch.is_multiple_of(devices) {
            return Err(Error::InvalidArgument(format!(
                "{op}: a batch of {batch} rows does not split over {devices} devices"
            )));
        }
        let client = f.client().clone();
        if devices > client.device_count() {
            return Err(Error::InvalidArgument(format!(
                "{op}: {devices} devices asked for, the client has {}",
                client.device_count()
            )));
        }
        let count = micro_steps
            .checked_mul(batch)
            .and_then(|n| n.checked_mul(seq_len.checked_add(1)?))
            .filter(|&n| i32::try_from(n).is_ok());
        if count.is_none() {
            return Err(Error::InvalidArgument(format!(
                "{op}: micro_steps x batch x (seq_len + 1) is too large"
            )));
        }
        let host = f
            .weight_buffers()
            .iter()
            .map(|b| b.to_host_array())
            .collect::<Result<Vec<_>>>()?;
        let start = Instant::now();
        let mesh = (devices > 1)
            .then(|| Mesh::new(&[(AXIS, devices)]))
            .transpose()?;
        let step_program = step_graph(f, &opt, &types, options, mesh.as_ref())?.compile(&client)?;
        let eval_program = eval_graph(f, &types, options, mesh.as_ref())?.compile(&client)?;
        let compile_seconds = start.elapsed().as_secs_f64();
        let everywhere = match &mesh {
            Some(m) => Sharding::replicated(m),
            None => Sharding::single(),
        };
        let put = |a: &HostArray| client.sharded_buffer_from_host_array(a, &everywhere);
        let init = opt.init(&host)?;
        let state = AdamWTree {
            m: init.m.iter().map(put).collect::<Result<_>>()?,
            v: init.v.iter().map(put).collect::<Result<_>>()?,
            step: put(&init.step)?,
        };
        Ok(FineTuner {
            family: f.family(),
            vocab: f.vocab_size(),
            options,
            devices,
            pieces: f.checkpoint_pieces()?,
            step_program,
            eval_program,
            weights: host.iter().map(put).collect::<Result<_>>()?,
            state,
            types,
            client,
            steps_done: 0,
            grad_norm: None,
            compile_seconds,
        })
    }

    /// How many tokens [`FineTuner::step`] takes: `micro_steps * batch * (seq_len + 1)`.
    pub fn tokens_per_call(&self) -> usize {
        let o = &self.options;
        o.micro_steps * o.batch * (o.seq_len + 1)
    }

    /// Runs `micro_steps` optimizer steps at learning rate `lr` on `tokens`, row-major
    /// `[micro_steps, batch, seq_len + 1]` ids; returns the mean loss (nats per token) of those
    /// steps, each measured before its update. A wrong number of tokens, an id outside the
    /// vocabulary or a negative or non-finite `lr` is an error, and nothing is updated.
    pub fn step(&mut self, tokens: &[u32], lr: f64) -> Result<f32> {
        let op = format!("{} FineTuner::step", self.family);
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::InvalidArgument(format!(
                "{op}: lr is {lr}, expected finite and >= 0"
            )));
        }
        let o = self.options;
        let dims = [o.micro_steps, o.batch, o.seq_len + 1];
        let tokens = self.tokens(&op, tokens, &dims, 1)?;
        let lr = self.put_everywhere(&HostArray::scalar(lr as f32))?;
        let mut args: Vec<&ShardedBuffer> = self.weights.iter().collect();
        args.extend(self.state.leaves());
        args.extend([&lr, &tokens]);
        let outs = self.step_program.run_sharded(&args)?;
        drop(args);
        let n = self.weights.len();
        if outs.len() != 2 + 3 * n + 1 {
            return Err(Error::InvalidArgument(format!(
                "{op}: the step program returned {} outputs, expected {}",
                outs.len(),
                3 * n + 3
            )));
        }
        let mut outs = outs.into_iter();
        let mut scalar = || -> Result<f32> {
            let a = outs.next().map(|b| b.to_host_array()).transpose()?;
            Ok(a.and_then(|a| a.to_f64_vec().first().copied())
                .unwrap_or(f64::NAN) as f32)
        };
        let (loss, norm) = (scalar()?, scalar()?);
        self.weights = outs.by_ref().take(n).collect();
        self.state = AdamWTree {
            m: outs.by_ref().take(n).collect(),
            v: outs.by_ref().take(n).collect(),
            step: outs
                .next()
                .ok_or_else(|| Error::InvalidArgument(format!("{op}: no step count returned")))?,
        };
        self.grad_norm = Some(norm);
        self.steps_done += o.micro_steps as u64;
        Ok(loss)
    }

    /// The loss (nats per token) of the current weights on `tokens`, without updating
    /// anything: row-major `[k, batch, seq_len + 1]` ids for any `k >= 1`; the mean over the
    /// `k` batches. A number of tokens that is not a positive multiple of `batch * (seq_len +
    /// 1)`, or an id outside the vocabulary, is an error.
    pub fn eval_loss(&self, tokens: &[u32]) -> Result<f32> {
        let op = format!("{} FineTuner::eval_loss", self.family);
        let o = self.options;
        let per = o.batch * (o.seq_len + 1);
        if tokens.is_empty() || !tokens.len().is_multiple_of(per) {
            return Err(Error::InvalidArgument(format!(
                "{op}: {} ids, expected a positive multiple of batch x (seq_len + 1) = {per}",
                tokens.len()
            )));
        }
        let mut total = 0.0f64;
        for chunk in tokens.chunks(per) {
            let ids = self.tokens(&op, chunk, &[o.batch, o.seq_len + 1], 0)?;
            let mut args: Vec<&ShardedBuffer> = self.weights.iter().collect();
            args.push(&ids);
            let outs = self.eval_program.run_sharded(&args)?;
            let loss = outs
                .first()
                .ok_or_else(|| Error::InvalidArgument(format!("{op}: no loss returned")))?
                .to_host_array()?;
            total += loss.to_f64_vec().first().copied().unwrap_or(f64::NAN);
        }
        Ok((total / (tokens.len() / per) as f64) as f32)
    }

    /// Checks `tokens` (count and vocabulary) and puts them on the devices, the rows (axis
    /// `rows_axis`) split over them.
    fn tokens(
        &self,
        op: &str,
        tokens: &[u32],
        dims: &[usize],
        rows_axis: usize,
    ) -> Result<ShardedBuffer> {
        let want: usize = dims.iter().product();
        if tokens.len() != want {
            return Err(Error::InvalidArgument(format!(
                "{op}: {} ids, expected {want} ({dims:?})",
                tokens.len()
            )));
        }
        check_tokens(op, tokens.iter().copied(), self.vocab)?;
        let ids = HostArray::from_vec(dims, tokens.iter().map(|&t| t as i32).collect())?;
        let sharding = match self.devices {
            1 => Sharding::single(),
            n => Sharding::new(&Mesh::new(&[(AXIS, n)])?, &rows_spec(dims.len(), rows_axis))?,
        };
        self.client.sharded_buffer_from_host_array(&ids, &sharding)
    }

    /// `a` on every device the tuner spans.
    fn put_everywhere(&self, a: &HostArray) -> Result<ShardedBuffer> {
        let sharding = match self.devices {
            1 => Sharding::single(),
            n => Sharding::replicated(&Mesh::new(&[(AXIS, n)])?),
        };
        self.client.sharded_buffer_from_host_array(a, &sharding)
    }

    /// The current weights as the checkpoint holds them: every tensor under its name and in
    /// its shape there, f32.
    pub fn checkpoint_tensors(&self) -> Result<Vec<(String, HostArray)>> {
        let values = self
            .weights
            .iter()
            .map(ShardedBuffer::to_host_array)
            .collect::<Result<Vec<_>>>()?;
        to_checkpoint(values, &self.pieces)
    }

    /// Writes the current weights as `dir/model.safetensors` (f32, under the checkpoint's
    /// names) and copies every other regular file of `source` (the checkpoint it started from:
    /// `config.json`, the tokenizer, `generation_config.json`, ...) into `dir`, leaving out the
    /// source's weight files. `dir` is created if missing; the weights are written to a
    /// temporary name and renamed, so a failed write leaves no partial file.
    pub fn save(&self, dir: &Path, source: &Path) -> Result<()> {
        let tensors = self.checkpoint_tensors()?;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let entries = std::fs::read_dir(source)
            .map_err(|e| Error::io(format!("reading {}", source.display()), e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            let weights = name.ends_with(".safetensors")
                || name.ends_with(".safetensors.index.json")
                || name.ends_with(".bin");
            if !path.is_file() || weights || name.starts_with('.') {
                continue;
            }
            let to = dir.join(&name);
            if to != path {
                std::fs::copy(&path, &to)
                    .map_err(|e| Error::io(format!("copying {}", path.display()), e))?;
            }
        }
        write_tensors(&dir.join("model.safetensors"), &tensors)
    }

    /// Optimizer steps done (each micro step counts).
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// The global L2 norm of the gradients before clipping in the last [`FineTuner::step`]
    /// (averaged over its micro steps); `None` before the first.
    pub fn last_grad_norm(&self) -> Option<f32> {
        self.grad_norm
    }

    /// Seconds spent compiling the step and loss programs.
    pub fn compile_seconds(&self) -> f64 {
        self.compile_seconds
    }

    /// The devices the batch is split over.
    pub fn devices(&self) -> usize {
        self.devices
    }

    /// The weights' count of scalars.
    pub fn parameter_count(&self) -> usize {
        self.types.iter().map(|(_, t)| t.element_count()).sum()
    }

    /// The compiled step program, for inspection: parameters every weight (`w.*`), every `m`,
    /// every `v`, the step count, `lr` and `tokens`; outputs the mean loss and gradient norm,
    /// then the new weights, `m`, `v` and step count, each written over its donated parameter.
    pub fn step_program(&self) -> &CompiledGraph {
        &self.step_program
    }
}

/// The spec of an array of `rank` split along `axis` over the batch axis.
fn rows_spec(rank: usize, axis: usize) -> PartitionSpec {
    let mut dims = vec![None; rank];
    dims[axis] = Some(AXIS);
    PartitionSpec::new(dims)
}

/// Puts `g` on `mesh` (when several devices): `tokens` split along `rows_axis`, everything
/// else, outputs included, on every device.
fn place(g: &Graph, mesh: Option<&Mesh>, rank: usize, rows_axis: usize) -> Result<()> {
    let Some(mesh) = mesh else { return Ok(()) };
    g.set_mesh(mesh);
    g.shard_parameter_named("tokens", &rows_spec(rank, rows_axis))?;
    let outs = vec![PartitionSpec::replicated(); g.output_types().len()];
    g.set_output_shardings(&outs)
}

/// The training-step graph of [`FineTuner`] (see [`FineTuner::step_program`]).
fn step_graph<F: Trainable + ?Sized>(
    f: &F,
    opt: &AdamW,
    types: &[(String, TensorType)],
    o: TrainOptions,
    mesh: Option<&Mesh>,
) -> Result<Graph> {
    let g = Graph::with_target(Target::of(f.client()));
    let params = |prefix: &str| -> Result<Vec<Tensor>> {
        types
            .iter()
            .map(|(name, ty)| {
                let t = g.parameter(&format!("{prefix}.{name}"), ty.dtype, &ty.dims)?;
                g.donate(&t)?;
                Ok(t)
            })
            .collect()
    };
    let (w, m, v) = (params("w")?, params("m")?, params("v")?);
    let step = g.parameter("step", DType::I32, &[])?;
    g.donate(&step)?;
    let lr = g.parameter("lr", DType::F32, &[])?;
    let (b, l1) = (o.batch, o.seq_len + 1);
    let tokens = g.parameter("tokens", DType::I32, &[o.micro_steps, b, l1])?;
    let state = (w, AdamWTree { m, v, step });
    let one = StepIn {
        f,
        opt,
        lr: &lr,
        remat: o.remat,
    };
    let rows = [b as isize, l1 as isize];
    let (loss, norm, next) = if o.micro_steps == 1 {
        one.run(&tokens.reshape(&rows)?, &state)?
    } else {
        let zero = g.scalar(0.0, DType::F32)?;
        let init = (state, (zero.clone(), zero));
        let (state, (loss_sum, norm_sum)) =
            g.fori_loop(0, o.micro_steps as i64, &init, |i, (state, (ls, ns))| {
                let z = g.scalar(0.0, i.dtype())?;
                let batch = tokens
                    .dynamic_slice(&[i, &z, &z], &[1, b, l1])?
                    .reshape(&rows)?;
                let (loss, norm, next) = one.run(&batch, state)?;
                Ok((next, (ls.add(&loss)?, ns.add(&norm)?)))
            })?;
        let k = o.micro_steps as f64;
        (loss_sum.div(k)?, norm_sum.div(k)?, state)
    };
    let mut outs: Vec<&Tensor> = vec![&loss, &norm];
    outs.extend(next.0.iter());
    outs.extend(next.1.leaves());
    g.set_outputs(&outs)?;
    place(&g, mesh, 3, 1)?;
    Ok(g)
}

/// The forward-only loss graph of [`FineTuner::eval_loss`]: the weights, then `tokens`
/// `[batch, seq_len + 1]`; the mean loss.
fn eval_graph<F: Trainable + ?Sized>(
    f: &F,
    types: &[(String, TensorType)],
    o: TrainOptions,
    mesh: Option<&Mesh>,
) -> Result<Graph> {
    let g = Graph::with_target(Target::of(f.client()));
    let w = weight_parameters(&g, types)?;
    let tokens = g.parameter("tokens", DType::I32, &[o.batch, o.seq_len + 1])?;
    let loss = row_loss(f, w, &tokens, Remat::Off)?;
    g.set_outputs(&[&loss])?;
    place(&g, mesh, 2, 0)?;
    Ok(g)
}
