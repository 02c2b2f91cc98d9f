//! Explicit collectives: [`Graph::shard_map`] (JAX's `shard_map`) and, inside its body, the
//! collectives over mesh axes (`lax.psum`, `all_gather`, `psum_scatter`, `all_to_all`,
//! `axis_index`).
//!
//! A shard_map body is a region, like a loop body, built by a Rust closure: it sees each
//! device's block of each input and returns per-device blocks. Every mesh axis is manual inside
//! it. The body may use tensors from outside it: such a value is captured as an extra input,
//! replicated (every device sees the whole value). A value made inside the body cannot be used
//! outside it. A shard_map cannot be nested in another one's body. The collectives are errors
//! outside a shard_map body.

use std::panic::Location;

use super::control::RegionGuard;
use super::graph::{graph_error, Graph};
use super::ir::ValueId;
use super::op::{Op, ReduceKind};
use super::rules::{block_type, global_type};
use super::sharding::message;
use super::tensor::Tensor;
use super::util::{self, same_graph, Loc};
use crate::dtype::TensorType;
use crate::error::Result;
use crate::sharding::{Mesh, PartitionSpec};

impl Graph {
    /// JAX's `shard_map`: runs `body` once per device of the graph's mesh, every mesh axis
    /// manual. `body` gets each device's block of each input (its shape divided as
    /// `in_specs[k]` says) and returns per-device blocks; the results are the global values
    /// those blocks make up (block shapes multiplied as `out_specs` say; where devices hold
    /// copies of a block, as for a replicated output, they must agree, and the interpreter
    /// takes the lowest device's). Tensors from outside used in `body` are captured as
    /// replicated inputs. An error when the graph has no mesh, a spec names an unknown axis or
    /// does not divide its value, the counts of inputs/specs/results differ, or the call is
    /// inside another shard_map body.
    #[track_caller]
    pub fn shard_map(
        &self,
        inputs: &[&Tensor],
        in_specs: &[PartitionSpec],
        out_specs: &[PartitionSpec],
        body: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let op = "shard_map";
        let (mesh, blocks) = self.shard_map_blocks(inputs, in_specs, out_specs, loc)?;
        let input_ids = inputs
            .iter()
            .map(|t| self.resolve(t.id(), op, loc))
            .collect::<Result<Vec<ValueId>>>()?;
        let outer = self.current_region();
        let (region, results) = {
            let _guard = RegionGuard { graph: self, outer };
            let region = self.open_region();
            self.with_sharding(|s| s.manual.push((region, mesh.clone())));
            let args: Vec<Tensor> = blocks
                .iter()
                .map(|t| self.add_block_arg(region, t.clone()))
                .collect();
            let results = body(&args)?;
            if results.len() != out_specs.len() {
                return Err(graph_error(
                    op,
                    format!(
                        "the body returns {} tensors but {} out_specs were given",
                        results.len(),
                        out_specs.len()
                    ),
                    loc,
                ));
            }
            let refs: Vec<&Tensor> = results.iter().collect();
            same_graph(self, &refs, op, loc)?;
            let ids = results
                .iter()
                .map(|t| self.resolve(t.id(), op, loc))
                .collect::<Result<Vec<_>>>()?;
            self.set_region_results(region, ids);
            // Captured outer values become replicated inputs after the user's.
            let mut region_args: Vec<ValueId> = args.iter().map(|t| t.id()).collect();
            let mut inputs = input_ids;
            let mut specs = in_specs.to_vec();
            for (outer_value, inner) in self.region_captures(region) {
                region_args.push(inner);
                inputs.push(outer_value);
                specs.push(PartitionSpec::replicated());
            }
            self.set_region_args(region, region_args);
            (region, (results, inputs, specs))
        };
        let (results, inputs, specs) = results;
        let out_types = global_types(&mesh, &results, out_specs, loc)?;
        self.push(
            Op::ShardMap {
                body: region,
                mesh,
                in_specs: specs,
                out_specs: out_specs.to_vec(),
            },
            inputs,
            out_types,
        )
    }

    /// The checks of a `shard_map` before its body is built: the graph's mesh (an error when
    /// there is none or the call is inside another shard_map body), inputs of this graph, one
    /// valid spec per input and valid out specs. Returns the mesh and each input's block type.
    fn shard_map_blocks(
        &self,
        inputs: &[&Tensor],
        in_specs: &[PartitionSpec],
        out_specs: &[PartitionSpec],
        loc: Loc,
    ) -> Result<(Mesh, Vec<TensorType>)> {
        let op = "shard_map";
        let Some(mesh) = self.mesh() else {
            return Err(graph_error(
                op,
                "the graph has no mesh: call Graph::set_mesh first",
                loc,
            ));
        };
        if self.manual_mesh().is_some() {
            return Err(graph_error(
                op,
                "a shard_map cannot be nested in another shard_map's body",
                loc,
            ));
        }
        same_graph(self, inputs, op, loc)?;
        if in_specs.len() != inputs.len() {
            return Err(graph_error(
                op,
                format!("{} inputs but {} in_specs", inputs.len(), in_specs.len()),
                loc,
            ));
        }
        let mut blocks = Vec::with_capacity(inputs.len());
        for (k, (t, spec)) in inputs.iter().zip(in_specs).enumerate() {
            let block = block_type(&mesh, spec, t.ty())
                .map_err(|m| graph_error(op, format!("input {k}: {m}"), loc))?;
            blocks.push(block);
        }
        for (k, spec) in out_specs.iter().enumerate() {
            crate::sharding::Sharding::new(&mesh, spec)
                .map_err(|e| graph_error(op, format!("out spec {k}: {}", message(e)), loc))?;
        }
        Ok((mesh, blocks))
    }

    /// The mesh of the innermost shard_map body around the current region, if any.
    fn manual_mesh(&self) -> Option<Mesh> {
        let manual = self.with_sharding(|s| s.manual.clone());
        let mut region = Some(self.current_region());
        while let Some(r) = region {
            if let Some((_, mesh)) = manual.iter().find(|(m, _)| *m == r) {
                return Some(mesh.clone());
            }
            region = self.region_parent(r);
        }
        None
    }

    /// The shard_map's mesh for collective `op`, or an error: collectives are valid only inside
    /// a shard_map body.
    fn collective_mesh(&self, op: &'static str, loc: Loc) -> Result<Mesh> {
        self.manual_mesh().ok_or_else(|| {
            graph_error(
                op,
                "is only valid inside a shard_map body (see Graph::shard_map)",
                loc,
            )
        })
    }

    /// This device's coordinate along mesh axis `axis`, an `i32[]` (`lax.axis_index`). Only
    /// inside a shard_map body.
    #[track_caller]
    pub fn axis_index(&self, axis: &str) -> Result<Tensor> {
        let loc = Location::caller();
        let mesh = self.collective_mesh("axis_index", loc)?;
        let op = Op::AxisIndex {
            axis: axis.to_string(),
            mesh,
        };
        util::node(self, op, &[], "axis_index", loc)
    }
}

impl Tensor {
    /// Reduces this block elementwise with `kind` over the devices that differ only in their
    /// coordinates along `axes` (`lax.psum`, `pmax`, `pmin`); each of them gets the result.
    /// Only inside a shard_map body; numbers only.
    #[track_caller]
    pub fn all_reduce(&self, axes: &[&str], kind: ReduceKind) -> Result<Tensor> {
        self.all_reduce_at(axes, kind, Location::caller())
    }

    /// [`Tensor::all_reduce`] with [`ReduceKind::Sum`] (`lax.psum`).
    #[track_caller]
    pub fn psum(&self, axes: &[&str]) -> Result<Tensor> {
        self.all_reduce_at(axes, ReduceKind::Sum, Location::caller())
    }

    fn all_reduce_at(&self, axes: &[&str], kind: ReduceKind, loc: Loc) -> Result<Tensor> {
        let mesh = self.graph().collective_mesh("all_reduce", loc)?;
        let op = Op::AllReduce {
            kind,
            axes: axes.iter().map(|a| a.to_string()).collect(),
            mesh,
        };
        util::node(self.graph(), op, &[self], "all_reduce", loc)
    }

    /// The blocks of the devices along mesh axis `axis`, in coordinate order, concatenated
    /// along `dim` (`lax.all_gather(..., tiled=True)`). Only inside a shard_map body.
    #[track_caller]
    pub fn all_gather(&self, axis: &str, dim: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let dim = util::axis("all_gather", self, dim, loc)?;
        self.all_gather_at(axis, dim, true, loc)
    }

    /// The blocks of the devices along mesh axis `axis`, in coordinate order, stacked as a new
    /// dimension `dim` (`lax.all_gather`, untiled); `dim` may be the rank. Only inside a
    /// shard_map body.
    #[track_caller]
    pub fn all_gather_stacked(&self, axis: &str, dim: usize) -> Result<Tensor> {
        self.all_gather_at(axis, dim, false, Location::caller())
    }

    fn all_gather_at(&self, axis: &str, dim: usize, tiled: bool, loc: Loc) -> Result<Tensor> {
        let mesh = self.graph().collective_mesh("all_gather", loc)?;
        let op = Op::AllGather {
            axis: axis.to_string(),
            dim,
            tiled,
            mesh,
        };
        util::node(self.graph(), op, &[self], "all_gather", loc)
    }

    /// The sum over the devices along mesh axis `axis`, split along `dim` into one part per
    /// device; device `i` along the axis gets part `i` (`lax.psum_scatter(..., tiled=True)`).
    /// Only inside a shard_map body; the axis size must divide dimension `dim`.
    #[track_caller]
    pub fn reduce_scatter(&self, axis: &str, dim: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let mesh = self.graph().collective_mesh("reduce_scatter", loc)?;
        let dim = util::axis("reduce_scatter", self, dim, loc)?;
        let op = Op::ReduceScatter {
            axis: axis.to_string(),
            dim,
            mesh,
        };
        util::node(self.graph(), op, &[self], "reduce_scatter", loc)
    }

    /// Splits this block along `split_dim` into one part per device along mesh axis `axis`,
    /// sends part `j` to device `j` and concatenates the parts received along `concat_dim`, in
    /// coordinate order (`lax.all_to_all(..., tiled=True)`). Only inside a shard_map body; the
    /// axis size must divide dimension `split_dim`.
    #[track_caller]
    pub fn all_to_all(&self, axis: &str, split_dim: isize, concat_dim: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let mesh = self.graph().collective_mesh("all_to_all", loc)?;
        let split_dim = util::axis("all_to_all", self, split_dim, loc)?;
        let concat_dim = util::axis("all_to_all", self, concat_dim, loc)?;
        let op = Op::AllToAll {
            axis: axis.to_string(),
            split_dim,
            concat_dim,
            mesh,
        };
        util::node(self.graph(), op, &[self], "all_to_all", loc)
    }
}

/// The global types a `shard_map`'s body `results` make up over `mesh` as `out_specs` say, each
/// small enough to address.
fn global_types(
    mesh: &Mesh,
    results: &[Tensor],
    out_specs: &[PartitionSpec],
    loc: Loc,
) -> Result<Vec<TensorType>> {
    let mut out_types: Vec<TensorType> = Vec::with_capacity(results.len());
    for (k, (r, spec)) in results.iter().zip(out_specs).enumerate() {
        let ty = global_type(mesh, spec, r.ty())
            .map_err(|m| graph_error("shard_map", format!("output {k}: {m}"), loc))?;
        if ty.byte_size().is_none() {
            return Err(graph_error(
                "shard_map",
                format!("{ty} is too large to address"),
                loc,
            ));
        }
        out_types.push(ty);
    }
    Ok(out_types)
}
