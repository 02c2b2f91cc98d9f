//! The VJP of a `while` node: only a `fori_loop` with constant bounds (a static trip count
//! `T`) is differentiable, by storing the carries.
//!
//! The backward pass runs the loop forward once more, stacking each step's state (every state
//! component the body changes: `T` times its size in memory; loop-invariant values are not
//! stored), then a second loop walks the steps backward: at step `t` it rebuilds the body on
//! the stored state (a copy of the body's nodes) and pulls the state's cotangent through it.
//! Compute: the forward loop twice plus one body replay and its VJP per step. A `while_loop`
//! with a data-dependent exit, or a loop nested in the differentiated body, is an error
//! (conditionals in it are fine).

use std::collections::HashMap;

use super::{backprop, SpanCopies, Step, OP};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::graph::{graph_error, Graph};
use crate::ops::ir::{Node, Region, ValueId};
use crate::ops::op::{BinaryOp, Comparison, Op};
use crate::ops::rules::takes_target;
use crate::ops::tensor::Tensor;
use crate::ops::util::{nodes as make_nodes, Loc};

/// The operands' cotangents of the `while` node of `s` (condition region `cond`, body region
/// `body`).
pub(super) fn while_vjp(
    g: &Graph,
    s: &Step,
    all: &[Node],
    regions: &[Region],
    cond: usize,
    body: usize,
) -> Result<Vec<Option<Tensor>>> {
    let trips = static_trip_count(s.node, all, regions, cond, body).ok_or_else(|| {
        graph_error(
            OP,
            "a while_loop is differentiable only as a fori_loop with constant bounds (a static \
             trip count); a data-dependent exit is not",
            s.loc,
        )
    })?;
    if all
        .iter()
        .any(|n| matches!(n.op, Op::While { .. }) && encloses(regions, body, n.region))
    {
        return Err(graph_error(
            OP,
            "a loop nested inside a differentiated loop body is not supported",
            s.loc,
        ));
    }
    let args = &regions[body].args;
    let results = &regions[body].results;
    let n = s.inputs.len();
    // Components the body passes through unchanged are invariant: not stored, not carried.
    let invariant: Vec<bool> = (0..n).map(|j| results[j] == args[j]).collect();
    let float: Vec<bool> = s.inputs.iter().map(|t| t.dtype().is_float()).collect();
    let cts: Vec<Tensor> = (0..n).map(|j| s.ct(j)).collect::<Result<_>>()?;
    if trips == 0 {
        return Ok((0..n).map(|j| float[j].then(|| cts[j].clone())).collect());
    }
    let replay = Replay {
        g,
        s,
        all,
        regions,
        body,
        stored: (0..n).filter(|&j| !invariant[j]).collect(),
        trips,
    };
    let stacks = replay.stack_states()?;
    let carried: Vec<usize> = (0..n).filter(|&j| float[j]).collect();
    let init: Vec<Tensor> = carried.iter().map(|&j| cts[j].clone()).collect();
    let finals = replay.backward(&stacks, &carried, init)?;
    let mut out = vec![None; n];
    for (slot, &j) in carried.iter().enumerate() {
        out[j] = Some(finals[slot].clone());
    }
    Ok(out)
}

/// A loop being differentiated: its node's step `s`, the graph's nodes and regions, its body,
/// the state components the body changes (`stored`) and its trip count.
struct Replay<'a, 'b> {
    g: &'a Graph,
    s: &'a Step<'b>,
    all: &'a [Node],
    regions: &'a [Region],
    body: usize,
    stored: Vec<usize>,
    trips: usize,
}

impl Replay<'_, '_> {
    /// The forward loop again, stacking the state each step starts from: one `[trips, ...]`
    /// stack per stored component.
    fn stack_states(&self) -> Result<Vec<Tensor>> {
        let (g, s, stored, trips) = (self.g, self.s, &self.stored, self.trips);
        let mut carry: Vec<Tensor> = stored.iter().map(|&j| s.inputs[j].clone()).collect();
        for &j in stored {
            let t = &s.inputs[j];
            let mut dims = vec![trips];
            dims.extend_from_slice(t.dims());
            carry.push(g.zeros(t.dtype(), &dims)?);
        }
        let m = stored.len();
        let stacks = g.fori_loop(0, trips as i64, &carry, |k, c| {
            let state = full_state(s, stored, &c[..m]);
            let next = replay(g, self.all, self.regions, self.body, &state, s.loc)?;
            let zero = g.scalar_i64(0)?;
            let mut out: Vec<Tensor> = stored.iter().map(|&j| next[j].clone()).collect();
            for (slot, stack) in c[m..].iter().enumerate() {
                let mut starts = vec![k];
                starts.extend(std::iter::repeat_n(&zero, stack.rank() - 1));
                out.push(stack.dynamic_update_slice(&c[slot].expand_dims(0)?, &starts)?);
            }
            Ok(out)
        })?;
        Ok(stacks[m..].to_vec())
    }

    /// Backward over the steps, carrying the cotangent of every float state component
    /// (`carried`, starting from `init`): at step `t`, the body rebuilt on the stored state and
    /// the cotangent pulled through it. Returns the cotangents of the initial state.
    fn backward(
        &self,
        stacks: &[Tensor],
        carried: &[usize],
        init: Vec<Tensor>,
    ) -> Result<Vec<Tensor>> {
        let (g, s, trips) = (self.g, self.s, self.trips);
        let last = g.scalar_i64(trips as i64 - 1)?;
        g.fori_loop(0, trips as i64, &init, |k, ct| {
            let step = last.sub(k)?;
            let state = self.stored_state(stacks, &step)?;
            let next = replay(g, self.all, self.regions, self.body, &state, s.loc)?;
            let outs: Vec<Tensor> = carried.iter().map(|&j| next[j].clone()).collect();
            let wrt: Vec<Tensor> = carried.iter().map(|&j| state[j].clone()).collect();
            let adjoints = backprop(g, &outs, ct, &wrt, s.loc)?;
            wrt.iter()
                .map(|w| match adjoints.get(&w.id()) {
                    Some(a) => Ok(a.clone()),
                    None => g.zeros(w.dtype(), w.dims()),
                })
                .collect()
        })
    }

    /// The state step `step` started from, read from the stacks, every value as a value of
    /// the region being built.
    fn stored_state(&self, stacks: &[Tensor], step: &Tensor) -> Result<Vec<Tensor>> {
        let (g, s) = (self.g, self.s);
        let zero = g.scalar_i64(0)?;
        let mut slices = Vec::with_capacity(self.stored.len());
        for (stack, &j) in stacks.iter().zip(&self.stored) {
            let mut starts = vec![step];
            starts.extend(std::iter::repeat_n(&zero, stack.rank() - 1));
            let mut sizes = vec![1];
            sizes.extend_from_slice(&stack.dims()[1..]);
            slices.push(
                stack
                    .dynamic_slice(&starts, &sizes)?
                    .reshape_at(s.inputs[j].dims(), s.loc)?,
            );
        }
        full_state(s, &self.stored, &slices)
            .iter()
            .map(|t| {
                let id = g.resolve(t.id(), OP, s.loc)?;
                g.tensor(id)
                    .ok_or_else(|| graph_error(OP, "internal: lost a value", s.loc))
            })
            .collect()
    }
}

/// The whole state of the loop of `s`: the stored components from `values`, the invariant
/// ones from the node's operands.
fn full_state(s: &Step, stored: &[usize], values: &[Tensor]) -> Vec<Tensor> {
    let mut state = s.inputs.to_vec();
    for (slot, &j) in stored.iter().enumerate() {
        state[j] = values[slot].clone();
    }
    state
}

/// Copies the nodes of region `body` into the current region with its arguments bound to
/// `state` (a loop or a conditional among them rebuilt with its regions replayed); returns its
/// results.
pub(super) fn replay(
    g: &Graph,
    all: &[Node],
    regions: &[Region],
    body: usize,
    state: &[Tensor],
    loc: Loc,
) -> Result<Vec<Tensor>> {
    let mut env: HashMap<ValueId, Tensor> = HashMap::new();
    for (arg, value) in regions[body].args.iter().zip(state) {
        env.insert(*arg, value.clone());
    }
    // Spans with rules of their own in the body keep them in the copy.
    let mut rules = SpanCopies::new(g, body, None);
    for (index, node) in all.iter().enumerate() {
        if node.region == body && !matches!(node.op, Op::BlockArg) {
            rules.step(g, index, &|v| env.get(&v).map(|t| (t.clone(), false)))?;
            replay_node(g, all, regions, index, &mut env, loc)?;
        }
    }
    rules.finish(g, &|v| env.get(&v).map(|t| (t.clone(), false)))?;
    regions[body]
        .results
        .iter()
        .map(|r| {
            env.get(r)
                .cloned()
                .ok_or_else(|| graph_error(OP, "internal: a body result is missing", loc))
        })
        .collect()
}

/// Copies node `index` into the current region, its inputs read from `env` and its results
/// written there (a loop or a conditional rebuilt with its regions replayed).
pub(super) fn replay_node(
    g: &Graph,
    all: &[Node],
    regions: &[Region],
    index: usize,
    env: &mut HashMap<ValueId, Tensor>,
    loc: Loc,
) -> Result<()> {
    let node = &all[index];
    let inputs: Vec<Tensor> = node
        .inputs
        .iter()
        .map(|i| {
            env.get(i)
                .cloned()
                .ok_or_else(|| graph_error(OP, "internal: a replayed value is missing", loc))
        })
        .collect::<Result<_>>()?;
    if matches!(node.op, Op::ShardMap { .. }) {
        return Err(graph_error(
            OP,
            "a shard_map cannot be replayed for a gradient (inside a checkpointed function, a \
             differentiated loop body or a differentiated branch)",
            loc,
        ));
    }
    let made = match &node.op {
        // A loop: rebuilt over its replayed condition and body.
        Op::While { cond, body } => replay_while(g, all, regions, *cond, *body, inputs, loc)?,
        // A conditional: rebuilt over its replayed branches.
        Op::Case { branches } => {
            let operands = inputs[1..].to_vec();
            g.case_at(
                &inputs[0],
                &operands,
                branches.len(),
                |k, c: &Vec<Tensor>| replay(g, all, regions, branches[k], c, loc),
                OP,
                loc,
            )?
        }
        op => {
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let target = takes_target(op).then(|| node.outputs[0].clone());
            make_nodes(g, op.clone(), &refs, target, OP, loc)?
        }
    };
    for (output, t) in made.into_iter().enumerate() {
        env.insert(
            ValueId {
                node: index,
                output,
            },
            t,
        );
    }
    Ok(())
}

/// A `while` node over regions `cond` and `body` built again on `inputs` (its state, the
/// captured values among it): a new loop whose condition and body are copies of the old ones.
/// Its state is the old node's operands one for one, so a `fori_loop` stays one (the same
/// counter, bounds and loop-invariant components) and [`while_vjp`] differentiates it.
fn replay_while(
    g: &Graph,
    all: &[Node],
    regions: &[Region],
    cond: usize,
    body: usize,
    inputs: Vec<Tensor>,
    loc: Loc,
) -> Result<Vec<Tensor>> {
    g.while_loop_at(
        &inputs,
        |state| {
            replay(g, all, regions, cond, state, loc)?
                .into_iter()
                .next()
                .ok_or_else(|| graph_error(OP, "internal: a loop condition has no result", loc))
        },
        |state| replay(g, all, regions, body, state, loc),
        OP,
        loc,
    )
}

/// Whether `inner` is `outer` or nested inside it.
pub(super) fn encloses(regions: &[Region], outer: usize, inner: usize) -> bool {
    let mut r = Some(inner);
    while let Some(k) = r {
        if k == outer {
            return true;
        }
        r = regions.get(k).and_then(|x| x.parent);
    }
    false
}

/// The trip count of a `while` built by `fori_loop` with constant bounds: state component 0
/// is the counter, starting at a constant `lo`; the condition is `counter < hi` with `hi` a
/// constant passed in as a captured operand; the body adds a constant 1 to the counter.
/// `None` for any other loop.
fn static_trip_count(
    node: &Node,
    all: &[Node],
    regions: &[Region],
    cond: usize,
    body: usize,
) -> Option<usize> {
    let counter_in = *node.inputs.first()?;
    let lo = int_constant(all, counter_in)?;
    let cregion = regions.get(cond)?;
    let c = all.get(cregion.results.first()?.node)?;
    if c.op != Op::Compare(Comparison::Lt) || c.inputs.first()? != cregion.args.first()? {
        return None;
    }
    let hi_pos = cregion.args.iter().position(|a| *a == c.inputs[1])?;
    let hi = int_constant(all, *node.inputs.get(hi_pos)?)?;
    let bregion = regions.get(body)?;
    let b = all.get(bregion.results.first()?.node)?;
    if b.op != Op::Binary(BinaryOp::Add) || b.inputs.first()? != bregion.args.first()? {
        return None;
    }
    if int_constant(all, b.inputs[1])? != 1 {
        return None;
    }
    usize::try_from(hi.saturating_sub(lo)).ok().or(Some(0))
}

/// The value of a rank-0 integer constant.
fn int_constant(all: &[Node], v: ValueId) -> Option<i64> {
    let n = all.get(v.node)?;
    let Op::Constant { data } = &n.op else {
        return None;
    };
    let ty = n.outputs.get(v.output)?;
    if ty.rank() != 0 {
        return None;
    }
    let bytes = |k: usize| -> Option<&[u8]> { data.get(..k) };
    Some(match ty.dtype {
        DType::I64 => i64::from_le_bytes(bytes(8)?.try_into().ok()?),
        DType::I32 => i32::from_le_bytes(bytes(4)?.try_into().ok()?) as i64,
        DType::U32 => u32::from_le_bytes(bytes(4)?.try_into().ok()?) as i64,
        DType::U64 => i64::try_from(u64::from_le_bytes(bytes(8)?.try_into().ok()?)).ok()?,
        DType::U8 => *bytes(1)?.first()? as i64,
        DType::I8 => *bytes(1)?.first()? as i8 as i64,
        _ => return None,
    })
}
