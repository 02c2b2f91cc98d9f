//! Shardings in the graph: the device mesh a program runs over, a [`PartitionSpec`] per
//! parameter and output, and constraints on intermediate values (JAX's `in_shardings`,
//! `out_shardings` and `with_sharding_constraint`).
//!
//! A graph without a mesh is a one-device program, as before. With a mesh, the lowering writes
//! the specs as Shardy annotations and the program is compiled for every device of the mesh;
//! XLA's SPMD partitioner propagates the layouts to the other values and inserts the collectives.
//! Parameters and outputs without a spec are replicated. The interpreter ignores all of it: a
//! sharded graph means what the same graph without shardings means.

use std::panic::Location;

use super::graph::{graph_error, Graph};
use super::op::Op;
use super::tensor::Tensor;
use super::util;
use crate::error::{Error, Result};
use crate::sharding::{check_spec, Mesh, PartitionSpec, Sharding};

/// What a graph records about its layout over devices.
#[derive(Debug, Clone, Default)]
pub(crate) struct GraphSharding {
    /// The mesh, once set.
    pub(crate) mesh: Option<Mesh>,
    /// `(parameter index, spec)`, one entry per sharded parameter.
    pub(crate) parameters: Vec<(usize, PartitionSpec)>,
    /// One spec per output, when set.
    pub(crate) outputs: Option<Vec<PartitionSpec>>,
    /// The regions that are shard_map bodies, with their mesh.
    pub(crate) manual: Vec<(usize, Mesh)>,
}

impl Graph {
    /// Makes the graph a program over `mesh`'s devices: it is compiled for all of them
    /// (one partition each) and its parameters, outputs and constrained values are laid out as
    /// their specs say. Replaces an earlier mesh; every spec is checked against the mesh again
    /// when the graph is lowered.
    pub fn set_mesh(&self, mesh: &Mesh) {
        self.with_sharding(|s| s.mesh = Some(mesh.clone()));
    }

    /// The mesh, if set.
    pub fn mesh(&self) -> Option<Mesh> {
        self.with_sharding(|s| s.mesh.clone())
    }

    /// Lays out `parameter` over the mesh as `spec` says (replacing an earlier spec). An error
    /// when the graph has no mesh, when `parameter` is not one of its parameters, or when the
    /// spec names an unknown axis or does not divide the parameter's shape.
    #[track_caller]
    pub fn shard_parameter(&self, parameter: &Tensor, spec: &PartitionSpec) -> Result<()> {
        let location = Location::caller();
        self.check_same(parameter, "shard_parameter", location)?;
        let index = self.with_nodes(|nodes| match &nodes[parameter.id().node].op {
            Op::Parameter { index, .. } => Some(*index),
            _ => None,
        });
        let Some(index) = index else {
            return Err(graph_error(
                "shard_parameter",
                format!("{} is not a parameter", parameter.ty()),
                location,
            ));
        };
        self.shard_parameter_at(index, spec, "shard_parameter", location)
    }

    /// [`Graph::shard_parameter`] for the parameter named `name`.
    #[track_caller]
    pub fn shard_parameter_named(&self, name: &str, spec: &PartitionSpec) -> Result<()> {
        let location = Location::caller();
        let op = "shard_parameter_named";
        let Some(index) = self.parameter_names().iter().position(|n| n == name) else {
            return Err(graph_error(
                op,
                format!("the graph has no parameter named {name:?}"),
                location,
            ));
        };
        self.shard_parameter_at(index, spec, op, location)
    }

    fn shard_parameter_at(
        &self,
        index: usize,
        spec: &PartitionSpec,
        op: &'static str,
        location: &'static Location<'static>,
    ) -> Result<()> {
        let ty = self.parameter_types()[index].clone();
        let name = &self.parameter_names()[index];
        self.sharding_of(spec, op, location)?
            .check(&ty, &format!("parameter {index} ({name})"))
            .map_err(|e| graph_error(op, message(e), location))?;
        self.with_sharding(|s| {
            s.parameters.retain(|(i, _)| *i != index);
            s.parameters.push((index, spec.clone()));
        });
        Ok(())
    }

    /// Lays out the outputs over the mesh, one spec per output in order (checked against the
    /// outputs when the graph is lowered). Outputs are replicated unless set here.
    #[track_caller]
    pub fn set_output_shardings(&self, specs: &[PartitionSpec]) -> Result<()> {
        let location = Location::caller();
        for spec in specs {
            self.sharding_of(spec, "set_output_shardings", location)?;
        }
        self.with_sharding(|s| s.outputs = Some(specs.to_vec()));
        Ok(())
    }

    /// Each parameter's spec (replicated when none was given).
    pub fn parameter_specs(&self) -> Vec<PartitionSpec> {
        let count = self.parameters().len();
        self.with_sharding(|s| {
            (0..count)
                .map(|i| {
                    s.parameters
                        .iter()
                        .find(|(k, _)| *k == i)
                        .map(|(_, spec)| spec.clone())
                        .unwrap_or_default()
                })
                .collect()
        })
    }

    /// Each output's spec (replicated when none was given).
    pub fn output_specs(&self) -> Vec<PartitionSpec> {
        let count = self.outputs().len();
        self.with_sharding(|s| match &s.outputs {
            Some(specs) => specs.clone(),
            None => vec![PartitionSpec::replicated(); count],
        })
    }

    /// The layouts the compiled program uses: the mesh, and each parameter's and output's
    /// [`Sharding`], checked against the graph (specs name mesh axes and divide the shapes; one
    /// spec per output). `None` for a graph without a mesh.
    pub fn shardings(&self) -> Result<Option<GraphShardings>> {
        let Some(mesh) = self.mesh() else {
            return Ok(None);
        };
        let outputs = self.output_specs();
        if outputs.len() != self.outputs().len() {
            return Err(Error::InvalidArgument(format!(
                "the graph has {} outputs but set_output_shardings gave {} specs",
                self.outputs().len(),
                outputs.len()
            )));
        }
        let names = self.parameter_names();
        let mut parameters = Vec::new();
        for ((spec, ty), name) in self
            .parameter_specs()
            .iter()
            .zip(self.parameter_types())
            .zip(&names)
        {
            let sharding = Sharding::new(&mesh, spec)?;
            sharding.check(&ty, &format!("parameter {name:?}"))?;
            parameters.push(sharding);
        }
        let mut results = Vec::new();
        for (k, (spec, ty)) in outputs.iter().zip(self.output_types()).enumerate() {
            let sharding = Sharding::new(&mesh, spec)?;
            sharding.check(&ty, &format!("output {k}"))?;
            results.push(sharding);
        }
        Ok(Some(GraphShardings {
            mesh,
            parameters,
            outputs: results,
        }))
    }

    /// The mesh's [`Sharding`] for `spec`, or an error naming `op`.
    fn sharding_of(
        &self,
        spec: &PartitionSpec,
        op: &'static str,
        location: &'static Location<'static>,
    ) -> Result<Sharding> {
        let Some(mesh) = self.mesh() else {
            return Err(graph_error(
                op,
                "the graph has no mesh: call Graph::set_mesh first",
                location,
            ));
        };
        check_spec(&mesh, spec).map_err(|e| graph_error(op, message(e), location))?;
        Sharding::new(&mesh, spec).map_err(|e| graph_error(op, message(e), location))
    }
}

/// The text of an error from [`crate::sharding`], to be prefixed with the op's name.
pub(crate) fn message(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => m,
        other => other.to_string(),
    }
}

/// A graph's mesh and the layout of each parameter and output (see [`Graph::shardings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphShardings {
    /// The mesh the program runs over.
    pub mesh: Mesh,
    /// Each parameter's layout, in order.
    pub parameters: Vec<Sharding>,
    /// Each output's layout, in order.
    pub outputs: Vec<Sharding>,
}

impl Tensor {
    /// The same value, laid out over the graph's mesh as `spec` says (JAX's
    /// `with_sharding_constraint`): XLA's partitioner places it so, and propagates from there.
    /// An error when the graph has no mesh, or the spec names an unknown axis or does not divide
    /// the shape.
    #[track_caller]
    pub fn with_sharding_constraint(&self, spec: &PartitionSpec) -> Result<Tensor> {
        let location = Location::caller();
        let name = "with_sharding_constraint";
        self.graph()
            .sharding_of(spec, name, location)?
            .check(self.ty(), "the value")
            .map_err(|e| graph_error(name, message(e), location))?;
        let op = Op::ShardingConstraint { spec: spec.clone() };
        util::node(self.graph(), op, &[self], name, location)
    }
}
