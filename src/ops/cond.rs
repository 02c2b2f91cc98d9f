//! Conditionals: `cond` and `switch` (JAX's `lax.cond` and `lax.switch`), each one
//! `stablehlo.case` that runs only the branch its index names.
//!
//! The branches are Rust closures over the operands (any [`Carry`]). Like loop bodies they may
//! use tensors from outside: such a value is captured automatically as one more operand. Every
//! branch must return values of the same types, checked when the graph is built (the error
//! names the branch and the output). A conditional is differentiable (the backward pass is a
//! conditional over the branches' VJPs, so it too runs the taken branch alone) and may sit
//! inside loops, `scan` and other conditionals.

use std::panic::Location;

use super::control::{Carry, RegionGuard};
use super::graph::{graph_error, Graph};
use super::op::Op;
use super::tensor::Tensor;
use super::util::{same_graph, Loc};
use crate::dtype::{DType, TensorType};
use crate::error::Result;

/// A branch of [`Graph::switch`]: a closure from the operands to the branch's results.
pub type Branch<'a, C, O> = &'a dyn Fn(&C) -> Result<O>;

impl Graph {
    /// `if pred { on_true(operands) } else { on_false(operands) }` as one `stablehlo.case`
    /// (JAX's `lax.cond`): only the taken branch runs. `pred` is a rank-0 pred; both branches
    /// return results of the same types.
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F32, &[3])?;
    /// let big = x.sum_all()?.gt(10.0)?;
    /// // Captured values (here `x` itself) need not be operands.
    /// let y = g.cond(&big, &x, |x| x.mul(0.25), |x| x.exp())?;
    /// let dx = y.sum_all()?.grad(&[&x])?;
    /// g.set_outputs(&[&y, &dx[0]])?;
    /// assert_eq!(g.to_stablehlo()?.matches("stablehlo.case").count(), 2);
    /// let out = g.evaluate(&[HostArray::from_vec(&[3], vec![20.0f32, 0.0, 1.0])?])?;
    /// assert_eq!(out[1].to_f64_vec(), vec![0.25; 3]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn cond<C: Carry, O: Carry>(
        &self,
        pred: &Tensor,
        operands: &C,
        on_true: impl FnOnce(&C) -> Result<O>,
        on_false: impl FnOnce(&C) -> Result<O>,
    ) -> Result<O> {
        let loc = Location::caller();
        same_graph(self, &[pred], "cond", loc)?;
        if pred.dtype() != DType::Pred || pred.rank() != 0 {
            return Err(graph_error(
                "cond",
                format!("the predicate must be a rank-0 pred, got {}", pred.ty()),
                loc,
            ));
        }
        let index = pred.convert(DType::I32)?;
        let (mut on_true, mut on_false) = (Some(on_true), Some(on_false));
        let build = |k: usize, c: &C| {
            let taken = match k {
                0 => on_false.take().map(|f| f(c)),
                _ => on_true.take().map(|f| f(c)),
            };
            taken.unwrap_or_else(|| Err(graph_error("cond", "internal: a branch built twice", loc)))
        };
        self.case_at(&index, operands, 2, build, "cond", loc)
    }

    /// `branches[clamp(index, 0, n - 1)](operands)` as one `stablehlo.case` (JAX's
    /// `lax.switch`): only that branch runs. `index` is a rank-0 integer, clamped to the
    /// branches as JAX does; every branch returns results of the same types.
    ///
    /// ```
    /// use stablegraph::ops::{Graph, Tensor};
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let i = g.parameter("i", DType::I32, &[])?;
    /// let x = g.parameter("x", DType::F32, &[2])?;
    /// let y = g.switch(&i, &x, &[&|x: &Tensor| x.neg(), &|x: &Tensor| x.mul(2.0), &|x: &Tensor| x.exp()])?;
    /// g.set_outputs(&[&y])?;
    /// let x0 = HostArray::from_vec(&[2], vec![1.0f32, 2.0])?;
    /// let run = |i: i32| g.evaluate(&[HostArray::scalar(i), x0.clone()]);
    /// assert_eq!(run(1)?[0].to_f64_vec(), vec![2.0, 4.0]);
    /// assert_eq!(run(-5)?[0].to_f64_vec(), vec![-1.0, -2.0]); // clamped to branch 0
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn switch<C: Carry, O: Carry>(
        &self,
        index: &Tensor,
        operands: &C,
        branches: &[Branch<'_, C, O>],
    ) -> Result<O> {
        let loc = Location::caller();
        same_graph(self, &[index], "switch", loc)?;
        if !index.dtype().is_int() || index.rank() != 0 {
            return Err(graph_error(
                "switch",
                format!("the index must be a rank-0 integer, got {}", index.ty()),
                loc,
            ));
        }
        let Some(last) = branches.len().checked_sub(1) else {
            return Err(graph_error("switch", "there are no branches", loc));
        };
        // Clamped in the index's own type, so that no value wraps on the way to i32.
        let last = (last as u64).min(i32::MAX as u64) as f64;
        let index = index.clamp(0.0, last)?.convert(DType::I32)?;
        let build = |k: usize, c: &C| branches[k](c);
        self.case_at(&index, operands, branches.len(), build, "switch", loc)
    }

    /// Builds `n` branch regions with `build(k, operands)` and the `Case` node over them with
    /// the i32 `index`; errors name `op`.
    pub(crate) fn case_at<C: Carry, O: Carry>(
        &self,
        index: &Tensor,
        operands: &C,
        n: usize,
        mut build: impl FnMut(usize, &C) -> Result<O>,
        op: &'static str,
        loc: Loc,
    ) -> Result<O> {
        let mut flat = Vec::new();
        operands.flatten(&mut flat);
        let refs: Vec<&Tensor> = flat.iter().collect();
        same_graph(self, &refs, op, loc)?;
        let outer = self.current_region();
        let mut inputs = vec![self.resolve(index.id(), op, loc)?];
        for t in &flat {
            inputs.push(self.resolve(t.id(), op, loc)?);
        }
        let types: Vec<TensorType> = flat.iter().map(|t| t.ty().clone()).collect();
        let mut branches = Vec::with_capacity(n);
        let mut first: Option<(O, Vec<TensorType>)> = None;
        for k in 0..n {
            let _guard = RegionGuard { graph: self, outer };
            let (region, state) = self.open_state_region(operands, &types, op, loc)?;
            let result = build(k, &state)?;
            let mut results = Vec::new();
            result.flatten(&mut results);
            let refs: Vec<&Tensor> = results.iter().collect();
            same_graph(self, &refs, op, loc)?;
            let tys: Vec<TensorType> = results.iter().map(|t| t.ty().clone()).collect();
            match &first {
                None => first = Some((result, tys)),
                Some((_, want)) => check_branch_types(k, &tys, want, op, loc)?,
            }
            let ids = results
                .iter()
                .map(|t| self.resolve(t.id(), op, loc))
                .collect::<Result<Vec<_>>>()?;
            self.set_region_results(region, ids);
            branches.push(region);
        }
        let (template, out_types) =
            first.ok_or_else(|| graph_error(op, "there are no branches", loc))?;
        inputs.extend(self.share_captures(&branches, flat.len(), op, loc)?);
        let outs = self.push(Op::Case { branches }, inputs, out_types)?;
        O::unflatten(&template, &mut outs.into_iter())
            .ok_or_else(|| graph_error(op, "internal: the results did not rebuild", loc))
    }
}

/// Branch `k` as the user of `op` knows it: `cond`'s are `on_false` (0) and `on_true` (1).
fn branch_name(op: &str, k: usize) -> String {
    match (op, k) {
        ("cond", 0) => "on_false".to_string(),
        ("cond", _) => "on_true".to_string(),
        _ => format!("branch {k}"),
    }
}

/// Branch `k`'s result types `got` against branch 0's `want`.
fn check_branch_types(
    k: usize,
    got: &[TensorType],
    want: &[TensorType],
    op: &'static str,
    loc: Loc,
) -> Result<()> {
    let (this, first) = (branch_name(op, k), branch_name(op, 0));
    if got.len() != want.len() {
        return Err(graph_error(
            op,
            format!(
                "{this} returns {} values, {first} returns {}",
                got.len(),
                want.len()
            ),
            loc,
        ));
    }
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            return Err(graph_error(
                op,
                format!("{this} returns {g} for output {j}, {first} returns {w}"),
                loc,
            ));
        }
    }
    Ok(())
}
