//! The one place where graphs meet the runtime: lower a [`Graph`], compile it through a
//! [`Client`], and run it on host arrays or device buffers.

use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ops::{Graph, Op};
use crate::runtime::{Buffer, Client, CompileOptions, Executable, ExecuteOptions, ShardedBuffer};
use crate::sharding::Sharding;

/// A graph compiled for one client, on one device or over a mesh of its devices (see
/// [`Graph::set_mesh`]). `Send + Sync`; cheap to clone.
#[derive(Clone, Debug)]
pub struct CompiledGraph {
    exe: Executable,
    params: Vec<TensorType>,
    /// The parameters' names, for errors.
    names: Vec<String>,
    outputs: Vec<TensorType>,
    /// Each parameter's and output's layout ([`Sharding::single`] without a mesh).
    param_shardings: Vec<Sharding>,
    output_shardings: Vec<Sharding>,
    /// Whether the graph has a mesh (runs as an SPMD program).
    sharded: bool,
    text: String,
}

impl Graph {
    /// The graph as a StableHLO module in MLIR text (needs outputs; see [`Graph::set_outputs`]).
    pub fn to_stablehlo(&self) -> Result<String> {
        crate::lower::to_stablehlo(self)
    }

    /// Lowers and compiles the graph for `client`: for device 0, or, for a graph with a mesh,
    /// as one SPMD program over the mesh's devices (XLA's partitioner, the device assignment
    /// from [`crate::Mesh::devices`]). The compiled program's output types (per device) are
    /// checked against the types the graph inferred. A mesh with more devices than the client
    /// is an error.
    pub fn compile(&self, client: &Client) -> Result<CompiledGraph> {
        let text = self.to_stablehlo()?;
        let outputs = self.output_types();
        let params = self.parameter_types();
        let sharded = self.mesh().is_some();
        let (exe, param_shardings, mut output_shardings) = match self.shardings()? {
            None => (
                client.compile(&text)?,
                vec![Sharding::single(); params.len()],
                vec![Sharding::single(); outputs.len()],
            ),
            Some(s) => {
                client.check_mesh(&s.mesh)?;
                refuse_what_aborts_the_partitioner(self)?;
                let devices = client.devices();
                let assignment = s
                    .mesh
                    .devices()
                    .iter()
                    .map(|&d| devices[d].id().map(|id| vec![i64::from(id)]))
                    .collect::<Result<Vec<_>>>()?;
                let options = CompileOptions {
                    num_partitions: s.mesh.size() as i64,
                    spmd: true,
                    device_assignment: Some(assignment),
                    ..CompileOptions::default()
                };
                (
                    client.compile_with(&text, &options)?,
                    s.parameters,
                    s.outputs,
                )
            }
        };
        // XLA does not split an output with no elements: each device returns all of it.
        for (k, (t, s)) in outputs.iter().zip(&mut output_shardings).enumerate() {
            if t.element_count() == 0 && exe.output_types().get(k) == Some(t) {
                *s = Sharding::replicated(s.mesh());
            }
        }
        let local: Vec<TensorType> = outputs
            .iter()
            .zip(&output_shardings)
            .map(|(t, s)| TensorType::new(t.dtype, &s.shard_dims(&t.dims)))
            .collect();
        if exe.output_types() != local.as_slice() {
            return Err(Error::InvalidArgument(format!(
                "the compiled program returns {:?} per device but the graph inferred {:?}; this \
                 is a stablegraph lowering bug",
                exe.output_types(),
                local
            )));
        }
        Ok(CompiledGraph {
            exe,
            params,
            names: self.parameter_names(),
            outputs,
            param_shardings,
            output_shardings,
            sharded,
            text,
        })
    }

    /// Evaluates the graph on the host with the reference interpreter.
    pub fn evaluate(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
        crate::interp::evaluate(self, inputs)
    }
}

/// An error for a graph over a mesh that XLA's SPMD partitioner (in the CPU plugins of
/// 2026-12) aborts the process on instead of refusing: a pad with interior padding and negative
/// edge padding on one dimension (`spmd_partitioner.cc: Check failed:
/// get_first_valid_element_offset_on_dilated_shard(0) == swd->padding_low()` when the padded
/// value is split). Found by the `sharded_graph` fuzz target.
fn refuse_what_aborts_the_partitioner(g: &Graph) -> Result<()> {
    let bad = g.nodes().into_iter().position(|n| match &n.op {
        Op::Pad {
            low,
            high,
            interior,
        } => (0..interior.len()).any(|d| {
            interior[d] > 0
                && (low.get(d).is_some_and(|&l| l < 0) || high.get(d).is_some_and(|&h| h < 0))
        }),
        _ => false,
    });
    match bad {
        Some(node) => Err(Error::InvalidArgument(format!(
            "node {node} pads one dimension with both interior and negative edge padding, which \
             aborts XLA's SPMD partitioner in a program over a mesh; pad without the negative \
             amounts and slice the result instead"
        ))),
        None => Ok(()),
    }
}

impl CompiledGraph {
    /// Uploads `inputs` (one per parameter, matching its type), runs, and downloads the outputs.
    /// An input of the wrong type is an error naming the parameter, as in [`Graph::evaluate`].
    /// A sharded program's inputs are split over the mesh and its outputs gathered.
    pub fn run(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
        self.check_inputs(inputs.iter().map(|x| (x.dtype(), x.dims())))?;
        let client = self.exe.client();
        if self.is_sharded() {
            let buffers = inputs
                .iter()
                .zip(&self.param_shardings)
                .map(|(x, s)| client.sharded_buffer_from_host_array(x, s))
                .collect::<Result<Vec<ShardedBuffer>>>()?;
            let args: Vec<&ShardedBuffer> = buffers.iter().collect();
            return self
                .run_sharded(&args)?
                .iter()
                .map(ShardedBuffer::to_host_array)
                .collect();
        }
        let buffers = inputs
            .iter()
            .map(|x| client.buffer_from_host_array(x))
            .collect::<Result<Vec<Buffer>>>()?;
        let args: Vec<&Buffer> = buffers.iter().collect();
        self.run_buffers(&args)?
            .iter()
            .map(Buffer::to_host_array)
            .collect()
    }

    /// Runs on device buffers and returns device buffers (no host copies). A buffer of the
    /// wrong type is an error naming the parameter, as in [`CompiledGraph::run`]. For a
    /// program on one device; a sharded one takes [`CompiledGraph::run_sharded`].
    pub fn run_buffers(&self, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
        if self.is_sharded() {
            return Err(Error::InvalidArgument(format!(
                "the program runs over a mesh of {} devices: pass sharded buffers to run_sharded",
                self.exe.devices().len()
            )));
        }
        self.check_inputs(inputs.iter().map(|b| (b.dtype(), b.dims())))?;
        self.exe.execute(inputs)
    }

    /// Runs on arrays laid out as the program's parameters are ([`CompiledGraph::input_shardings`];
    /// [`Sharding::single`] for a program without a mesh) and returns its outputs laid out as
    /// [`CompiledGraph::output_shardings`] says, each block on its device (no host copies).
    /// Donated parameters consume every block of their argument. An input of the wrong type or
    /// layout is an error naming the parameter.
    pub fn run_sharded(&self, inputs: &[&ShardedBuffer]) -> Result<Vec<ShardedBuffer>> {
        self.check_inputs(inputs.iter().map(|b| (b.dtype(), b.dims())))?;
        for (i, (x, want)) in inputs.iter().zip(&self.param_shardings).enumerate() {
            if x.sharding() != want {
                let name = self.names.get(i).map_or("?", String::as_str);
                return Err(Error::InvalidArgument(format!(
                    "input {i} is laid out as {} over {:?}, but parameter {i} ({name}) is \
                     laid out as {} over {:?}",
                    x.sharding().spec(),
                    x.sharding().mesh(),
                    want.spec(),
                    want.mesh()
                )));
            }
        }
        let devices = self.exe.devices().len();
        let lists: Vec<Vec<&Buffer>> = (0..devices)
            .map(|p| inputs.iter().map(|x| &x.shards()[p]).collect())
            .collect();
        let per_device = self
            .exe
            .execute_partitioned(&lists, ExecuteOptions::default())?;
        let mut by_output: Vec<Vec<Buffer>> = self.outputs.iter().map(|_| Vec::new()).collect();
        for list in per_device {
            for (k, b) in list.into_iter().enumerate() {
                if let Some(slot) = by_output.get_mut(k) {
                    slot.push(b);
                }
            }
        }
        by_output
            .into_iter()
            .zip(&self.outputs)
            .zip(&self.output_shardings)
            .map(|((shards, ty), s)| ShardedBuffer::from_shards(ty.clone(), s.clone(), shards))
            .collect()
    }

    /// [`CompiledGraph::run_sharded`] with the parameters after the first `leading` (a model's
    /// weights, say) given by name: each parameter takes the input of its name, whatever the
    /// order of `named`. A parameter without an input, an input whose name no parameter has
    /// (or that is given twice), and an input of the wrong dtype, shape or layout are errors
    /// naming it, so two inputs of one type cannot be swapped silently.
    pub fn run_named(
        &self,
        leading: &[&ShardedBuffer],
        named: &[(&str, &ShardedBuffer)],
    ) -> Result<Vec<ShardedBuffer>> {
        let wanted = self.names.get(leading.len()..).unwrap_or_default();
        let mut used = vec![false; named.len()];
        let mut args: Vec<&ShardedBuffer> = leading.to_vec();
        for name in wanted {
            let found = named
                .iter()
                .enumerate()
                .position(|(i, (n, _))| !used[i] && n == name);
            let Some(i) = found else {
                return Err(Error::InvalidArgument(format!(
                    "the program's parameter {name} was given no input"
                )));
            };
            used[i] = true;
            args.push(named[i].1);
        }
        if let Some(i) = used.iter().position(|u| !u) {
            return Err(Error::InvalidArgument(format!(
                "the program has no parameter {} (or it was given twice); its parameters after \
                 the first {} are: {}",
                named[i].0,
                leading.len(),
                wanted.join(", ")
            )));
        }
        self.run_sharded(&args)
    }

    /// The parameters' names, in order.
    pub fn parameter_names(&self) -> &[String] {
        &self.names
    }

    /// Whether the program runs over a mesh (its graph has one; see [`Graph::set_mesh`]).
    pub fn is_sharded(&self) -> bool {
        self.sharded
    }

    /// Each parameter's layout ([`Sharding::single`] for a program without a mesh).
    pub fn input_shardings(&self) -> &[Sharding] {
        &self.param_shardings
    }

    /// Each output's layout (as the graph says, but replicated for an output with no elements,
    /// which XLA does not split).
    pub fn output_shardings(&self) -> &[Sharding] {
        &self.output_shardings
    }

    /// An error unless there is one input per parameter, each of its type; a mismatch names the
    /// parameter by position and name, in the interpreter's words.
    fn check_inputs<'a>(
        &self,
        inputs: impl ExactSizeIterator<Item = (DType, &'a [usize])>,
    ) -> Result<()> {
        if inputs.len() != self.params.len() {
            return Err(Error::InvalidArgument(format!(
                "the graph has {} parameters but {} inputs were given",
                self.params.len(),
                inputs.len()
            )));
        }
        for (i, ((dtype, dims), want)) in inputs.zip(&self.params).enumerate() {
            if dtype != want.dtype || dims != want.dims.as_slice() {
                let name = self.names.get(i).map_or("?", String::as_str);
                return Err(Error::InvalidArgument(format!(
                    "input {i} is {}, but parameter {i} ({name}) is {want}",
                    TensorType::new(dtype, dims)
                )));
            }
        }
        Ok(())
    }

    /// The compiled executable.
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// The StableHLO text that was compiled.
    pub fn stablehlo(&self) -> &str {
        &self.text
    }

    /// Parameter types, in order.
    pub fn parameter_types(&self) -> &[TensorType] {
        &self.params
    }

    /// Output types, in order.
    pub fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }
}
