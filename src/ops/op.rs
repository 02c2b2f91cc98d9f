//! The primitive set: [`Op`], and the small enums its variants carry ([`UnaryOp`],
//! [`BinaryOp`], [`Comparison`], [`ReduceKind`], [`ArgKind`]).
//!
//! Every node of a graph is one primitive with precise semantics, written down here once in the
//! variant's doc comment; its type rule and VJP rule (`rules/`), the lowering (`crate::lower`)
//! and the reference interpreter (`crate::interp`) each implement exactly these. Composites
//! (softplus, einsum, tril, ...) are built from primitives by the builders.

/// Elementwise functions of one operand; the output has the operand's type. Like [`Op`], it grows
/// with the library (`#[non_exhaustive]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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

/// Elementwise functions of two operands of the same type; the output has that type. Like [`Op`],
/// it grows with the library (`#[non_exhaustive]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
///
/// The set grows as the library does, so it is `#[non_exhaustive]`: a `match` over it outside
/// this crate needs a wildcard arm (inside the crate every match is exhaustive, so that a new
/// primitive does not compile until each layer has its arm).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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
    /// Both operands have one dtype (the output too, or a wider one: `dot_general_as`). Lowered
    /// at `HIGHEST` precision for f32 and f64 operands (the lowering's rule, not a field).
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
    /// A convolution (`stablehlo.convolution`, a cross-correlation) of `inputs[0]` (`[N, C,
    /// *spatial]`) with the kernel `inputs[1]` (`[O, C / groups, *window]`), giving `[N, O,
    /// *out]`; see [`ConvWindow`]. One float dtype.
    Convolution(ConvWindow),
    /// Rows of the table `inputs[0]` (shape `[n, rest...]`) picked by the integer tensor
    /// `inputs[1]` (any shape `I`): output shape `I ++ rest`. Indices are clamped to `[0, n-1]`.
    Take,
    /// `inputs[0]` (a table `[n, rest...]`, numbers, not `Pred`) with the rows `inputs[2]`
    /// (shape `I ++ rest`) added at the rows the integer tensor `inputs[1]` (shape `I`) names:
    /// `out[idx[i]] += updates[i]` for every position `i` of `I`, repeated indices adding up
    /// (in an unspecified order). Indices are clamped to `[0, n-1]` as [`Op::Take`]'s, so this
    /// is `Take`'s transpose.
    ScatterAdd,
    /// `inputs[0]` (a table `[n, rest...]`) with the rows the integer tensor `inputs[1]`
    /// (shape `I`) names replaced by the rows of `inputs[2]` (shape `I ++ rest`): `out[idx[i]] =
    /// updates[i]`; of repeated indices one update is kept (which one is unspecified). Indices
    /// are clamped to `[0, n-1]` as [`Op::Take`]'s.
    ScatterSet,
    /// An argument of the region the node belongs to (a loop's state inside its condition or
    /// body). Its position is its place in [`Region::args`](crate::ops::Region::args). No inputs.
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
    /// A conditional (`stablehlo.case`): `inputs[0]` is a rank-0 `I32` branch index, the rest
    /// are the operands. Each region of `branches` takes the operands as its arguments and
    /// returns values of the node's output types; only the branch the index names runs. An
    /// index outside `[0, branches.len())` runs the last branch (StableHLO's rule; the
    /// builders clamp first, as JAX's `switch` does).
    Case {
        /// The branch regions, in index order.
        branches: Vec<usize>,
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
    /// The inputs unchanged, one output each (JAX's `lax.optimization_barrier`): XLA may not
    /// look through it, so nothing computed from an output is moved before every input exists,
    /// and no computation is moved across it.
    OptimizationBarrier,
    /// `inputs[0]` unchanged, laid out over the graph's mesh as `spec` says (JAX's
    /// `with_sharding_constraint`): a hint to XLA's SPMD partitioner, the identity everywhere
    /// else. See [`Graph::set_mesh`](crate::ops::Graph::set_mesh).
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

/// How an [`Op::Convolution`] slides its kernel, per spatial axis: the input dilated by
/// `lhs_dilation` (`d - 1` zeros between elements), padded by `padding` (`(low, high)`,
/// negative amounts crop), the kernel's taps `rhs_dilation` apart, windows `strides` apart
/// (`out = (padded - ((k - 1) * rhs_dilation + 1)) / stride + 1` windows, at least one); output
/// channel `o` reads the input channels of its group `o / (O / feature_groups)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvWindow {
    /// The step between windows.
    pub strides: Vec<usize>,
    /// `(low, high)` padding.
    pub padding: Vec<(i64, i64)>,
    /// Input dilation.
    pub lhs_dilation: Vec<usize>,
    /// Kernel dilation.
    pub rhs_dilation: Vec<usize>,
    /// Channel groups (at least 1).
    pub feature_groups: usize,
    /// How precisely XLA computes the products (the interpreter ignores it).
    pub precision: Precision,
}

/// How precisely XLA computes a convolution's products (JAX's `lax.Precision`), written into
/// the program as StableHLO's `precision_config` for both operands. On a GPU or TPU the
/// default may compute f32 products in bf16 or tf32 passes; `Highest` asks for full f32. The
/// interpreter ignores it: it always computes in the operands' own dtype.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// The backend's choice (no `precision_config` is written).
    #[default]
    Default,
    /// More precise than the default where the backend has a choice (`HIGH`).
    High,
    /// The most precise the backend has (`HIGHEST`).
    Highest,
}

impl Precision {
    /// StableHLO's name for it: `DEFAULT`, `HIGH`, `HIGHEST`.
    pub fn stablehlo_name(self) -> &'static str {
        match self {
            Precision::Default => "DEFAULT",
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        }
    }
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
            Op::Convolution(_) => "convolution",
            Op::Take => "take",
            Op::ScatterAdd => "scatter_add",
            Op::ScatterSet => "scatter_set",
            Op::Sort { .. } => "sort",
            Op::BlockArg => "block_arg",
            Op::While { .. } => "while",
            Op::Case { .. } => "case",
            Op::OptimizationBarrier => "optimization_barrier",
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
