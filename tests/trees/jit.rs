//! `jit` over trees: results against the host, one compile per input signature, donation by
//! path prefix, and the errors.

use super::common::{client, vals};
use stablegraph::jit::jit;
use stablegraph::ops::Tensor;
use stablegraph::tree::{self, Tree};
use stablegraph::HostArray;

#[derive(Tree)]
struct Affine<T> {
    w: T,
    b: Option<T>,
}

/// `x @ w + b` and the sum of `w`: a tree in, a tuple with a tree out.
fn apply((p, x): (Affine<Tensor>, Tensor)) -> stablegraph::Result<(Tensor, Affine<Tensor>)> {
    let mut y = x.matmul(&p.w)?;
    if let Some(b) = &p.b {
        y = y.add(b)?;
    }
    let doubled = Affine {
        w: p.w.mul(&p.w.graph().scalar(2.0, p.w.dtype())?)?,
        b: p.b.clone(),
    };
    Ok((y, doubled))
}

fn affine(k: usize, n: usize, bias: bool) -> Affine<HostArray> {
    Affine {
        w: HostArray::from_vec(&[k, n], (0..k * n).map(|i| i as f32 - 2.0).collect()).unwrap(),
        b: bias
            .then(|| HostArray::from_vec(&[n], (0..n).map(|i| 0.5 * i as f32).collect()).unwrap()),
    }
}

/// `x @ w + b` on the host.
fn host_apply(p: &Affine<HostArray>, x: &[f32], rows: usize) -> Vec<f32> {
    let (k, n) = (p.w.dims()[0], p.w.dims()[1]);
    let (w, b) = (vals::<f32>(&p.w), p.b.as_ref().map(vals::<f32>));
    let mut y = vec![0f32; rows * n];
    for r in 0..rows {
        for j in 0..n {
            let dot: f32 = (0..k).map(|i| x[r * k + i] * w[i * n + j]).sum();
            y[r * n + j] = dot + b.as_ref().map_or(0.0, |b| b[j]);
        }
    }
    y
}

#[test]
fn jit_runs_trees_and_compiles_once_per_signature() {
    let c = client();
    let f = jit(&c, apply);
    let x: Vec<f32> = (0..6).map(|i| i as f32 * 0.25).collect();
    for (bias, rows, compiles) in [(true, 2, 1), (true, 2, 1), (false, 2, 2), (true, 3, 3)] {
        let p = affine(3, 4, bias);
        let xs = HostArray::from_vec(
            &[rows, 3],
            x.iter().cycle().take(rows * 3).copied().collect(),
        )
        .unwrap();
        let args = tree::upload(&c, &(p, xs.clone())).unwrap();
        let (y, doubled) = f.call(&args.as_refs().unwrap()).unwrap();
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            host_apply(&args_host(&args.0), &vals::<f32>(&xs), rows)
        );
        let d = tree::download(&doubled).unwrap();
        assert_eq!(
            vals::<f32>(&d.w),
            vals::<f32>(&args_host(&args.0).w)
                .iter()
                .map(|v| 2.0 * v)
                .collect::<Vec<_>>()
        );
        assert_eq!(d.b.is_some(), bias);
        assert_eq!(f.compiles(), compiles);
    }
    let text = f
        .stablehlo(&(affine(3, 4, true), HostArray::from_vec(&[2, 3], x).unwrap()))
        .unwrap();
    assert!(text.contains("stablehlo.dot_general"), "{text}");
    assert_eq!(
        f.compiles(),
        3,
        "the signature of the first calls is cached"
    );
}

fn args_host(p: &Affine<stablegraph::runtime::Buffer>) -> Affine<HostArray> {
    tree::download(p).unwrap()
}

#[test]
fn donated_inputs_are_consumed_and_the_others_kept() {
    let c = client();
    let step = jit(&c, |(p, x): (Affine<Tensor>, Tensor)| {
        Ok(Affine {
            w: p.w.add(&x)?,
            b: p.b,
        })
    })
    .donate("0.w");
    let p = tree::upload(&c, &affine(2, 2, true)).unwrap();
    let x = c
        .buffer_from_host_array(&HostArray::from_vec(&[2, 2], vec![1f32; 4]).unwrap())
        .unwrap();
    let next = step.call(&(p.as_refs().unwrap(), &x)).unwrap();
    assert!(p.w.is_donated());
    assert!(!p.b.as_ref().unwrap().is_donated() && !x.is_donated());
    assert_eq!(next.w.to_vec::<f32>().unwrap(), [-1.0, 0.0, 1.0, 2.0]);
    // The donated buffer is refused afterwards, with an error.
    assert!(step.call(&(p.as_refs().unwrap(), &x)).is_err());
    let none = jit(&c, |(p, _x): (Affine<Tensor>, Tensor)| Ok(p.w)).donate("1.w");
    let p = tree::upload(&c, &affine(2, 2, false)).unwrap();
    let err = none
        .call(&(p.as_refs().unwrap(), &x))
        .unwrap_err()
        .to_string();
    assert!(err.contains("donate(\"1.w\") matches no input"), "{err}");
    assert!(err.contains("`0.w`, `1`"), "{err}");
}

#[test]
fn errors_in_the_function_reach_the_caller() {
    let c = client();
    let f = jit(&c, |(a, b): (Tensor, Tensor)| a.matmul(&b));
    let a = c
        .buffer_from_host_array(&HostArray::from_vec(&[2, 3], vec![0f32; 6]).unwrap())
        .unwrap();
    let err = f.call(&(&a, &a)).unwrap_err().to_string();
    assert!(err.contains("matmul") && err.contains("jit.rs"), "{err}");
    assert_eq!(f.compiles(), 0);
}
