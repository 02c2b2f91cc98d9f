//! `vmap` over loops, dynamic slices at per-example positions and convolutions, against the
//! same function applied to each example in turn and the results stacked (in the same graph,
//! compiled and interpreted): a `fori_loop` whose counter stays unbatched (and its gradient,
//! inside and outside `vmap`), a `while_loop` whose predicate is batched (each example stops
//! at its own trip), slices read and written at each example's own (clamped) offsets, batched
//! inputs and kernels; and `vmap` of a function over most primitive families, and of a
//! gradient, against JAX's on recorded fixtures (`tests/fixtures/jax/make_fixtures.py`).

use super::*;

/// `each[e][k]` stacked along a new axis 0, for every `k`.
fn stacked(each: &[Vec<Tensor>]) -> Result<Vec<Tensor>> {
    (0..each[0].len())
        .map(|k| {
            let parts: Vec<Tensor> = each
                .iter()
                .map(|r| r[k].expand_dims(0))
                .collect::<Result<_>>()?;
            Tensor::concat(&parts.iter().collect::<Vec<_>>(), 0)
        })
        .collect()
}

/// Example `e` of `t` (batched along axis 0).
fn example(t: &Tensor, e: usize) -> Result<Tensor> {
    let dims: Vec<isize> = t.dims()[1..].iter().map(|&d| d as isize).collect();
    t.narrow(0, e, 1)?.reshape(&dims)
}

/// Runs `g` (outputs: `n` batched results, then the same stacked from each example) on the
/// interpreter and the device and compares each pair to 1e-12.
fn check_pairs(g: &Graph, ins: &[HostArray], n: usize) -> Result<()> {
    for (side, out) in [
        ("interpreter", g.evaluate(ins)?),
        ("device", g.compile(&client())?.run(ins)?),
    ] {
        for k in 0..n {
            assert_eq!(out[k].dims(), out[n + k].dims(), "{side}, result {k}");
            for (a, e) in out[k].to_f64_vec().iter().zip(out[n + k].to_f64_vec()) {
                assert!((a - e).abs() <= 1e-12, "{side}, result {k}: {a} vs {e}");
            }
        }
    }
    Ok(())
}

#[test]
fn vmap_over_a_fori_loop_keeps_its_counter_and_its_gradient() -> Result<()> {
    let mut rng = Rng::new(91);
    let b = 3;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[b, 4, 2])?;
    let h0 = g.parameter("h0", F64, &[2])?;
    let w = g.parameter("w", F64, &[2, 2])?;
    // A recurrence over the example's 4 steps (a dynamic slice at the unbatched counter), an
    // unbatched initial state, a captured weight; its loss's gradient with respect to w.
    let per = |x: &Tensor| -> Result<Vec<Tensor>> {
        let h = g.fori_loop(0, 4, &h0, |i, h| {
            let zero = g.scalar(0.0, i.dtype())?;
            let row = x.dynamic_slice(&[i, &zero], &[1, 2])?.reshape(&[2])?;
            h.reshape(&[1, 2])?
                .matmul(&w)?
                .reshape(&[2])?
                .add(&row)?
                .tanh()
        })?;
        let loss = h.square()?.sum_all()?;
        Ok(vec![h, loss.clone(), loss.grad(&[&w])?.remove(0)])
    };
    let batched = g.vmap(&[&xs], &[Some(0)], &[], |a| per(&a[0]))?;
    let each = (0..b)
        .map(|e| per(&example(&xs, e)?))
        .collect::<Result<Vec<_>>>()?;
    // The gradient of the batch's summed loss through the vmapped loop: the sum of the
    // examples' gradients.
    let total = batched[1].sum_all()?.grad(&[&w])?.remove(0);
    let mut sum = each[0][2].clone();
    for r in &each[1..] {
        sum = sum.add(&r[2])?;
    }
    let mut outs = batched.clone();
    outs.push(total);
    outs.extend(stacked(&each)?);
    outs.push(sum);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        rng.array(F64, &[b, 4, 2], -1.0, 1.0),
        rng.array(F64, &[2], -1.0, 1.0),
        rng.array(F64, &[2, 2], -1.0, 1.0),
    ];
    check_pairs(&g, &ins, 4)
}

#[test]
fn vmap_over_a_while_loop_stops_each_example_on_its_own() -> Result<()> {
    let b = 5;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[b])?;
    let limits = g.parameter("limits", F64, &[b])?;
    let growth = g.parameter("growth", F64, &[])?;
    // Grow x until it passes the example's limit, counting the trips: a different count per
    // example (0 for one already past it).
    let per = |x: &Tensor, limit: &Tensor| -> Result<Vec<Tensor>> {
        let init = (x.clone(), g.scalar(0.0, I32)?);
        let (x, n) = g.while_loop(
            &init,
            |(x, _)| x.lt(limit),
            |(x, n)| Ok((x.mul(&growth)?.add(0.25)?, n.add(1)?)),
        )?;
        Ok(vec![x, n.astype(F64)?])
    };
    let batched = g.vmap(&[&xs, &limits], &[Some(0), Some(0)], &[], |a| {
        per(&a[0], &a[1])
    })?;
    let each = (0..b)
        .map(|e| per(&example(&xs, e)?, &example(&limits, e)?))
        .collect::<Result<Vec<_>>>()?;
    let mut outs = batched.clone();
    outs.extend(stacked(&each)?);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        arr(&[b], vec![0.5f64, 3.0, 0.05, 0.1, 2.0]),
        arr(&[b], vec![4.0f64, 1.0, 10.0, 0.2, 2.5]),
        HostArray::scalar(1.5f64),
    ];
    check_pairs(&g, &ins, 2)?;
    // The trip counts differ from example to example.
    let counts = g.evaluate(&ins)?[1].to_f64_vec();
    assert_eq!(counts[1], 0.0, "{counts:?}");
    assert!(counts[2] > counts[0], "{counts:?}");
    Ok(())
}

#[test]
fn vmap_slices_at_each_examples_own_offsets() -> Result<()> {
    let mut rng = Rng::new(93);
    let b = 4;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[b, 5, 3])?;
    let shared = g.parameter("shared", F64, &[5, 3])?;
    let rows = g.parameter("rows", I32, &[b])?;
    let cols = g.parameter("cols", I64, &[b])?;
    let patches = g.parameter("patches", F64, &[b, 2, 2])?;
    // Out-of-range offsets clamp so that the window fits, per example.
    let per = |x: &Tensor, r: &Tensor, c: &Tensor, p: &Tensor| -> Result<Vec<Tensor>> {
        let c32 = c.astype(I32)?;
        Ok(vec![
            x.dynamic_slice(&[r, &c32], &[2, 2])?,
            shared.dynamic_slice(&[r, &c32], &[3, 1])?,
            x.dynamic_update_slice(p, &[r, &c32])?,
            shared.dynamic_update_slice(p, &[r, &c32])?,
        ])
    };
    let batched = g.vmap(
        &[&xs, &rows, &cols, &patches],
        &[Some(0), Some(0), Some(0), Some(0)],
        &[],
        |a| per(&a[0], &a[1], &a[2], &a[3]),
    )?;
    let each = (0..b)
        .map(|e| {
            per(
                &example(&xs, e)?,
                &example(&rows, e)?,
                &example(&cols, e)?,
                &example(&patches, e)?,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mut outs = batched.clone();
    outs.extend(stacked(&each)?);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        rng.array(F64, &[b, 5, 3], -1.0, 1.0),
        rng.array(F64, &[5, 3], -1.0, 1.0),
        arr(&[b], vec![0i32, 4, -3, 2]),
        arr(&[b], vec![1i64, 0, 2, 9]),
        rng.array(F64, &[b, 2, 2], 2.0, 3.0),
    ];
    check_pairs(&g, &ins, 4)
}

#[test]
fn vmap_batches_convolutions_over_inputs_and_kernels() -> Result<()> {
    use stablegraph::ops::{ConvOptions, Padding};
    let mut rng = Rng::new(95);
    let b = 3;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[b, 2, 4, 5, 4])?;
    let ks = g.parameter("ks", F64, &[b, 6, 2, 2, 3])?;
    let k = g.parameter("k", F64, &[6, 2, 2, 3])?;
    let opts = ConvOptions {
        strides: vec![2, 1],
        padding: Padding::Explicit(vec![(1, 0), (-1, 2)]),
        rhs_dilation: vec![1, 2],
        feature_group_count: 2,
        ..ConvOptions::default()
    };
    // A batched input with a shared kernel, a batched kernel, and both batched; and the
    // per-example gradient of a loss through the convolution.
    let per = |x: &Tensor, kk: &Tensor| -> Result<Vec<Tensor>> {
        let loss = x.conv_general_dilated(kk, &opts)?.sin()?.sum_all()?;
        Ok(vec![
            x.conv_general_dilated(&k, &opts)?,
            x.conv_general_dilated(kk, &opts)?,
            loss.grad(&[kk])?.remove(0),
        ])
    };
    let batched = g.vmap(&[&xs, &ks], &[Some(0), Some(0)], &[], |a| per(&a[0], &a[1]))?;
    let shared_x = g.vmap(&[&xs, &ks], &[None, Some(0)], &[], |a| {
        Ok(vec![example(&a[0], 1)?.conv_general_dilated(&a[1], &opts)?])
    })?;
    let each = (0..b)
        .map(|e| {
            let x = example(&xs, e)?;
            let mut r = per(&x, &example(&ks, e)?)?;
            r.push(example(&xs, 1)?.conv_general_dilated(&example(&ks, e)?, &opts)?);
            Ok(r)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut outs = batched.clone();
    outs.extend(shared_x);
    outs.extend(stacked(&each)?);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        rng.array(F64, &[b, 2, 4, 5, 4], -1.0, 1.0),
        rng.array(F64, &[b, 6, 2, 2, 3], -1.0, 1.0),
        rng.array(F64, &[6, 2, 2, 3], -1.0, 1.0),
    ];
    check_pairs(&g, &ins, 4)
}

/// `per_example` of `tests/fixtures/jax/make_fixtures.py`: x `[3, 4]`, w `[4, 5]`, idx `[2]`,
/// k (a switch index) and limit (rank 0).
fn jax_per_example(
    x: &Tensor,
    w: &Tensor,
    idx: &Tensor,
    k: &Tensor,
    limit: &Tensor,
) -> Result<Vec<Tensor>> {
    let g = x.graph();
    let h = x.matmul(w)?.softmax(-1)?;
    let t = h.t()?.slice(0, 1, 5, 2)?;
    let joined = Tensor::concat(&[&t, &t.flip(&[1])?], 0)?;
    let padded = joined.pad(&[1, 0], &[0, 2], &[0, 1], 0.5)?;
    let scanned = padded.cumsum(1)?.sort(1, SortOrder::Descending)?;
    let picked = w.take(idx)?;
    let gated = x.gt(0.0)?.select(&x.mul(2.0)?, &x.clamp(-0.5, 0.5)?)?;
    let at = |i: usize| idx.narrow(0, i, 1)?.reshape(&[]);
    let window = gated.dynamic_slice(&[&at(0)?, &at(1)?], &[2, 2])?;
    let best = h.argmax(-1)?.astype(F64)?;
    let branches: [stablegraph::ops::Branch<'_, Tensor, Tensor>; 3] =
        [&|v| v.neg(), &|v| v.mul(2.0), &|v| v.tanh()];
    let sw = g.switch(k, &x.sum(&[0])?, &branches)?;
    let start = x
        .narrow(0, 0, 1)?
        .narrow(1, 0, 1)?
        .reshape(&[])?
        .abs()?
        .add(0.05)?;
    let (last, trips) = g.while_loop(
        &(start, g.scalar(0.0, I32)?),
        |(c, _)| c.lt(limit),
        |(c, n)| Ok((c.mul(1.5)?.add(0.25)?, n.add(1)?)),
    )?;
    Ok(vec![
        scanned,
        picked,
        window,
        best,
        sw,
        last,
        trips.astype(F64)?,
    ])
}

#[test]
fn vmap_matches_jax_over_most_primitive_families() -> Result<()> {
    let f = super::assoc_scan::jax_fixture("vmap");
    let vals = |k: &str| super::assoc_scan::values(&f, k);
    let ints = |k: &str| vals(k).iter().map(|&v| v as i32).collect::<Vec<_>>();
    let b = 4;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[3, b, 4])?;
    let w = g.parameter("w", F64, &[4, 5])?;
    let idx = g.parameter("idx", I32, &[b, 2])?;
    let ks = g.parameter("ks", I32, &[b])?;
    let limits = g.parameter("limits", F64, &[b])?;
    let ys = g.parameter("ys", I32, &[b])?;
    let mut outs = g.vmap(
        &[&xs, &w, &idx, &ks, &limits],
        &[Some(1), None, Some(0), Some(0), Some(0)],
        &[0, 1, 0, 0, 0, 0, 0],
        |a| jax_per_example(&a[0], &a[1], &a[2], &a[3], &a[4]),
    )?;
    // Per-example gradients of a cross-entropy with respect to the shared w.
    outs.extend(g.vmap(&[&xs, &ys], &[Some(1), Some(0)], &[], |a| {
        let logits = a[0].matmul(&w)?.tanh()?.sum(&[0])?.reshape(&[1, 5])?;
        logits
            .cross_entropy(&a[1].reshape(&[1])?, None)?
            .grad(&[&w])
    })?);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        HostArray::from_vec(&[3, b, 4], vals("xs"))?,
        HostArray::from_vec(&[4, 5], vals("w"))?,
        HostArray::from_vec(&[b, 2], ints("idx"))?,
        HostArray::from_vec(&[b], ints("ks"))?,
        HostArray::from_vec(&[b], vals("limits"))?,
        HostArray::from_vec(&[b], ints("ys"))?,
    ];
    let keys = [
        "scanned", "picked", "window", "best", "switch", "final", "trips", "grads",
    ];
    for (side, out) in [
        ("interpreter", g.evaluate(&ins)?),
        ("device", g.compile(&client())?.run(&ins)?),
    ] {
        for (k, key) in keys.iter().enumerate() {
            let (got, want) = (out[k].to_f64_vec(), vals(key));
            assert_eq!(got.len(), want.len(), "{side}, {key}");
            for (a, e) in got.iter().zip(&want) {
                assert!(
                    (a - e).abs() <= 1e-12 * e.abs().max(1.0),
                    "{side}, {key}: {got:?} vs JAX {want:?}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn vmap_of_a_rematerialised_gradient_is_the_per_example_gradient() -> Result<()> {
    let mut rng = Rng::new(97);
    let b = 3;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[b, 4])?;
    let w = g.parameter("w", F64, &[4, 4])?;
    // A checkpointed block (recomputed behind an optimization barrier in the backward pass).
    let per = |x: &Tensor| -> Result<Vec<Tensor>> {
        let h = g.checkpoint(x, |x| x.reshape(&[1, 4])?.matmul(&w)?.tanh()?.reshape(&[4]))?;
        let loss = h.square()?.sum_all()?;
        Ok(vec![loss.grad(&[&w])?.remove(0)])
    };
    let batched = g.vmap(&[&xs], &[Some(0)], &[], |a| per(&a[0]))?;
    let each = (0..b)
        .map(|e| per(&example(&xs, e)?))
        .collect::<Result<Vec<_>>>()?;
    let mut outs = batched.clone();
    outs.extend(stacked(&each)?);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        rng.array(F64, &[b, 4], -1.0, 1.0),
        rng.array(F64, &[4, 4], -1.0, 1.0),
    ];
    check_pairs(&g, &ins, 1)
}

#[test]
fn an_unbatched_predicate_stays_a_conditional_under_vmap() -> Result<()> {
    let mut rng = Rng::new(99);
    let b = 3;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[b, 4])?;
    let flag = g.parameter("flag", Pred, &[])?;
    let w = g.parameter("w", F64, &[4])?;
    // One branch reads only the shared w (its result unbatched until the other's is).
    let per = |x: &Tensor| -> Result<Vec<Tensor>> {
        Ok(vec![g.cond(&flag, x, |x| x.mul(&w)?.exp(), |_| w.sin())?])
    };
    let batched = g.vmap(&[&xs], &[Some(0)], &[], |a| per(&a[0]))?;
    let each = (0..b)
        .map(|e| per(&example(&xs, e)?))
        .collect::<Result<Vec<_>>>()?;
    let mut outs = batched.clone();
    outs.extend(stacked(&each)?);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    // The batched function keeps one `case` (the per-example ones add three more), no select
    // of both branches.
    let text = g.to_stablehlo()?;
    assert_eq!(text.matches("stablehlo.case").count(), 4, "{text}");
    for f in [true, false] {
        let ins = [
            rng.array(F64, &[b, 4], -1.0, 1.0),
            HostArray::scalar(f),
            rng.array(F64, &[4], -1.0, 1.0),
        ];
        check_pairs(&g, &ins, 1)?;
    }
    Ok(())
}

#[test]
fn a_conditional_in_a_vmapped_loop_keeps_its_unbatched_results() -> Result<()> {
    let mut rng = Rng::new(101);
    let b = 3;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[b, 2])?;
    let flag = g.parameter("flag", Pred, &[])?;
    // The count s never meets the batch; h does. Both go through a conditional in the body.
    let per = |x: &Tensor| -> Result<Vec<Tensor>> {
        let init = (x.clone(), g.scalar(0.0, F64)?);
        let (h, s) = g.fori_loop(0, 3, &init, |_, state| {
            g.cond(
                &flag,
                state,
                |(h, s)| Ok((h.mul(2.0)?.sin()?, s.add(1.0)?)),
                |(h, s)| Ok((h.add(s)?, s.clone())),
            )
        })?;
        Ok(vec![h, s])
    };
    let batched = g.vmap(&[&xs], &[Some(0)], &[], |a| per(&a[0]))?;
    let each = (0..b)
        .map(|e| per(&example(&xs, e)?))
        .collect::<Result<Vec<_>>>()?;
    let mut outs = batched.clone();
    outs.extend(stacked(&each)?);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    for f in [true, false] {
        let ins = [rng.array(F64, &[b, 2], -1.0, 1.0), HostArray::scalar(f)];
        check_pairs(&g, &ins, 2)?;
    }
    Ok(())
}
