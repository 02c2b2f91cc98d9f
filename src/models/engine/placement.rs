//! A model of any family over several devices: where each weight and each program input and
//! output lives, as partition specs that XLA's SPMD partitioner turns into per-device programs.
//!
//! - [`Parallel::Heads`] (mesh axis `model`): every matrix (`[out, in]`, or stacked experts
//!   `[experts, out, in]`) is split along its input dimension when the devices divide it, so
//!   each device computes a partial product that XLA all-reduces: an output projection's input
//!   is its heads (attention heads, SSM heads, MLP and expert channels), so those run on each
//!   device's share; vectors, 8-bit scales, the convolution and the states stay whole.
//! - [`Parallel::Batch`] (mesh axis `batch`): every device holds all weights and `1/N` of the
//!   rows: every input and output whose first dimension is the batch is split along it.
//!
//! Specs only place values: any spec computes the same function, so the choices are about
//! memory and communication, never results; the tests compare with one device.

use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::models::common::Parallel;
use crate::ops::Graph;
use crate::sharding::{Mesh, PartitionSpec, Sharding};

/// A family's placement over a one-axis mesh of devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    kind: Parallel,
    mesh: Mesh,
}

impl Placement {
    /// `kind` over devices `0..devices` of a model whose `heads` (for [`Parallel::Heads`]:
    /// every kind of head it has, each count with its name) must divide among them.
    pub(crate) fn new(
        kind: Parallel,
        devices: usize,
        heads: &[(&str, usize)],
    ) -> Result<Placement> {
        if devices == 0 {
            return Err(Error::InvalidArgument(
                "devices is 0; a model needs at least one".into(),
            ));
        }
        if kind == Parallel::Heads {
            if let Some((what, n)) = heads.iter().find(|(_, n)| !n.is_multiple_of(devices)) {
                return Err(Error::InvalidArgument(format!(
                    "parallel heads over {devices} devices: the model's {n} {what} do not \
                     divide into {devices} equal parts"
                )));
            }
        }
        Ok(Placement {
            kind,
            mesh: Mesh::new(&[(kind.axis(), devices)])?,
        })
    }

    /// The mesh.
    pub(crate) fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The number of devices.
    pub(crate) fn devices(&self) -> usize {
        self.mesh.size()
    }

    /// An error unless `batch` rows split over the devices (batch parallelism).
    pub(crate) fn check_batch(&self, batch: usize) -> Result<()> {
        self.kind.check_rows(self.devices(), batch)
    }

    /// The spec of the weight `name` of type `ty`.
    pub(crate) fn weight_spec(&self, name: &str, ty: &TensorType) -> PartitionSpec {
        let rank = ty.dims.len();
        let eight_bit = ty.dtype == crate::models::quant::QUANTIZED;
        let float = ty.dtype.is_float() && !name.contains("conv");
        let matrix = rank >= 2 && (eight_bit || float);
        match self.kind {
            Parallel::Heads if matrix && ty.dims[rank - 1].is_multiple_of(self.devices()) => {
                let mut dims = vec![None; rank];
                dims[rank - 1] = Some(self.kind.axis());
                PartitionSpec::new(dims)
            }
            _ => PartitionSpec::replicated(),
        }
    }

    /// The spec of a program input or output of type `ty` in a program of `batch` rows.
    fn rows_spec(&self, ty: &TensorType, batch: usize) -> PartitionSpec {
        let rows = ty.dims.first() == Some(&batch) && batch.is_multiple_of(self.devices());
        match self.kind {
            Parallel::Batch if rows => PartitionSpec::new([Some(self.kind.axis())]),
            _ => PartitionSpec::replicated(),
        }
    }

    /// The [`Sharding`] of `spec`.
    pub(crate) fn sharding(&self, spec: &PartitionSpec) -> Result<Sharding> {
        Sharding::new(&self.mesh, spec)
    }

    /// Puts a finished program of `batch` rows on the mesh: every parameter (the first
    /// `weights` are the weights, `named` in order) and output gets its spec.
    pub(crate) fn apply(
        &self,
        g: &Graph,
        weights: &[(String, TensorType)],
        batch: usize,
    ) -> Result<()> {
        self.check_batch(batch)?;
        g.set_mesh(&self.mesh);
        let names = g.parameter_names();
        for (i, (name, ty)) in names.iter().zip(g.parameter_types()).enumerate() {
            let spec = match weights.get(i) {
                Some((w, ty)) => self.weight_spec(w, ty),
                None => self.rows_spec(&ty, batch),
            };
            if !spec.is_replicated() {
                g.shard_parameter_named(name, &spec)?;
            }
        }
        let outputs: Vec<PartitionSpec> = g
            .output_types()
            .iter()
            .map(|t| self.rows_spec(t, batch))
            .collect();
        g.set_output_shardings(&outputs)
    }
}
