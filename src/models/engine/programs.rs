//! A family's weights on the device, its compiled programs, how a program is called (by its
//! parameters' names, [`call`]), and the checks of its weights.

use std::collections::HashMap;
use std::sync::Mutex;

use super::placement::Placement;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::ops::Graph;
use crate::runtime::{Client, ShardedBuffer};
use crate::sharding::Sharding;
use crate::target::Target;

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

/// A program input: an array on the host (uploaded as the program lays it out) or a buffer
/// already on the device (passed as it is, or moved when laid out otherwise).
pub(crate) enum Value {
    /// On the host.
    Host(HostArray),
    /// On the device.
    Device(ShardedBuffer),
}

impl Value {
    /// The value on the host (downloaded when on the device).
    pub(crate) fn into_host(self) -> Result<HostArray> {
        match self {
            Value::Host(a) => Ok(a),
            Value::Device(b) => b.to_host_array(),
        }
    }

    /// The value on the device (uploaded to `client`'s first device when on the host).
    pub(crate) fn into_device(self, client: &Client) -> Result<ShardedBuffer> {
        match self {
            Value::Host(a) => client.sharded_buffer_from_host_array(&a, &Sharding::single()),
            Value::Device(b) => Ok(b),
        }
    }
}

/// An input by the name of the program parameter it is.
pub(crate) type Named = (String, Value);

/// Runs `program` on `weights` (its first parameters) and `inputs` by name (see
/// [`CompiledGraph::run_named`]): each input laid out as its parameter is, host arrays
/// uploaded, device buffers laid out otherwise moved through the host (a state read from a
/// file onto one device, given to a model over several). The outputs stay on the device.
pub(crate) fn call(
    client: &Client,
    program: &CompiledGraph,
    weights: &[&ShardedBuffer],
    inputs: Vec<Named>,
) -> Result<Vec<ShardedBuffer>> {
    let names = program.parameter_names();
    let layout = |name: &str| {
        names
            .iter()
            .skip(weights.len())
            .position(|n| n == name)
            .and_then(|i| program.input_shardings().get(weights.len() + i))
            .cloned()
            .unwrap_or_else(Sharding::single)
    };
    let placed = inputs
        .into_iter()
        .map(|(name, v)| {
            let want = layout(&name);
            let b = match v {
                Value::Host(a) => client.sharded_buffer_from_host_array(&a, &want)?,
                Value::Device(b) if *b.sharding() == want => b,
                Value::Device(b) => {
                    client.sharded_buffer_from_host_array(&b.to_host_array()?, &want)?
                }
            };
            Ok((name, b))
        })
        .collect::<Result<Vec<_>>>()?;
    let named: Vec<(&str, &ShardedBuffer)> = placed.iter().map(|(n, b)| (n.as_str(), b)).collect();
    program.run_named(weights, &named)
}

/// A model's compiled programs by what they compute (`K`), and its weights on the device (or
/// split over several, as a [`Placement`] says), which every program takes first.
pub(crate) struct Programs<K> {
    client: Client,
    weights: Vec<ShardedBuffer>,
    /// The weights' names and types, in order.
    types: Vec<(String, TensorType)>,
    placement: Option<Placement>,
    /// Where the programs run (decided once from the client).
    target: Target,
    cache: Mutex<HashMap<K, CompiledGraph>>,
    /// The engine's own programs (serving slots' inserts and extracts), by name.
    named: Mutex<HashMap<String, CompiledGraph>>,
}

impl<K: std::hash::Hash + Eq> Programs<K> {
    /// No programs yet; `weights` (by name) uploaded to `client`'s first device, or split over
    /// its devices as `placement` says.
    pub(crate) fn upload(
        client: &Client,
        weights: &[(String, &HostArray)],
        placement: Option<Placement>,
    ) -> Result<Self> {
        if let Some(p) = &placement {
            client.check_mesh(p.mesh())?;
        }
        let buffers = weights
            .iter()
            .map(|(name, a)| {
                let sharding = match &placement {
                    Some(p) => p.sharding(&p.weight_spec(name, &a.ty()))?,
                    None => Sharding::single(),
                };
                client.sharded_buffer_from_host_array(a, &sharding)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Programs {
            client: client.clone(),
            weights: buffers,
            types: weights.iter().map(|(n, a)| (n.clone(), a.ty())).collect(),
            placement,
            target: Target::of(client),
            cache: Mutex::new(HashMap::new()),
            named: Mutex::new(HashMap::new()),
        })
    }

    /// The weights on the device, in the order every program takes them first.
    pub(crate) fn weight_buffers(&self) -> Vec<&ShardedBuffer> {
        self.weights.iter().collect()
    }

    /// Where the programs run, decided once from the client.
    pub(crate) fn target(&self) -> Target {
        self.target
    }

    /// The devices the model spans.
    pub(crate) fn devices(&self) -> usize {
        self.placement.as_ref().map_or(1, Placement::devices)
    }

    /// The bytes of the weights on each device.
    pub(crate) fn weight_bytes(&self) -> usize {
        self.weights
            .iter()
            .map(ShardedBuffer::bytes_per_device)
            .sum()
    }

    /// The dtype of the matrices: that of the largest weight (f32 when there is none).
    pub(crate) fn matmul_dtype(&self) -> crate::dtype::DType {
        self.types
            .iter()
            .max_by_key(|(_, t)| t.element_count())
            .map_or(crate::dtype::DType::F32, |(_, t)| t.dtype)
    }

    /// Forgets the compiled programs (after a setting that changes them).
    pub(crate) fn clear(&mut self) {
        self.cache = Mutex::new(HashMap::new());
    }

    /// Builds the programs for `target` from now on (forgetting those compiled).
    pub(crate) fn set_target(&mut self, target: Target) {
        self.target = target;
        self.clear();
    }

    /// The program `key` of `batch` rows, compiled from the graph `build` returns (its
    /// outputs set) on first use, placed on the model's devices.
    pub(crate) fn get(
        &self,
        key: K,
        batch: usize,
        build: impl FnOnce() -> Result<Graph>,
    ) -> Result<CompiledGraph> {
        if let Some(p) = &self.placement {
            p.check_batch(batch)?;
        }
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| Error::InvalidArgument("a program cache was poisoned".into()))?;
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let g = build()?;
        if let Some(p) = &self.placement {
            p.apply(&g, &self.types, batch)?;
        }
        let program = g.compile(&self.client)?;
        cache.insert(key, program.clone());
        Ok(program)
    }

    /// Runs `program` on the weights and `inputs` by name ([`call`]), downloading its
    /// outputs.
    pub(crate) fn run(
        &self,
        program: &CompiledGraph,
        inputs: Vec<Named>,
    ) -> Result<Vec<HostArray>> {
        call(&self.client, program, &self.weight_buffers(), inputs)?
            .iter()
            .map(ShardedBuffer::to_host_array)
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
    /// The devices the weights span.
    fn devices(&self) -> usize;
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

    /// The devices the weights span.
    fn devices(&self) -> usize {
        Programs::devices(self)
    }
}
