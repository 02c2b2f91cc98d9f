//! A Mamba-2 model over several devices: where each weight, state and input lives, written as
//! partition specs that XLA's SPMD partitioner turns into per-device programs.
//!
//! - [`Parallel::Heads`] (tensor parallelism, mesh axis `model`): each device holds `1/N` of the
//!   heads. `in_proj` is split along its input (hidden) dimension, so each device computes a
//!   partial product that XLA all-reduces; the per-head tensors (`dt_bias`, `A_log`, `D`, the
//!   gated norm's weight) and `out_proj`'s input dimension are split by heads, so the SSM and
//!   its state run on each device's heads and `out_proj`'s partial sums are all-reduced; the
//!   gated norm's per-group sums of squares are reduced across the devices a group spans. The
//!   embedding and the head are split along the hidden dimension when `N` divides it.
//!   The SSM state `[b, H, P, N]` is split by heads; the convolution state `[b, conv_dim, k]`
//!   along its channels when `N` divides them (its blocks do not fall on the `x | B | C`
//!   boundaries, but measured on the 130M step this removes the state's all-gather, 7168
//!   floats per layer, and adds no collective), else replicated.
//! - [`Parallel::Batch`] (data parallelism, mesh axis `batch`): every device holds all weights
//!   and `1/N` of the rows: tokens, masks, states, logits and sampling settings are split along
//!   their first (row) dimension.
//!
//! Specs only place values: any spec computes the same function, so the choices here are about
//! memory and communication, never results; the tests compare with one device.

use super::config::Mamba2Config;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
pub use crate::models::common::Parallel;
use crate::ops::Graph;
use crate::sharding::{Mesh, PartitionSpec, Sharding};

/// A model's placement over a one-axis mesh of devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) kind: Parallel,
    pub(crate) mesh: Mesh,
    /// The config's sizes the specs split.
    hidden: usize,
    state: TensorType,
    conv: TensorType,
}

impl Placement {
    /// `kind` over devices `0..devices`; for heads, an error unless `devices` divides the head
    /// count (and so `d_inner`).
    pub(crate) fn new(kind: Parallel, devices: usize, config: &Mamba2Config) -> Result<Placement> {
        if devices == 0 {
            return Err(Error::InvalidArgument(
                "devices is 0; a model needs at least one".into(),
            ));
        }
        if kind == Parallel::Heads && !config.num_heads.is_multiple_of(devices) {
            return Err(Error::InvalidArgument(format!(
                "parallel heads over {devices} devices: the model's {} heads do not divide \
                 into {devices} equal parts",
                config.num_heads
            )));
        }
        Ok(Placement {
            kind,
            mesh: Mesh::new(&[(kind.axis(), devices)])?,
            hidden: config.hidden_size,
            state: TensorType::new(
                crate::DType::F32,
                &[0, config.num_heads, config.head_dim, config.state_size],
            ),
            conv: TensorType::new(
                crate::DType::F32,
                &[0, config.conv_dim(), config.conv_kernel],
            ),
        })
    }

    /// The number of devices.
    pub(crate) fn devices(&self) -> usize {
        self.mesh.size()
    }

    /// An error unless `batch` rows split over the devices (batch parallelism).
    pub(crate) fn check_batch(&self, batch: usize) -> Result<()> {
        self.kind.check_rows(self.devices(), batch)
    }

    fn split(&self, dims: &[Option<&str>]) -> PartitionSpec {
        PartitionSpec::new(dims.iter().copied())
    }

    /// The spec of weight `name` (as [`crate::tree::Tree::named`] names it) of type `ty`.
    pub(crate) fn weight_spec(&self, name: &str, ty: &TensorType) -> PartitionSpec {
        let axis = Some(self.kind.axis());
        if self.kind == Parallel::Batch {
            return PartitionSpec::replicated();
        }
        let divides = |n: usize| n.is_multiple_of(self.devices());
        let field = name.rsplit_once(".mixer.").map(|(_, f)| f);
        match (name, field) {
            (_, Some("in_proj")) if divides(self.hidden) => self.split(&[None, axis]),
            // Input dimension `d_inner`, whose major blocks are heads.
            (_, Some("out_proj")) => self.split(&[None, axis]),
            // Per head (`[H]`), and the gated norm's weight (`[d_inner]`).
            (_, Some("dt_bias" | "A_log" | "D" | "norm"))
                if ty.dims.first().is_some_and(|&d| divides(d)) =>
            {
                self.split(&[axis])
            }
            // Along the hidden dimension: the head's partial products are all-reduced by
            // addition. (Split by vocabulary rows, the logits would be too, and a greedy or
            // sampled pick's NaN-aware max across devices is a reduction XLA's CPU all-reduce
            // refuses: "Unsupported reduction computation".)
            ("embedding" | "lm_head", None) if divides(self.hidden) => self.split(&[None, axis]),
            _ => PartitionSpec::replicated(),
        }
    }

    /// The spec of a program input other than a weight: `name` is the graph parameter's name,
    /// `batch` the program's rows.
    pub(crate) fn input_spec(&self, name: &str, ty: &TensorType, batch: usize) -> PartitionSpec {
        match self.kind {
            Parallel::Heads if name.starts_with("ssm.") => {
                self.split(&[None, Some(self.kind.axis())])
            }
            Parallel::Heads if name.starts_with("conv.") && self.conv_splits() => {
                self.split(&[None, Some(self.kind.axis())])
            }
            Parallel::Heads => PartitionSpec::replicated(),
            Parallel::Batch => self.rows_spec(ty, batch),
        }
    }

    /// Whether the convolution state is split along its channels.
    fn conv_splits(&self) -> bool {
        self.conv.dims[1].is_multiple_of(self.devices())
    }

    /// The spec of a program output of type `ty`.
    pub(crate) fn output_spec(&self, ty: &TensorType, batch: usize) -> PartitionSpec {
        match self.kind {
            Parallel::Heads if self.is_ssm_state(ty, batch) => {
                self.split(&[None, Some(self.kind.axis())])
            }
            Parallel::Heads
                if self.conv_splits()
                    && ty.dims.len() == 3
                    && ty.dims[0] == batch
                    && ty.dims[1..] == self.conv.dims[1..] =>
            {
                self.split(&[None, Some(self.kind.axis())])
            }
            Parallel::Heads => PartitionSpec::replicated(),
            Parallel::Batch => self.rows_spec(ty, batch),
        }
    }

    /// Split along rows when the first dimension is the batch.
    fn rows_spec(&self, ty: &TensorType, batch: usize) -> PartitionSpec {
        if ty.dims.first() == Some(&batch) && batch.is_multiple_of(self.devices()) {
            self.split(&[Some(self.kind.axis())])
        } else {
            PartitionSpec::replicated()
        }
    }

    fn is_ssm_state(&self, ty: &TensorType, batch: usize) -> bool {
        ty.dtype == self.state.dtype
            && ty.dims.len() == 4
            && ty.dims[0] == batch
            && ty.dims[1..] == self.state.dims[1..]
    }

    /// The [`Sharding`] of `spec`.
    pub(crate) fn sharding(&self, spec: &PartitionSpec) -> Result<Sharding> {
        Sharding::new(&self.mesh, spec)
    }

    /// Puts a finished program of `batch` rows on the mesh: every parameter (weights are named
    /// `w.<name>`) and output gets its spec.
    pub(crate) fn apply(&self, g: &Graph, batch: usize) -> Result<()> {
        g.set_mesh(&self.mesh);
        for (name, ty) in g.parameter_names().iter().zip(g.parameter_types()) {
            let spec = match name.strip_prefix("w.") {
                Some(weight) => self.weight_spec(weight, &ty),
                None => self.input_spec(name, &ty, batch),
            };
            if !spec.is_replicated() {
                g.shard_parameter_named(name, &spec)?;
            }
        }
        let outputs: Vec<PartitionSpec> = g
            .output_types()
            .iter()
            .map(|t| self.output_spec(t, batch))
            .collect();
        g.set_output_shardings(&outputs)
    }
}
