//! The reference interpreter: evaluates a [`Graph`] on host arrays, one primitive at a time.
//!
//! It is the oracle the compiled programs are tested against, so it is written for clarity, not
//! speed, and follows the semantics documented on [`Op`] exactly: integers are exact (wrapping
//! arithmetic, XLA's rules for division by zero and oversized shifts), floats are IEEE.
//!
//! Precision rules beyond the op documentation:
//! - `f16` and `bf16` elementwise ops are computed in `f32` and rounded back (to nearest even).
//! - Accumulations (`Reduce` sum and product, `Cumsum`, `DotGeneral`) run in `f32` for
//!   `f16`/`bf16` operands and in `f64` for `f32`/`f64` operands, in row-major order, and are
//!   rounded to the output type once per output element.
//! - Float `Max`/`Min` (binary, `Clamp`, `Reduce`) propagate NaN and order `-0.0` below `+0.0`.
//! - Conversions to a float type round to nearest even directly from the exact source value (no
//!   double rounding through an intermediate type).
//!
//! A `While` binds its state to the condition region's arguments and evaluates that region;
//! while it gives true, the state moves to the body region's arguments and the body's results
//! become the next state. A region evaluates only the nodes its results depend on, in node order.
//! There is no iteration limit: a loop whose condition never turns false does not return.
//!
//! A `ShardMap` splits its inputs into per-device blocks, evaluates its body once per device of
//! its mesh (one thread each; the collectives exchange values through a rendezvous that errors
//! rather than hangs when the devices diverge) and assembles the outputs; see `collectives`.
//!
//! The interpreter reads each node's recorded types and never re-checks them: before evaluating,
//! it runs the graph's walk ([`crate::ops`]'s `live_nodes`, which runs every live node's rule),
//! and a malformed graph (one built below the DSL) gives [`Error::Interp`] naming the node.
//! Evaluation never panics.

mod collectives;
mod elementwise;
mod index;
mod linalg;
mod reduce;
mod scalar;
mod shape;

use std::fmt::Display;

use crate::array::HostArray;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::ops::{live_nodes, Graph, Node, Op, Region, ValueId};

/// Evaluates `graph` on `inputs` (one per parameter, in order) and returns the graph's outputs in
/// order.
///
/// Fails with [`Error::Interp`] if an input's dtype or shape differs from its parameter's, if a
/// node is malformed (wrong operand count or types, outputs that its op cannot produce, operands
/// defined after the node or in another region, a loop whose regions do not fit its state), or if
/// an array would be too large to allocate. Only the nodes the outputs depend on are evaluated.
pub fn evaluate(graph: &Graph, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
    let types = graph.parameter_types();
    if inputs.len() != types.len() {
        return Err(Error::Interp(format!(
            "the graph has {} parameters but {} inputs were given",
            types.len(),
            inputs.len()
        )));
    }
    let names = graph.parameter_names();
    for (i, (input, expected)) in inputs.iter().zip(&types).enumerate() {
        let got = input.ty();
        if &got != expected {
            let name = names.get(i).map(String::as_str).unwrap_or("?");
            return Err(Error::Interp(format!(
                "input {i} is {got}, but parameter {i} ({name}) is {expected}"
            )));
        }
    }
    let params = graph.parameters();
    let outputs = graph.outputs();
    graph.with_structure(|nodes, regions| {
        let order = live_nodes(nodes, regions, &params, &outputs).map_err(Error::Interp)?;
        evaluate_nodes(nodes, regions, order, inputs, &outputs)
    })
}

/// The state of one evaluation: the graph, the program's inputs, and the current value of every
/// node (nodes inside a loop hold their values from the latest iteration).
struct Evaluator<'a> {
    nodes: &'a [Node],
    regions: &'a [Region],
    inputs: &'a [HostArray],
    /// The live nodes of each region other than block arguments, in node order (from
    /// [`live_nodes`], which checked them).
    order: Vec<Vec<usize>>,
    values: Vec<Option<Vec<HostArray>>>,
    /// The device being evaluated, inside a shard_map body (`None` outside).
    device: Option<collectives::Device<'a>>,
}

fn evaluate_nodes(
    nodes: &[Node],
    regions: &[Region],
    order: Vec<Vec<usize>>,
    inputs: &[HostArray],
    outputs: &[ValueId],
) -> Result<Vec<HostArray>> {
    let mut ev = Evaluator {
        nodes,
        regions,
        inputs,
        order,
        values: vec![None; nodes.len()],
        device: None,
    };
    ev.run_nodes(0)?;

    outputs
        .iter()
        .map(|out| {
            ev.values
                .get(out.node)
                .and_then(|v| v.as_ref())
                .and_then(|outs| outs.get(out.output))
                .cloned()
                .ok_or_else(|| {
                    Error::Interp(format!(
                        "graph output refers to value {}#{}, which does not exist",
                        out.node, out.output
                    ))
                })
        })
        .collect()
}

impl Evaluator<'_> {
    /// Evaluates the needed nodes of region `r` in order (its arguments are bound).
    fn run_nodes(&mut self, r: usize) -> Result<()> {
        for k in 0..self.order[r].len() {
            let i = self.order[r][k];
            self.node(i)?;
        }
        Ok(())
    }

    /// The value `v` read by input `k` of node `index`: an output of an earlier node of the same
    /// region ([`live_nodes`] checked it), evaluated before.
    fn operand(&self, index: usize, k: usize, v: ValueId) -> Result<&HostArray> {
        let node = &self.nodes[index];
        let value = if v.node < index {
            self.values[v.node]
                .as_ref()
                .and_then(|outs| outs.get(v.output))
        } else {
            None
        };
        value.ok_or_else(|| {
            Error::Interp(format!(
                "node {index} ({}): input {k} refers to value {}#{}, which is not an output of \
                 an earlier node",
                node.op.name(),
                v.node,
                v.output
            ))
        })
    }

    /// Evaluates node `index` and stores its outputs.
    fn node(&mut self, index: usize) -> Result<()> {
        let node = &self.nodes[index];
        match &node.op {
            Op::While { cond, body } => return self.while_loop(index, *cond, *body),
            Op::Case { branches } => return self.case(index, branches),
            Op::ShardMap {
                body,
                mesh,
                in_specs,
                out_specs,
            } => return self.shard_map(index, *body, mesh, [in_specs, out_specs]),
            Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::AllToAll { .. }
            | Op::AxisIndex { .. } => return self.collective(index),
            _ => {}
        }
        let results = {
            let args = node
                .inputs
                .iter()
                .enumerate()
                .map(|(k, &v)| self.operand(index, k, v))
                .collect::<Result<Vec<_>>>()?;
            let ctx = Ctx { index, node, args };
            ctx.evaluate(self.inputs)?
        };
        self.values[index] = Some(results);
        Ok(())
    }

    /// Runs the `While` node `index` over its regions `cond` and `body` (which fit its state
    /// and belong to it alone, as [`live_nodes`] checked): binds the state to the condition's
    /// arguments, evaluates the condition, and while it is true moves the state to the body's
    /// arguments and takes the body's results as the next state. Between iterations the state
    /// is moved, not copied.
    fn while_loop(&mut self, index: usize, cond: usize, body: usize) -> Result<()> {
        let err = |m: String| Error::Interp(format!("node {index} (while): {m}"));
        let node = &self.nodes[index];
        let mut state = node
            .inputs
            .iter()
            .enumerate()
            .map(|(k, &v)| self.operand(index, k, v).cloned())
            .collect::<Result<Vec<_>>>()?;
        let (cond_args, body_args) = (&self.regions[cond].args, &self.regions[body].args);
        loop {
            self.bind(cond_args, state);
            self.run_nodes(cond)?;
            // Read in place: the condition may return one of its arguments.
            let go = self.regions[cond]
                .results
                .first()
                .and_then(|v| self.values[v.node].as_ref()?.get(v.output));
            let go = match go {
                Some(HostArray::Pred(p)) if p.ndim() == 0 => p.iter().all(|&b| b),
                _ => return Err(err("the condition did not give one pred[]".to_string())),
            };
            state = self.unbind(cond_args).map_err(err)?;
            if !go {
                break;
            }
            self.bind(body_args, state);
            self.run_nodes(body)?;
            state = self.results(body)?;
        }
        self.values[index] = Some(state);
        Ok(())
    }

    /// Runs the `Case` node `index`: the branch its index names (the last one when out of
    /// range, as StableHLO's `case`), with the operands bound to the branch's arguments.
    fn case(&mut self, index: usize, branches: &[usize]) -> Result<()> {
        let err = |m: String| Error::Interp(format!("node {index} (case): {m}"));
        let node = &self.nodes[index];
        let which = match self.operand(index, 0, node.inputs[0])? {
            HostArray::I32(i) if i.ndim() == 0 => i.iter().next().copied().unwrap_or(0),
            _ => return Err(err("the branch index is not one i32[]".to_string())),
        };
        let last = branches.len().saturating_sub(1);
        let r = match usize::try_from(which) {
            Ok(k) if k < last => branches[k],
            _ => *branches
                .get(last)
                .ok_or_else(|| err("no branches".to_string()))?,
        };
        let operands = node.inputs[1..]
            .iter()
            .enumerate()
            .map(|(k, &v)| self.operand(index, k + 1, v).cloned())
            .collect::<Result<Vec<_>>>()?;
        let args = self.regions[r].args.clone();
        self.bind(&args, operands);
        self.run_nodes(r)?;
        let results = self.results(r)?;
        self.values[index] = Some(results);
        Ok(())
    }

    /// Binds the block arguments `args` to `values`.
    fn bind(&mut self, args: &[ValueId], values: Vec<HostArray>) {
        for (a, v) in args.iter().zip(values) {
            self.values[a.node] = Some(vec![v]);
        }
    }

    /// Takes the values bound to the block arguments `args` back.
    fn unbind(&mut self, args: &[ValueId]) -> std::result::Result<Vec<HostArray>, String> {
        args.iter()
            .map(|a| {
                self.values[a.node]
                    .take()
                    .and_then(|v| v.into_iter().next())
                    .ok_or_else(|| format!("block argument {} lost its value", a.node))
            })
            .collect()
    }

    /// The results of region `r`, just evaluated (its values are not read again before it is
    /// evaluated anew). A value is moved out, or copied when a later result returns it too.
    fn results(&mut self, r: usize) -> Result<Vec<HostArray>> {
        let results = &self.regions[r].results;
        let mut out = Vec::with_capacity(results.len());
        for (k, v) in results.iter().enumerate() {
            let slot = self.values[v.node]
                .as_mut()
                .and_then(|outs| outs.get_mut(v.output));
            let value = if results[k + 1..].contains(v) {
                slot.map(|x| x.clone())
            } else {
                let empty = HostArray::Pred(ndarray::ArrayD::default(ndarray::IxDyn(&[0])));
                slot.map(|x| std::mem::replace(x, empty))
            };
            out.push(value.ok_or_else(|| {
                Error::Interp(format!(
                    "result {k} of region {r} is value {}#{}, which was not computed",
                    v.node, v.output
                ))
            })?);
        }
        Ok(out)
    }
}

/// One node being evaluated: its position, definition and operand values.
pub(super) struct Ctx<'a> {
    index: usize,
    node: &'a Node,
    args: Vec<&'a HostArray>,
}

impl<'a> Ctx<'a> {
    /// An [`Error::Interp`] naming this node.
    pub(super) fn err(&self, message: impl Display) -> Error {
        Error::Interp(format!(
            "node {} ({}): {message}",
            self.index,
            self.node.op.name()
        ))
    }

    /// The operands, `n` of them (as the op's rule checked; an error rather than a panic if
    /// not).
    pub(super) fn args(&self, n: usize) -> Result<&[&'a HostArray]> {
        if self.args.len() == n {
            Ok(&self.args)
        } else {
            Err(self.err(format!("expects {n} inputs, has {}", self.args.len())))
        }
    }

    /// All operands, whatever their number.
    pub(super) fn all_args(&self) -> &[&'a HostArray] {
        &self.args
    }

    /// The single declared output type.
    pub(super) fn out(&self) -> Result<&'a TensorType> {
        match self.node.outputs.as_slice() {
            [ty] => Ok(ty),
            other => Err(self.err(format!("expects 1 output, declares {}", other.len()))),
        }
    }

    /// Evaluates the node and checks its results against the declared output types (the
    /// interpreter checking itself against the rules).
    fn evaluate(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
        for ty in &self.node.outputs {
            self.check_allocatable(ty)?;
        }
        let one = |r: Result<HostArray>| r.map(|v| vec![v]);
        let results = match &self.node.op {
            Op::ShardMap { .. }
            | Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::AllToAll { .. }
            | Op::AxisIndex { .. } => {
                // Evaluated by `Evaluator`, which knows the devices.
                return Err(self.err("is evaluated with its shard_map, not on its own"));
            }
            Op::BlockArg | Op::While { .. } | Op::Case { .. } => {
                // Block arguments are bound by their loop, which `Evaluator` runs.
                return Err(self.err("is evaluated by its loop, not on its own"));
            }
            Op::Parameter { index, .. } => {
                let value = inputs.get(*index).ok_or_else(|| {
                    self.err(format!(
                        "parameter index {index}, but there are {} inputs",
                        inputs.len()
                    ))
                })?;
                Ok(vec![value.clone()])
            }
            Op::Constant { data } => one(shape::constant(self, data)),
            Op::Iota { dim } => one(shape::iota(self, *dim)),
            Op::Unary(op) => one(elementwise::unary(self, *op)),
            Op::Binary(op) => one(elementwise::binary(self, *op)),
            Op::Compare(dir) => one(elementwise::compare(self, *dir)),
            Op::Select => one(elementwise::select(self)),
            Op::Clamp => one(elementwise::clamp(self)),
            Op::Convert => one(elementwise::convert(self)),
            Op::BitcastConvert => one(elementwise::bitcast_convert(self)),
            Op::BroadcastInDim { dims } => one(shape::broadcast_in_dim(self, dims)),
            Op::Reshape => one(shape::reshape(self)),
            Op::Transpose { perm } => one(shape::transpose(self, perm)),
            Op::Slice { start, stride, .. } => one(shape::slice(self, start, stride)),
            Op::DynamicSlice { sizes } => one(index::dynamic_slice(self, sizes)),
            Op::DynamicUpdateSlice => one(index::dynamic_update_slice(self)),
            Op::Concatenate { axis } => one(shape::concatenate(self, *axis)),
            Op::Pad { low, interior, .. } => one(shape::pad(self, low, interior)),
            Op::Reverse { axes } => one(shape::reverse(self, axes)),
            // The unsharded meaning: a layout hint only.
            Op::ShardingConstraint { .. } => one(Ok(self.all_args()[0].clone())),
            Op::OptimizationBarrier => Ok(self.all_args().iter().map(|&a| a.clone()).collect()),
            Op::Reduce { kind, axes } => one(reduce::reduce(self, *kind, axes)),
            Op::ArgReduce { kind, axis } => one(reduce::arg_reduce(self, *kind, *axis)),
            Op::Cumsum { axis } => one(reduce::cumsum(self, *axis)),
            Op::Convolution(w) => one(linalg::convolution(self, w)),
            Op::DotGeneral {
                lhs_batch,
                rhs_batch,
                lhs_contract,
                rhs_contract,
            } => one(linalg::dot_general(
                self,
                linalg::DotDims {
                    lhs_batch,
                    rhs_batch,
                    lhs_contract,
                    rhs_contract,
                },
            )),
            Op::Take => one(index::take(self)),
            Op::ScatterAdd => one(index::scatter_add(self)),
            Op::ScatterSet => one(index::scatter_set(self)),
            Op::Sort { axis, descending } => reduce::sort(self, *axis, *descending),
        }?;
        if results.len() != self.node.outputs.len() {
            return Err(self.err(format!(
                "produces {} outputs but declares {}",
                results.len(),
                self.node.outputs.len()
            )));
        }
        for (k, (value, declared)) in results.iter().zip(&self.node.outputs).enumerate() {
            let got = value.ty();
            if &got != declared {
                return Err(self.err(format!(
                    "output {k} is declared {declared}, but the op produces {got}"
                )));
            }
        }
        Ok(results)
    }

    /// Fails unless an array of type `ty` fits in memory: its size in bytes must fit `isize`
    /// (ndarray's limit) and the allocator must be able to provide it.
    fn check_allocatable(&self, ty: &TensorType) -> Result<()> {
        let too_large = || self.err(format!("{ty} is too large to allocate"));
        let nonzero = ty
            .dims
            .iter()
            .filter(|&&d| d != 0)
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(too_large)?;
        let bytes = nonzero
            .checked_mul(ty.dtype.size_in_bytes())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(too_large)?;
        let count = element_count(&ty.dims).ok_or_else(too_large)?;
        if count > 0 {
            let mut probe: Vec<u8> = Vec::new();
            probe.try_reserve_exact(bytes).map_err(|_| too_large())?;
        }
        Ok(())
    }
}

/// The number of elements of a shape, or `None` on overflow.
pub(super) fn element_count(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The row-major position of `index` in an array of shape `dims` (`index` within bounds).
pub(super) fn row_major_index(index: &[usize], dims: &[usize]) -> usize {
    index.iter().zip(dims).fold(0, |acc, (&i, &n)| acc * n + i)
}

#[cfg(test)]
pub(super) mod test_util {
    //! Helpers for the interpreter's unit tests: one-node graphs over parameters.

    use half::{bf16, f16};

    use crate::array::{HostArray, HostElement};
    use crate::dtype::{DType, TensorType};
    use crate::error::Result;
    use crate::ops::{Graph, Op};

    /// An array from row-major data.
    pub fn arr<T: HostElement>(dims: &[usize], data: Vec<T>) -> HostArray {
        HostArray::from_vec(dims, data).unwrap()
    }

    /// A 1-D array.
    pub fn vec1<T: HostElement>(data: Vec<T>) -> HostArray {
        let n = data.len();
        arr(&[n], data)
    }

    /// A 1-D f16 array from f32 values (rounded).
    pub fn f16s(data: &[f32]) -> HostArray {
        vec1(data.iter().map(|&x| f16::from_f32(x)).collect())
    }

    /// A 1-D bf16 array from f32 values (rounded).
    pub fn bf16s(data: &[f32]) -> HostArray {
        vec1(data.iter().map(|&x| bf16::from_f32(x)).collect())
    }

    /// Evaluates one node of `op` whose inputs are parameters holding `inputs`.
    pub fn eval_op(op: Op, inputs: &[HostArray], outputs: &[TensorType]) -> Result<Vec<HostArray>> {
        let g = Graph::new();
        let mut ids = Vec::new();
        for (i, x) in inputs.iter().enumerate() {
            let p = g.parameter(&format!("p{i}"), x.dtype(), x.dims())?;
            ids.push(p.id());
        }
        let outs = g.push(op, ids, outputs.to_vec())?;
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        super::evaluate(&g, inputs)
    }

    /// Evaluates a one-output node and returns its value.
    pub fn eval1(op: Op, inputs: &[HostArray], out: TensorType) -> Result<HostArray> {
        Ok(eval_op(op, inputs, &[out])?.remove(0))
    }

    /// A tensor type.
    pub fn ty(dtype: DType, dims: &[usize]) -> TensorType {
        TensorType::new(dtype, dims)
    }

    /// The elements of an array as `T`, row-major.
    pub fn values<T: HostElement>(a: &HostArray) -> Vec<T> {
        a.as_array::<T>().unwrap().iter().copied().collect()
    }

    /// The bit patterns of an f32 array (to compare NaNs and signed zeros exactly).
    pub fn f32_bits(a: &HostArray) -> Vec<u32> {
        values::<f32>(a).iter().map(|x| x.to_bits()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::slice::from_ref;

    use super::test_util::*;
    use super::*;
    use crate::dtype::DType;
    use crate::ops::{BinaryOp, UnaryOp};

    fn is_interp_err<T: std::fmt::Debug>(r: Result<T>, needle: &str) {
        match r {
            Err(Error::Interp(m)) => assert!(m.contains(needle), "message {m:?} lacks {needle:?}"),
            other => panic!("expected an interpreter error, got {other:?}"),
        }
    }

    #[test]
    fn evaluates_a_chain_and_returns_outputs_in_order() {
        let g = Graph::new();
        let x = g.parameter("x", DType::I32, &[3]).unwrap();
        let y = g.parameter("y", DType::I32, &[3]).unwrap();
        let t = ty(DType::I32, &[3]);
        let s = g
            .push(
                Op::Binary(BinaryOp::Add),
                vec![x.id(), y.id()],
                vec![t.clone()],
            )
            .unwrap();
        let p = g
            .push(Op::Binary(BinaryOp::Mul), vec![s[0].id(), x.id()], vec![t])
            .unwrap();
        g.set_outputs(&[&p[0], &s[0], &p[0]]).unwrap();
        let out = evaluate(&g, &[vec1(vec![1i32, 2, 3]), vec1(vec![10i32, 20, 30])]).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(values::<i32>(&out[0]), vec![11, 44, 99]);
        assert_eq!(values::<i32>(&out[1]), vec![11, 22, 33]);
        assert_eq!(out[2], out[0]);
    }

    #[test]
    fn no_outputs_and_unreachable_malformed_nodes_are_fine() {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[]).unwrap();
        // A malformed node nobody uses is never evaluated.
        g.push(
            Op::Binary(BinaryOp::Add),
            vec![x.id()],
            vec![ty(DType::F32, &[])],
        )
        .unwrap();
        assert!(evaluate(&g, &[HostArray::scalar(1.0f32)])
            .unwrap()
            .is_empty());
        g.set_outputs(&[&x]).unwrap();
        let out = evaluate(&g, &[HostArray::scalar(1.5f32)]).unwrap();
        assert_eq!(out, vec![HostArray::scalar(1.5f32)]);
    }

    #[test]
    fn input_count_dtype_and_shape_are_checked() {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).unwrap();
        g.set_outputs(&[&x]).unwrap();
        is_interp_err(evaluate(&g, &[]), "1 parameters but 0 inputs");
        is_interp_err(
            evaluate(&g, &[vec1(vec![1i32, 2])]),
            "input 0 is i32[2], but parameter 0 (x) is f32[2]",
        );
        is_interp_err(
            evaluate(&g, &[vec1(vec![1f32, 2.0, 3.0])]),
            "input 0 is f32[3], but parameter 0 (x) is f32[2]",
        );
    }

    #[test]
    fn wrong_input_count_and_types_are_errors() {
        let t = ty(DType::F32, &[2]);
        let a = vec1(vec![1f32, 2.0]);
        is_interp_err(
            eval1(Op::Binary(BinaryOp::Add), from_ref(&a), t.clone()),
            "takes 2 operands, got 1",
        );
        is_interp_err(
            eval1(Op::Unary(UnaryOp::Neg), from_ref(&a), ty(DType::F32, &[3])),
            "node 1 (unary)",
        );
        is_interp_err(
            eval1(
                Op::Binary(BinaryOp::Add),
                &[a.clone(), vec1(vec![1i32, 2])],
                t.clone(),
            ),
            "operands f32[2], i32[2] differ in type",
        );
        is_interp_err(
            eval_op(Op::Unary(UnaryOp::Neg), from_ref(&a), &[t.clone(), t]),
            "the outputs are declared (f32[2], f32[2]), but the op gives (f32[2])",
        );
    }

    #[test]
    fn dangling_and_forward_references_are_errors() {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[]).unwrap();
        let t = ty(DType::F32, &[]);
        let bad = g
            .push(
                Op::Unary(UnaryOp::Neg),
                vec![ValueId { node: 7, output: 0 }],
                vec![t.clone()],
            )
            .unwrap();
        g.set_outputs(&[&bad[0]]).unwrap();
        is_interp_err(
            evaluate(&g, &[HostArray::scalar(1f32)]),
            "input 0 refers to value 7#0",
        );
        // An operand that names a missing output of an earlier node.
        let bad = g
            .push(
                Op::Unary(UnaryOp::Neg),
                vec![ValueId {
                    node: x.id().node,
                    output: 1,
                }],
                vec![t],
            )
            .unwrap();
        g.set_outputs(&[&bad[0]]).unwrap();
        is_interp_err(
            evaluate(&g, &[HostArray::scalar(1f32)]),
            "refers to value 0#1",
        );
    }

    #[test]
    fn parameter_node_with_bad_index_or_type_is_an_error() {
        let g = Graph::new();
        let t = ty(DType::F32, &[]);
        let p = g
            .push(
                Op::Parameter {
                    index: 3,
                    name: "p".into(),
                },
                vec![],
                vec![t],
            )
            .unwrap();
        g.set_outputs(&[&p[0]]).unwrap();
        is_interp_err(
            evaluate(&g, &[]),
            "parameter 3 (\"p\") is not in the graph's parameter list",
        );

        let g = Graph::new();
        g.parameter("x", DType::F32, &[]).unwrap();
        let p = g
            .push(
                Op::Parameter {
                    index: 0,
                    name: "p".into(),
                },
                vec![],
                vec![ty(DType::I32, &[])],
            )
            .unwrap();
        g.set_outputs(&[&p[0]]).unwrap();
        is_interp_err(
            evaluate(&g, &[HostArray::scalar(1f32)]),
            "parameter 0 (\"p\") is not in the graph's parameter list",
        );
    }

    #[test]
    fn inputs_in_any_memory_layout_give_row_major_results() {
        use crate::ops::{ReduceKind, UnaryOp};
        use ndarray::{ArrayD, IxDyn};
        // A column-major (transposed) array: logically [[0, 1, 2], [3, 4, 5]].
        let base = ArrayD::from_shape_vec(IxDyn(&[3, 2]), vec![0i32, 3, 1, 4, 2, 5]).unwrap();
        let fortran = HostArray::I32(base.reversed_axes());
        assert_eq!(fortran, arr(&[2, 3], vec![0i32, 1, 2, 3, 4, 5]));
        let r = eval1(
            Op::Reshape,
            std::slice::from_ref(&fortran),
            ty(DType::I32, &[6]),
        )
        .unwrap();
        assert_eq!(values::<i32>(&r), vec![0, 1, 2, 3, 4, 5]);
        let r = eval1(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![1],
            },
            std::slice::from_ref(&fortran),
            ty(DType::I32, &[2]),
        )
        .unwrap();
        assert_eq!(values::<i32>(&r), vec![3, 12]);
        let r = eval1(
            Op::Sort {
                axis: 1,
                descending: true,
            },
            std::slice::from_ref(&fortran),
            ty(DType::I32, &[2, 3]),
        )
        .unwrap();
        assert_eq!(values::<i32>(&r), vec![2, 1, 0, 5, 4, 3]);
        let r = eval1(
            Op::Unary(UnaryOp::Neg),
            std::slice::from_ref(&fortran),
            fortran.ty(),
        )
        .unwrap();
        assert_eq!(
            r.to_bytes(),
            arr(&[2, 3], vec![0i32, -1, -2, -3, -4, -5]).to_bytes()
        );
        let r = eval1(
            Op::DotGeneral {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![1],
                rhs_contract: vec![1],
            },
            &[fortran.clone(), fortran],
            ty(DType::I32, &[2, 2]),
        )
        .unwrap();
        assert_eq!(values::<i32>(&r), vec![5, 14, 14, 50]);
    }

    #[test]
    fn huge_declared_outputs_are_errors_not_aborts() {
        // Past what a size in bytes can address: the rule rejects the node.
        let huge = ty(DType::F32, &[usize::MAX, 2]);
        is_interp_err(
            eval1(Op::Iota { dim: 0 }, &[], huge),
            "too large to address",
        );
        let huge = ty(DType::F64, &[1 << 60]);
        is_interp_err(
            eval1(Op::Iota { dim: 0 }, &[], huge),
            "too large to address",
        );
        // Addressable but more than the allocator gives.
        let huge = ty(DType::U8, &[1 << 50]);
        is_interp_err(
            eval1(Op::Iota { dim: 0 }, &[], huge),
            "too large to allocate",
        );
        // Zero elements with a huge dimension is fine.
        let empty = ty(DType::I32, &[0, 1 << 40]);
        let out = eval1(Op::Iota { dim: 1 }, &[], empty.clone()).unwrap();
        assert_eq!(out.ty(), empty);
    }

    #[test]
    fn malformed_loops_are_errors() {
        for (what, g, needle) in crate::ops::malformed_loops() {
            match evaluate(&g, &[vec1(vec![1f32, 2.0])]) {
                Err(Error::Interp(m)) => assert!(m.contains(needle), "{what}: {m}"),
                other => panic!("{what}: expected an interpreter error, got {other:?}"),
            }
        }
    }

    /// States moved between the regions: a condition returning its own argument, a body that
    /// swaps its arguments, returns one value twice, and returns a second output of a sort.
    #[test]
    fn loop_states_move_between_regions() {
        let g = Graph::new();
        let flag = g.parameter("flag", DType::Pred, &[]).unwrap();
        let a = g.parameter("a", DType::I32, &[3]).unwrap();
        let b = g.parameter("b", DType::I32, &[3]).unwrap();
        let n = g.scalar(0.0, DType::I64).unwrap();
        let (flag_out, n_out, a_out, b_out, sum, idx) = {
            let init = (
                flag.clone(),
                n,
                (a.clone(), b.clone()),
                (a.clone(), a.clone()),
            );
            let iota = g.iota(DType::I64, &[3], 0).unwrap();
            let (f, n, (x, y), (s, i)) = g
                .while_loop(
                    &init,
                    |(f, _, _, _)| Ok(f.clone()),
                    |(_, n, (x, y), (s, _))| {
                        let stop = n.ge(4)?;
                        let both = x.add(y)?;
                        let (_, order) =
                            s.sort_with_indices(0, crate::ops::SortOrder::Descending)?;
                        Ok((
                            stop.not()?,
                            n.add(1)?,
                            (y.clone(), x.clone()),
                            (
                                both,
                                order.convert(DType::I32)?.add(&iota.convert(DType::I32)?)?,
                            ),
                        ))
                    },
                )
                .unwrap();
            (f, n, x, y, s, i)
        };
        g.set_outputs(&[&flag_out, &n_out, &a_out, &b_out, &sum, &idx])
            .unwrap();
        let run = |f: bool| {
            evaluate(
                &g,
                &[
                    HostArray::scalar(f),
                    vec1(vec![1i32, 2, 3]),
                    vec1(vec![10i32, 20, 30]),
                ],
            )
            .unwrap()
        };
        // Five iterations (n = 0..=4): the swap happens an odd number of times.
        let out = run(true);
        assert_eq!(out[0], HostArray::scalar(false));
        assert_eq!(out[1], HostArray::scalar(5i64));
        assert_eq!(values::<i32>(&out[2]), vec![10, 20, 30]);
        assert_eq!(values::<i32>(&out[3]), vec![1, 2, 3]);
        assert_eq!(values::<i32>(&out[4]), vec![11, 22, 33]);
        // The last sort saw [11, 22, 33]: order [2, 1, 0], plus the iota.
        assert_eq!(values::<i32>(&out[5]), vec![2, 2, 2]);
        // Zero iterations return the initial state.
        let out = run(false);
        assert_eq!(out[1], HostArray::scalar(0i64));
        assert_eq!(values::<i32>(&out[3]), vec![10, 20, 30]);
        assert_eq!(values::<i32>(&out[5]), vec![1, 2, 3]);
    }
}
