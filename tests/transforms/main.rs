//! The function transformations over trees (`stablegraph::transforms`) against JAX's results
//! recorded in float64 by `tests/fixtures/jax/make_functions.py` (jax 0.10.2): every value
//! checked to 1e-10 on the interpreter and on the compiled CPU program. Then the errors of the
//! transformations, in the user's terms.

#[path = "../common/mod.rs"]
mod common;
mod custom;

use common::jax::JaxFixture;
use stablegraph::ops::{Graph, Tensor};
use stablegraph::transforms::{
    grad, grad_wrt, hessian, jacfwd, jacrev, jvp, stop_gradient, value_and_grad_aux, vjp, vmap,
    Axes,
};
use stablegraph::tree::Tree;
use stablegraph::{DType, HostArray, Result};

use DType::F64;

/// One section of `tests/fixtures/jax/functions.json` (recorded with JAX 0.10.2).
pub struct Fixture;

impl Fixture {
    pub fn load(section: &str) -> JaxFixture {
        let version = JaxFixture::load("functions.json", "jax");
        assert_eq!(version.0, "0.10.2");
        JaxFixture::load("functions.json", section)
    }
}

/// A graph under test: parameters fed from fixture arrays, outputs compared with fixture
/// fields.
#[derive(Default)]
pub struct Case {
    pub g: Graph,
    inputs: Vec<HostArray>,
    outputs: Vec<(String, Tensor)>,
}

impl Case {
    pub fn new() -> Case {
        Case::default()
    }

    /// A parameter holding `value`.
    pub fn input(&mut self, value: HostArray) -> Tensor {
        let name = format!("p{}", self.inputs.len());
        let t = self
            .g
            .parameter(&name, value.dtype(), value.dims())
            .unwrap();
        self.inputs.push(value);
        t
    }

    /// Compares `t` with the fixture's field `key`.
    pub fn expect(&mut self, key: &str, t: &Tensor) {
        self.outputs.push((key.to_string(), t.clone()));
    }

    /// Runs the graph on the interpreter and compiled on the CPU, and checks every expected
    /// output against `f` to 1e-10 (relative above 1).
    pub fn check(self, f: &JaxFixture) {
        let refs: Vec<&Tensor> = self.outputs.iter().map(|(_, t)| t).collect();
        self.g.set_outputs(&refs).unwrap();
        let host = self.g.evaluate(&self.inputs).unwrap();
        let compiled = self
            .g
            .compile(&common::client())
            .unwrap()
            .run(&self.inputs)
            .unwrap();
        for (k, (key, _)) in self.outputs.iter().enumerate() {
            let want = f.values(key);
            for (what, got) in [("interpreter", &host[k]), ("compiled", &compiled[k])] {
                let got = got.to_f64_vec();
                assert_eq!(got.len(), want.len(), "{key} ({what}): length");
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-10 * b.abs().max(1.0),
                        "{key} ({what}) [{i}]: {a} vs JAX {b}"
                    );
                }
            }
        }
    }
}

#[derive(Tree)]
struct Linear<T> {
    w: T,
    b: T,
}

#[derive(Tree)]
struct Mlp<T> {
    fc1: Linear<T>,
    fc2: Linear<T>,
}

/// One example's cross-entropy: x [4], y an int class of 3.
fn mlp_loss((p, x, y): (Mlp<Tensor>, Tensor, Tensor)) -> Result<Tensor> {
    let affine = |l: &Linear<Tensor>, h: &Tensor| -> Result<Tensor> {
        let n = h.dims()[0] as isize;
        h.reshape(&[1, n])?.matmul(&l.w)?.reshape(&[-1])?.add(&l.b)
    };
    let h = affine(&p.fc1, &x)?.tanh()?;
    let logits = affine(&p.fc2, &h)?;
    logits
        .reshape(&[1, 3])?
        .cross_entropy(&y.reshape(&[1])?, None)
}

#[test]
fn per_example_gradients_of_a_tree_are_one_expression() {
    let f = Fixture::load("per_example");
    let mut c = Case::new();
    let mut layer = |w: &str, wd: &[usize], b: &str, bd: &[usize]| Linear {
        w: c.input(f.array(w, wd)),
        b: c.input(f.array(b, bd)),
    };
    let p = Mlp {
        fc1: layer("fc1_w", &[4, 5], "fc1_b", &[5]),
        fc2: layer("fc2_w", &[5, 3], "fc2_b", &[3]),
    };
    let xs = c.input(f.array("xs", &[6, 4]));
    let ys: Vec<i32> = f.values("ys").iter().map(|&y| y as i32).collect();
    let ys = c.input(HostArray::from_vec(&[6], ys).unwrap());
    let per = vmap(grad(mlp_loss), (None, 0, 0), 0)((p, xs, ys)).unwrap();
    assert_eq!(per.fc1.w.dims(), &[6, 4, 5]);
    assert_eq!(per.fc2.b.dims(), &[6, 3]);
    c.expect("g_fc1_w", &per.fc1.w);
    c.expect("g_fc1_b", &per.fc1.b);
    c.expect("g_fc2_w", &per.fc2.w);
    c.expect("g_fc2_b", &per.fc2.b);
    c.check(&f);
}

#[test]
fn vmap_takes_negative_axes_and_unbatched_outputs() {
    let f = Fixture::load("vmap_axes");
    let mut c = Case::new();
    let x = c.input(f.array("x", &[3, 5]));
    let w = c.input(f.array("w", &[3]));
    let body = |(x, w): (Tensor, Tensor)| {
        Ok((
            x.mul(&w)?.sin()?.mul(&x.sum_all()?)?,
            w.square()?.sum_all()?,
        ))
    };
    let (y, s) = vmap(body, (-1, None), (-1, None))((x.clone(), w.clone())).unwrap();
    c.expect("y", &y);
    c.expect("s", &s);
    // The same by paths.
    let by_path = vmap(
        body,
        Axes::paths([("0", Some(-1)), ("1", None)]),
        (-1, None),
    );
    let (y2, _) = by_path((x, w)).unwrap();
    c.expect("y", &y2);
    c.check(&f);
}

#[test]
fn value_and_grad_with_aux_over_a_tuple_tree() {
    let f = Fixture::load("value_grad_aux");
    let mut c = Case::new();
    let w = c.input(f.array("w", &[3, 2]));
    let b = c.input(f.array("b", &[2]));
    let x = c.input(f.array("x", &[4, 3]));
    let loss = |((w, b), x): ((Tensor, Tensor), Tensor)| {
        let z = x.matmul(&w)?.add(&b)?.tanh()?;
        Ok((z.square()?.sum_all()?, z.mean(&[0, 1])?))
    };
    let ((value, aux), (gw, gb)) = value_and_grad_aux(loss)(((w, b), x)).unwrap();
    for (key, t) in [("value", &value), ("aux", &aux), ("gw", &gw), ("gb", &gb)] {
        c.expect(key, t);
    }
    c.check(&f);
}

#[test]
fn hessian_jacobians_and_jvp_with_primals() {
    let f = Fixture::load("hessian_jvp");
    let mut c = Case::new();
    let x = c.input(f.array("x", &[3]));
    let a = c.input(f.array("a", &[3, 3]));
    let t = c.input(f.array("t", &[3]));
    let scalar = |x: Tensor| {
        a.matmul(&x)?
            .tanh()?
            .mul(&x)?
            .sum_all()?
            .add(&x.cos()?.prod(&[0])?)
    };
    let h = hessian(scalar)(x.clone()).unwrap();
    assert_eq!(h.dims(), &[3, 3]);
    c.expect("hessian", &h);
    // The Hessian again as both Jacobians of the gradient.
    c.expect("hessian", &jacfwd(grad(scalar))(x.clone()).unwrap());
    c.expect("hessian", &jacrev(grad(scalar))(x.clone()).unwrap());
    let v = |x: Tensor| a.matmul(&x)?.sin()?.mul(&x);
    let (y, ty) = jvp(v, &x, &t).unwrap();
    c.expect("y", &y);
    c.expect("ty", &ty);
    // vjp's pullback of the tangent's dual: <J t, J t> = <t, Jᵀ J t> checked below by value.
    let (y2, pullback) = vjp(v, &x).unwrap();
    c.expect("y", &y2);
    let back = pullback(&ty).unwrap(); // Jᵀ (J t)
    let lhs = ty.square().unwrap().sum_all().unwrap();
    let rhs = back.mul(&t).unwrap().sum_all().unwrap();
    c.g.set_outputs(&[&lhs, &rhs]).unwrap();
    let ins = [
        f.array("x", &[3]),
        f.array("a", &[3, 3]),
        f.array("t", &[3]),
    ];
    let out = c.g.evaluate(&ins).unwrap();
    let (l, r) = (out[0].to_f64_vec()[0], out[1].to_f64_vec()[0]);
    assert!((l - r).abs() <= 1e-12 * l.abs().max(1.0), "{l} vs {r}");
    c.check(&f);
}

#[test]
fn zero_operand_cond_grad_wrt_paths_and_stop_gradient() {
    let f = Fixture::load("cond_stop");
    let mut c = Case::new();
    let w = c.input(f.array("w", &[3]));
    for side in ["pos", "neg"] {
        let x = c.input(f.array(&format!("{side}_x"), &[3]));
        let fun = |(x, w): (Tensor, Tensor)| {
            let g = x.graph().clone();
            let pred = x.sum_all()?.gt(0.0)?;
            // Branches that only capture values: no operands.
            let y = g.cond(&pred, &(), |_| x.mul(&w)?.exp(), |_| x.mul(&w.sum_all()?))?;
            y.sum_all()
        };
        let y = fun((x.clone(), w.clone())).unwrap();
        let (gx, gw) = grad_wrt(fun, &["0", "1"])((x, w.clone())).unwrap();
        c.expect(&format!("{side}_y"), &y);
        c.expect(&format!("{side}_gx"), &gx);
        c.expect(&format!("{side}_gw"), &gw);
    }
    let x = c.input(f.array("s_x", &[3]));
    let s = |x: Tensor| x.mul(&stop_gradient(&x.sin()?)?)?.add(&x.cos()?)?.sum_all();
    c.expect("s_y", &s(x.clone()).unwrap());
    c.expect("s_gx", &grad(s)(x).unwrap());
    c.check(&f);
}

#[test]
fn transformation_errors_name_what_the_user_wrote() {
    let g = Graph::new();
    let x = g.parameter("x", F64, &[4, 3]).unwrap();
    let w = g.parameter("w", F64, &[3]).unwrap();
    let f = |(x, w): (Tensor, Tensor)| x.mul(&w);
    // out_axes None for a result that differs between examples.
    let err = vmap(f, (0, None), None::<i32>)((x.clone(), w.clone()))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("out_axes is None for ``"), "{err}");
    // in_axes with an entry for a path that holds no leaf.
    let err = vmap(f, Axes::paths([("0", Some(0)), ("2", None)]), 0)((x.clone(), w.clone()))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("in_axes has an entry for `2`"), "{err}");
    // An axis out of range, counted from the end.
    let err = vmap(f, (-3, None), 0)((x.clone(), w.clone()))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("in_axes -3 is out of range for `0` of rank 2"),
        "{err}"
    );
    // grad_wrt with a prefix that selects nothing.
    let loss = |(x, w): (Tensor, Tensor)| x.mul(&w)?.sum_all();
    let err = grad_wrt(loss, &["1.w"])((x.clone(), w.clone()))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no input leaf lies under `1.w`"), "{err}");
    // grad of a value that is not a scalar.
    let err = grad(|x: Tensor| x.mul(2.0))(x).err().unwrap().to_string();
    assert!(err.contains("rank-0 float"), "{err}");
}

#[test]
fn transformed_functions_run_under_jit_and_checkpoint_keeps_the_gradient() {
    use stablegraph::jit::jit;
    use stablegraph::transforms::checkpoint;
    let f = Fixture::load("per_example");
    let client = common::client();
    // The per-example gradients as one compiled function of host trees.
    let per_example = jit(&client, vmap(grad(mlp_loss), (None, 0, 0), 0));
    let p = Mlp {
        fc1: Linear {
            w: f.array("fc1_w", &[4, 5]),
            b: f.array("fc1_b", &[5]),
        },
        fc2: Linear {
            w: f.array("fc2_w", &[5, 3]),
            b: f.array("fc2_b", &[3]),
        },
    };
    let ys: Vec<i32> = f.values("ys").iter().map(|&y| y as i32).collect();
    let args = (
        p,
        f.array("xs", &[6, 4]),
        HostArray::from_vec(&[6], ys).unwrap(),
    );
    let args = stablegraph::tree::upload(&client, &args).unwrap();
    let out = per_example.call(&args).unwrap();
    let got = out.fc2.w.to_host_array().unwrap().to_f64_vec();
    let want = f.values("g_fc2_w");
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-10));
    // checkpoint as a function: the same gradient, recomputed behind a barrier.
    let g = Graph::new();
    let x = g.parameter("x", F64, &[3]).unwrap();
    let block = |x: Tensor| x.sin()?.mul(&x)?.exp();
    let plain = grad(|x: Tensor| block(x)?.sum_all())(x.clone()).unwrap();
    let remat = grad(|x: Tensor| checkpoint(block)(x)?.sum_all())(x).unwrap();
    g.set_outputs(&[&plain, &remat]).unwrap();
    assert!(g.to_stablehlo().unwrap().contains("optimization_barrier"));
    let out = g
        .evaluate(&[HostArray::from_vec(&[3], vec![0.3f64, -1.2, 2.0]).unwrap()])
        .unwrap();
    assert_eq!(out[0].to_f64_vec(), out[1].to_f64_vec());
}
