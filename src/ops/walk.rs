//! The walk every reader of a finished graph starts with: which nodes the outputs depend on, in
//! which order, and whether they form a well-made program.
//!
//! The lowering and the interpreter (and later transformations) call [`live_nodes`] and then
//! trust what it checked; each wraps its message in its own error kind.

use super::ir::{Node, Region, ValueId};
use super::op::Op;
use super::regions::{check_case, check_while};
use super::rules::{check_node, check_shard_map, value_type};

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
    let (live, owner) = mark_live(nodes, regions, outputs)?;
    // Whether region `r` is a shard_map body or nested in one (parents followed at most once
    // per region, so a malformed cycle ends).
    let manual = |mut r: usize| {
        for _ in 0..regions.len() {
            if let Some(o) = owner.get(r).copied().flatten() {
                if matches!(nodes.get(o).map(|n| &n.op), Some(Op::ShardMap { .. })) {
                    return true;
                }
            }
            match regions.get(r).and_then(|x| x.parent) {
                Some(p) => r = p,
                None => return false,
            }
        }
        false
    };
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
            Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::AllToAll { .. }
            | Op::AxisIndex { .. }
                if !manual(r) =>
            {
                return Err(at("a collective outside a shard_map body".to_string()));
            }
            Op::ShardMap { .. } if manual(r) => {
                return Err(at(
                    "a shard_map nested in another shard_map's body".to_string()
                ));
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
/// Also returns the node that owns each region (`usize::MAX` for the program, `None` for a
/// region no live node owns).
#[allow(clippy::type_complexity)]
fn mark_live(
    nodes: &[Node],
    regions: &[Region],
    outputs: &[ValueId],
) -> Result<(Vec<bool>, Vec<Option<usize>>), String> {
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
        let owned = match node.op {
            Op::While { .. } => {
                let (cond, body) = check_while(nodes, regions, i).map_err(at)?;
                vec![cond, body]
            }
            Op::ShardMap { .. } => vec![check_shard_map(nodes, regions, i).map_err(at)?],
            Op::Case { .. } => check_case(nodes, regions, i).map_err(at)?,
            _ => Vec::new(),
        };
        for r in owned {
            match owner[r].replace(i) {
                None => {}
                Some(usize::MAX) => return Err(at(format!("region {r} is the program"))),
                Some(other) => {
                    return Err(format!(
                        "region {r} belongs to two region ops, nodes {other} and {i}"
                    ))
                }
            }
            stack.extend(regions[r].results.iter().map(|v| v.node));
        }
    }
    Ok((live, owner))
}

#[cfg(test)]
mod tests {
    use super::live_nodes;
    use crate::dtype::{DType, TensorType};
    use crate::ops::{Graph, Node, Op, Region, UnaryOp, ValueId};

    /// The walk of `g` as it is.
    fn walk(g: &Graph) -> Result<Vec<Vec<usize>>, String> {
        let (params, outputs) = (g.parameters(), g.outputs());
        g.with_structure(|nodes, regions| live_nodes(nodes, regions, &params, &outputs))
    }

    #[test]
    fn live_nodes_per_region_in_node_order() {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).unwrap(); // 0
        let _unused = g.parameter("unused", DType::I32, &[]).unwrap(); // 1
        let _dead = x.exp().unwrap(); // 2
                                      // 3: the bound, then the loop: regions 1 (cond) and 2 (body).
        let y = g.fori_loop(0, 3, &x, |_, x| x.mul(2.0)?.neg()).unwrap();
        let z = y.add(&x).unwrap();
        g.set_outputs(&[&z]).unwrap();
        let order = walk(&g).unwrap();
        let loop_node = z.id().node - 1;
        assert!(matches!(g.nodes()[loop_node].op, Op::While { .. }));
        // Region 0: the parameter x, the bounds, the loop and the sum; no dead exp, no unused
        // parameter (it stays in the signature), no block arguments.
        assert_eq!(order[0].first(), Some(&0));
        assert!(!order[0].contains(&1) && !order[0].contains(&2));
        assert_eq!(&order[0][order[0].len() - 2..], &[loop_node, z.id().node]);
        let nodes = g.nodes();
        for (r, list) in order.iter().enumerate() {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "region {r}: {list:?}");
            for &i in list {
                assert_eq!(nodes[i].region, r);
                assert!(!matches!(nodes[i].op, Op::BlockArg));
            }
        }
        // The body computes mul, neg and the counter's add; the condition compares.
        assert_eq!(order.len(), 3);
        assert!(order[1].len() == 1 && order[2].len() >= 3, "{order:?}");
    }

    #[test]
    fn malformed_loops_are_rejected_by_the_walk() {
        for (what, g, needle) in crate::ops::malformed_loops() {
            match walk(&g) {
                Err(m) => assert!(m.contains(needle), "{what}: {m}"),
                Ok(order) => panic!("{what}: walked as {order:?}"),
            }
        }
    }

    #[test]
    fn outputs_operands_and_parameters_are_checked() {
        let f32x2 = TensorType::new(DType::F32, &[2]);
        let neg = Op::Unary(UnaryOp::Neg);
        // An operand defined after its user, and one that does not exist.
        for v in [
            ValueId { node: 5, output: 0 },
            ValueId { node: 0, output: 1 },
        ] {
            let g = Graph::new();
            g.parameter("x", DType::F32, &[2]).unwrap();
            let bad = g.push(neg.clone(), vec![v], vec![f32x2.clone()]).unwrap();
            g.set_outputs(&[&bad[0]]).unwrap();
            let m = walk(&g).unwrap_err();
            let refers = format!("input 0 refers to value {}#{}", v.node, v.output);
            assert!(
                m.contains(&refers) && m.contains("not a value defined before it"),
                "{m}"
            );
        }
        // A node whose recorded type is not its rule's.
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).unwrap();
        let three = TensorType::new(DType::F32, &[3]);
        let bad = g.push(neg.clone(), vec![x.id()], vec![three]).unwrap();
        g.set_outputs(&[&bad[0]]).unwrap();
        let m = walk(&g).unwrap_err();
        assert!(
            m.starts_with("node 1 (unary): the outputs are declared (f32[3])"),
            "{m}"
        );
        // A parameter node that is not in the list, or claims another's place.
        for index in [0, 3] {
            let g = Graph::new();
            g.parameter("x", DType::F32, &[2]).unwrap();
            let param = Op::Parameter {
                index,
                name: "ghost".into(),
            };
            let p = g.push(param, vec![], vec![f32x2.clone()]).unwrap();
            g.set_outputs(&[&p[0]]).unwrap();
            let m = walk(&g).unwrap_err();
            let want =
                format!("parameter {index} (\"ghost\") is not in the graph's parameter list");
            assert!(m.contains(&want), "{m}");
        }
        // An output that is no value.
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).unwrap();
        g.set_outputs(&[&x]).unwrap();
        let outputs = [ValueId { node: 4, output: 0 }];
        let m = g
            .with_structure(|nodes, regions| live_nodes(nodes, regions, &g.parameters(), &outputs))
            .unwrap_err();
        assert!(m.contains("graph output value 4#0 does not exist"), "{m}");
    }

    #[test]
    fn a_loop_cannot_claim_the_program() {
        // Below the graph API: region 0 made a child of itself and used as a loop's condition,
        // which would nest the program in itself (and a reader recurse forever).
        let f32x2 = TensorType::new(DType::F32, &[2]);
        let node = |op, inputs: Vec<ValueId>, ty: TensorType, region| Node {
            op,
            inputs,
            outputs: vec![ty],
            region,
        };
        let v = |node| ValueId { node, output: 0 };
        let param = Op::Parameter {
            index: 0,
            name: "x".into(),
        };
        let pred = TensorType::new(DType::Pred, &[]);
        let nodes = vec![
            node(param, vec![], f32x2.clone(), 0),
            node(Op::BlockArg, vec![], f32x2.clone(), 0),
            node(Op::Constant { data: vec![0] }, vec![], pred, 0),
            node(Op::BlockArg, vec![], f32x2.clone(), 1),
            node(Op::While { cond: 0, body: 1 }, vec![v(0)], f32x2, 0),
        ];
        let regions = vec![
            Region {
                parent: Some(0),
                args: vec![v(1)],
                results: vec![v(2)],
                captures: vec![],
            },
            Region {
                parent: Some(0),
                args: vec![v(3)],
                results: vec![v(3)],
                captures: vec![],
            },
        ];
        let m = live_nodes(&nodes, &regions, &[v(0)], &[v(4)]).unwrap_err();
        assert!(m.contains("region 0 is the program"), "{m}");
    }
}
