//! The graph under construction: [`Graph`], a shared handle on the nodes, regions, parameters,
//! outputs and layouts built so far, and the region bookkeeping the builders use (which region
//! is being built, values captured from enclosing ones).

use std::cell::RefCell;
use std::panic::Location;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ir::{Node, Region, ValueId};
use super::op::Op;
use super::tensor::Tensor;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};

static NEXT_GRAPH_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug)]
struct GraphData {
    id: u64,
    /// The nodes, shared copy-on-write: [`Graph::with_nodes`] and [`Graph::with_structure`]
    /// hand their callback a snapshot (an `Rc` clone, no copy) and hold no borrow of the
    /// `RefCell` while it runs, so a callback that builds nodes neither panics nor sees them;
    /// a node added meanwhile copies the vector once (`Rc::make_mut`).
    nodes: Rc<Vec<Node>>,
    params: Vec<ValueId>,
    outputs: Vec<ValueId>,
    /// The regions, shared copy-on-write like `nodes`.
    regions: Rc<Vec<Region>>,
    /// The innermost region being built; new nodes go there.
    current: usize,
    /// Indices of the parameters whose buffers the program may take over (see
    /// [`Graph::donate`]).
    donated: Vec<usize>,
    /// The mesh and the layouts (see [`Graph::set_mesh`]).
    sharding: super::sharding::GraphSharding,
    /// The checkpointed spans (see [`Graph::checkpoint`]).
    checkpoints: Vec<Checkpointed>,
    /// The spans with a differentiation rule of their own (see [`Graph::custom_vjp`]).
    customs: Vec<super::autodiff::CustomRule>,
    /// Where the program will run, when said (see [`Graph::with_target`]).
    target: Option<crate::target::Target>,
}

/// A span of nodes built by [`Graph::checkpoint`]: recomputed in the backward pass.
#[derive(Clone, Debug)]
pub(crate) struct Checkpointed {
    /// The region the span was built in.
    pub(crate) region: usize,
    /// Its first node.
    pub(crate) first: usize,
    /// Its last node.
    pub(crate) last: usize,
}

/// A tensor program under construction: named parameters, nodes, outputs. Cheap to clone (a
/// shared handle to the same graph). Not `Send`: build a graph on one thread; the compiled
/// program it produces is `Send + Sync`.
#[derive(Clone)]
pub struct Graph {
    data: Rc<RefCell<GraphData>>,
}

impl Default for Graph {
    fn default() -> Self {
        Graph::new()
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.data.borrow();
        f.debug_struct("Graph")
            .field("id", &d.id)
            .field("nodes", &d.nodes.len())
            .field("params", &d.params.len())
            .field("outputs", &d.outputs.len())
            .finish()
    }
}

/// Builds a graph error naming the op, what was wrong, and the caller's location.
pub(crate) fn graph_error(
    op: &'static str,
    message: impl Into<String>,
    location: &'static Location<'static>,
) -> Error {
    Error::Graph {
        op,
        message: message.into(),
        location: format!(
            "{}:{}:{}",
            location.file(),
            location.line(),
            location.column()
        ),
    }
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph {
            data: Rc::new(RefCell::new(GraphData {
                id: NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed),
                nodes: Rc::new(Vec::new()),
                params: Vec::new(),
                outputs: Vec::new(),
                regions: Rc::new(vec![Region::default()]),
                current: 0,
                donated: Vec::new(),
                sharding: Default::default(),
                checkpoints: Vec::new(),
                customs: Vec::new(),
                target: None,
            })),
        }
    }

    /// An empty graph for programs that will run on `target`: the models' layers that have a
    /// form per platform (their products with a matrix) choose by it.
    pub fn with_target(target: crate::target::Target) -> Graph {
        let g = Graph::new();
        g.data.borrow_mut().target = Some(target);
        g
    }

    /// Where the program will run: the target the graph was made with, else this host's CPU
    /// ([`crate::target::Target::host`]).
    pub fn target(&self) -> crate::target::Target {
        self.data
            .borrow()
            .target
            .unwrap_or_else(crate::target::Target::host)
    }

    /// This graph's identity (distinct for every graph made in the process).
    pub fn id(&self) -> u64 {
        self.data.borrow().id
    }

    /// Adds a named parameter of the given type. Parameters are the program's inputs, in the
    /// order they are added.
    #[track_caller]
    pub fn parameter(&self, name: &str, dtype: DType, dims: &[usize]) -> Result<Tensor> {
        let location = Location::caller();
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        if !valid {
            return Err(graph_error(
                "parameter",
                format!("name {name:?} must be non-empty ASCII letters, digits, '_' or '.'"),
                location,
            ));
        }
        if self.data.borrow().current != 0 {
            return Err(graph_error(
                "parameter",
                format!("parameter {name:?} is created inside a loop; create it before the loop"),
                location,
            ));
        }
        let index = self.data.borrow().params.len();
        if self.parameter_names().iter().any(|n| n == name) {
            return Err(graph_error(
                "parameter",
                format!("a parameter named {name:?} already exists"),
                location,
            ));
        }
        let op = Op::Parameter {
            index,
            name: name.to_string(),
        };
        let ty = TensorType::new(dtype, dims);
        let t = super::util::typed_node(self, op, &[], ty, "parameter", location)?;
        self.data.borrow_mut().params.push(t.id());
        Ok(t)
    }

    /// The parameter names, in order.
    pub fn parameter_names(&self) -> Vec<String> {
        let d = self.data.borrow();
        d.params
            .iter()
            .map(|p| match &d.nodes[p.node].op {
                Op::Parameter { name, .. } => name.clone(),
                _ => String::new(),
            })
            .collect()
    }

    /// The parameter types, in order.
    pub fn parameter_types(&self) -> Vec<TensorType> {
        let d = self.data.borrow();
        d.params
            .iter()
            .map(|p| d.nodes[p.node].outputs[p.output].clone())
            .collect()
    }

    /// Sets the program's outputs (replacing earlier ones).
    #[track_caller]
    pub fn set_outputs(&self, outputs: &[&Tensor]) -> Result<()> {
        let location = Location::caller();
        for t in outputs {
            self.check_same(t, "set_outputs", location)?;
            if self.region_of(t.id()) != 0 {
                return Err(graph_error(
                    "set_outputs",
                    format!("{} is defined inside a loop, not in the program", t.ty()),
                    location,
                ));
            }
        }
        if self.data.borrow().current != 0 {
            return Err(graph_error(
                "set_outputs",
                "set_outputs is called inside a loop body",
                location,
            ));
        }
        self.data.borrow_mut().outputs = outputs.iter().map(|t| t.id()).collect();
        Ok(())
    }

    /// Marks a parameter as donated: the compiled program may reuse its device buffer for an
    /// output of the same type, so a step program updates a large state in place. The lowering
    /// aliases each donated parameter to the first output of its type not aliased yet
    /// (`tf.aliasing_output`); a device buffer passed for it is consumed by the execution and
    /// cannot be used again (the runtime refuses it with an error).
    #[track_caller]
    pub fn donate(&self, parameter: &Tensor) -> Result<()> {
        let location = Location::caller();
        self.check_same(parameter, "donate", location)?;
        let index = match &self.data.borrow().nodes[parameter.id().node].op {
            Op::Parameter { index, .. } => Some(*index),
            _ => None,
        };
        let Some(index) = index else {
            return Err(graph_error(
                "donate",
                format!("{} is not a parameter", parameter.ty()),
                location,
            ));
        };
        let mut d = self.data.borrow_mut();
        if !d.donated.contains(&index) {
            d.donated.push(index);
            d.donated.sort_unstable();
        }
        Ok(())
    }

    /// The indices of the donated parameters, ascending.
    pub fn donated_parameters(&self) -> Vec<usize> {
        self.data.borrow().donated.clone()
    }

    /// For each parameter, the output it is aliased to: a donated parameter takes the first
    /// output of the same type that no earlier donated parameter took. An error names a donated
    /// parameter that no output can take.
    pub fn output_aliases(&self) -> Result<Vec<Option<usize>>> {
        let params = self.parameter_types();
        let names = self.parameter_names();
        let outputs = self.output_types();
        let mut taken = vec![false; outputs.len()];
        let mut aliases = vec![None; params.len()];
        for &p in &self.data.borrow().donated {
            let slot = outputs
                .iter()
                .enumerate()
                .position(|(k, t)| !taken[k] && *t == params[p]);
            match slot {
                Some(k) => {
                    taken[k] = true;
                    aliases[p] = Some(k);
                }
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "parameter {p} ({:?}, {}) is donated but no output of that type is left to reuse its buffer",
                        names[p], params[p]
                    )))
                }
            }
        }
        Ok(aliases)
    }

    /// The output values.
    pub fn outputs(&self) -> Vec<ValueId> {
        self.data.borrow().outputs.clone()
    }

    /// The output types, in order.
    pub fn output_types(&self) -> Vec<TensorType> {
        let d = self.data.borrow();
        d.outputs
            .iter()
            .map(|o| d.nodes[o.node].outputs[o.output].clone())
            .collect()
    }

    /// A copy of all nodes, in creation (topological) order.
    pub fn nodes(&self) -> Vec<Node> {
        self.data.borrow().nodes.to_vec()
    }

    /// Records a checkpointed span.
    pub(crate) fn add_checkpoint(&self, span: Checkpointed) {
        self.data.borrow_mut().checkpoints.push(span);
    }

    /// The checkpointed spans built in `region`.
    pub(crate) fn checkpoints_in(&self, region: usize) -> Vec<Checkpointed> {
        let d = self.data.borrow();
        d.checkpoints
            .iter()
            .filter(|c| c.region == region)
            .cloned()
            .collect()
    }

    /// Records a span with a differentiation rule of its own.
    pub(crate) fn add_custom(&self, rule: super::autodiff::CustomRule) {
        self.data.borrow_mut().customs.push(rule);
    }

    /// The spans with rules of their own built in `region`.
    pub(crate) fn customs_in(&self, region: usize) -> Vec<super::autodiff::CustomRule> {
        let d = self.data.borrow();
        d.customs
            .iter()
            .filter(|c| c.region == region)
            .cloned()
            .collect()
    }

    /// Calls `f` with the nodes as they are now, without copying them. `f` may keep building
    /// this graph: the nodes it adds are not in the slice it was given.
    pub fn with_nodes<R>(&self, f: impl FnOnce(&[Node]) -> R) -> R {
        // The snapshot is taken and the borrow released before `f` runs.
        let nodes = Rc::clone(&self.data.borrow().nodes);
        f(&nodes)
    }

    /// The parameter values, in order.
    pub fn parameters(&self) -> Vec<ValueId> {
        self.data.borrow().params.clone()
    }

    /// The type of a value.
    pub fn value_type(&self, id: ValueId) -> Option<TensorType> {
        let d = self.data.borrow();
        d.nodes.get(id.node)?.outputs.get(id.output).cloned()
    }

    /// A copy of the regions (index 0 is the program; see [`Region`]).
    pub fn regions(&self) -> Vec<Region> {
        self.data.borrow().regions.to_vec()
    }

    /// Calls `f` with the nodes and the regions as they are now, without copying them. `f` may
    /// keep building this graph: what it adds is not in the slices it was given.
    pub fn with_structure<R>(&self, f: impl FnOnce(&[Node], &[Region]) -> R) -> R {
        // The snapshot is taken and the borrow released before `f` runs.
        let (nodes, regions) = {
            let d = self.data.borrow();
            (Rc::clone(&d.nodes), Rc::clone(&d.regions))
        };
        f(&nodes, &regions)
    }

    /// Reads or changes the graph's mesh and layouts.
    pub(crate) fn with_sharding<R>(
        &self,
        f: impl FnOnce(&mut super::sharding::GraphSharding) -> R,
    ) -> R {
        f(&mut self.data.borrow_mut().sharding)
    }

    pub(crate) fn region_of(&self, v: ValueId) -> usize {
        self.data.borrow().nodes.get(v.node).map_or(0, |n| n.region)
    }

    pub(crate) fn current_region(&self) -> usize {
        self.data.borrow().current
    }

    /// Opens a new region inside the current one and makes it current; returns its index.
    pub(crate) fn open_region(&self) -> usize {
        let mut d = self.data.borrow_mut();
        let parent = d.current;
        Rc::make_mut(&mut d.regions).push(Region {
            parent: Some(parent),
            ..Region::default()
        });
        d.current = d.regions.len() - 1;
        d.current
    }

    /// Makes `region` current again (closing whatever was opened inside it).
    pub(crate) fn set_current_region(&self, region: usize) {
        self.data.borrow_mut().current = region;
    }

    /// Adds a `BlockArg` of type `ty` to `region` (which must be current or an ancestor of it).
    pub(crate) fn add_block_arg(&self, region: usize, ty: TensorType) -> Tensor {
        let mut d = self.data.borrow_mut();
        let node = d.nodes.len();
        Rc::make_mut(&mut d.nodes).push(Node {
            op: Op::BlockArg,
            inputs: vec![],
            outputs: vec![ty.clone()],
            region,
        });
        let id = ValueId { node, output: 0 };
        if let Some(r) = Rc::make_mut(&mut d.regions).get_mut(region) {
            r.args.push(id);
        }
        drop(d);
        Tensor::new(self.clone(), id, ty)
    }

    pub(crate) fn set_region_results(&self, region: usize, results: Vec<ValueId>) {
        if let Some(r) = Rc::make_mut(&mut self.data.borrow_mut().regions).get_mut(region) {
            r.results = results;
        }
    }

    pub(crate) fn set_region_args(&self, region: usize, args: Vec<ValueId>) {
        if let Some(r) = Rc::make_mut(&mut self.data.borrow_mut().regions).get_mut(region) {
            r.args = args;
        }
    }

    /// The region enclosing `region` (`None` for the program or a region that does not exist).
    pub(crate) fn region_parent(&self, region: usize) -> Option<usize> {
        self.data
            .borrow()
            .regions
            .get(region)
            .and_then(|r| r.parent)
    }

    pub(crate) fn region_captures(&self, region: usize) -> Vec<(ValueId, ValueId)> {
        self.data.borrow().regions[region].captures.clone()
    }

    /// The id under which `v` can be used in the current region: `v` itself if it is defined
    /// there, or a `BlockArg` capturing it if it is defined in an enclosing region (capturing it
    /// in every region in between). A value from inside a loop used outside it is an error.
    pub(crate) fn resolve(
        &self,
        v: ValueId,
        op: &'static str,
        location: &'static Location<'static>,
    ) -> Result<ValueId> {
        let current = self.current_region();
        self.resolve_in(v, current, op, location)
    }

    fn resolve_in(
        &self,
        v: ValueId,
        region: usize,
        op: &'static str,
        location: &'static Location<'static>,
    ) -> Result<ValueId> {
        let home = self.region_of(v);
        if home == region {
            return Ok(v);
        }
        let parent = self.data.borrow().regions[region].parent;
        let Some(parent) = parent else {
            let ty = self
                .value_type(v)
                .map(|t| t.to_string())
                .unwrap_or_default();
            return Err(graph_error(
                op,
                format!("{ty} is defined inside a loop and cannot be used outside it"),
                location,
            ));
        };
        let outer = self.resolve_in(v, parent, op, location)?;
        if let Some(&(_, inner)) = self.data.borrow().regions[region]
            .captures
            .iter()
            .find(|(o, _)| *o == outer)
        {
            return Ok(inner);
        }
        let ty = self
            .value_type(outer)
            .unwrap_or_else(|| TensorType::new(DType::F32, &[]));
        let inner = self.add_block_arg(region, ty).id();
        if let Some(r) = Rc::make_mut(&mut self.data.borrow_mut().regions).get_mut(region) {
            r.captures.push((outer, inner));
        }
        Ok(inner)
    }

    /// A handle on an existing value of this graph (`None` when there is no such value).
    pub(crate) fn tensor(&self, id: ValueId) -> Option<Tensor> {
        let ty = self.value_type(id)?;
        Some(Tensor::new(self.clone(), id, ty))
    }

    /// Whether `t` belongs to this graph.
    pub fn owns(&self, t: &Tensor) -> bool {
        Rc::ptr_eq(&self.data, &t.graph().data)
    }

    pub(crate) fn check_same(
        &self,
        t: &Tensor,
        op: &'static str,
        location: &'static Location<'static>,
    ) -> Result<()> {
        if self.owns(t) {
            Ok(())
        } else {
            Err(graph_error(
                op,
                format!(
                    "operand {} belongs to graph {}, not to graph {}",
                    t.ty(),
                    t.graph().id(),
                    self.id()
                ),
                location,
            ))
        }
    }

    /// Appends a node as given, without running its rule; returns its outputs. Builders go
    /// through `util::node` (which runs the rule first); tests use this to build the malformed
    /// graphs that the walk must reject.
    pub(crate) fn push(
        &self,
        op: Op,
        inputs: Vec<ValueId>,
        outputs: Vec<TensorType>,
    ) -> Result<Vec<Tensor>> {
        let mut d = self.data.borrow_mut();
        let node = d.nodes.len();
        let region = d.current;
        Rc::make_mut(&mut d.nodes).push(Node {
            op,
            inputs,
            outputs: outputs.clone(),
            region,
        });
        drop(d);
        Ok(outputs
            .into_iter()
            .enumerate()
            .map(|(output, ty)| Tensor::new(self.clone(), ValueId { node, output }, ty))
            .collect())
    }
}
