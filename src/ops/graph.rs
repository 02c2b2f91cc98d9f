//! The graph: an arena of typed nodes, the primitive [`Op`] set, and the [`Tensor`] handle.
//!
//! Every node is a primitive with precise semantics, written down here once; the lowering
//! (`crate::lower`) and the reference interpreter (`crate::interp`) each implement exactly these.
//! Composites (softplus, einsum, tril, ...) are built from primitives by the builder methods.

use std::cell::RefCell;
use std::panic::Location;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};

/// Elementwise functions of one operand; the output has the operand's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x` (wrapping for integers).
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x` (float).
    Exp,
    /// `e^x - 1`, accurate near 0 (float).
    Expm1,
    /// Natural logarithm (float).
    Log,
    /// `ln(1 + x)`, accurate near 0 (float).
    Log1p,
    /// Square root (float).
    Sqrt,
    /// `1 / sqrt(x)` (float).
    Rsqrt,
    /// Hyperbolic tangent (float).
    Tanh,
    /// `1 / (1 + e^-x)` (float).
    Logistic,
    /// Round toward negative infinity (float).
    Floor,
    /// Round toward positive infinity (float).
    Ceil,
    /// -1, 0 or 1 (and NaN for NaN); for integers -1, 0, 1.
    Sign,
    /// Sine (float).
    Sin,
    /// Cosine (float).
    Cos,
    /// Logical not for pred, bitwise not for integers.
    Not,
}

/// Elementwise functions of two operands of the same type; the output has that type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b` (wrapping for integers).
    Add,
    /// `a - b` (wrapping for integers).
    Sub,
    /// `a * b` (wrapping for integers).
    Mul,
    /// `a / b`; integers truncate toward zero, `x / 0 = -1` for integers (XLA's definition).
    Div,
    /// `a ^ b`.
    Pow,
    /// Maximum (NaN if either is NaN).
    Max,
    /// Minimum (NaN if either is NaN).
    Min,
    /// Remainder with the sign of `a` (C `fmod`); for integers `x % 0 = x` (XLA's definition).
    Rem,
    /// Logical and for pred, bitwise and for integers.
    And,
    /// Logical or for pred, bitwise or for integers.
    Or,
    /// Logical xor for pred, bitwise xor for integers.
    Xor,
    /// `a << b` for integers (0 when `b` >= bit width).
    ShiftLeft,
    /// Logical `a >> b` for integers (0 when `b` >= bit width).
    ShiftRightLogical,
}

impl UnaryOp {
    /// The primitive's name for messages (`exp`, `log1p`, ...).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Expm1 => "expm1",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Sign => "sign",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Not => "not",
        }
    }
}

impl BinaryOp {
    /// The primitive's name for messages (`add`, `shift_left`, ...).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Rem => "rem",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::ShiftLeft => "shift_left",
            BinaryOp::ShiftRightLogical => "shift_right_logical",
        }
    }
}

/// Comparison directions; floats compare as IEEE (every comparison with NaN is false, except `Ne`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Comparison {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// Reduction monoids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Sum, identity 0.
    Sum,
    /// Product, identity 1.
    Prod,
    /// Maximum, identity -inf (floats) or the type's minimum (integers).
    Max,
    /// Minimum, identity +inf (floats) or the type's maximum (integers).
    Min,
}

impl ReduceKind {
    /// The monoid's name for messages (`sum`, `prod`, `max`, `min`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Prod => "prod",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
        }
    }
}

/// Which extreme an arg-reduction looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArgKind {
    /// Index of the maximum.
    Max,
    /// Index of the minimum.
    Min,
}

/// The primitive operations. Operands are the node's `inputs`, in the order given here; every
/// shape below is checked by the op's rule, which the builders run when they create the node.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Parameter number `index` of the program, named `name`. No inputs.
    Parameter {
        /// Position in the parameter list.
        index: usize,
        /// The user's name for it.
        name: String,
    },
    /// A constant. `data` holds little-endian element bytes (`Pred`: one byte, 0 or 1) either for
    /// every element in row-major order, or for exactly one element that fills the whole shape
    /// (a splat). No inputs.
    Constant {
        /// The element bytes.
        data: Vec<u8>,
    },
    /// `out[i_0, ..., i_n] = i_dim`, converted to the output dtype. No inputs.
    Iota {
        /// The counting dimension.
        dim: usize,
    },
    /// An elementwise function of `inputs[0]`.
    Unary(UnaryOp),
    /// An elementwise function of `inputs[0]` and `inputs[1]` (same type as the output).
    Binary(BinaryOp),
    /// Elementwise comparison of `inputs[0]` and `inputs[1]` (same type); output `Pred`.
    Compare(Comparison),
    /// `inputs[0] ? inputs[1] : inputs[2]` elementwise; the predicate is `Pred` of the output's
    /// shape, the branches have the output type.
    Select,
    /// `min(max(inputs[1], inputs[0]), inputs[2])`: clamp(lo, x, hi), all of the output type.
    Clamp,
    /// Elementwise conversion of `inputs[0]` to the output dtype: float to integer rounds toward
    /// zero and saturates (NaN gives 0), integers wrap, to `Pred` is `x != 0`, from `Pred` gives 0
    /// or 1; to a float rounds to nearest even, to `BF16` through `F32` (as XLA does), and from
    /// `F64` to `F16` through `F32` too (the same on every processor).
    Convert,
    /// Reinterprets the bits of `inputs[0]` as the output dtype (same element size, same shape).
    BitcastConvert,
    /// Broadcasts `inputs[0]`: its dimension `i` becomes output dimension `dims[i]` (`dims`
    /// strictly increasing), where it must have size 1 or the output's size.
    BroadcastInDim {
        /// For each operand dimension, the output dimension it maps to.
        dims: Vec<usize>,
    },
    /// Row-major reshape of `inputs[0]` to the output shape (same element count).
    Reshape,
    /// Output dimension `i` is operand dimension `perm[i]`.
    Transpose {
        /// A permutation of the operand's dimensions.
        perm: Vec<usize>,
    },
    /// `out[i] = x[start + i * stride]` per dimension, for `start <= index < limit`.
    Slice {
        /// First index per dimension.
        start: Vec<usize>,
        /// End (exclusive) per dimension.
        limit: Vec<usize>,
        /// Step per dimension (at least 1).
        stride: Vec<usize>,
    },
    /// A window of `sizes` from `inputs[0]` at start indices `inputs[1..]` (one rank-0 integer
    /// per dimension, all of one dtype), each clamped to `[0, dim - size]`.
    DynamicSlice {
        /// Window size per dimension.
        sizes: Vec<usize>,
    },
    /// `inputs[0]` with `inputs[1]` written at start indices `inputs[2..]` (one rank-0 integer
    /// per dimension, all of one dtype), each clamped to `[0, dim - update_dim]`.
    DynamicUpdateSlice,
    /// Concatenates all inputs (same dtype, same shape except along `axis`) along `axis`.
    Concatenate {
        /// The joining dimension.
        axis: usize,
    },
    /// Pads `inputs[0]` with the rank-0 `inputs[1]`: `low`/`high` elements before/after each
    /// dimension (negative values crop) and `interior` elements between neighbours.
    Pad {
        /// Padding before, per dimension.
        low: Vec<i64>,
        /// Padding after, per dimension.
        high: Vec<i64>,
        /// Padding between elements, per dimension.
        interior: Vec<usize>,
    },
    /// Reverses `inputs[0]` along each of `axes`.
    Reverse {
        /// Dimensions to reverse.
        axes: Vec<usize>,
    },
    /// Reduces `inputs[0]` over `axes` (sorted, distinct), which disappear from the shape.
    Reduce {
        /// The monoid.
        kind: ReduceKind,
        /// Reduced dimensions.
        axes: Vec<usize>,
    },
    /// The index (in the node's integer output dtype) of the first maximum or minimum of
    /// `inputs[0]` along `axis`, which disappears from the shape. NaN is treated as larger than
    /// every number.
    ArgReduce {
        /// Max or min.
        kind: ArgKind,
        /// Reduced dimension.
        axis: usize,
    },
    /// Inclusive running sum of `inputs[0]` along `axis`, first to last.
    Cumsum {
        /// The scanned dimension.
        axis: usize,
    },
    /// `dot_general(inputs[0], inputs[1])`: batch dimensions pair up, contracting dimensions are
    /// summed over; output dimensions are the batch dimensions (in `lhs_batch` order), then the
    /// lhs's remaining dimensions, then the rhs's remaining dimensions, each in operand order.
    /// Both operands and the output have one dtype.
    DotGeneral {
        /// Batch dimensions of the lhs.
        lhs_batch: Vec<usize>,
        /// Batch dimensions of the rhs, paired with `lhs_batch`.
        rhs_batch: Vec<usize>,
        /// Contracting dimensions of the lhs.
        lhs_contract: Vec<usize>,
        /// Contracting dimensions of the rhs, paired with `lhs_contract`.
        rhs_contract: Vec<usize>,
    },
    /// Rows of the table `inputs[0]` (shape `[n, rest...]`) picked by the integer tensor
    /// `inputs[1]` (any shape `I`): output shape `I ++ rest`. Indices are clamped to `[0, n-1]`.
    Take,
    /// `inputs[0]` (a table `[n, rest...]`, numbers, not `Pred`) with the rows `inputs[2]`
    /// (shape `I ++ rest`) added at the rows the integer tensor `inputs[1]` (shape `I`) names:
    /// `out[idx[i]] += updates[i]` for every position `i` of `I`, repeated indices adding up
    /// (in an unspecified order). Indices are clamped to `[0, n-1]` as [`Op::Take`]'s, so this
    /// is `Take`'s transpose.
    ScatterAdd,
    /// An argument of the region the node belongs to (a loop's state inside its condition or
    /// body). Its position is its place in [`Region::args`]. No inputs.
    BlockArg,
    /// A `while` loop over a state of several values. `inputs` are the initial state; the
    /// outputs are the final state (same types). Region `cond` takes the state as its arguments
    /// and returns one rank-0 `Pred`; region `body` takes the state and returns the next state.
    /// The loop runs `body` while `cond` is true (possibly zero times).
    While {
        /// The condition region.
        cond: usize,
        /// The body region.
        body: usize,
    },
    /// Sorts along `axis`, stable. `inputs[0]` are the keys; an optional `inputs[1]` (same shape)
    /// is permuted along with them. Outputs: sorted keys, then the permuted second input if any.
    /// Floats sort with NaN last (first when descending).
    Sort {
        /// The sorted dimension.
        axis: usize,
        /// Largest first.
        descending: bool,
    },
    /// `inputs[0]` unchanged, laid out over the graph's mesh as `spec` says (JAX's
    /// `with_sharding_constraint`): a hint to XLA's SPMD partitioner, the identity everywhere
    /// else. See [`Graph::set_mesh`].
    ShardingConstraint {
        /// How the value is split over the mesh axes.
        spec: crate::sharding::PartitionSpec,
    },
    /// JAX's `shard_map`: region `body` runs once per device of `mesh` with every mesh axis
    /// manual. `inputs` are global values; the body's arguments are each device's block of them
    /// (`in_specs`, one per input); the body returns per-device blocks and the outputs are the
    /// global values they make up (`out_specs`, one per output; where devices hold copies of a
    /// block, they must agree).
    ShardMap {
        /// The per-device region.
        body: usize,
        /// The mesh the blocks are laid out over (the graph's).
        mesh: crate::sharding::Mesh,
        /// How each input is split into the body's arguments.
        in_specs: Vec<crate::sharding::PartitionSpec>,
        /// How the body's results make up each output.
        out_specs: Vec<crate::sharding::PartitionSpec>,
    },
    /// Inside a `ShardMap` body: reduces `inputs[0]` elementwise over the devices that differ
    /// only in `axes` (`lax.psum` and kin); every device of a group gets the result.
    AllReduce {
        /// The monoid.
        kind: ReduceKind,
        /// The mesh axes reduced over (distinct).
        axes: Vec<String>,
        /// The shard_map's mesh.
        mesh: crate::sharding::Mesh,
    },
    /// Inside a `ShardMap` body: the blocks of the devices along mesh axis `axis`, in coordinate
    /// order, concatenated along `dim` (`tiled`) or stacked as a new dimension `dim`.
    AllGather {
        /// The mesh axis gathered over.
        axis: String,
        /// The joining (or new) dimension.
        dim: usize,
        /// Concatenate (true) or stack (false).
        tiled: bool,
        /// The shard_map's mesh.
        mesh: crate::sharding::Mesh,
    },
    /// Inside a `ShardMap` body: the sum over the devices along `axis`, split along `dim` into
    /// one part per device; device `i` along the axis gets part `i` (`lax.psum_scatter`).
    ReduceScatter {
        /// The mesh axis reduced over.
        axis: String,
        /// The split dimension (divisible by the axis size).
        dim: usize,
        /// The shard_map's mesh.
        mesh: crate::sharding::Mesh,
    },
    /// Inside a `ShardMap` body: each device splits `inputs[0]` along `split_dim` into one part
    /// per device along `axis`, sends part `j` to device `j`, and concatenates what it receives
    /// along `concat_dim` in coordinate order (`lax.all_to_all`, tiled).
    AllToAll {
        /// The mesh axis exchanged over.
        axis: String,
        /// The dimension split (divisible by the axis size).
        split_dim: usize,
        /// The dimension the received parts are joined along.
        concat_dim: usize,
        /// The shard_map's mesh.
        mesh: crate::sharding::Mesh,
    },
    /// Inside a `ShardMap` body: this device's coordinate along mesh axis `axis`, an `i32[]`.
    /// No inputs.
    AxisIndex {
        /// The mesh axis.
        axis: String,
        /// The shard_map's mesh.
        mesh: crate::sharding::Mesh,
    },
}

impl Op {
    /// A short name for messages (`add`, `dot_general`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Constant { .. } => "constant",
            Op::Iota { .. } => "iota",
            Op::Unary(_) => "unary",
            Op::Binary(_) => "binary",
            Op::Compare(_) => "compare",
            Op::Select => "select",
            Op::Clamp => "clamp",
            Op::Convert => "convert",
            Op::BitcastConvert => "bitcast_convert",
            Op::BroadcastInDim { .. } => "broadcast_in_dim",
            Op::Reshape => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::DynamicSlice { .. } => "dynamic_slice",
            Op::DynamicUpdateSlice => "dynamic_update_slice",
            Op::Concatenate { .. } => "concatenate",
            Op::Pad { .. } => "pad",
            Op::Reverse { .. } => "reverse",
            Op::Reduce { .. } => "reduce",
            Op::ArgReduce { .. } => "arg_reduce",
            Op::Cumsum { .. } => "cumsum",
            Op::DotGeneral { .. } => "dot_general",
            Op::Take => "take",
            Op::ScatterAdd => "scatter_add",
            Op::Sort { .. } => "sort",
            Op::BlockArg => "block_arg",
            Op::While { .. } => "while",
            Op::ShardingConstraint { .. } => "sharding_constraint",
            Op::ShardMap { .. } => "shard_map",
            Op::AllReduce { .. } => "all_reduce",
            Op::AllGather { .. } => "all_gather",
            Op::ReduceScatter { .. } => "reduce_scatter",
            Op::AllToAll { .. } => "all_to_all",
            Op::AxisIndex { .. } => "axis_index",
        }
    }
}

/// One output of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId {
    /// The node's index in [`Graph::nodes`].
    pub node: usize,
    /// Which of the node's outputs.
    pub output: usize,
}

/// A node of the graph: a primitive, its operands and its output types.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The primitive.
    pub op: Op,
    /// Operands, all defined by earlier nodes.
    pub inputs: Vec<ValueId>,
    /// Output types (one for every op except a `Sort` with two inputs, and `While`).
    pub outputs: Vec<TensorType>,
    /// The region the node belongs to: 0 is the program itself, others are loop conditions and
    /// bodies (see [`Graph::regions`]).
    pub region: usize,
}

/// A nested block of nodes: a loop's condition or body. Region 0 is the program itself.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Region {
    /// The enclosing region (`None` for region 0).
    pub parent: Option<usize>,
    /// The region's arguments, `BlockArg` nodes in order (empty for region 0, whose inputs are
    /// the parameters).
    pub args: Vec<ValueId>,
    /// What the region returns.
    pub results: Vec<ValueId>,
    /// Values of enclosing regions used inside this one: (the value in the parent region, the
    /// `BlockArg` that stands for it here).
    pub captures: Vec<(ValueId, ValueId)>,
}

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
}

/// A tensor program under construction: named parameters, nodes, outputs. Cheap to clone (a
/// shared handle to the same graph). Not `Send`: build a graph on one thread; the compiled
/// program it produces is `Send + Sync`.
#[derive(Clone)]
pub struct Graph {
    data: Rc<RefCell<GraphData>>,
}

/// A value in a [`Graph`]: a handle holding the graph, the value's id and its type. Builder
/// methods on it add nodes to its graph.
#[derive(Clone)]
pub struct Tensor {
    graph: Graph,
    id: ValueId,
    ty: TensorType,
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

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} @ node {}", self.ty, self.id.node)?;
        if self.id.output > 0 {
            write!(f, "#{}", self.id.output)?;
        }
        write!(f, ")")
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
            })),
        }
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
        self.data.borrow_mut().params.push(t.id);
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
            if self.region_of(t.id) != 0 {
                return Err(graph_error(
                    "set_outputs",
                    format!("{} is defined inside a loop, not in the program", t.ty),
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
        self.data.borrow_mut().outputs = outputs.iter().map(|t| t.id).collect();
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
        let index = match &self.data.borrow().nodes[parameter.id.node].op {
            Op::Parameter { index, .. } => Some(*index),
            _ => None,
        };
        let Some(index) = index else {
            return Err(graph_error(
                "donate",
                format!("{} is not a parameter", parameter.ty),
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
                        "parameter {p} ({:?}, {}) is donated but no output of that type is left                          to reuse its buffer",
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
        Tensor {
            graph: self.clone(),
            id,
            ty,
        }
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
        let inner = self.add_block_arg(region, ty).id;
        if let Some(r) = Rc::make_mut(&mut self.data.borrow_mut().regions).get_mut(region) {
            r.captures.push((outer, inner));
        }
        Ok(inner)
    }

    /// A handle on an existing value of this graph (`None` when there is no such value).
    pub(crate) fn tensor(&self, id: ValueId) -> Option<Tensor> {
        let ty = self.value_type(id)?;
        Some(Tensor {
            graph: self.clone(),
            id,
            ty,
        })
    }

    /// Whether `t` belongs to this graph.
    pub fn owns(&self, t: &Tensor) -> bool {
        Rc::ptr_eq(&self.data, &t.graph.data)
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
                    t.ty,
                    t.graph.id(),
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
            .map(|(output, ty)| Tensor {
                graph: self.clone(),
                id: ValueId { node, output },
                ty,
            })
            .collect())
    }
}

impl Tensor {
    /// The graph this tensor belongs to.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The value's id in its graph.
    pub fn id(&self) -> ValueId {
        self.id
    }

    /// The element type and shape.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The shape.
    pub fn dims(&self) -> &[usize] {
        &self.ty.dims
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.ty.dims.len()
    }
}
