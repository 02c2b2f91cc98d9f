//! The one place where graphs meet the runtime: lower a [`Graph`], compile it through a
//! [`Client`], and run it on host arrays or device buffers.

use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ops::Graph;
use crate::runtime::{Buffer, Client, Executable};

/// A graph compiled for one client. `Send + Sync`; cheap to clone.
#[derive(Clone, Debug)]
pub struct CompiledGraph {
    exe: Executable,
    params: Vec<TensorType>,
    /// The parameters' names, for errors.
    names: Vec<String>,
    outputs: Vec<TensorType>,
    text: String,
}

impl Graph {
    /// The graph as a StableHLO module in MLIR text (needs outputs; see [`Graph::set_outputs`]).
    pub fn to_stablehlo(&self) -> Result<String> {
        crate::lower::to_stablehlo(self)
    }

    /// Lowers and compiles the graph for `client`. The compiled program's output types are
    /// checked against the types the graph inferred.
    pub fn compile(&self, client: &Client) -> Result<CompiledGraph> {
        let text = self.to_stablehlo()?;
        let exe = client.compile(&text)?;
        let outputs = self.output_types();
        if exe.output_types() != outputs.as_slice() {
            return Err(Error::InvalidArgument(format!(
                "the compiled program returns {:?} but the graph inferred {:?}; this is a \
                 stablegraph lowering bug",
                exe.output_types(),
                outputs
            )));
        }
        Ok(CompiledGraph {
            exe,
            params: self.parameter_types(),
            names: self.parameter_names(),
            outputs,
            text,
        })
    }

    /// Evaluates the graph on the host with the reference interpreter.
    pub fn evaluate(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
        crate::interp::evaluate(self, inputs)
    }
}

impl CompiledGraph {
    /// Uploads `inputs` (one per parameter, matching its type), runs, and downloads the outputs.
    /// An input of the wrong type is an error naming the parameter, as in [`Graph::evaluate`].
    pub fn run(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
        self.check_inputs(inputs.iter().map(|x| (x.dtype(), x.dims())))?;
        let client = self.exe.client();
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
    /// wrong type is an error naming the parameter, as in [`CompiledGraph::run`].
    pub fn run_buffers(&self, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
        self.check_inputs(inputs.iter().map(|b| (b.dtype(), b.dims())))?;
        self.exe.execute(inputs)
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
