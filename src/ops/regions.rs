//! The rule of `While`: how a loop's regions must fit its state. [`super::rules::check_node`]
//! and [`super::walk::live_nodes`] apply it to every live loop, so that the lowering and the
//! interpreter reject a malformed `While` for the same reasons (each wraps the message in its
//! own error).

use super::ir::{Node, Region};
use super::op::Op;
use super::rules::value_type;
use crate::dtype::{DType, TensorType};

/// Checks the `While` node `index` against its regions and returns `(cond, body)`.
///
/// The state has one value per input; the outputs have the inputs' types; `cond` and `body` are
/// two distinct regions nested directly in the node's region, each with one `BlockArg` of that
/// region per state value (of its type); `cond` returns one rank-0 `Pred` and `body` a next
/// state of the state's types, all values of the region itself.
pub(crate) fn check_while(
    nodes: &[Node],
    regions: &[Region],
    index: usize,
) -> Result<(usize, usize), String> {
    let node = nodes
        .get(index)
        .ok_or_else(|| format!("node {index} does not exist"))?;
    let Op::While { cond, body } = node.op else {
        return Err(format!("node {index} is a {}, not a while", node.op.name()));
    };
    let state = node
        .inputs
        .iter()
        .map(|&v| value_type(nodes, v))
        .collect::<Result<Vec<_>, _>>()?;
    if state.is_empty() {
        return Err("the loop has no state".to_string());
    }
    if node.outputs.len() != state.len() {
        return Err(format!(
            "{} state values but {} output types",
            state.len(),
            node.outputs.len()
        ));
    }
    for (k, (ty, out)) in state.iter().zip(&node.outputs).enumerate() {
        if *ty != out {
            return Err(format!("state value {k} is {ty} but output {k} is {out}"));
        }
    }
    if cond == body {
        return Err(format!("the condition and the body are both region {cond}"));
    }
    for (what, r) in [("condition", cond), ("body", body)] {
        check_loop_region(nodes, regions, node, what, r, &state)?;
    }
    check_loop_results(nodes, regions, cond, body, &state)?;
    Ok((cond, body))
}

/// Region `r`, the loop `node`'s condition or body (`what`), nested directly in the node's
/// region, with one distinct `BlockArg` of its own per state value (of its type) and results
/// defined in itself.
fn check_loop_region(
    nodes: &[Node],
    regions: &[Region],
    node: &Node,
    what: &str,
    r: usize,
    state: &[&TensorType],
) -> Result<(), String> {
    let region = regions
        .get(r)
        .ok_or_else(|| format!("the {what} region {r} does not exist"))?;
    if region.parent != Some(node.region) {
        return Err(format!(
            "the {what} region {r} is not nested in region {}, where the loop is",
            node.region
        ));
    }
    if region.args.len() != state.len() {
        return Err(format!(
            "the {what} region {r} takes {} arguments, the state has {}",
            region.args.len(),
            state.len()
        ));
    }
    for (k, (&a, ty)) in region.args.iter().zip(state).enumerate() {
        let arg = nodes.get(a.node).filter(|n| {
            matches!(n.op, Op::BlockArg) && n.region == r && a.output == 0 && n.outputs.len() == 1
        });
        if arg.is_none() || region.args[..k].contains(&a) {
            return Err(format!(
                "argument {k} of the {what} region {r} is {}#{}, not a distinct block \
                 argument of that region",
                a.node, a.output
            ));
        }
        let got = value_type(nodes, a)?;
        if got != *ty {
            return Err(format!(
                "argument {k} of the {what} region {r} is {got}, state value {k} is {ty}"
            ));
        }
    }
    for (k, &v) in region.results.iter().enumerate() {
        value_type(nodes, v)?;
        if nodes[v.node].region != r {
            return Err(format!(
                "result {k} of the {what} region {r} is {}#{}, which is defined in region {}",
                v.node, v.output, nodes[v.node].region
            ));
        }
    }
    Ok(())
}

/// What a loop's regions return: one rank-0 `Pred` from `cond`, a next state of the state's
/// types from `body`.
fn check_loop_results(
    nodes: &[Node],
    regions: &[Region],
    cond: usize,
    body: usize,
    state: &[&TensorType],
) -> Result<(), String> {
    let cond_results = &regions[cond].results;
    let pred = TensorType::new(DType::Pred, &[]);
    if cond_results.len() != 1 || value_type(nodes, cond_results[0])? != &pred {
        let got: Vec<String> = cond_results
            .iter()
            .filter_map(|&v| value_type(nodes, v).ok().map(|t| t.to_string()))
            .collect();
        return Err(format!(
            "the condition returns ({}), not one pred[]",
            got.join(", ")
        ));
    }
    let body_results = &regions[body].results;
    if body_results.len() != state.len() {
        return Err(format!(
            "the body returns {} values, the state has {}",
            body_results.len(),
            state.len()
        ));
    }
    for (k, (&v, ty)) in body_results.iter().zip(state).enumerate() {
        let got = value_type(nodes, v)?;
        if got != *ty {
            return Err(format!(
                "the body returns {got} for state value {k}, which is {ty}"
            ));
        }
    }
    Ok(())
}

/// Malformed loops, built by hand below the DSL, that the lowering and the interpreter must both
/// reject with an error (never a panic). Each graph has one parameter `x: f32[2]`.
#[cfg(test)]
pub(crate) mod malformed {
    use super::super::graph::Graph;
    use super::super::op::Op;
    use super::super::tensor::Tensor;
    use crate::dtype::{DType, TensorType};

    fn f32x2() -> TensorType {
        TensorType::new(DType::F32, &[2])
    }

    fn push(g: &Graph, op: Op, inputs: &[&Tensor], out: TensorType) -> Tensor {
        g.push(op, inputs.iter().map(|t| t.id()).collect(), vec![out])
            .expect("push")
            .remove(0)
    }

    /// A rank-0 pred constant in the current region.
    fn flag(g: &Graph) -> Tensor {
        let pred = TensorType::new(DType::Pred, &[]);
        push(g, Op::Constant { data: vec![0] }, &[], pred)
    }

    /// Opens a region in the current one with block arguments of `types`, builds its results
    /// with `build` and closes it.
    fn region(
        g: &Graph,
        types: &[TensorType],
        build: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    ) -> usize {
        let outer = g.current_region();
        let r = g.open_region();
        let args: Vec<Tensor> = types
            .iter()
            .map(|t| g.add_block_arg(r, t.clone()))
            .collect();
        let results = build(&args);
        g.set_region_results(r, results.iter().map(|t| t.id()).collect());
        g.set_current_region(outer);
        r
    }

    /// A loop over `x` whose body is `body`; sets the loop's output as the graph's.
    fn looped(
        build_cond: impl FnOnce(&Graph, &[Tensor]) -> Vec<Tensor>,
        build_body: impl FnOnce(&Graph, &Tensor, &[Tensor]) -> Vec<Tensor>,
    ) -> Graph {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).expect("parameter");
        let cond = region(&g, &[f32x2()], |a| build_cond(&g, a));
        let body = region(&g, &[f32x2()], |a| build_body(&g, &x, a));
        let out = push(&g, Op::While { cond, body }, &[&x], f32x2());
        g.set_outputs(&[&out]).expect("outputs");
        g
    }

    /// `(what, graph, a fragment of the message)`.
    pub(crate) fn cases() -> Vec<(&'static str, Graph, &'static str)> {
        let cond = |g: &Graph, _: &[Tensor]| vec![flag(g)];
        let neg =
            |g: &Graph, t: &Tensor| push(g, Op::Unary(crate::ops::UnaryOp::Neg), &[t], f32x2());
        let mut cases = vec![
            (
                "a body reads an outer value it did not capture",
                looped(cond, |g, x, _| vec![neg(g, x)]),
                "not visible",
            ),
            (
                "the condition returns f32[2]",
                looped(|_, a| vec![a[0].clone()], |_, _, a| vec![a[0].clone()]),
                "not one pred[]",
            ),
            (
                "the body returns two values for a state of one",
                looped(cond, |_, _, a| vec![a[0].clone(), a[0].clone()]),
                "the body returns 2 values",
            ),
            (
                "a block argument its region does not list",
                looped(cond, |g, _, _| vec![push(g, Op::BlockArg, &[], f32x2())]),
                "not an argument of region",
            ),
            (
                "a parameter inside a loop",
                looped(cond, |g, _, _| {
                    let p = Op::Parameter {
                        index: 0,
                        name: "x".into(),
                    };
                    vec![push(g, p, &[], f32x2())]
                }),
                "a parameter inside region",
            ),
        ];

        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).expect("parameter");
        let out = push(&g, Op::While { cond: 7, body: 8 }, &[&x], f32x2());
        g.set_outputs(&[&out]).expect("outputs");
        cases.push(("regions that do not exist", g, "region 7 does not exist"));

        // Two loops share their regions.
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).expect("parameter");
        let cond = region(&g, &[f32x2()], |_| vec![flag(&g)]);
        let body = region(&g, &[f32x2()], |a| vec![a[0].clone()]);
        let a = push(&g, Op::While { cond, body }, &[&x], f32x2());
        let b = push(&g, Op::While { cond, body }, &[&a], f32x2());
        g.set_outputs(&[&b]).expect("outputs");
        cases.push((
            "two loops share their regions",
            g,
            "belongs to two region ops",
        ));

        // The loop's output type differs from its state's.
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).expect("parameter");
        let cond = region(&g, &[f32x2()], |_| vec![flag(&g)]);
        let body = region(&g, &[f32x2()], |a| vec![a[0].clone()]);
        let out = push(
            &g,
            Op::While { cond, body },
            &[&x],
            TensorType::new(DType::F32, &[3]),
        );
        g.set_outputs(&[&out]).expect("outputs");
        cases.push((
            "an output type differs from the state",
            g,
            "output 0 is f32[3]",
        ));

        // A region nested in another loop's body, used by a loop in the program.
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).expect("parameter");
        let outer = g.open_region();
        let cond = region(&g, &[f32x2()], |_| vec![flag(&g)]);
        let body = region(&g, &[f32x2()], |a| vec![a[0].clone()]);
        g.set_current_region(0);
        let _ = outer;
        let out = push(&g, Op::While { cond, body }, &[&x], f32x2());
        g.set_outputs(&[&out]).expect("outputs");
        cases.push(("regions nested elsewhere", g, "is not nested in region 0"));
        cases
    }
}
