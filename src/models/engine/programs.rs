//! A family's weights on the device and its compiled programs, and the checks of its weights.

use crate::array::HostArray;
use crate::error::{Error, Result};
use crate::ops::Graph;

/// Checks host weights against the types a model expects (by name, in order); an error names
/// `family` and every tensor of the wrong dtype or shape.
pub(crate) fn check_weight_types(
    family: &str,
    want: &[(String, &crate::dtype::TensorType)],
    got: &[(String, &HostArray)],
) -> Result<()> {
    let mut wrong: Vec<String> = Vec::new();
    if want.len() != got.len() {
        wrong.push(format!("{} tensors, expected {}", got.len(), want.len()));
    }
    for ((name, ty), (_, a)) in want.iter().zip(got) {
        if a.dtype() != ty.dtype || a.dims() != ty.dims.as_slice() {
            wrong.push(format!(
                "{name} is {:?} {:?}, expected {ty}",
                a.dtype(),
                a.dims()
            ));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{family} weights do not fit the config: {}",
        wrong.join("; ")
    )))
}

/// A model's compiled programs by what they compute (`K`), and its weights on the device,
/// which every program takes first.
pub(crate) struct Programs<K> {
    client: crate::runtime::Client,
    weights: Vec<crate::runtime::Buffer>,
    cache: std::sync::Mutex<std::collections::HashMap<K, crate::compiled::CompiledGraph>>,
    /// The engine's own programs (serving slots' inserts and extracts), by name.
    named: std::sync::Mutex<std::collections::HashMap<String, crate::compiled::CompiledGraph>>,
}

impl<K: std::hash::Hash + Eq> Programs<K> {
    /// No programs yet, for `weights` on `client`'s first device.
    pub(crate) fn new(
        client: &crate::runtime::Client,
        weights: Vec<crate::runtime::Buffer>,
    ) -> Self {
        Programs {
            client: client.clone(),
            weights,
            cache: std::sync::Mutex::new(std::collections::HashMap::new()),
            named: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The bytes of the weights on the device.
    pub(crate) fn weight_bytes(&self) -> usize {
        self.weights
            .iter()
            .map(|b| b.element_count() * b.dtype().size_in_bytes())
            .sum()
    }

    /// The dtype of the matrices: that of the largest weight (f32 when there is none).
    pub(crate) fn matmul_dtype(&self) -> crate::dtype::DType {
        self.weights
            .iter()
            .max_by_key(|b| b.element_count())
            .map_or(crate::dtype::DType::F32, |b| b.dtype())
    }

    /// Forgets the compiled programs (after a setting that changes them).
    pub(crate) fn clear(&mut self) {
        self.cache = std::sync::Mutex::new(std::collections::HashMap::new());
    }

    /// The program `key`, compiled from the graph `build` returns (its outputs set) on first
    /// use.
    pub(crate) fn get(
        &self,
        key: K,
        build: impl FnOnce() -> Result<Graph>,
    ) -> Result<crate::compiled::CompiledGraph> {
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| Error::InvalidArgument("a program cache was poisoned".into()))?;
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let program = build()?.compile(&self.client)?;
        cache.insert(key, program.clone());
        Ok(program)
    }

    /// Runs `program` on the weights and `inputs` (uploaded), downloading its outputs.
    pub(crate) fn run(
        &self,
        program: &crate::compiled::CompiledGraph,
        inputs: &[HostArray],
    ) -> Result<Vec<HostArray>> {
        let uploaded = inputs
            .iter()
            .map(|a| self.client.buffer_from_host_array(a))
            .collect::<Result<Vec<_>>>()?;
        let mut args: Vec<&crate::runtime::Buffer> = self.weights.iter().collect();
        args.extend(uploaded.iter());
        program
            .run_buffers(&args)?
            .iter()
            .map(crate::runtime::Buffer::to_host_array)
            .collect()
    }
}

/// A family's weights and programs on the device, whatever its program keys: what the
/// engine's own programs (serving slots) need.
pub(crate) trait Device {
    /// The engine's program `key` (taking no weights), compiled from the graph `build` returns
    /// on first use.
    fn named(
        &self,
        key: &str,
        build: &mut dyn FnMut() -> Result<Graph>,
    ) -> Result<crate::compiled::CompiledGraph>;
    /// How many programs have been compiled (the family's and the engine's).
    fn compiled(&self) -> usize;
    /// The client the weights live on.
    fn client(&self) -> &crate::runtime::Client;
    /// Runs `program` on the weights and `inputs`, all on the device, returning its outputs
    /// there.
    fn run_on_device(
        &self,
        program: &crate::compiled::CompiledGraph,
        inputs: &[&crate::runtime::Buffer],
    ) -> Result<Vec<crate::runtime::Buffer>>;
}

impl<K: std::hash::Hash + Eq> Device for Programs<K> {
    /// The engine's program `key` (taking no weights), compiled from the graph `build` returns
    /// on first use.
    fn named(
        &self,
        key: &str,
        build: &mut dyn FnMut() -> Result<Graph>,
    ) -> Result<crate::compiled::CompiledGraph> {
        let mut cache = self
            .named
            .lock()
            .map_err(|_| Error::InvalidArgument("a program cache was poisoned".into()))?;
        if let Some(p) = cache.get(key) {
            return Ok(p.clone());
        }
        let program = build()?.compile(&self.client)?;
        cache.insert(key.to_string(), program.clone());
        Ok(program)
    }

    /// How many programs have been compiled (the family's and the engine's).
    fn compiled(&self) -> usize {
        let count = |n: std::result::Result<usize, ()>| n.unwrap_or(0);
        count(self.cache.lock().map(|c| c.len()).map_err(|_| ()))
            + count(self.named.lock().map(|c| c.len()).map_err(|_| ()))
    }

    /// The client the weights live on.
    fn client(&self) -> &crate::runtime::Client {
        &self.client
    }

    /// Runs `program` on the weights and `inputs`, all on the device, returning its outputs
    /// there.
    fn run_on_device(
        &self,
        program: &crate::compiled::CompiledGraph,
        inputs: &[&crate::runtime::Buffer],
    ) -> Result<Vec<crate::runtime::Buffer>> {
        let mut args: Vec<&crate::runtime::Buffer> = self.weights.iter().collect();
        args.extend(inputs);
        program.run_buffers(&args)
    }
}
