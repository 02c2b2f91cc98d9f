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
//! Choices that the op semantics (see [`crate::ops::Op`]) force:
//!
//! - Float `maximum`/`minimum` (elementwise and in reductions) propagate NaN with explicit
//!   selects: XLA's CPU compiler by default (`xla_cpu_enable_fast_min_max`) drops a NaN in the
//!   second operand.
//! - Arg-reductions are a variadic reduce over (value, index) whose comparator is commutative
//!   and associative: NaN beats every number for the max and loses to every number for the min,
//!   ties go to the smaller index.
//! - Sorts compare with `FLOAT` plus explicit NaN tests, not `TOTALORDER`, which would put
//!   negative NaNs first and order `-0.0` before `0.0`.
//! - Cumsum along an axis of `n <= 16` is a `reduce_window` whose window covers everything up to
//!   each element (a sequential sum, `n` additions per element); a longer one is a log-depth
//!   scan, `ceil(log2 n)` rounds of adding the running sum shifted by 1, 2, 4, ... (a tree sum
//!   per element; `n log n` work). Both are exact for integers.
//! - Constants: small ones element by element (floats as the shortest decimal that reads back
//!   bit-exactly), large ones as one hex string; `Pred` never in hex.
//!
//! The text is accepted by StableHLO 1.13 (the `xla-cpu-pjrt` plugin) through 1.20
//! (`lammps-jax-pjrt-cpu`).

mod literal;
#[cfg(test)]
mod tests;

use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ops::{
    check_while, ArgKind, BinaryOp, Comparison, Graph, Node, Op, ReduceKind, Region, UnaryOp,
    ValueId,
};
use literal::{dense, i64_array, int_list, scalar_or_shaped, special, tensor_type, Special};

/// Lowers `graph` to one StableHLO module, `module @stablegraph`, whose `func.func public @main`
/// takes the graph's parameters in order and returns its outputs in order.
///
/// Fails with [`Error::InvalidArgument`] when the graph has no outputs, when it is malformed (an
/// operand defined after its user or in another region, a wrong operand count, a constant whose
/// bytes do not fit its type, a loop whose regions do not fit its state), or when a node's dtypes
/// have no lowering (`exp` of an integer, the sum of `Pred`s).
/// Shapes are the builders' business; a shape error that slipped through is reported by the
/// compiler.
pub fn to_stablehlo(graph: &Graph) -> Result<String> {
    let params = graph.parameters();
    let outputs = graph.outputs();
    if outputs.is_empty() {
        return Err(Error::InvalidArgument(
            "cannot lower a graph without outputs: call Graph::set_outputs first".to_string(),
        ));
    }
    let aliases = graph.output_aliases()?;
    graph.with_structure(|nodes, regions| {
        Lowering::new(nodes, regions).module(&params, &outputs, &aliases)
    })
}

/// The state of one lowering: the nodes, the SSA names given to values so far, and the body text.
struct Lowering<'g> {
    nodes: &'g [Node],
    regions: &'g [Region],
    /// The SSA names of each node's outputs; empty until the node is emitted.
    names: Vec<Vec<String>>,
    /// The live nodes of each region other than block arguments, in node order.
    order: Vec<Vec<usize>>,
    /// Which regions have been emitted (each belongs to one loop and is emitted once).
    emitted: Vec<bool>,
    /// How many regions deep the next line is.
    depth: usize,
    body: String,
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

/// `(a, b) -> c`: the functional type of an op.
fn signature(operands: &[&TensorType], result: &TensorType) -> String {
    let ins: Vec<String> = operands.iter().map(|t| tensor_type(t)).collect();
    format!("({}) -> {}", ins.join(", "), tensor_type(result))
}

/// The comparison type StableHLO needs for `dtype`.
fn compare_type(dtype: DType) -> &'static str {
    if dtype.is_float() {
        "FLOAT"
    } else if dtype.is_int() && !dtype.is_unsigned() {
        "SIGNED"
    } else {
        "UNSIGNED"
    }
}

fn direction(c: Comparison) -> &'static str {
    match c {
        Comparison::Eq => "EQ",
        Comparison::Ne => "NE",
        Comparison::Lt => "LT",
        Comparison::Le => "LE",
        Comparison::Gt => "GT",
        Comparison::Ge => "GE",
    }
}

fn unary_name(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "negate",
        UnaryOp::Abs => "abs",
        UnaryOp::Exp => "exponential",
        UnaryOp::Expm1 => "exponential_minus_one",
        UnaryOp::Log => "log",
        UnaryOp::Log1p => "log_plus_one",
        UnaryOp::Sqrt => "sqrt",
        UnaryOp::Rsqrt => "rsqrt",
        UnaryOp::Tanh => "tanh",
        UnaryOp::Logistic => "logistic",
        UnaryOp::Floor => "floor",
        UnaryOp::Ceil => "ceil",
        UnaryOp::Sign => "sign",
        UnaryOp::Sin => "sine",
        UnaryOp::Cos => "cosine",
        UnaryOp::Not => "not",
    }
}

fn binary_name(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "subtract",
        BinaryOp::Mul => "multiply",
        BinaryOp::Div => "divide",
        BinaryOp::Pow => "power",
        BinaryOp::Max => "maximum",
        BinaryOp::Min => "minimum",
        BinaryOp::Rem => "remainder",
        BinaryOp::And => "and",
        BinaryOp::Or => "or",
        BinaryOp::Xor => "xor",
        BinaryOp::ShiftLeft => "shift_left",
        BinaryOp::ShiftRightLogical => "shift_right_logical",
    }
}

/// Which dtypes a unary op is defined for (and lowered directly; see [`Lowering::unary`]).
fn unary_accepts(u: UnaryOp, dtype: DType) -> bool {
    match u {
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => dtype != DType::Pred,
        UnaryOp::Not => !dtype.is_float(),
        _ => dtype.is_float(),
    }
}

/// Which dtypes a binary op is defined for.
fn binary_accepts(b: BinaryOp, dtype: DType) -> bool {
    match b {
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => !dtype.is_float(),
        BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => dtype.is_int(),
        BinaryOp::Max | BinaryOp::Min => true,
        _ => dtype != DType::Pred,
    }
}

/// How many operands a node of `op` takes, given the rank of its first operand (for the dynamic
/// slices, which take one index per dimension).
fn arity_ok(op: &Op, count: usize, first_rank: Option<usize>) -> bool {
    match op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::BlockArg => count == 0,
        Op::While { .. } => count >= 1,
        Op::Unary(_)
        | Op::Convert
        | Op::BitcastConvert
        | Op::BroadcastInDim { .. }
        | Op::Reshape
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Reverse { .. }
        | Op::Reduce { .. }
        | Op::ArgReduce { .. }
        | Op::Cumsum { .. } => count == 1,
        Op::Binary(_) | Op::Compare(_) | Op::Pad { .. } | Op::DotGeneral { .. } | Op::Take => {
            count == 2
        }
        Op::Select | Op::Clamp => count == 3,
        Op::DynamicSlice { .. } => first_rank.is_some_and(|r| count == 1 + r),
        Op::DynamicUpdateSlice => first_rank.is_some_and(|r| count == 2 + r),
        Op::Concatenate { .. } => count >= 1,
        Op::Sort { .. } => count == 1 || count == 2,
    }
}

/// The longest axis a cumulative sum is lowered as a `reduce_window` over (see
/// `Lowering::cumsum`); longer ones are log-depth scans.
const SCAN_WINDOW_MAX: usize = 16;

impl<'g> Lowering<'g> {
    fn new(nodes: &'g [Node], regions: &'g [Region]) -> Self {
        Lowering {
            nodes,
            regions,
            names: vec![Vec::new(); nodes.len()],
            order: vec![Vec::new(); regions.len()],
            emitted: vec![false; regions.len()],
            depth: 0,
            body: String::new(),
        }
    }

    /// The whole module.
    /// `aliases[k]` is the output that donated parameter `k` is aliased to.
    fn module(
        mut self,
        params: &[ValueId],
        outputs: &[ValueId],
        aliases: &[Option<usize>],
    ) -> Result<String> {
        if outputs.is_empty() {
            return Err(Error::InvalidArgument(
                "cannot lower a graph without outputs: call Graph::set_outputs first".to_string(),
            ));
        }
        let live = self.live(outputs)?;

        let mut args = Vec::with_capacity(params.len());
        for (k, p) in params.iter().enumerate() {
            let node = self.nodes.get(p.node).ok_or_else(|| {
                graph_err(format!(
                    "parameter {k} is node {}, which does not exist",
                    p.node
                ))
            })?;
            let (Op::Parameter { index, name }, [ty], 0) =
                (&node.op, node.outputs.as_slice(), node.region)
            else {
                return Err(graph_err(format!(
                    "parameter {k} is node {}, a {} with {} outputs in region {}",
                    p.node,
                    node.op.name(),
                    node.outputs.len(),
                    node.region
                )));
            };
            if *index != k || p.output != 0 {
                return Err(graph_err(format!(
                    "parameter {k} ({name:?}) is listed as node {} output {}, which says it is \
                     parameter {index}",
                    p.node, p.output
                )));
            }
            if !self.names[p.node].is_empty() {
                return Err(graph_err(format!(
                    "node {} ({name:?}) is listed twice as a parameter",
                    p.node
                )));
            }
            let ssa = format!("%p{k}_{}", sanitize(name));
            match aliases.get(k).copied().flatten() {
                Some(out) => args.push(format!(
                    "{ssa}: {} {{tf.aliasing_output = {out} : i32}}",
                    tensor_type(ty)
                )),
                None => args.push(format!("{ssa}: {}", tensor_type(ty))),
            }
            self.names[p.node] = vec![ssa];
        }

        for (i, &is_live) in live.iter().enumerate() {
            if !is_live {
                continue;
            }
            let region = self.nodes[i].region;
            let Some(r) = self.regions.get(region) else {
                return Err(graph_err(format!(
                    "node {i} is in region {region}, which does not exist"
                )));
            };
            if matches!(self.nodes[i].op, Op::BlockArg) {
                // Named by the loop that binds it.
                let listed = r.args.contains(&ValueId { node: i, output: 0 });
                if !listed {
                    return Err(graph_err(format!(
                        "node {i} (block_arg) is not an argument of region {region}"
                    )));
                }
            } else {
                self.order[region].push(i);
            }
        }
        self.emitted[0] = true;
        self.region_nodes(0)?;

        let mut results = Vec::with_capacity(outputs.len());
        let mut types = Vec::with_capacity(outputs.len());
        for &o in outputs {
            results.push(self.value(o)?);
            types.push(tensor_type(self.ty(o)?));
        }
        let result_types = if types.len() == 1 {
            types[0].clone()
        } else {
            format!("({})", types.join(", "))
        };
        Ok(format!(
            "module @stablegraph {{\n  func.func public @main({}) -> {result_types} {{\n{}    \
             return {} : {}\n  }}\n}}\n",
            args.join(", "),
            self.body,
            results.join(", "),
            types.join(", ")
        ))
    }

    /// Which nodes the outputs depend on, through operands and the results of the regions of
    /// live loops. Checks that every operand of those nodes is an output of an earlier node of
    /// the same region, and that every live loop is well formed.
    fn live(&self, outputs: &[ValueId]) -> Result<Vec<bool>> {
        let mut live = vec![false; self.nodes.len()];
        let mut owner: Vec<Option<usize>> = vec![None; self.regions.len()];
        let mut stack = Vec::new();
        for &o in outputs {
            self.ty(o)
                .map_err(|_| graph_err(format!("output {o:?} is not a value of this graph")))?;
            if self.nodes[o.node].region != 0 {
                return Err(graph_err(format!(
                    "output {o:?} is defined inside region {}, not in the program",
                    self.nodes[o.node].region
                )));
            }
            stack.push(o.node);
        }
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut live[i], true) {
                continue;
            }
            let node = &self.nodes[i];
            for v in &node.inputs {
                if v.node >= i || self.ty(*v).is_err() {
                    return Err(graph_err(format!(
                        "node {i} ({}) reads output {} of node {}, which is not a value defined \
                         before it",
                        node.op.name(),
                        v.output,
                        v.node
                    )));
                }
                let home = self.nodes[v.node].region;
                if home != node.region {
                    return Err(graph_err(format!(
                        "node {i} ({}) in region {} reads output {} of node {}, which is defined \
                         in region {home} and not visible there",
                        node.op.name(),
                        node.region,
                        v.output,
                        v.node
                    )));
                }
                stack.push(v.node);
            }
            if let Op::While { .. } = node.op {
                let (cond, body) = check_while(self.nodes, self.regions, i)
                    .map_err(|m| graph_err(format!("node {i} ({}): {m}", node.op.name())))?;
                for r in [cond, body] {
                    if let Some(other) = owner[r].replace(i) {
                        return Err(graph_err(format!(
                            "region {r} belongs to two loops, nodes {other} and {i}"
                        )));
                    }
                    stack.extend(self.regions[r].results.iter().map(|v| v.node));
                }
            }
        }
        Ok(live)
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
        match self.names.get(v.node).and_then(|n| n.get(v.output)) {
            Some(name) => Ok(name.clone()),
            None => match self.nodes.get(v.node).map(|n| &n.op) {
                Some(Op::Parameter { name, .. }) => Err(graph_err(format!(
                    "node {} is parameter {name:?}, which is not in the graph's parameter list",
                    v.node
                ))),
                _ => Err(graph_err(format!("{v:?} is used before it is defined"))),
            },
        }
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

    /// Emits the `While` node `i` (checked by [`Lowering::live`]) as a generic `stablehlo.while`
    /// whose two regions hold their own nodes; block arguments are named like other values.
    fn while_loop(&mut self, i: usize, ins: &[String], tys: &[&'g TensorType]) -> Result<()> {
        let err = |message: String| {
            Error::InvalidArgument(format!("cannot lower node {i} (while): {message}"))
        };
        let (cond, body) = check_while(self.nodes, self.regions, i).map_err(err)?;
        let res = format!("%v{i}");
        let types: Vec<String> = tys.iter().map(|t| tensor_type(t)).collect();
        let types = types.join(", ");
        let n = ins.len();
        let result = if n == 1 {
            res.clone()
        } else {
            format!("{res}:{n}")
        };
        self.emit(format!(
            "{result} = \"stablehlo.while\"({}) ({{",
            ins.join(", ")
        ));
        for r in [cond, body] {
            if std::mem::replace(&mut self.emitted[r], true) {
                return Err(err(format!("region {r} belongs to two loops")));
            }
            let region = &self.regions[r];
            let mut args = Vec::with_capacity(n);
            for (a, ty) in region.args.iter().zip(tys) {
                let name = format!("%v{}", a.node);
                args.push(format!("{name}: {}", tensor_type(ty)));
                self.names[a.node] = vec![name];
            }
            if r == body {
                self.emit("}, {");
            }
            self.emit(format!("^bb0({}):", args.join(", ")));
            self.depth += 1;
            self.region_nodes(r)?;
            let results = region
                .results
                .iter()
                .map(|&v| self.value(v))
                .collect::<Result<Vec<_>>>()?;
            let result_types: Vec<String> = region
                .results
                .iter()
                .map(|&v| self.ty(v).map(tensor_type))
                .collect::<Result<Vec<_>>>()?;
            self.emit(format!(
                "stablehlo.return {} : {}",
                results.join(", "),
                result_types.join(", ")
            ));
            self.depth -= 1;
        }
        let outputs = if n == 1 {
            types.clone()
        } else {
            format!("({types})")
        };
        self.emit(format!("}}) : ({types}) -> {outputs}"));
        self.names[i] = if n == 1 {
            vec![res]
        } else {
            (0..n).map(|k| format!("{res}#{k}")).collect()
        };
        Ok(())
    }

    /// Emits node `i` (whose operands are emitted) and records the names of its outputs.
    fn node(&mut self, i: usize) -> Result<()> {
        let nodes: &'g [Node] = self.nodes;
        let node = &nodes[i];
        let err = |message: String| {
            Error::InvalidArgument(format!(
                "cannot lower node {i} ({}): {message}",
                node.op.name()
            ))
        };
        let ins = node
            .inputs
            .iter()
            .map(|&v| self.value(v))
            .collect::<Result<Vec<String>>>()?;
        let tys = node
            .inputs
            .iter()
            .map(|&v| self.ty(v))
            .collect::<Result<Vec<&'g TensorType>>>()?;
        if let Op::While { .. } = node.op {
            return self.while_loop(i, &ins, &tys);
        }
        if !arity_ok(&node.op, ins.len(), tys.first().map(|t| t.rank())) {
            return Err(err(format!("wrong number of operands ({})", ins.len())));
        }
        let expected_outputs = if matches!(node.op, Op::Sort { .. }) {
            ins.len()
        } else {
            1
        };
        if node.outputs.len() != expected_outputs {
            return Err(err(format!(
                "{} output types, expected {expected_outputs}",
                node.outputs.len()
            )));
        }
        let out = &node.outputs[0];
        let out_t = tensor_type(out);
        let res = format!("%v{i}");
        // Elementwise ops print one type for operands and result: check that it is one type.
        let same_types = |types: &[&TensorType]| -> Result<()> {
            match types.iter().find(|t| **t != out) {
                Some(t) => Err(err(format!(
                    "operand type {t} differs from the output type {out}"
                ))),
                None => Ok(()),
            }
        };
        let axis_ok = |axis: usize, t: &TensorType| -> Result<()> {
            if axis < t.rank() {
                Ok(())
            } else {
                Err(err(format!("axis {axis} is out of range for {t}")))
            }
        };

        match &node.op {
            Op::BlockArg | Op::While { .. } => {
                // Block arguments are named by their region; loops are emitted above.
                return Err(err("not emitted through its region".to_string()));
            }
            Op::Parameter { .. } if node.region != 0 => {
                return Err(err(format!("a parameter inside region {}", node.region)));
            }
            Op::Parameter { .. } => {
                // Named in the signature; reading it fails if it is not a listed parameter.
                self.value(ValueId { node: i, output: 0 })?;
                return Ok(());
            }
            Op::Constant { data } => {
                literal::check_constant_len(out, data).map_err(err)?;
                self.emit(format!(
                    "{res} = stablehlo.constant {} : {out_t}",
                    dense(out, data)
                ));
            }
            Op::Iota { dim } => {
                axis_ok(*dim, out)?;
                if out.dtype == DType::Pred {
                    // StableHLO has no i1 iota; count in i64 and convert (`x != 0`).
                    let wide = TensorType::new(DType::I64, &out.dims);
                    self.emit(format!(
                        "{res}_i64 = stablehlo.iota dim = {dim} : {}",
                        tensor_type(&wide)
                    ));
                    self.emit(format!(
                        "{res} = stablehlo.convert {res}_i64 : {}",
                        signature(&[&wide], out)
                    ));
                } else {
                    self.emit(format!("{res} = stablehlo.iota dim = {dim} : {out_t}"));
                }
            }
            Op::Unary(u) => {
                same_types(&tys)?;
                if !unary_accepts(*u, out.dtype) {
                    return Err(err(format!("{u:?} is not defined for {}", out.dtype)));
                }
                let x = &ins[0];
                match u {
                    // StableHLO's abs and sign take signed operands only.
                    UnaryOp::Abs if out.dtype.is_unsigned() => {
                        self.names[i] = vec![x.clone()];
                        return Ok(());
                    }
                    UnaryOp::Sign if out.dtype.is_unsigned() => {
                        let scalar = scalar_or_shaped(out.dtype, &[]);
                        self.emit(format!(
                            "{res}_one = stablehlo.constant dense<1> : {scalar}"
                        ));
                        self.emit(format!(
                            "{res}_ones = stablehlo.broadcast_in_dim {res}_one, dims = [] : \
                             ({scalar}) -> {out_t}"
                        ));
                        self.emit(format!(
                            "{res} = stablehlo.minimum {x}, {res}_ones : {out_t}"
                        ));
                    }
                    _ => self.emit(format!(
                        "{res} = stablehlo.{} {x} : {out_t}",
                        unary_name(*u)
                    )),
                }
            }
            Op::Binary(b) => {
                same_types(&tys)?;
                if !binary_accepts(*b, out.dtype) {
                    return Err(err(format!("{b:?} is not defined for {}", out.dtype)));
                }
                let name = match (b, out.dtype) {
                    (BinaryOp::Max, DType::Pred) => "or",
                    (BinaryOp::Min, DType::Pred) => "and",
                    _ => binary_name(*b),
                };
                if out.dtype.is_float() && matches!(b, BinaryOp::Max | BinaryOp::Min) {
                    let pred = scalar_or_shaped(DType::Pred, &out.dims);
                    self.nan_propagating(&res, &res, name, &ins[0], &ins[1], &out_t, &pred, false);
                    self.names[i] = vec![res];
                    return Ok(());
                }
                self.emit(format!(
                    "{res} = stablehlo.{name} {}, {} : {out_t}",
                    ins[0], ins[1]
                ));
            }
            Op::Compare(c) => {
                if tys[0] != tys[1] || out.dtype != DType::Pred || out.dims != tys[0].dims {
                    return Err(err(format!(
                        "compares {} with {} into {out}",
                        tys[0], tys[1]
                    )));
                }
                self.emit(format!(
                    "{res} = stablehlo.compare {}, {}, {}, {} : {}",
                    direction(*c),
                    ins[0],
                    ins[1],
                    compare_type(tys[0].dtype),
                    signature(&tys, out)
                ));
            }
            Op::Select => {
                same_types(&tys[1..])?;
                self.emit(format!(
                    "{res} = stablehlo.select {}, {}, {} : {}, {out_t}",
                    ins[0],
                    ins[1],
                    ins[2],
                    tensor_type(tys[0])
                ));
            }
            Op::Clamp if out.dtype.is_float() && tys.iter().all(|t| *t == out) => {
                // min(max(x, lo), hi) with NaN propagation: XLA's clamp drops a NaN operand.
                let pred = scalar_or_shaped(DType::Pred, &out.dims);
                let lo = format!("{res}_lo");
                self.nan_propagating(&lo, &lo, "maximum", &ins[1], &ins[0], &out_t, &pred, false);
                self.nan_propagating(&res, &res, "minimum", &lo, &ins[2], &out_t, &pred, false);
            }
            Op::Clamp => {
                let types = if tys.iter().all(|t| *t == out) {
                    out_t.clone()
                } else {
                    signature(&tys, out)
                };
                self.emit(format!(
                    "{res} = stablehlo.clamp {}, {}, {} : {types}",
                    ins[0], ins[1], ins[2]
                ));
            }
            Op::Convert => {
                let narrow = matches!(out.dtype, DType::F16 | DType::BF16);
                if tys[0].dtype == DType::F64 && narrow {
                    // Through f32 on every backend: XLA CPU converts f64 to a 16-bit float
                    // directly on some processors and through f32 on others.
                    let mid = TensorType::new(DType::F32, &out.dims);
                    self.emit(format!(
                        "{res}_f32 = stablehlo.convert {} : {}",
                        ins[0],
                        signature(&tys, &mid)
                    ));
                    self.emit(format!(
                        "{res} = stablehlo.convert {res}_f32 : {}",
                        signature(&[&mid], out)
                    ));
                } else {
                    self.emit(format!(
                        "{res} = stablehlo.convert {} : {}",
                        ins[0],
                        signature(&tys, out)
                    ));
                }
            }
            Op::BitcastConvert => {
                let from = tys[0].dtype;
                if from == out.dtype && tys[0] == out {
                    self.names[i] = vec![ins[0].clone()];
                    return Ok(());
                }
                if from.size_in_bytes() != out.dtype.size_in_bytes() {
                    return Err(err(format!("cannot reinterpret {} as {out}", tys[0])));
                }
                // i1 is one bit wide in StableHLO: between pred and u8, a byte is 0 or 1 (and
                // reading a byte as pred is `x != 0`), which is what convert does.
                let op = if from == DType::Pred || out.dtype == DType::Pred {
                    "convert"
                } else {
                    "bitcast_convert"
                };
                self.emit(format!(
                    "{res} = stablehlo.{op} {} : {}",
                    ins[0],
                    signature(&tys, out)
                ));
            }
            Op::BroadcastInDim { dims } => {
                self.emit(format!(
                    "{res} = stablehlo.broadcast_in_dim {}, dims = {} : {}",
                    ins[0],
                    int_list(dims),
                    signature(&tys, out)
                ));
            }
            Op::Reshape => {
                self.emit(format!(
                    "{res} = stablehlo.reshape {} : {}",
                    ins[0],
                    signature(&tys, out)
                ));
            }
            Op::Transpose { perm } => {
                self.emit(format!(
                    "{res} = stablehlo.transpose {}, dims = {} : {}",
                    ins[0],
                    int_list(perm),
                    signature(&tys, out)
                ));
            }
            Op::Slice {
                start,
                limit,
                stride,
            } => {
                let rank = tys[0].rank();
                if start.len() != rank || limit.len() != rank || stride.len() != rank {
                    return Err(err(format!(
                        "start, limit and stride need {rank} entries each for {}",
                        tys[0]
                    )));
                }
                let ranges: Vec<String> = (0..rank)
                    .map(|d| {
                        if stride[d] == 1 {
                            format!("{}:{}", start[d], limit[d])
                        } else {
                            format!("{}:{}:{}", start[d], limit[d], stride[d])
                        }
                    })
                    .collect();
                self.emit(format!(
                    "{res} = stablehlo.slice {} [{}] : {}",
                    ins[0],
                    ranges.join(", "),
                    signature(&tys, out)
                ));
            }
            Op::DynamicSlice { sizes } => {
                let mut operands = ins.clone();
                operands.push(format!("sizes = {}", int_list(sizes)));
                self.emit(format!(
                    "{res} = stablehlo.dynamic_slice {} : {}",
                    operands.join(", "),
                    signature(&tys, out)
                ));
            }
            Op::DynamicUpdateSlice => {
                self.emit(format!(
                    "{res} = stablehlo.dynamic_update_slice {} : {}",
                    ins.join(", "),
                    signature(&tys, out)
                ));
            }
            Op::Concatenate { axis } => {
                self.emit(format!(
                    "{res} = stablehlo.concatenate {}, dim = {axis} : {}",
                    ins.join(", "),
                    signature(&tys, out)
                ));
            }
            Op::Pad {
                low,
                high,
                interior,
            } => {
                self.emit(format!(
                    "{res} = stablehlo.pad {}, {}, low = {}, high = {}, interior = {} : {}",
                    ins[0],
                    ins[1],
                    int_list(low),
                    int_list(high),
                    int_list(interior),
                    signature(&tys, out)
                ));
            }
            Op::Reverse { axes } => {
                same_types(&tys)?;
                self.emit(format!(
                    "{res} = stablehlo.reverse {}, dims = {} : {out_t}",
                    ins[0],
                    int_list(axes)
                ));
            }
            Op::Reduce { kind, axes } => {
                let dtype = tys[0].dtype;
                let (op, init) = match (kind, dtype) {
                    (ReduceKind::Sum | ReduceKind::Prod, DType::Pred) => {
                        return Err(err(format!("{kind:?} is not defined for pred")));
                    }
                    (ReduceKind::Max, DType::Pred) => ("or", Special::Lowest),
                    (ReduceKind::Min, DType::Pred) => ("and", Special::Highest),
                    (ReduceKind::Sum, _) => ("add", Special::Zero),
                    (ReduceKind::Prod, _) => ("multiply", Special::One),
                    (ReduceKind::Max, _) => ("maximum", Special::Lowest),
                    (ReduceKind::Min, _) => ("minimum", Special::Highest),
                };
                let scalar = scalar_or_shaped(dtype, &[]);
                self.emit(format!(
                    "{res}_init = stablehlo.constant dense<{}> : {scalar}",
                    special(dtype, init)
                ));
                if dtype.is_float() && matches!(kind, ReduceKind::Max | ReduceKind::Min) {
                    let pred = scalar_or_shaped(DType::Pred, &[]);
                    self.emit(format!(
                        "{res} = \"stablehlo.reduce\"({}, {res}_init) ({{",
                        ins[0]
                    ));
                    self.emit(format!("^bb0({res}_a: {scalar}, {res}_b: {scalar}):"));
                    let (a, b) = (format!("{res}_a"), format!("{res}_b"));
                    let r = format!("{res}_r");
                    self.nan_propagating(&r, &res, op, &a, &b, &scalar, &pred, true);
                    self.emit_inner(format!("stablehlo.return {r} : {scalar}"));
                    self.emit(format!(
                        "}}) {{dimensions = {}}} : ({}, {scalar}) -> {out_t}",
                        i64_array(axes),
                        tensor_type(tys[0])
                    ));
                    self.names[i] = vec![res];
                    return Ok(());
                }
                self.emit(format!(
                    "{res} = stablehlo.reduce({} init: {res}_init) applies stablehlo.{op} across \
                     dimensions = {} : ({}, {scalar}) -> {out_t}",
                    ins[0],
                    int_list(axes),
                    tensor_type(tys[0])
                ));
            }
            Op::ArgReduce { kind, axis } => {
                axis_ok(*axis, tys[0])?;
                if !out.dtype.is_int() {
                    return Err(err(format!(
                        "the index output must be an integer, not {out}"
                    )));
                }
                self.arg_reduce(&res, &ins[0], tys[0], out, *kind, *axis);
                self.names[i] = vec![format!("{res}_r#1")];
                return Ok(());
            }
            Op::Cumsum { axis } => {
                same_types(&tys)?;
                axis_ok(*axis, out)?;
                if out.dtype == DType::Pred {
                    return Err(err("cumsum is not defined for pred".to_string()));
                }
                let n = out.dims[*axis];
                if n == 0 {
                    self.names[i] = vec![ins[0].clone()];
                    return Ok(());
                }
                self.cumsum(&res, &ins[0], out, *axis, n);
            }
            Op::DotGeneral {
                lhs_batch,
                rhs_batch,
                lhs_contract,
                rhs_contract,
            } => {
                if lhs_batch.len() != rhs_batch.len() || lhs_contract.len() != rhs_contract.len() {
                    return Err(err(
                        "batch and contracting dimensions must pair up".to_string()
                    ));
                }
                let batching = if lhs_batch.is_empty() {
                    String::new()
                } else {
                    format!(
                        "batching_dims = {} x {}, ",
                        int_list(lhs_batch),
                        int_list(rhs_batch)
                    )
                };
                self.emit(format!(
                    "{res} = stablehlo.dot_general {}, {}, {batching}contracting_dims = {} x {} : \
                     {}",
                    ins[0],
                    ins[1],
                    int_list(lhs_contract),
                    int_list(rhs_contract),
                    signature(&tys, out)
                ));
            }
            Op::Take => {
                let (table, indices) = (tys[0], tys[1]);
                let Some((&rows, rest)) = table.dims.split_first() else {
                    return Err(err(format!("the table {table} has rank 0")));
                };
                if rows == 0 {
                    return Err(err(format!("the table {table} has no rows to take")));
                }
                if !indices.dtype.is_int() {
                    return Err(err(format!("indices {indices} are not integers")));
                }
                let r = indices.rank();
                let offset_dims: Vec<usize> = (r..r + rest.len()).collect();
                let mut slice_sizes = vec![1];
                slice_sizes.extend_from_slice(rest);
                self.emit(format!(
                    "{res} = \"stablehlo.gather\"({}, {}) {{dimension_numbers = \
                     #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [0], \
                     start_index_map = [0], index_vector_dim = {r}>, slice_sizes = {}, \
                     indices_are_sorted = false}} : {}",
                    ins[0],
                    ins[1],
                    int_list(&offset_dims),
                    i64_array(&slice_sizes),
                    signature(&tys, out)
                ));
            }
            Op::Sort { axis, descending } => {
                axis_ok(*axis, tys[0])?;
                if tys.iter().zip(&node.outputs).any(|(t, o)| *t != o) {
                    return Err(err("the outputs must have the operands' types".to_string()));
                }
                self.sort(&res, &ins, &tys, *axis, *descending);
                self.names[i] = if ins.len() == 1 {
                    vec![res]
                } else {
                    (0..ins.len()).map(|k| format!("{res}#{k}")).collect()
                };
                return Ok(());
            }
        }
        self.names[i] = vec![res];
        Ok(())
    }

    /// Emits `{out} = {op}(a, b)` (`maximum` or `minimum` of floats of type `ty`) that is NaN
    /// when either operand is NaN, with helper values named `{tmp}_...`.
    ///
    /// XLA's CPU compiler, with its default `xla_cpu_enable_fast_min_max`, compiles
    /// `stablehlo.maximum` to `a >= b ? a : b` (unordered), which drops a NaN in `b`; the
    /// explicit selects keep the op's semantics whatever the flag.
    #[allow(clippy::too_many_arguments)]
    fn nan_propagating(
        &mut self,
        out: &str,
        tmp: &str,
        op: &str,
        a: &str,
        b: &str,
        ty: &str,
        pred: &str,
        region: bool,
    ) {
        let lines = [
            format!("{tmp}_{op} = stablehlo.{op} {a}, {b} : {ty}"),
            format!("{tmp}_a_nan = stablehlo.compare NE, {a}, {a}, FLOAT : ({ty}, {ty}) -> {pred}"),
            format!("{tmp}_or_a = stablehlo.select {tmp}_a_nan, {a}, {tmp}_{op} : {pred}, {ty}"),
            format!("{tmp}_b_nan = stablehlo.compare NE, {b}, {b}, FLOAT : ({ty}, {ty}) -> {pred}"),
            format!("{out} = stablehlo.select {tmp}_b_nan, {b}, {tmp}_or_a : {pred}, {ty}"),
        ];
        for line in lines {
            if region {
                self.emit_inner(line);
            } else {
                self.emit(line);
            }
        }
    }

    /// A variadic reduce over (values, their indices along `axis`) keeping the best pair: the
    /// larger (smaller) value, NaN counting as larger than every number, and on a tie the smaller
    /// index. This choice is commutative and associative, as `stablehlo.reduce` requires; the
    /// init pair (the worst value, the index dtype's maximum) is its identity. Results `{res}_r#0`
    /// (values) and `{res}_r#1` (indices).
    fn arg_reduce(
        &mut self,
        res: &str,
        x: &str,
        x_ty: &TensorType,
        out: &TensorType,
        kind: ArgKind,
        axis: usize,
    ) {
        let dtype = x_ty.dtype;
        // The index dtype is the node's (integer) output dtype.
        let index = out.dtype;
        let iota = TensorType::new(index, &x_ty.dims);
        let values_out = TensorType::new(dtype, &out.dims);
        let sv = scalar_or_shaped(dtype, &[]);
        let si = scalar_or_shaped(index, &[]);
        let pred = scalar_or_shaped(DType::Pred, &[]);
        let cmp_type = compare_type(dtype);
        let float = dtype.is_float();
        // The worst value: nothing beats it, so it loses every tie (by its index).
        let worst = match (kind, float) {
            (ArgKind::Max, _) => special(dtype, Special::Lowest),
            (ArgKind::Min, true) => literal::nan(dtype),
            (ArgKind::Min, false) => special(dtype, Special::Highest),
        };
        let better = match kind {
            ArgKind::Max => "GT",
            ArgKind::Min => "LT",
        };
        self.emit(format!(
            "{res}_iota = stablehlo.iota dim = {axis} : {}",
            tensor_type(&iota)
        ));
        self.emit(format!(
            "{res}_init = stablehlo.constant dense<{worst}> : {sv}"
        ));
        self.emit(format!(
            "{res}_init_index = stablehlo.constant dense<{}> : {si}",
            special(index, Special::Highest)
        ));
        self.emit(format!(
            "{res}_r:2 = \"stablehlo.reduce\"({x}, {res}_iota, {res}_init, {res}_init_index) ({{"
        ));
        self.emit(format!(
            "^bb0({res}_a: {sv}, {res}_ai: {si}, {res}_b: {sv}, {res}_bi: {si}):"
        ));
        let cmp = |name: &str, dir: &str, l: &str, r: &str, ty: &str, ct: &str| {
            format!(
                "{res}_{name} = stablehlo.compare {dir}, {res}_{l}, {res}_{r}, {ct} : ({ty}, \
                 {ty}) -> {pred}"
            )
        };
        self.emit_inner(cmp("better", better, "a", "b", &sv, cmp_type));
        self.emit_inner(cmp("eq", "EQ", "a", "b", &sv, cmp_type));
        self.emit_inner(cmp("first", "LT", "ai", "bi", &si, compare_type(index)));
        let binop = |name: &str, op: &str, l: &str, r: &str| {
            format!("{res}_{name} = stablehlo.{op} {res}_{l}, {res}_{r} : {pred}")
        };
        if float {
            self.emit_inner(cmp("a_nan", "NE", "a", "a", &sv, cmp_type));
            self.emit_inner(cmp("b_nan", "NE", "b", "b", &sv, cmp_type));
            // NaN is larger than every number: it wins a max and loses a min against one.
            let (nan_side, number_side) = match kind {
                ArgKind::Max => ("a_nan", "b_nan"),
                ArgKind::Min => ("b_nan", "a_nan"),
            };
            self.emit_inner(format!(
                "{res}_number = stablehlo.not {res}_{number_side} : {pred}"
            ));
            self.emit_inner(binop("nan_wins", "and", nan_side, "number"));
            self.emit_inner(binop("both_nan", "and", "a_nan", "b_nan"));
            self.emit_inner(binop("same", "or", "eq", "both_nan"));
            self.emit_inner(binop("tie", "and", "same", "first"));
            self.emit_inner(binop("wins", "or", "better", "nan_wins"));
            self.emit_inner(binop("pick_a", "or", "wins", "tie"));
        } else {
            self.emit_inner(binop("tie", "and", "eq", "first"));
            self.emit_inner(binop("pick_a", "or", "better", "tie"));
        }
        self.emit_inner(format!(
            "{res}_value = stablehlo.select {res}_pick_a, {res}_a, {res}_b : {pred}, {sv}"
        ));
        self.emit_inner(format!(
            "{res}_index = stablehlo.select {res}_pick_a, {res}_ai, {res}_bi : {pred}, {si}"
        ));
        self.emit_inner(format!(
            "stablehlo.return {res}_value, {res}_index : {sv}, {si}"
        ));
        self.emit(format!(
            "}}) {{dimensions = array<i64: {axis}>}} : ({}, {}, {sv}, {si}) -> ({}, {})",
            tensor_type(x_ty),
            tensor_type(&iota),
            tensor_type(&values_out),
            tensor_type(out)
        ));
    }

    /// An inclusive running sum along `axis` (of length `n`). Up to [`SCAN_WINDOW_MAX`]
    /// elements: a `reduce_window` whose window covers the `n` elements up to and including
    /// each position (padding `n - 1` zeros in front), summed first to last, `n` additions per
    /// element. Longer: a Hillis-Steele scan, `s = s + shift(s, 2^k)` for `k = 0, 1, ...` while
    /// `2^k < n` (each shift a slice and a zero pad), `ceil(log2 n)` additions per element.
    fn cumsum(&mut self, res: &str, x: &str, ty: &TensorType, axis: usize, n: usize) {
        if n > SCAN_WINDOW_MAX {
            return self.log_scan(res, x, ty, axis, n);
        }
        let scalar = scalar_or_shaped(ty.dtype, &[]);
        let t = tensor_type(ty);
        let window: Vec<usize> = (0..ty.rank())
            .map(|d| if d == axis { n } else { 1 })
            .collect();
        let padding: Vec<String> = (0..ty.rank())
            .map(|d| {
                if d == axis {
                    format!("[{}, 0]", n - 1)
                } else {
                    "[0, 0]".to_string()
                }
            })
            .collect();
        self.emit(format!(
            "{res}_init = stablehlo.constant dense<{}> : {scalar}",
            special(ty.dtype, Special::Zero)
        ));
        self.emit(format!(
            "{res} = \"stablehlo.reduce_window\"({x}, {res}_init) ({{"
        ));
        self.emit(format!("^bb0({res}_a: {scalar}, {res}_b: {scalar}):"));
        self.emit_inner(format!(
            "{res}_sum = stablehlo.add {res}_a, {res}_b : {scalar}"
        ));
        self.emit_inner(format!("stablehlo.return {res}_sum : {scalar}"));
        self.emit(format!(
            "}}) {{window_dimensions = {}, padding = dense<[{}]> : tensor<{}x2xi64>}} : ({t}, \
             {scalar}) -> {t}",
            i64_array(&window),
            padding.join(", "),
            ty.rank()
        ));
    }

    /// The log-depth inclusive scan of [`Self::cumsum`] for `n > SCAN_WINDOW_MAX`.
    fn log_scan(&mut self, res: &str, x: &str, ty: &TensorType, axis: usize, n: usize) {
        let t = tensor_type(ty);
        let scalar = scalar_or_shaped(ty.dtype, &[]);
        self.emit(format!(
            "{res}_zero = stablehlo.constant dense<{}> : {scalar}",
            special(ty.dtype, Special::Zero)
        ));
        let mut acc = x.to_string();
        let mut shift = 1;
        let mut round = 0;
        while shift < n {
            // shifted[i] = acc[i - shift] (0 for i < shift) along the axis.
            let mut kept = ty.dims.clone();
            kept[axis] = n - shift;
            let ranges: Vec<String> = ty
                .dims
                .iter()
                .enumerate()
                .map(|(d, &len)| {
                    if d == axis {
                        format!("0:{}", n - shift)
                    } else {
                        format!("0:{len}")
                    }
                })
                .collect();
            let low: Vec<usize> = (0..ty.rank())
                .map(|d| if d == axis { shift } else { 0 })
                .collect();
            let zeros = vec![0; ty.rank()];
            let kept_t = tensor_type(&TensorType::new(ty.dtype, &kept));
            let name = format!("{res}_s{round}");
            self.emit(format!(
                "{name}_kept = stablehlo.slice {acc} [{}] : ({t}) -> {kept_t}",
                ranges.join(", ")
            ));
            self.emit(format!(
                "{name}_shifted = stablehlo.pad {name}_kept, {res}_zero, low = {}, high = {}, \
                 interior = {} : ({kept_t}, {scalar}) -> {t}",
                int_list(&low),
                int_list(&zeros),
                int_list(&zeros)
            ));
            let out = if shift * 2 >= n {
                res.to_string()
            } else {
                name.clone()
            };
            self.emit(format!("{out} = stablehlo.add {acc}, {name}_shifted : {t}"));
            acc = out;
            shift *= 2;
            round += 1;
        }
    }

    /// A stable sort whose comparator looks at the keys only: `a` goes before `b` when it is
    /// smaller (larger when descending); for floats every NaN counts as larger than every
    /// number and NaNs are equal to each other, so NaNs go last (first when descending) in their
    /// original order, and `-0.0` equals `0.0`.
    ///
    /// (StableHLO's `TOTALORDER` comparison would put negative NaNs first and `-0.0` before
    /// `0.0`, which the op's semantics do not.)
    fn sort(
        &mut self,
        res: &str,
        ins: &[String],
        tys: &[&TensorType],
        axis: usize,
        descending: bool,
    ) {
        let key = tys[0].dtype;
        let sk = scalar_or_shaped(key, &[]);
        let pred = scalar_or_shaped(DType::Pred, &[]);
        let ct = compare_type(key);
        let result = if ins.len() == 1 {
            res.to_string()
        } else {
            format!("{res}:{}", ins.len())
        };
        self.emit(format!(
            "{result} = \"stablehlo.sort\"({}) ({{",
            ins.join(", ")
        ));
        let mut args = vec![format!("{res}_a: {sk}"), format!("{res}_b: {sk}")];
        for (k, t) in tys.iter().enumerate().skip(1) {
            let s = scalar_or_shaped(t.dtype, &[]);
            args.push(format!("{res}_a{k}: {s}"));
            args.push(format!("{res}_b{k}: {s}"));
        }
        self.emit(format!("^bb0({}):", args.join(", ")));
        let dir = if descending { "GT" } else { "LT" };
        let cmp = |name: &str, dir: &str, l: &str, r: &str| {
            format!(
                "{res}_{name} = stablehlo.compare {dir}, {res}_{l}, {res}_{r}, {ct} : ({sk}, \
                 {sk}) -> {pred}"
            )
        };
        self.emit_inner(cmp("before", dir, "a", "b"));
        let verdict = if key.is_float() {
            self.emit_inner(cmp("a_nan", "NE", "a", "a"));
            self.emit_inner(cmp("b_nan", "NE", "b", "b"));
            // Ascending: a number goes before a NaN; descending: a NaN before a number.
            let (nan, number) = if descending {
                ("a_nan", "b_nan")
            } else {
                ("b_nan", "a_nan")
            };
            self.emit_inner(format!(
                "{res}_number = stablehlo.not {res}_{number} : {pred}"
            ));
            self.emit_inner(format!(
                "{res}_nan_order = stablehlo.and {res}_{nan}, {res}_number : {pred}"
            ));
            self.emit_inner(format!(
                "{res}_lt = stablehlo.or {res}_before, {res}_nan_order : {pred}"
            ));
            format!("{res}_lt")
        } else {
            format!("{res}_before")
        };
        self.emit_inner(format!("stablehlo.return {verdict} : {pred}"));
        let operand_types: Vec<String> = tys.iter().map(|t| tensor_type(t)).collect();
        let result_types = if tys.len() == 1 {
            operand_types[0].clone()
        } else {
            format!("({})", operand_types.join(", "))
        };
        self.emit(format!(
            "}}) {{dimension = {axis} : i64, is_stable = true}} : ({}) -> {result_types}",
            operand_types.join(", ")
        ));
    }
}
