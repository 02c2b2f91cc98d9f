//! The VJP of a `case` node (`cond`, `switch`): a conditional with the same index over the
//! branches' VJPs, so the backward pass too runs the taken branch alone. Each of its branches
//! replays the forward branch on the operands (a copy of the branch's nodes; conditionals
//! nested in it are replayed the same way) and pulls the results' cotangents through it: the
//! taken branch's forward work is done twice, nothing is stored. A loop inside a differentiated
//! branch is an error.

use super::loops::{encloses, replay};
use super::{backprop, Step, OP};
use crate::error::Result;
use crate::ops::graph::{graph_error, Graph};
use crate::ops::ir::{Node, Region};
use crate::ops::op::Op;
use crate::ops::tensor::Tensor;

/// The operands' cotangents of the `case` node of `s` over the regions `branches` (none for the
/// index).
pub(super) fn case_vjp(
    g: &Graph,
    s: &Step,
    all: &[Node],
    regions: &[Region],
    branches: &[usize],
) -> Result<Vec<Option<Tensor>>> {
    let looped = all.iter().any(|n| {
        matches!(n.op, Op::While { .. }) && branches.iter().any(|&b| encloses(regions, b, n.region))
    });
    if looped {
        return Err(graph_error(
            OP,
            "a loop inside a differentiated cond/switch branch is not supported",
            s.loc,
        ));
    }
    let m = s.inputs.len() - 1;
    // Operand positions (after the index) that want a cotangent.
    let wanted: Vec<usize> = (0..m).filter(|&j| s.want[j + 1]).collect();
    let mut out = vec![None; s.inputs.len()];
    if wanted.is_empty() {
        return Ok(out);
    }
    let cts = (0..s.outputs.len())
        .map(|k| s.ct(k))
        .collect::<Result<Vec<_>>>()?;
    let mut operands: Vec<Tensor> = s.inputs[1..].to_vec();
    operands.extend(cts.iter().cloned());
    let grads = g.case_at(
        &s.inputs[0],
        &operands,
        branches.len(),
        |k, c: &Vec<Tensor>| {
            let (values, cts) = c.split_at(m);
            let outs = replay(g, all, regions, branches[k], values, s.loc)?;
            let (outs, cts): (Vec<Tensor>, Vec<Tensor>) = outs
                .into_iter()
                .zip(cts.iter().cloned())
                .filter(|(o, _)| o.dtype().is_float())
                .unzip();
            let wrt: Vec<Tensor> = wanted.iter().map(|&j| values[j].clone()).collect();
            let adjoints = backprop(g, &outs, &cts, &wrt, s.loc)?;
            wrt.iter()
                .map(|w| match adjoints.get(&w.id()) {
                    Some(a) => Ok(a.clone()),
                    None => g.zeros(w.dtype(), w.dims()),
                })
                .collect::<Result<Vec<_>>>()
        },
        OP,
        s.loc,
    )?;
    for (&j, grad) in wanted.iter().zip(grads) {
        out[j + 1] = Some(grad);
    }
    Ok(out)
}
