//! The walk every reader of a finished graph starts with: which nodes the outputs depend on, in
//! which order, and whether they form a well-made program.
//!
//! The lowering and the interpreter (and later transformations) call [`live_nodes`] and then
//! trust what it checked; each wraps its message in its own error kind.

use super::graph::{Node, Op, Region, ValueId};
use super::regions::check_while;
use super::rules::{check_node, value_type};

/// The nodes the outputs depend on, through operands and the regions of live loops, listed per
/// region in node order; block arguments, which their loop binds, are left out (a region's are
/// [`Region::args`]).
///
/// Checks, so that readers need not: `params` are the `Parameter` nodes `0, 1, ...` of region 0,
/// each listed once, and every live parameter is listed; the outputs are values of region 0;
/// every operand of a live node is an output of an earlier node of the same region; every live
/// loop is well formed ([`check_while`]) and owns its two regions alone (region 0 is the
/// program's); a live block argument is an argument of its region; every live node's recorded
/// types are the ones its rule gives ([`check_node`]). So a reader that follows the order
/// evaluates each region's nodes after their operands and enters each region from one loop.
pub(crate) fn live_nodes(
    nodes: &[Node],
    regions: &[Region],
    params: &[ValueId],
    outputs: &[ValueId],
) -> Result<Vec<Vec<usize>>, String> {
    check_params(nodes, params)?;
    let live = mark_live(nodes, regions, outputs)?;
    let mut order = vec![Vec::new(); regions.len()];
    for (i, node) in nodes.iter().enumerate().filter(|&(i, _)| live[i]) {
        let r = node.region;
        let Some(region) = regions.get(r) else {
            return Err(format!(
                "node {i} ({}) is in region {r}, which does not exist",
                node.op.name()
            ));
        };
        let at = |m: String| format!("node {i} ({}): {m}", node.op.name());
        match &node.op {
            Op::BlockArg if !region.args.contains(&ValueId { node: i, output: 0 }) => {
                return Err(at(format!("not an argument of region {r}")));
            }
            Op::Parameter { .. } if r != 0 => {
                return Err(at(format!("a parameter inside region {r}")));
            }
            Op::Parameter { index, name } if params.get(*index).map(|p| p.node) != Some(i) => {
                return Err(at(format!(
                    "parameter {index} ({name:?}) is not in the graph's parameter list"
                )));
            }
            _ => {}
        }
        check_node(nodes, regions, i).map_err(at)?;
        if !matches!(node.op, Op::BlockArg) {
            order[r].push(i);
        }
    }
    Ok(order)
}

/// Checks that `params[k]` is output 0 of a `Parameter` node of region 0 that says it is
/// parameter `k`.
fn check_params(nodes: &[Node], params: &[ValueId]) -> Result<(), String> {
    for (k, p) in params.iter().enumerate() {
        let node = nodes
            .get(p.node)
            .ok_or_else(|| format!("parameter {k} is node {}, which does not exist", p.node))?;
        match &node.op {
            Op::Parameter { index, .. } if *index == k && p.output == 0 && node.region == 0 => {}
            _ => {
                return Err(format!(
                    "parameter {k} is output {} of node {}, a {} in region {}, which is not \
                     parameter {k} of the program",
                    p.output,
                    p.node,
                    node.op.name(),
                    node.region
                ))
            }
        }
    }
    Ok(())
}

/// Which nodes the outputs depend on. Checks the outputs, every operand of a live node, and
/// every live loop's regions.
fn mark_live(nodes: &[Node], regions: &[Region], outputs: &[ValueId]) -> Result<Vec<bool>, String> {
    let mut live = vec![false; nodes.len()];
    // The node that owns each region; region 0 is the program's (`usize::MAX`).
    let mut owner: Vec<Option<usize>> = vec![None; regions.len()];
    if let Some(program) = owner.first_mut() {
        *program = Some(usize::MAX);
    }
    let mut stack = Vec::new();
    for &o in outputs {
        value_type(nodes, o).map_err(|m| format!("graph output {m}"))?;
        let region = nodes[o.node].region;
        if region != 0 {
            return Err(format!(
                "graph output {}#{} is defined inside region {region}, not in the program",
                o.node, o.output
            ));
        }
        stack.push(o.node);
    }
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut live[i], true) {
            continue;
        }
        let node = &nodes[i];
        let at = |m: String| format!("node {i} ({}): {m}", node.op.name());
        for (k, &v) in node.inputs.iter().enumerate() {
            let refers = format!("input {k} refers to value {}#{}", v.node, v.output);
            if v.node >= i || value_type(nodes, v).is_err() {
                return Err(at(format!(
                    "{refers}, which is not a value defined before it"
                )));
            }
            let home = nodes[v.node].region;
            if home != node.region {
                return Err(at(format!(
                    "{refers}, which is defined in region {home} and not visible in region {}",
                    node.region
                )));
            }
            stack.push(v.node);
        }
        if let Op::While { .. } = node.op {
            let (cond, body) = check_while(nodes, regions, i).map_err(at)?;
            for r in [cond, body] {
                match owner[r].replace(i) {
                    None => {}
                    Some(usize::MAX) => return Err(at(format!("region {r} is the program"))),
                    Some(other) => {
                        return Err(format!(
                            "region {r} belongs to two loops, nodes {other} and {i}"
                        ))
                    }
                }
                stack.extend(regions[r].results.iter().map(|v| v.node));
            }
        }
    }
    Ok(live)
}
