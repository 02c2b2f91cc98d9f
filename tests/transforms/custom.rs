//! `custom_vjp` and `custom_jvp` against JAX: a stable log-sum-exp given by its reverse rule,
//! a straight-through round and a log-sum-exp given by their tangent rules, each under
//! `grad`, `jvp`, `vmap(grad)` and `grad` of `vmap` (the batched copy keeps the rule).

use super::{Case, Fixture};
use stablegraph::ops::Tensor;
use stablegraph::transforms::{custom_jvp, custom_vjp, grad, jvp, vmap};
use stablegraph::Result;

/// log(sum(exp(x))) with the maximum taken out.
fn stable_lse(x: &Tensor) -> Result<Tensor> {
    let m = x.max(&[0])?;
    x.sub(&m)?.exp()?.sum_all()?.log()?.add(&m)
}

/// JAX's `lse`: a reverse rule whose forward is stable and whose cotangent is the softmax.
fn lse_vjp() -> impl Fn(Tensor) -> Result<Tensor> {
    custom_vjp(
        |x: Tensor| {
            let y = stable_lse(&x)?;
            Ok((y.clone(), (x, y)))
        },
        |(x, y): (Tensor, Tensor), ct: Tensor| x.sub(&y)?.exp()?.mul(&ct),
    )
}

/// JAX's `st_round`: rounds (half up here, half to even in JAX; the inputs hold no halves),
/// passes the tangent unchanged.
fn st_round() -> impl Fn(Tensor) -> Result<Tensor> {
    custom_jvp(
        |x: Tensor| x.add(0.5)?.floor(),
        |_x: Tensor, t: Tensor| Ok(t),
    )
}

/// JAX's `lse_jvp`: the tangent is the softmax times the input's tangent.
fn lse_jvp() -> impl Fn(Tensor) -> Result<Tensor> {
    custom_jvp(
        |x: Tensor| stable_lse(&x),
        |x: Tensor, t: Tensor| {
            let y = stable_lse(&x)?;
            x.sub(&y)?.exp()?.mul(&t)?.sum_all()
        },
    )
}

#[test]
fn custom_vjp_rule_under_grad_and_vmap() {
    let f = Fixture::load("custom");
    let mut c = Case::new();
    let big = c.input(f.array("big", &[4]));
    let xs = c.input(f.array("xs", &[3, 4]));
    let lse = lse_vjp();
    c.expect("vjp_lse_big", &lse(big.clone()).unwrap());
    c.expect("vjp_grad_big", &grad(&lse)(big).unwrap());
    let weighted = |v: Tensor| lse(v.clone())?.mul(&v.sum_all()?);
    c.expect(
        "vjp_vmap_grad",
        &vmap(grad(weighted), 0, 0)(xs.clone()).unwrap(),
    );
    // The gradient of the batched function: the batched span keeps the rule, per example.
    let total = |xs: Tensor| vmap(weighted, 0, 0)(xs)?.sum_all();
    c.expect("vjp_vmap_grad", &grad(total)(xs).unwrap());
    c.check(&f);
}

#[test]
fn custom_jvp_rules_under_grad_jvp_and_vmap() {
    let f = Fixture::load("custom");
    let mut c = Case::new();
    let x = c.input(f.array("x", &[4]));
    let t = c.input(f.array("t", &[4]));
    let xs = c.input(f.array("xs", &[3, 4]));
    let big = c.input(f.array("big", &[4]));
    let round = st_round();
    let st_loss = |x: Tensor| round(x.mul(2.0)?)?.mul(&x)?.sum_all();
    c.expect("st_y", &st_loss(x.clone()).unwrap());
    // Without the rule the round's derivative is 0 and the gradient would be round(2x).
    c.expect("st_grad", &grad(st_loss)(x.clone()).unwrap());
    c.expect("st_jvp_t", &jvp(st_loss, &x, &t).unwrap().1);
    c.expect(
        "st_vmap_grad",
        &vmap(grad(st_loss), 0, 0)(xs.clone()).unwrap(),
    );
    let total = |xs: Tensor| vmap(st_loss, 0, 0)(xs)?.sum_all();
    c.expect("st_vmap_grad", &grad(total)(xs).unwrap());
    let lse = lse_jvp();
    c.expect("jvp_lse_big", &lse(big.clone()).unwrap());
    c.expect("jvp_grad_big", &grad(&lse)(big).unwrap());
    c.expect("jvp_tangent", &jvp(&lse, &x, &t).unwrap().1);
    c.check(&f);
}

#[test]
fn rules_hold_inside_loops_conditionals_and_checkpoints() {
    use stablegraph::ops::Graph;
    use stablegraph::transforms::checkpoint;
    use stablegraph::{DType, HostArray};
    // With the straight-through rule, round(h) * a has derivative a in h (0 without the rule):
    // three loop steps give a^3, the conditional's taken branch a, a checkpointed span a.
    let g = Graph::new();
    let x = g.parameter("x", DType::F64, &[3]).unwrap();
    let a = g.parameter("a", DType::F64, &[3]).unwrap();
    let round = st_round();
    let step = |h: &Tensor| round(h.clone())?.mul(&a);
    let looped = |x: Tensor| g.fori_loop(0, 3, &x, |_, h| step(h))?.sum_all();
    let branched = |x: Tensor| {
        let pred = x.sum_all()?.gt(-100.0)?;
        g.cond(&pred, &(), |_| step(&x), |_| x.mul(2.0))?.sum_all()
    };
    let remat = |x: Tensor| checkpoint(|x: Tensor| step(&x))(x)?.sum_all();
    // A rule's result also read after the checkpointed span: pulled through once (a + 2).
    let read_after = |x: Tensor| {
        let (y, r) = checkpoint(|x: Tensor| {
            let r = round(x)?;
            Ok((r.mul(&a)?.sum_all()?, r))
        })(x)?;
        y.add(&r.mul(2.0)?.sum_all()?)
    };
    let outs = [
        grad(looped)(x.clone()).unwrap(),
        grad(branched)(x.clone()).unwrap(),
        grad(remat)(x.clone()).unwrap(),
        grad(read_after)(x).unwrap(),
    ];
    g.set_outputs(&outs.iter().collect::<Vec<_>>()).unwrap();
    let av = [0.5f64, -1.5, 2.0];
    let ins = [
        HostArray::from_vec(&[3], vec![0.7f64, -1.2, 2.4]).unwrap(),
        HostArray::from_vec(&[3], av.to_vec()).unwrap(),
    ];
    let host = g.evaluate(&ins).unwrap();
    let dev = g
        .compile(&super::common::client())
        .unwrap()
        .run(&ins)
        .unwrap();
    let cubes: Vec<f64> = av.iter().map(|a| a * a * a).collect();
    for (what, out) in [("interpreter", &host), ("compiled", &dev)] {
        assert_eq!(out[0].to_f64_vec(), cubes, "loop ({what})");
        assert_eq!(out[1].to_f64_vec(), av, "cond ({what})");
        assert_eq!(out[2].to_f64_vec(), av, "checkpoint ({what})");
        let plus_two: Vec<f64> = av.iter().map(|a| a + 2.0).collect();
        assert_eq!(
            out[3].to_f64_vec(),
            plus_two,
            "read after the checkpoint ({what})"
        );
    }
}
