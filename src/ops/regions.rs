//! The rules of `While` and `Case`: how a loop's regions must fit its state, and a
//! conditional's branches its operands and outputs. [`super::rules::check_node`]
//! and [`super::walk::live_nodes`] apply them to every live loop and conditional, so that the
//! lowering and the interpreter reject a malformed one for the same reasons (each wraps the message in its
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

/// Checks the `Case` node `index` against its branches and returns them.
///
/// `inputs[0]` is a rank-0 `I32` index; every branch is a distinct region nested directly in
/// the node's region, with one `BlockArg` of its own per operand (`inputs[1..]`, of its type),
/// returning values of the node's output types defined in itself. There is at least one.
pub(crate) fn check_case(
    nodes: &[Node],
    regions: &[Region],
    index: usize,
) -> Result<Vec<usize>, String> {
    let node = nodes
        .get(index)
        .ok_or_else(|| format!("node {index} does not exist"))?;
    let Op::Case { branches } = &node.op else {
        return Err(format!("node {index} is a {}, not a case", node.op.name()));
    };
    if branches.is_empty() {
        return Err("the conditional has no branches".to_string());
    }
    let which = node
        .inputs
        .first()
        .ok_or_else(|| "the conditional has no branch index".to_string())?;
    let which = value_type(nodes, *which)?;
    if *which != TensorType::new(DType::I32, &[]) {
        return Err(format!("the branch index is {which}, not i32[]"));
    }
    let operands = node.inputs[1..]
        .iter()
        .map(|&v| value_type(nodes, v))
        .collect::<Result<Vec<_>, _>>()?;
    for (k, &r) in branches.iter().enumerate() {
        if branches[..k].contains(&r) {
            return Err(format!(
                "branches {k} and an earlier one are both region {r}"
            ));
        }
        let what = format!("branch {k}");
        check_loop_region(nodes, regions, node, &what, r, &operands)?;
        let results = &regions[r].results;
        if results.len() != node.outputs.len() {
            return Err(format!(
                "{what} returns {} values, the conditional has {} outputs",
                results.len(),
                node.outputs.len()
            ));
        }
        for (j, (&v, out)) in results.iter().zip(&node.outputs).enumerate() {
            let got = value_type(nodes, v)?;
            if got != out {
                return Err(format!(
                    "{what} returns {got} for output {j}, which is {out}"
                ));
            }
        }
    }
    Ok(branches.clone())
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

/// Malformed loops and conditionals, built by hand below the DSL, that the lowering and the interpreter must both
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
        cases.extend(conditionals());
        cases
    }

    /// A conditional on `x` over two branches returning `x` negated, with the index `index`
    /// makes and the node's output type `out`.
    fn conditional(index: impl FnOnce(&Graph, &Tensor) -> Tensor, out: TensorType) -> Graph {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).expect("parameter");
        let i = index(&g, &x);
        let neg = |a: &[Tensor]| {
            vec![push(
                &g,
                Op::Unary(crate::ops::UnaryOp::Neg),
                &[&a[0]],
                f32x2(),
            )]
        };
        let branches = vec![region(&g, &[f32x2()], neg), region(&g, &[f32x2()], neg)];
        let out = push(&g, Op::Case { branches }, &[&i, &x], out);
        g.set_outputs(&[&out]).expect("outputs");
        g
    }

    /// Malformed `Case` nodes.
    fn conditionals() -> Vec<(&'static str, Graph, &'static str)> {
        let i32_index = |g: &Graph, _: &Tensor| {
            let ty = TensorType::new(DType::I32, &[]);
            push(g, Op::Constant { data: vec![0; 4] }, &[], ty)
        };
        vec![
            (
                "a case indexed by a float",
                conditional(|_, x| x.clone(), f32x2()),
                "the branch index is f32[2], not i32[]",
            ),
            (
                "a case whose branches return another type than its output",
                conditional(i32_index, TensorType::new(DType::F32, &[3])),
                "branch 0 returns f32[2] for output 0, which is f32[3]",
            ),
        ]
    }
}
