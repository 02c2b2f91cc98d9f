//! Structured control flow: `while_loop` and `fori_loop`, lowered to one `stablehlo.while`.
//!
//! The loop state is any [`Carry`]: a tensor, a tuple, an array, a `Vec`, or a user struct that
//! implements the trait. The condition and the body are Rust closures that build their regions
//! with the ordinary builders. They may use any tensor from outside the loop: such a value is
//! captured automatically, threaded into the loop as an extra, unchanged part of the state (a
//! loop-invariant operand), and the same happens through every level of nested loops. A value
//! made inside a loop cannot be used outside it (an error). The body must return a state of the
//! same types; a component whose dtype or shape changed is an error that names it.
//!
//! `scan` is JAX's `lax.scan` on top of the same loop: a carry threaded through the steps, inputs
//! sliced along their leading axis, per-step outputs stacked into preallocated buffers.

use std::panic::Location;

use super::graph::{graph_error, Graph};
use super::ir::ValueId;
use super::op::Op;
use super::tensor::Tensor;
use super::util::{same_graph, Loc};
use crate::dtype::{DType, TensorType};
use crate::error::Result;

/// A loop state made of tensors. Implemented for [`Tensor`], tuples of up to four carries,
/// arrays and `Vec`s; implement it for your own struct by listing its tensors in a fixed order:
///
/// ```
/// use stablegraph::ops::{Carry, Tensor};
///
/// struct State { h: Tensor, step: Tensor }
///
/// impl Carry for State {
///     fn flatten(&self, out: &mut Vec<Tensor>) {
///         out.push(self.h.clone());
///         out.push(self.step.clone());
///     }
///     fn unflatten(_template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
///         Some(State { h: values.next()?, step: values.next()? })
///     }
/// }
/// ```
pub trait Carry: Sized {
    /// Appends the state's tensors, in a fixed order.
    fn flatten(&self, out: &mut Vec<Tensor>);
    /// Rebuilds a state shaped like `template` from tensors in the order `flatten` wrote them;
    /// `None` when there are too few.
    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self>;
}

impl Carry for Tensor {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.push(self.clone());
    }
    fn unflatten(_: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        values.next()
    }
}

impl<T: Carry> Carry for Vec<T> {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        for t in self {
            t.flatten(out);
        }
    }
    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        template.iter().map(|t| T::unflatten(t, values)).collect()
    }
}

impl<T: Carry, const N: usize> Carry for [T; N] {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        for t in self {
            t.flatten(out);
        }
    }
    fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        let v: Vec<T> = template
            .iter()
            .map(|t| T::unflatten(t, values))
            .collect::<Option<_>>()?;
        v.try_into().ok()
    }
}

macro_rules! tuple_carry {
    ($($name:ident $idx:tt),*) => {
        #[allow(unused_variables)]
        impl<$($name: Carry),*> Carry for ($($name,)*) {
            fn flatten(&self, out: &mut Vec<Tensor>) {
                $(self.$idx.flatten(out);)*
            }
            fn unflatten(template: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
                Some(($($name::unflatten(&template.$idx, values)?,)*))
            }
        }
    };
}

tuple_carry!();
tuple_carry!(A 0);
tuple_carry!(A 0, B 1);
tuple_carry!(A 0, B 1, C 2);
tuple_carry!(A 0, B 1, C 2, D 3);

/// Restores the graph's current region when a region builder (a loop, a `shard_map`) returns,
/// also on error.
pub(super) struct RegionGuard<'g> {
    pub(super) graph: &'g Graph,
    pub(super) outer: usize,
}

impl Drop for RegionGuard<'_> {
    fn drop(&mut self) {
        self.graph.set_current_region(self.outer);
    }
}

/// A loop bound: a number or a rank-0 integer tensor.
#[derive(Clone)]
pub enum Bound {
    /// A constant bound.
    Const(i64),
    /// A rank-0 integer tensor.
    Tensor(Tensor),
}

impl From<i64> for Bound {
    fn from(v: i64) -> Self {
        Bound::Const(v)
    }
}

impl From<i32> for Bound {
    fn from(v: i32) -> Self {
        Bound::Const(i64::from(v))
    }
}

impl From<usize> for Bound {
    fn from(v: usize) -> Self {
        Bound::Const(v as i64)
    }
}

impl From<&Tensor> for Bound {
    fn from(t: &Tensor) -> Self {
        Bound::Tensor(t.clone())
    }
}

/// The loop builder a user called, for its errors: its name, and how many leading components of
/// the carry are the builder's own (the user's carry follows them).
#[derive(Clone, Copy)]
struct LoopName {
    op: &'static str,
    hidden: usize,
}

impl LoopName {
    const WHILE: LoopName = LoopName {
        op: "while_loop",
        hidden: 0,
    };
    /// `fori_loop` carries its counter first.
    const FORI: LoopName = LoopName {
        op: "fori_loop",
        hidden: 1,
    };
}

impl Graph {
    /// Runs `body` on the state while `cond` holds, starting from `init`, as one
    /// `stablehlo.while`; returns the final state. `cond` must return a rank-0 pred; `body` a
    /// state of the same types as `init`. Both may use tensors from outside the loop (captured
    /// as loop-invariant operands).
    #[track_caller]
    pub fn while_loop<C: Carry>(
        &self,
        init: &C,
        cond: impl FnOnce(&C) -> Result<Tensor>,
        body: impl FnOnce(&C) -> Result<C>,
    ) -> Result<C> {
        self.while_at(init, cond, body, LoopName::WHILE, Location::caller())
    }

    /// [`Graph::while_loop`] for the crate's own loops (a loop replayed for a gradient): errors
    /// name `op` at `loc`.
    pub(crate) fn while_loop_at<C: Carry>(
        &self,
        init: &C,
        cond: impl FnOnce(&C) -> Result<Tensor>,
        body: impl FnOnce(&C) -> Result<C>,
        op: &'static str,
        loc: Loc,
    ) -> Result<C> {
        self.while_at(init, cond, body, LoopName { op, hidden: 0 }, loc)
    }

    /// The loop for `while_loop` and `fori_loop`; errors name `name.op` and count the carry's
    /// components from after the first `name.hidden` (the builder's own, such as a counter).
    fn while_at<C: Carry>(
        &self,
        init: &C,
        cond: impl FnOnce(&C) -> Result<Tensor>,
        body: impl FnOnce(&C) -> Result<C>,
        name: LoopName,
        loc: Loc,
    ) -> Result<C> {
        let op = name.op;
        let mut flat = Vec::new();
        init.flatten(&mut flat);
        let refs: Vec<&Tensor> = flat.iter().collect();
        same_graph(self, &refs, op, loc)?;
        let outer = self.current_region();
        let init_ids = flat
            .iter()
            .map(|t| self.resolve(t.id(), op, loc))
            .collect::<Result<Vec<ValueId>>>()?;
        let types: Vec<TensorType> = flat.iter().map(|t| t.ty().clone()).collect();

        // The condition region.
        let cond_region = {
            let _guard = RegionGuard { graph: self, outer };
            let (region, state) = self.open_state_region(init, &types, op, loc)?;
            let c = cond(&state)?;
            same_graph(self, &[&c], op, loc)?;
            if c.dtype() != DType::Pred || c.rank() != 0 {
                return Err(graph_error(
                    op,
                    format!("the condition must be a rank-0 pred, got {}", c.ty()),
                    loc,
                ));
            }
            let c = self.resolve(c.id(), op, loc)?;
            self.set_region_results(region, vec![c]);
            region
        };

        // The body region.
        let body_region = {
            let _guard = RegionGuard { graph: self, outer };
            let (region, state) = self.open_state_region(init, &types, op, loc)?;
            let next = body(&state)?;
            let mut next_flat = Vec::new();
            next.flatten(&mut next_flat);
            self.check_next_state(&next_flat, &types, name, loc)?;
            let results = next_flat
                .iter()
                .map(|t| self.resolve(t.id(), op, loc))
                .collect::<Result<Vec<_>>>()?;
            self.set_region_results(region, results);
            region
        };

        let outs = self.close_while(cond_region, body_region, init_ids, &types, op, loc)?;
        C::unflatten(init, &mut outs.into_iter())
            .ok_or_else(|| graph_error(op, "internal: the state did not rebuild", loc))
    }

    /// Checks that a body's next state has the state's types; errors name `name.op` and count
    /// the carry's components from after the builder's own `name.hidden` ones.
    fn check_next_state(
        &self,
        next: &[Tensor],
        types: &[TensorType],
        name: LoopName,
        loc: Loc,
    ) -> Result<()> {
        let LoopName { op, hidden } = name;
        if next.len() != types.len() {
            return Err(graph_error(
                op,
                format!(
                    "the body returns {} tensors, the state has {}",
                    next.len().saturating_sub(hidden),
                    types.len() - hidden
                ),
                loc,
            ));
        }
        for (k, (t, want)) in next.iter().zip(types).enumerate() {
            same_graph(self, &[t], op, loc)?;
            if t.ty() != want {
                let what = match k.checked_sub(hidden) {
                    Some(k) => format!("carry component {k}"),
                    None => "the loop's own state".to_string(),
                };
                return Err(graph_error(
                    op,
                    format!("{what} changes from {want} to {} in the body", t.ty()),
                    loc,
                ));
            }
        }
        Ok(())
    }

    /// Finishes a loop whose condition and body regions are built, with the state's first
    /// `types.len()` arguments in each and the body's next state as its results: threads the
    /// captured outer values through both regions and adds the `While` node. Returns the final
    /// state (without the captures).
    fn close_while(
        &self,
        cond_region: usize,
        body_region: usize,
        init_ids: Vec<ValueId>,
        types: &[TensorType],
        op: &'static str,
        loc: Loc,
    ) -> Result<Vec<Tensor>> {
        // Both regions take the same state: the carry, then every captured outer value (each
        // region gets an argument for the other's captures too). The body passes captures on.
        let n = types.len();
        let captured = self.share_captures(&[cond_region, body_region], n, op, loc)?;
        let pass_through = self.regions()[body_region].args[n..].to_vec();
        let mut results = self.regions()[body_region].results.clone();
        results.extend(pass_through);
        self.set_region_results(body_region, results);
        let mut inputs = init_ids;
        inputs.extend(captured.iter().copied());
        let mut out_types = types.to_vec();
        for o in &captured {
            out_types.push(
                self.value_type(*o)
                    .ok_or_else(|| graph_error(op, "internal: lost a captured value", loc))?,
            );
        }
        let outs = self.push(
            Op::While {
                cond: cond_region,
                body: body_region,
            },
            inputs,
            out_types,
        )?;
        Ok(outs.into_iter().take(n).collect())
    }

    /// Gives each of `regions` (sibling regions of one op, each with `n` arguments of its
    /// own first) an argument for every value any of them captured, in one order; returns
    /// the captured outer values, the operands the op passes in after its own.
    pub(super) fn share_captures(
        &self,
        regions: &[usize],
        n: usize,
        op: &'static str,
        loc: Loc,
    ) -> Result<Vec<ValueId>> {
        let mut captured: Vec<ValueId> = Vec::new();
        for &r in regions {
            for (o, _) in self.region_captures(r) {
                if !captured.contains(&o) {
                    captured.push(o);
                }
            }
        }
        for &r in regions {
            let caps = self.region_captures(r);
            let mut args: Vec<ValueId> = self.regions()[r].args[..n].to_vec();
            for o in &captured {
                let inner = match caps.iter().find(|(c, _)| c == o) {
                    Some(&(_, inner)) => inner,
                    None => {
                        let ty = self.value_type(*o).ok_or_else(|| {
                            graph_error(op, "internal: lost a captured value", loc)
                        })?;
                        self.add_block_arg(r, ty).id()
                    }
                };
                args.push(inner);
            }
            self.set_region_args(r, args);
        }
        Ok(captured)
    }

    /// Opens a region (made current) whose arguments are the loop state, and returns it with
    /// the state rebuilt from those arguments in the shape of `init`.
    pub(super) fn open_state_region<C: Carry>(
        &self,
        init: &C,
        types: &[TensorType],
        op: &'static str,
        loc: Loc,
    ) -> Result<(usize, C)> {
        let region = self.open_region();
        let args: Vec<Tensor> = types
            .iter()
            .map(|t| self.add_block_arg(region, t.clone()))
            .collect();
        let state = C::unflatten(init, &mut args.into_iter())
            .ok_or_else(|| graph_error(op, "internal: the state did not rebuild", loc))?;
        Ok((region, state))
    }

    /// `for i in lo..hi { state = body(i, state) }` as one `stablehlo.while`; `i` is a rank-0
    /// integer (`i64` for number bounds, else the tensor bound's dtype). Bounds are numbers or
    /// rank-0 integer tensors; with `hi <= lo` the body never runs.
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F32, &[4])?;
    /// let out = g.zeros(DType::F32, &[16, 4])?;
    /// // for i in 0..16 { x = tanh(x) * 0.9; out[i] = x }, all on the device.
    /// let (_, out) = g.fori_loop(0, 16, &(x.clone(), out), |i, (x, out)| {
    ///     let x = x.tanh()?.mul(0.9)?;
    ///     let zero = g.scalar_i64(0)?;
    ///     let out = out.dynamic_update_slice(&x.expand_dims(0)?, &[i, &zero])?;
    ///     Ok((x, out))
    /// })?;
    /// g.set_outputs(&[&out])?;
    /// assert_eq!(g.to_stablehlo()?.matches("stablehlo.while").count(), 1);
    /// let rows = g.evaluate(&[HostArray::from_vec(&[4], vec![1.0f32, -1.0, 0.5, 0.0])?])?;
    /// assert_eq!(rows[0].dims(), &[16, 4]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn fori_loop<C: Carry + Clone>(
        &self,
        lo: impl Into<Bound>,
        hi: impl Into<Bound>,
        init: &C,
        body: impl FnOnce(&Tensor, &C) -> Result<C>,
    ) -> Result<C> {
        let loc = Location::caller();
        let (lo, hi) = (lo.into(), hi.into());
        let dtype = match (&lo, &hi) {
            (Bound::Tensor(t), _) | (_, Bound::Tensor(t)) => t.dtype(),
            _ => DType::I64,
        };
        let as_tensor = |b: &Bound| -> Result<Tensor> {
            match b {
                Bound::Const(v) => self.full_at(*v as f64, dtype, &[], loc),
                Bound::Tensor(t) => {
                    same_graph(self, &[t], "fori_loop", loc)?;
                    if t.rank() != 0 || !t.dtype().is_int() || t.dtype() != dtype {
                        return Err(graph_error(
                            "fori_loop",
                            format!(
                                "bounds must be rank-0 integers of one dtype, got {}",
                                t.ty()
                            ),
                            loc,
                        ));
                    }
                    Ok(t.clone())
                }
            }
        };
        let lo = as_tensor(&lo)?;
        let hi = as_tensor(&hi)?;
        let (_, state) = self.while_at(
            &(lo, init.clone()),
            |(i, _)| i.lt(&hi),
            |(i, s)| {
                let next = body(i, s)?;
                Ok((i.add(1)?, next))
            },
            LoopName::FORI,
            loc,
        )?;
        Ok(state)
    }

    /// JAX's `lax.scan`: runs `body(carry, x_t) -> (carry, y_t)` for `t = 0..T`, where `x_t` is
    /// step `t` of `xs` (every tensor of `xs` sliced along its leading axis, of length `T`), and
    /// returns the final carry and the `y_t` stacked along a new leading axis (each tensor of
    /// `Y` gains a first dimension `T`). `C`, `X` and `Y` are any [`Carry`] (a tensor, a tuple, a
    /// `Vec`, ...). One `stablehlo.while` whose state holds the step, the carry and the stacked
    /// outputs, written in place with `dynamic_update_slice`. With `T = 0` the body is built but
    /// never runs: the carry is `init` and the stacked outputs are empty.
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let xs = g.parameter("xs", DType::F32, &[5, 3])?;
    /// let h0 = g.zeros(DType::F32, &[3])?;
    /// // h_t = 0.5 h_{t-1} + x_t, returning every h_t.
    /// let (h, hs) = g.scan(&h0, &xs, |h, x| {
    ///     let h = h.mul(0.5)?.add(x)?;
    ///     Ok((h.clone(), h))
    /// })?;
    /// g.set_outputs(&[&h, &hs])?;
    /// let out = g.evaluate(&[HostArray::from_vec(&[5, 3], vec![1.0f32; 15])?])?;
    /// assert_eq!(out[1].dims(), &[5, 3]);
    /// assert_eq!(out[1].to_f64_vec()[3..6], [1.5; 3]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn scan<C: Carry, X: Carry, Y: Carry>(
        &self,
        init: &C,
        xs: &X,
        body: impl FnOnce(&C, &X) -> Result<(C, Y)>,
    ) -> Result<(C, Y)> {
        let loc = Location::caller();
        let op = "scan";
        let (mut x_flat, mut c_flat) = (Vec::new(), Vec::new());
        xs.flatten(&mut x_flat);
        init.flatten(&mut c_flat);
        let operands: Vec<&Tensor> = x_flat.iter().chain(&c_flat).collect();
        same_graph(self, &operands, op, loc)?;
        let length = scan_length(&x_flat, loc)?;
        let outer = self.current_region();
        let mut types = vec![TensorType::new(DType::I64, &[])];
        types.extend(c_flat.iter().map(|t| t.ty().clone()));
        let lost = || graph_error(op, "internal: the state did not rebuild", loc);

        // The body region takes the step and the carry, then the stacked outputs, whose types
        // are known once the body has been built.
        let (body_region, y, stacked) = {
            let _guard = RegionGuard { graph: self, outer };
            let region = self.open_region();
            let args: Vec<Tensor> = types
                .iter()
                .map(|t| self.add_block_arg(region, t.clone()))
                .collect();
            let i = &args[0];
            let carry = C::unflatten(init, &mut args[1..].iter().cloned()).ok_or_else(lost)?;
            let slices = x_flat
                .iter()
                .map(|x| self.step_slice(x, i, loc))
                .collect::<Result<Vec<_>>>()?;
            let x = X::unflatten(xs, &mut slices.into_iter()).ok_or_else(lost)?;
            let (next, y) = body(&carry, &x)?;
            let (mut next_flat, mut y_flat) = (Vec::new(), Vec::new());
            next.flatten(&mut next_flat);
            y.flatten(&mut y_flat);
            self.check_next_state(&next_flat, &types[1..], LoopName { op, hidden: 0 }, loc)?;
            let mut stacked = Vec::with_capacity(y_flat.len());
            for t in &y_flat {
                same_graph(self, &[t], op, loc)?;
                let mut dims = vec![length];
                dims.extend_from_slice(t.dims());
                let ty = TensorType::new(t.dtype(), &dims);
                if ty.byte_size().is_none() {
                    return Err(graph_error(
                        op,
                        format!("{ty} is too large to address"),
                        loc,
                    ));
                }
                stacked.push(ty);
            }
            let buffers: Vec<Tensor> = stacked
                .iter()
                .map(|t| self.add_block_arg(region, t.clone()))
                .collect();
            let mut results = vec![i.add(1)?];
            results.extend(next_flat);
            for (buffer, y) in buffers.iter().zip(&y_flat) {
                results.push(self.write_step(buffer, y, i, loc)?);
            }
            // The state's arguments first; `close_while` appends the captures.
            let state = args.iter().chain(&buffers).map(|t| t.id()).collect();
            self.set_region_args(region, state);
            let results = results
                .iter()
                .map(|t| self.resolve(t.id(), op, loc))
                .collect::<Result<Vec<_>>>()?;
            self.set_region_results(region, results);
            (region, y, stacked)
        };

        let mut init_flat = vec![self.scalar_i64(0)?];
        init_flat.extend(c_flat);
        for t in &stacked {
            init_flat.push(self.full_at(0.0, t.dtype, &t.dims, loc)?);
        }
        types.extend(stacked);
        let end = self.full_at(length as f64, DType::I64, &[], loc)?;
        let cond_region = {
            let _guard = RegionGuard { graph: self, outer };
            let (region, state) = self.open_state_region(&init_flat, &types, op, loc)?;
            let c = state[0].lt(&end)?;
            let c = self.resolve(c.id(), op, loc)?;
            self.set_region_results(region, vec![c]);
            region
        };
        let init_ids = init_flat
            .iter()
            .map(|t| self.resolve(t.id(), op, loc))
            .collect::<Result<Vec<ValueId>>>()?;
        let outs = self.close_while(cond_region, body_region, init_ids, &types, op, loc)?;
        let mut rest = outs.into_iter().skip(1);
        let carry = C::unflatten(init, &mut rest).ok_or_else(lost)?;
        let ys = Y::unflatten(&y, &mut rest).ok_or_else(lost)?;
        Ok((carry, ys))
    }

    /// Step `i` of `x` along its leading axis, without that axis (zeros when the axis is empty:
    /// the loop then never runs).
    fn step_slice(&self, x: &Tensor, i: &Tensor, loc: Loc) -> Result<Tensor> {
        let rest = &x.dims()[1..];
        if x.dims()[0] == 0 {
            return self.full_at(0.0, x.dtype(), rest, loc);
        }
        let zero = self.scalar_i64(0)?;
        let mut starts = vec![i];
        starts.extend(std::iter::repeat_n(&zero, rest.len()));
        let mut sizes = vec![1];
        sizes.extend_from_slice(rest);
        x.dynamic_slice(&starts, &sizes)?.reshape_at(rest, loc)
    }

    /// `buffer` with `y` written as row `i` of its leading axis.
    fn write_step(&self, buffer: &Tensor, y: &Tensor, i: &Tensor, loc: Loc) -> Result<Tensor> {
        if buffer.dims()[0] == 0 {
            return Ok(buffer.clone());
        }
        let zero = self.scalar_i64(0)?;
        let mut starts = vec![i];
        starts.extend(std::iter::repeat_n(&zero, y.rank()));
        let mut dims = vec![1];
        dims.extend_from_slice(y.dims());
        buffer.dynamic_update_slice(&y.reshape_at(&dims, loc)?, &starts)
    }
}

/// The common length of the leading axes of a scan's inputs.
fn scan_length(xs: &[Tensor], loc: Loc) -> Result<usize> {
    let Some(first) = xs.first() else {
        return Err(graph_error(
            "scan",
            "scan needs at least one input tensor to scan over (its leading axis sets the \
             number of steps); use fori_loop for a loop without inputs",
            loc,
        ));
    };
    let length = first.dims().first().copied();
    if length.is_none() || xs.iter().any(|x| x.dims().first().copied() != length) {
        let types: Vec<String> = xs.iter().map(|x| x.ty().to_string()).collect();
        return Err(graph_error(
            "scan",
            format!(
                "the inputs must share a leading axis of one length, got [{}]",
                types.join(", ")
            ),
            loc,
        ));
    }
    Ok(length.unwrap_or(0))
}

impl Tensor {
    /// JAX's `lax.optimization_barrier`: `values` unchanged, as one group XLA does not look
    /// through. Nothing computed from an output is moved before all of `values` exist, and no
    /// computation is moved across the barrier: e.g. converting a weight after a barrier with
    /// the activation that multiplies it keeps XLA from converting every layer's weight at the
    /// start of a program (and holding all the copies at once). Differentiable (the cotangents
    /// pass through a barrier of their own). An empty list, or values of different graphs,
    /// are an error.
    #[track_caller]
    pub fn optimization_barrier(values: &[&Tensor]) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let Some(first) = values.first() else {
            return Err(graph_error(
                "optimization_barrier",
                "needs at least one value",
                loc,
            ));
        };
        super::util::nodes(
            first.graph(),
            Op::OptimizationBarrier,
            values,
            None,
            "optimization_barrier",
            loc,
        )
    }
}
