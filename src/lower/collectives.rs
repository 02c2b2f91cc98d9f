//! Lowering of `ShardMap` and the collectives.
//!
//! A shard_map is one `sdy.manual_computation(inputs) in_shardings=[...] out_shardings=[...]
//! manual_axes={every mesh axis} (block arguments) { body; sdy.return blocks } : (global
//! types) -> (global types)`. Inside it the collectives are the generic StableHLO ops
//! `all_reduce`, `all_gather`, `reduce_scatter` and `all_to_all` over the mesh's device groups
//! (`replica_groups`: the grid positions that differ only in the collective's axes, each group
//! in position order, which for one axis is coordinate order), each with its own
//! `channel_handle` (type 1, device to device) and, where the op has it,
//! `use_global_device_ids`, so that the groups name partitions (one replica). A stacked
//! all_gather reshapes its operand to insert the new dimension first. `axis_index` is
//! `(partition_id / stride) % size`, `stride` being the product of the sizes of the axes after
//! it (positions are row-major over the axes).

use super::literal::tensor_type;
use super::{graph_err, sharding, Inst, Lowering};
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::{ReduceKind, Region};
use crate::sharding::{Mesh, PartitionSpec};

/// `dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>`.
fn replica_groups(mesh: &Mesh, axes: &[String]) -> String {
    let groups = mesh.groups(axes);
    let rows: Vec<String> = groups
        .iter()
        .map(|g| {
            let items: Vec<String> = g.iter().map(|p| p.to_string()).collect();
            format!("[{}]", items.join(", "))
        })
        .collect();
    let size = groups.first().map_or(0, Vec::len);
    format!(
        "replica_groups = dense<[{}]> : tensor<{}x{size}xi64>",
        rows.join(", "),
        groups.len()
    )
}

/// The StableHLO op combining two elements for `kind`.
fn combiner(kind: ReduceKind) -> &'static str {
    match kind {
        ReduceKind::Sum => "stablehlo.add",
        ReduceKind::Prod => "stablehlo.multiply",
        ReduceKind::Max => "stablehlo.maximum",
        ReduceKind::Min => "stablehlo.minimum",
    }
}

impl<'g> Lowering<'g> {
    /// A fresh channel id.
    fn channel(&mut self) -> String {
        self.channels += 1;
        format!(
            "channel_handle = #stablehlo.channel_handle<handle = {}, type = 1>",
            self.channels
        )
    }

    /// Emits the shard_map `n` over region `body` and returns the names of its results.
    pub(super) fn shard_map(
        &mut self,
        n: &Inst,
        body: usize,
        mesh: &Mesh,
        specs: [&[PartitionSpec]; 2],
    ) -> Result<Vec<String>> {
        let [in_specs, out_specs] = specs;
        if self.mesh.as_ref() != Some(mesh) {
            return Err(graph_err(format!(
                "a shard_map was built over mesh {mesh:?}, but the graph's mesh is {:?}",
                self.mesh
            )));
        }
        let regions: &'g [Region] = self.regions;
        let region = &regions[body];
        let shardings = |specs: &[PartitionSpec], types: &[&TensorType]| -> String {
            let items: Vec<String> = specs
                .iter()
                .zip(types)
                .map(|(s, t)| sharding::dims(s, t.dims.len()))
                .collect();
            format!("[{}]", items.join(", "))
        };
        let outs: Vec<&TensorType> = n.outs.iter().collect();
        let axes: Vec<String> = mesh.axes().map(|(a, _)| format!("\"{a}\"")).collect();
        let mut args = Vec::with_capacity(region.args.len());
        for a in &region.args {
            let name = format!("%v{}", a.node);
            args.push(format!("{name}: {}", tensor_type(self.ty(*a)?)));
            self.names[a.node] = vec![name];
        }
        let (result, names) = n.results();
        self.emit(format!(
            "{result} = sdy.manual_computation({}) in_shardings={} out_shardings={} \
             manual_axes={{{}}} ({}) {{",
            n.ins.join(", "),
            shardings(in_specs, &n.tys),
            shardings(out_specs, &outs),
            axes.join(", "),
            args.join(", ")
        ));
        self.depth += 1;
        self.region_nodes(body)?;
        let results = region
            .results
            .iter()
            .map(|&v| self.value(v))
            .collect::<Result<Vec<_>>>()?;
        let result_types = region
            .results
            .iter()
            .map(|&v| self.ty(v).map(tensor_type))
            .collect::<Result<Vec<_>>>()?;
        self.emit(format!(
            "sdy.return {} : {}",
            results.join(", "),
            result_types.join(", ")
        ));
        self.depth -= 1;
        let ins: Vec<String> = n.tys.iter().map(|t| tensor_type(t)).collect();
        let outs: Vec<String> = outs.iter().map(|t| tensor_type(t)).collect();
        self.emit(format!(
            "}} : ({}) -> ({})",
            ins.join(", "),
            outs.join(", ")
        ));
        Ok(names)
    }

    /// The region `({ ^bb0(a, b): c = op a, b; return c })` combining elements of `dtype`.
    fn combining_region(&mut self, res: &str, dtype: DType, kind: ReduceKind) {
        let scalar = tensor_type(&TensorType::new(dtype, &[]));
        self.emit_inner(format!("^bb0({res}_a: {scalar}, {res}_b: {scalar}):"));
        self.emit_inner(format!(
            "  {res}_c = {} {res}_a, {res}_b : {scalar}",
            combiner(kind)
        ));
        self.emit_inner(format!("  stablehlo.return {res}_c : {scalar}"));
    }

    /// `stablehlo.all_reduce` over the groups of `axes`.
    pub(super) fn all_reduce(
        &mut self,
        n: &Inst,
        kind: ReduceKind,
        axes: &[String],
        mesh: &Mesh,
    ) -> String {
        let channel = self.channel();
        self.emit(format!(
            "{} = \"stablehlo.all_reduce\"({}) ({{",
            n.res, n.ins[0]
        ));
        self.combining_region(&n.res, n.out().dtype, kind);
        self.emit(format!(
            "}}) {{{channel}, {}, use_global_device_ids}} : {}",
            replica_groups(mesh, axes),
            n.sig()
        ));
        n.res.clone()
    }

    /// `stablehlo.all_gather` along `dim` over the devices of `axis`; a stacked gather first
    /// inserts dimension `dim` of size 1.
    pub(super) fn all_gather(
        &mut self,
        n: &Inst,
        axis: &str,
        dim: usize,
        tiled: bool,
        mesh: &Mesh,
    ) -> String {
        let mut x = n.ins[0].clone();
        let mut x_ty = n.tys[0].clone();
        if !tiled {
            let mut dims = x_ty.dims.clone();
            dims.insert(dim, 1);
            let to = TensorType::new(x_ty.dtype, &dims);
            let name = format!("{}_stacked", n.res);
            self.emit(format!(
                "{name} = stablehlo.reshape {x} : ({}) -> {}",
                tensor_type(&x_ty),
                tensor_type(&to)
            ));
            x = name;
            x_ty = to;
        }
        let channel = self.channel();
        self.emit(format!(
            "{} = \"stablehlo.all_gather\"({x}) {{all_gather_dim = {dim} : i64, {channel}, {}, \
             use_global_device_ids}} : ({}) -> {}",
            n.res,
            replica_groups(mesh, &[axis.to_string()]),
            tensor_type(&x_ty),
            n.out_t()
        ));
        n.res.clone()
    }

    /// `stablehlo.reduce_scatter` (sum) along `dim` over the devices of `axis`.
    pub(super) fn reduce_scatter(
        &mut self,
        n: &Inst,
        axis: &str,
        dim: usize,
        mesh: &Mesh,
    ) -> String {
        let channel = self.channel();
        self.emit(format!(
            "{} = \"stablehlo.reduce_scatter\"({}) ({{",
            n.res, n.ins[0]
        ));
        self.combining_region(&n.res, n.out().dtype, ReduceKind::Sum);
        self.emit(format!(
            "}}) {{{channel}, {}, scatter_dimension = {dim} : i64, use_global_device_ids}} : {}",
            replica_groups(mesh, &[axis.to_string()]),
            n.sig()
        ));
        n.res.clone()
    }

    /// `stablehlo.all_to_all` over the devices of `axis`.
    pub(super) fn all_to_all(
        &mut self,
        n: &Inst,
        axis: &str,
        dims: [usize; 2],
        mesh: &Mesh,
    ) -> String {
        let [split, concat] = dims;
        let channel = self.channel();
        let count = mesh.axis_size(axis).unwrap_or(1);
        self.emit(format!(
            "{} = \"stablehlo.all_to_all\"({}) {{{channel}, concat_dimension = {concat} : i64, \
             {}, split_count = {count} : i64, split_dimension = {split} : i64}} : {}",
            n.res,
            n.ins[0],
            replica_groups(mesh, &[axis.to_string()]),
            n.sig()
        ));
        n.res.clone()
    }

    /// `(partition_id / stride) % size` as an `i32[]`.
    pub(super) fn axis_index(&mut self, n: &Inst, axis: &str, mesh: &Mesh) -> String {
        let mut stride = 1usize;
        let mut size = 1usize;
        for (a, s) in mesh.axes().collect::<Vec<_>>().into_iter().rev() {
            if a == axis {
                size = s;
                break;
            }
            stride *= s;
        }
        let r = &n.res;
        self.emit(format!("{r}_pid = stablehlo.partition_id : tensor<ui32>"));
        self.emit(format!(
            "{r}_id = stablehlo.convert {r}_pid : (tensor<ui32>) -> tensor<i32>"
        ));
        self.emit(format!(
            "{r}_stride = stablehlo.constant dense<{stride}> : tensor<i32>"
        ));
        self.emit(format!(
            "{r}_size = stablehlo.constant dense<{size}> : tensor<i32>"
        ));
        self.emit(format!(
            "{r}_q = stablehlo.divide {r}_id, {r}_stride : tensor<i32>"
        ));
        self.emit(format!(
            "{r} = stablehlo.remainder {r}_q, {r}_size : tensor<i32>"
        ));
        r.clone()
    }
}
