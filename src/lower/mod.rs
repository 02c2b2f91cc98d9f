//! Lowering a [`Graph`] to a StableHLO module in MLIR text.
//!
//! [`to_stablehlo`] is a pure function of the graph: no plugin is needed to lower, and the text
//! is meant to be read. Parameters become the arguments of `@main`, named `%p<k>_<name>`; the
//! node that defines a value is named `%v<node>` (results of multi-result ops `%v<node>#<k>`;
//! helper values of a node `%v<node>_<what>`); only nodes that the outputs depend on are emitted,
//! in node order. Simple ops use StableHLO's pretty syntax (a reduction by one op too:
//! `stablehlo.reduce(%x init: %c) applies stablehlo.add across dimensions = [1]`); ops whose region
//! has more than one op (float max/min reductions, arg-reductions, cumsum's window, sorts) and
//! gathers use the generic form.
//!
//! Loops: a `While` node is one generic `"stablehlo.while"(state) ({ ^bb0(args): cond }, {
//! ^bb0(args): body })`. Each region holds the live nodes whose `region` it is (those its results
//! depend on, nested loops included), in node order; its block arguments are named `%v<node>`
//! like other values, and lines are indented two more spaces per level of nesting. Every operand
//! must be defined in its user's region (the DSL captures outer values as loop state), and only
//! region 0 has parameters.
//!
//! A `ShardMap` is one `sdy.manual_computation` whose body region is emitted the same way, and
//! the collectives inside it are generic StableHLO collectives (see `collectives`).
//!
//! The lowering reads each node's recorded types and never re-checks them: the graph's walk
//! ([`crate::ops`]'s `live_nodes`, which runs every live node's rule) has done that. One emitter
//! per primitive, grouped by family as in the interpreter: `elementwise`, `shape`, `index`,
//! `reduce` (sorts too), `linalg`, `control` (loops); each family's module says the choices the
//! op semantics (see [`crate::ops::Op`]) force there. Constants: small ones element by element
//! (floats as the shortest decimal that reads back bit-exactly), large ones as one hex string;
//! `Pred` never in hex.
//!
//! The text is accepted by StableHLO 1.13 (the `xla-cpu-pjrt` plugin) through 1.20
//! (`lammps-jax-pjrt-cpu`).

mod collectives;
mod control;
mod elementwise;
mod index;
mod linalg;
mod literal;
mod reduce;
mod shape;
mod sharding;
#[cfg(test)]
mod tests;

use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::ops::GraphShardings;
use crate::ops::{live_nodes, Graph, Node, Op, Region, ValueId};
use crate::sharding::{Mesh, Sharding};
use literal::{signature, tensor_type};

/// Lowers `graph` to one StableHLO module, `module @stablegraph`, whose `func.func public @main`
/// takes the graph's parameters in order and returns its outputs in order.
///
/// Fails with [`Error::InvalidArgument`] when the graph has no outputs, when a donated parameter
/// has no output to alias, or when the graph is malformed (only graphs built below the DSL can
/// be): an operand defined after its user or in another region, a node whose recorded types are
/// not the ones its op's rule gives, a loop whose regions do not fit its state (see
/// [`crate::ops`]'s walk and rules, which the lowering relies on).
pub fn to_stablehlo(graph: &Graph) -> Result<String> {
    let params = graph.parameters();
    let outputs = graph.outputs();
    if outputs.is_empty() {
        return Err(Error::InvalidArgument(
            "cannot lower a graph without outputs: call Graph::set_outputs first".to_string(),
        ));
    }
    let aliases = graph.output_aliases()?;
    let shardings = graph.shardings()?;
    graph.with_structure(|nodes, regions| {
        let order = live_nodes(nodes, regions, &params, &outputs).map_err(graph_err)?;
        Lowering::new(nodes, regions, order).module(&params, &outputs, &aliases, shardings.as_ref())
    })
}

/// The state of one lowering: the nodes, the SSA names given to values so far, and the body text.
struct Lowering<'g> {
    nodes: &'g [Node],
    regions: &'g [Region],
    /// The SSA names of each node's outputs; empty until the node is emitted.
    names: Vec<Vec<String>>,
    /// The live nodes of each region other than block arguments, in node order (from
    /// [`live_nodes`], which checked them).
    order: Vec<Vec<usize>>,
    /// How many regions deep the next line is.
    depth: usize,
    body: String,
    /// The graph's mesh, for a program over one.
    mesh: Option<Mesh>,
    /// The channel ids given to collectives so far.
    channels: usize,
}

/// One node being emitted: the SSA name of its result, its operands' names and types, and its
/// output types. Each family's emitter writes its lines and returns the names of the outputs.
struct Inst<'g> {
    /// `%v<node>`; helper values are `%v<node>_<what>`.
    res: String,
    ins: Vec<String>,
    tys: Vec<&'g TensorType>,
    outs: &'g [TensorType],
}

impl<'g> Inst<'g> {
    /// The (first) output type.
    fn out(&self) -> &'g TensorType {
        &self.outs[0]
    }

    /// `tensor<...>` of the output.
    fn out_t(&self) -> String {
        tensor_type(self.out())
    }

    /// For an op of several results: the name it binds (`%v3:2`; `%v3` for one result) and the
    /// names of its results (`%v3#0`, `%v3#1`; `%v3`).
    fn results(&self) -> (String, Vec<String>) {
        let count = self.outs.len();
        if count == 1 {
            return (self.res.clone(), vec![self.res.clone()]);
        }
        let names = (0..count).map(|k| format!("{}#{k}", self.res)).collect();
        (format!("{}:{count}", self.res), names)
    }

    /// `(operand types) -> output type`.
    fn sig(&self) -> String {
        signature(&self.tys, self.out())
    }
}

/// An [`Error::InvalidArgument`] about the graph as a whole.
fn graph_err(message: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("cannot lower the graph: {message}"))
}

/// `name` with every character MLIR does not allow in an SSA name replaced by `_`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl<'g> Lowering<'g> {
    fn new(nodes: &'g [Node], regions: &'g [Region], order: Vec<Vec<usize>>) -> Self {
        Lowering {
            nodes,
            regions,
            names: vec![Vec::new(); nodes.len()],
            order,
            depth: 0,
            body: String::new(),
            mesh: None,
            channels: 0,
        }
    }

    /// The whole module. `aliases[k]` is the output that donated parameter `k` is aliased to;
    /// `sharded` is the mesh and each parameter's and output's layout, for a program over a mesh.
    fn module(
        mut self,
        params: &[ValueId],
        outputs: &[ValueId],
        aliases: &[Option<usize>],
        sharded: Option<&GraphShardings>,
    ) -> Result<String> {
        self.mesh = sharded.map(|s| s.mesh.clone());
        let args = self.arguments(params, aliases, sharded.map(|s| s.parameters.as_slice()));
        self.region_nodes(0)?;
        let mut results = Vec::with_capacity(outputs.len());
        let mut types = Vec::with_capacity(outputs.len());
        let mut result_types = Vec::with_capacity(outputs.len());
        for (k, &o) in outputs.iter().enumerate() {
            results.push(self.value(o)?);
            let ty = self.ty(o)?;
            types.push(tensor_type(ty));
            result_types.push(match sharded.and_then(|s| s.outputs.get(k)) {
                Some(layout) => format!(
                    "{} {{{}}}",
                    tensor_type(ty),
                    sharding::attribute(layout.spec(), ty.dims.len())
                ),
                None => tensor_type(ty),
            });
        }
        let result_types = if result_types.len() == 1 && sharded.is_none() {
            result_types[0].clone()
        } else {
            format!("({})", result_types.join(", "))
        };
        let header = match sharded.map(|s| &s.mesh) {
            Some(mesh) => format!(
                "module @stablegraph attributes {{mhlo.num_partitions = {} : i32, \
                 mhlo.num_replicas = 1 : i32}} {{\n  {}\n",
                mesh.size(),
                sharding::mesh_line(mesh)
            ),
            None => "module @stablegraph {\n".to_string(),
        };
        Ok(format!(
            "{header}  func.func public @main({}) -> {result_types} {{\n{}    \
             return {} : {}\n  }}\n}}\n",
            args.join(", "),
            self.body,
            results.join(", "),
            types.join(", ")
        ))
    }

    /// The arguments of `@main`, `%p<k>_<name>: type` (with `tf.aliasing_output` for a donated
    /// parameter, and `sdy.sharding` for each parameter of a program over a mesh), naming the
    /// parameter nodes.
    fn arguments(
        &mut self,
        params: &[ValueId],
        aliases: &[Option<usize>],
        layouts: Option<&[Sharding]>,
    ) -> Vec<String> {
        let mut args = Vec::with_capacity(params.len());
        for (k, p) in params.iter().enumerate() {
            let node = &self.nodes[p.node];
            let (Op::Parameter { name, .. }, Some(ty)) = (&node.op, node.outputs.first()) else {
                continue; // `live_nodes` checked the list
            };
            let ssa = format!("%p{k}_{}", sanitize(name));
            let mut attributes = Vec::new();
            if let Some(out) = aliases.get(k).copied().flatten() {
                attributes.push(format!("tf.aliasing_output = {out} : i32"));
            }
            if let Some(layout) = layouts.and_then(|s| s.get(k)) {
                attributes.push(sharding::attribute(layout.spec(), ty.dims.len()));
            }
            if attributes.is_empty() {
                args.push(format!("{ssa}: {}", tensor_type(ty)));
            } else {
                args.push(format!(
                    "{ssa}: {} {{{}}}",
                    tensor_type(ty),
                    attributes.join(", ")
                ));
            }
            self.names[p.node] = vec![ssa];
        }
        args
    }

    /// The type of a value.
    fn ty(&self, v: ValueId) -> Result<&'g TensorType> {
        let nodes: &'g [Node] = self.nodes;
        nodes
            .get(v.node)
            .and_then(|n| n.outputs.get(v.output))
            .ok_or_else(|| graph_err(format!("{v:?} does not exist")))
    }

    /// The SSA name of a value that has been emitted.
    fn value(&self, v: ValueId) -> Result<String> {
        self.names
            .get(v.node)
            .and_then(|n| n.get(v.output))
            .cloned()
            .ok_or_else(|| graph_err(format!("{v:?} is used before it is defined")))
    }

    /// Appends one line of the function body, indented by the current region depth.
    fn emit(&mut self, line: impl AsRef<str>) {
        self.body.push_str("    ");
        for _ in 0..self.depth {
            self.body.push_str("  ");
        }
        self.body.push_str(line.as_ref());
        self.body.push('\n');
    }

    /// Appends one line of a region body (one level deeper).
    fn emit_inner(&mut self, line: impl AsRef<str>) {
        self.body.push_str("  ");
        self.emit(line);
    }

    /// Emits the live nodes of region `r`, in node order.
    fn region_nodes(&mut self, r: usize) -> Result<()> {
        let order = std::mem::take(&mut self.order[r]);
        for &i in &order {
            self.node(i)?;
        }
        Ok(())
    }

    /// Emits node `i` (whose operands are emitted) through its family's emitter and records
    /// the names of its outputs.
    fn node(&mut self, i: usize) -> Result<()> {
        let nodes: &'g [Node] = self.nodes;
        let node = &nodes[i];
        let n = Inst {
            res: format!("%v{i}"),
            ins: node
                .inputs
                .iter()
                .map(|&v| self.value(v))
                .collect::<Result<_>>()?,
            tys: node
                .inputs
                .iter()
                .map(|&v| self.ty(v))
                .collect::<Result<_>>()?,
            outs: &node.outputs,
        };
        let names = match &node.op {
            // Named in the signature, or by the loop that binds it.
            Op::Parameter { .. } | Op::BlockArg => return Ok(()),
            Op::While { cond, body } => self.while_loop(&n, *cond, *body)?,
            Op::Case { branches } => self.case(&n, &node.inputs[1..], branches)?,
            Op::ShardMap {
                body,
                mesh,
                in_specs,
                out_specs,
            } => self.shard_map(&n, *body, mesh, [in_specs, out_specs])?,
            Op::Sort { axis, descending } => self.sort(&n, *axis, *descending),
            Op::OptimizationBarrier => self.optimization_barrier(&n),
            op => vec![self.single(&n, op)?],
        };
        self.names[i] = names;
        Ok(())
    }

    /// Emits `n`, a node of `op` with one result, through its family's emitter; returns the
    /// result's name.
    fn single(&mut self, n: &Inst, op: &Op) -> Result<String> {
        Ok(match op {
            Op::Constant { data } => self.constant(n, data),
            Op::Iota { dim } => self.iota(n, *dim),
            Op::Unary(u) => self.unary(n, *u),
            Op::Binary(b) => self.binary(n, *b),
            Op::Compare(c) => self.compare(n, *c),
            Op::Select => self.select(n),
            Op::Clamp => self.clamp(n),
            Op::Convert => self.convert(n),
            Op::BitcastConvert => self.bitcast_convert(n),
            Op::BroadcastInDim { dims } => self.broadcast_in_dim(n, dims),
            Op::Reshape => self.reshape(n),
            Op::Transpose { perm } => self.transpose(n, perm),
            Op::Slice {
                start,
                limit,
                stride,
            } => self.slice(n, start, limit, stride),
            Op::DynamicSlice { sizes } => self.dynamic_slice(n, sizes),
            Op::DynamicUpdateSlice => self.dynamic_update_slice(n),
            Op::Concatenate { axis } => self.concatenate(n, *axis),
            Op::Pad {
                low,
                high,
                interior,
            } => self.pad(n, low, high, interior),
            Op::Reverse { axes } => self.reverse(n, axes),
            Op::Reduce { kind, axes } => self.reduce(n, *kind, axes),
            Op::ArgReduce { kind, axis } => self.arg_reduce(n, *kind, *axis),
            Op::Cumsum { axis } => self.cumsum(n, *axis),
            Op::DotGeneral {
                lhs_batch,
                rhs_batch,
                lhs_contract,
                rhs_contract,
            } => self.dot_general(n, [lhs_batch, rhs_batch], [lhs_contract, rhs_contract]),
            Op::Convolution(w) => self.convolution(n, w),
            Op::Take => self.take(n),
            Op::ScatterAdd => self.scatter(n, true),
            Op::ScatterSet => self.scatter(n, false),
            Op::ShardingConstraint { spec } => self.sharding_constraint(n, spec),
            Op::AllReduce { kind, axes, mesh } => self.all_reduce(n, *kind, axes, mesh),
            Op::AllGather {
                axis,
                dim,
                tiled,
                mesh,
            } => self.all_gather(n, axis, *dim, *tiled, mesh),
            Op::ReduceScatter { axis, dim, mesh } => self.reduce_scatter(n, axis, *dim, mesh),
            Op::AllToAll {
                axis,
                split_dim,
                concat_dim,
                mesh,
            } => self.all_to_all(n, axis, [*split_dim, *concat_dim], mesh),
            Op::AxisIndex { axis, mesh } => self.axis_index(n, axis, mesh),
            Op::Parameter { .. }
            | Op::BlockArg
            | Op::While { .. }
            | Op::Case { .. }
            | Op::ShardMap { .. }
            | Op::Sort { .. }
            | Op::OptimizationBarrier => {
                return Err(graph_err(format!(
                    "internal: {} is not a one-result op",
                    op.name()
                )))
            }
        })
    }
}
