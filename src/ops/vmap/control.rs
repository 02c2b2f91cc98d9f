//! `vmap` of control flow: which values carry the batch (a fixed point over a loop's body), the
//! batched loop, and conditionals with batched and unbatched indices.

use std::collections::HashMap;

use super::{lookup, Batcher};
use crate::error::Result;
use crate::ops::cond::Branch;
use crate::ops::graph::graph_error;
use crate::ops::ir::ValueId;
use crate::ops::op::Op;
use crate::ops::rules::batching::{batch_broadcast, Batched, OP};
use crate::ops::tensor::Tensor;

impl Batcher<'_> {
    /// Which results of `region` carry the batch when its arguments do as `args` says: a value
    /// is batched when any operand is (a conditional's results when its index is or a branch's
    /// result is; a loop's by [`Batcher::loop_flags`]), as the rules batch them.
    pub(super) fn flags(&self, region: usize, args: &[bool]) -> Vec<bool> {
        let mut f: HashMap<ValueId, bool> = self.regions[region]
            .args
            .iter()
            .copied()
            .zip(args.iter().copied())
            .collect();
        for (index, node) in self.nodes.iter().enumerate() {
            if node.region != region || matches!(node.op, Op::BlockArg) {
                continue;
            }
            let ins: Vec<bool> = node
                .inputs
                .iter()
                .map(|v| f.get(v) == Some(&true))
                .collect();
            let outs = match &node.op {
                Op::Case { branches } => {
                    // A batched index batches every result; an unbatched one, each result some
                    // branch batches.
                    let mut outs = vec![ins[0]; node.outputs.len()];
                    for &r in branches {
                        for (o, x) in outs.iter_mut().zip(self.flags(r, &ins[1..])) {
                            *o |= x;
                        }
                    }
                    outs
                }
                Op::While { cond, body } => self.loop_flags(*cond, *body, &ins).0,
                _ => vec![ins.contains(&true); node.outputs.len()],
            };
            for (output, b) in outs.into_iter().enumerate() {
                f.insert(
                    ValueId {
                        node: index,
                        output,
                    },
                    b,
                );
            }
        }
        self.regions[region]
            .results
            .iter()
            .map(|v| f.get(v) == Some(&true))
            .collect()
    }

    /// Which components of a loop's state carry the batch, starting from `init`: those whose
    /// initial value does, and those the body makes batched (to a fixed point); with a batched
    /// predicate, every component the body changes (each example stops on its own). Returns
    /// them and whether the predicate is batched.
    fn loop_flags(&self, cond: usize, body: usize, init: &[bool]) -> (Vec<bool>, bool) {
        let mut flags = init.to_vec();
        loop {
            let res = self.flags(body, &flags);
            let next: Vec<bool> = flags.iter().zip(&res).map(|(a, b)| *a || *b).collect();
            if next == flags {
                break;
            }
            flags = next;
        }
        let pred = self.flags(cond, &flags).first() == Some(&true);
        if pred {
            for (k, changes) in self.changing(body).into_iter().enumerate() {
                flags[k] |= changes;
            }
        }
        (flags, pred)
    }

    /// For each state component of the loop body `body`, whether the body changes it (its next
    /// value is not its own argument).
    fn changing(&self, body: usize) -> Vec<bool> {
        let r = &self.regions[body];
        r.results.iter().zip(&r.args).map(|(v, a)| v != a).collect()
    }

    /// A loop under `vmap` (`ins`: its initial state, captured values included): a loop over
    /// the batched state, its body and condition batched by the same rules. An unbatched
    /// predicate (a `fori_loop`'s counter) keeps one trip count for all examples, and the loop
    /// stays a `fori_loop` that `grad` differentiates; a batched one runs while any example
    /// goes on, each example's state frozen (`select`) once its own predicate is false, as
    /// JAX's rule does.
    pub(super) fn while_loop(
        &self,
        cond: usize,
        body: usize,
        ins: &[Batched],
        env: &HashMap<ValueId, Batched>,
    ) -> Result<Vec<Batched>> {
        let (b, loc) = (self.b, self.loc);
        let init_flags: Vec<bool> = ins.iter().map(|v| v.1).collect();
        let (flags, pred_batched) = self.loop_flags(cond, body, &init_flags);
        let changing = self.changing(body);
        let widen = |(t, batched): &Batched, want: bool| match (want, *batched) {
            (true, false) => batch_broadcast(t, b),
            _ => Ok(t.clone()),
        };
        let init = ins
            .iter()
            .zip(&flags)
            .map(|(v, &f)| widen(v, f))
            .collect::<Result<Vec<_>>>()?;
        // `region` copied over the state `s`, each component batched as `flags` says.
        let run = |region: usize, s: &[Tensor]| -> Result<Vec<Batched>> {
            let mut e = env.clone();
            for (arg, (t, &f)) in self.regions[region].args.iter().zip(s.iter().zip(&flags)) {
                e.insert(*arg, (t.clone(), f));
            }
            self.region(region, &mut e)?;
            lookup(&e, &self.regions[region].results, loc)
        };
        let predicate = |s: &[Tensor]| -> Result<Batched> {
            run(cond, s)?
                .into_iter()
                .next()
                .ok_or_else(|| graph_error(OP, "internal: a loop without a condition", loc))
        };
        let out = self.g.while_loop(
            &init,
            |s| {
                let (p, batched) = predicate(s)?;
                match batched {
                    // Whether any example goes on.
                    true => p.astype(crate::dtype::DType::I32)?.max(&[0])?.gt(0.0),
                    false => Ok(p),
                }
            },
            |s| {
                let next = run(body, s)?;
                let mut next = next
                    .iter()
                    .zip(&flags)
                    .map(|(v, &f)| widen(v, f))
                    .collect::<Result<Vec<_>>>()?;
                if pred_batched {
                    let (p, _) = predicate(s)?;
                    for (k, n) in next.iter_mut().enumerate() {
                        if changing[k] {
                            let mut dims = vec![1isize; n.rank()];
                            dims[0] = b as isize;
                            let goes_on = p.reshape(&dims)?.broadcast_to(n.dims())?;
                            *n = goes_on.select(&*n, &s[k])?;
                        }
                    }
                }
                Ok(next)
            },
        )?;
        Ok(out.into_iter().zip(flags).collect())
    }
}

/// A batched branch of a conditional.
type BranchFn<'a> = dyn Fn(&Vec<Tensor>) -> Result<Vec<Tensor>> + 'a;

impl Batcher<'_> {
    /// A conditional under `vmap` (`ins`: the branch index, then the operands). An unbatched
    /// index stays a conditional over the batched branches (only the taken one runs); a
    /// batched one runs every branch and picks each example's result by its index (`select`),
    /// as JAX does.
    pub(super) fn case(
        &self,
        branches: &[usize],
        ins: &[Batched],
        env: &mut HashMap<ValueId, Batched>,
    ) -> Result<Vec<Batched>> {
        if !ins[0].1 {
            return self.unbatched_case(branches, ins, env);
        }
        let (b, loc) = (self.b, self.loc);
        let mut results: Vec<Vec<Batched>> = Vec::with_capacity(branches.len());
        for &r in branches {
            for (arg, value) in self.regions[r].args.iter().zip(&ins[1..]) {
                env.insert(*arg, value.clone());
            }
            self.region(r, env)?;
            results.push(lookup(env, &self.regions[r].results, loc)?);
        }
        let (index, index_batched) = ins[0].clone();
        let last = results
            .pop()
            .ok_or_else(|| graph_error(OP, "a case with no branches", loc))?;
        let batched = index_batched || last.iter().chain(results.iter().flatten()).any(|v| v.1);
        let full = |v: &Batched| match (batched, v.1) {
            (true, false) => batch_broadcast(&v.0, b),
            _ => Ok(v.0.clone()),
        };
        let mut out = last.iter().map(full).collect::<Result<Vec<_>>>()?;
        // Branch k where the index is k; the last one otherwise (StableHLO's rule).
        for (k, branch) in results.iter().enumerate().rev() {
            let is_k = index.eq(k as f64)?;
            for (o, v) in out.iter_mut().zip(branch) {
                let pick = match index_batched {
                    true => {
                        let mut dims = vec![1isize; o.rank()];
                        dims[0] = b as isize;
                        is_k.reshape(&dims)?.broadcast_to(o.dims())?
                    }
                    false => is_k.broadcast_to(o.dims())?,
                };
                *o = pick.select(&full(v)?, &*o)?;
            }
        }
        Ok(out.into_iter().map(|t| (t, batched)).collect())
    }

    /// A conditional whose index is the same for every example: one conditional whose
    /// branches are the batched branches, each result batched when any branch's is.
    fn unbatched_case(
        &self,
        branches: &[usize],
        ins: &[Batched],
        env: &HashMap<ValueId, Batched>,
    ) -> Result<Vec<Batched>> {
        let (b, loc) = (self.b, self.loc);
        let operand_flags: Vec<bool> = ins[1..].iter().map(|v| v.1).collect();
        let mut out_flags: Vec<bool> = Vec::new();
        for &r in branches {
            let f = self.flags(r, &operand_flags);
            out_flags.resize(f.len(), false);
            for (o, x) in out_flags.iter_mut().zip(f) {
                *o |= x;
            }
        }
        let operands: Vec<Tensor> = ins[1..].iter().map(|v| v.0.clone()).collect();
        let run = |r: usize, ops: &Vec<Tensor>| -> Result<Vec<Tensor>> {
            let mut e = env.clone();
            for (arg, (t, &f)) in self.regions[r]
                .args
                .iter()
                .zip(ops.iter().zip(&operand_flags))
            {
                e.insert(*arg, (t.clone(), f));
            }
            self.region(r, &mut e)?;
            lookup(&e, &self.regions[r].results, loc)?
                .iter()
                .zip(&out_flags)
                .map(|((t, batched), &want)| match (want, batched) {
                    (true, false) => batch_broadcast(t, b),
                    _ => Ok(t.clone()),
                })
                .collect()
        };
        let closures: Vec<Box<BranchFn<'_>>> = branches
            .iter()
            .map(|&r| Box::new(move |ops: &Vec<Tensor>| run(r, ops)) as Box<BranchFn<'_>>)
            .collect();
        let refs: Vec<Branch<'_, Vec<Tensor>, Vec<Tensor>>> =
            closures.iter().map(|c| c.as_ref()).collect();
        let outs = self.g.switch(&ins[0].0, &operands, &refs)?;
        Ok(outs.into_iter().zip(out_flags.iter().copied()).collect())
    }
}
