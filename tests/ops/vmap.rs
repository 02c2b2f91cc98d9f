//! `vmap` against the same function applied to each example in turn and the results stacked (in
//! the same graph, compiled and interpreted): a function touching most primitive families, with
//! unbatched and captured operands, `in_axes` other than 0 and `out_axes`; per-example
//! gradients (`vmap` of `grad`); conditionals with batched and unbatched predicates; gathers
//! and scatter-adds on batched tables (and the per-example gradient of an embedding lookup);
//! `vmap` of `vmap`; the errors.

use super::*;

/// A per-example function over `x` `[3, 4]` and `w` `[4, 5]`, `idx` `[2]` (integers): most
/// primitive families (dot_general, softmax's reductions, transpose, slices, concatenation,
/// pad, reverse, cumsum, sort, argmax, select, clamp, a take at the example's indices, a
/// dynamic slice at a fixed position), and a captured constant.
fn per_example(x: &Tensor, w: &Tensor, idx: &Tensor, c: &Tensor) -> Result<Vec<Tensor>> {
    let h = x.matmul(w)?.softmax(-1)?; // [3, 5]
    let t = h.t()?.slice(0, 1, 5, 2)?; // [2, 3]
    let joined = Tensor::concat(&[&t, &t.flip(&[1])?], 0)?; // [4, 3]
    let padded = joined.pad(&[1, 0], &[0, 2], &[0, 1], 0.5)?; // [5, 7]
    let scanned = padded.cumsum(1)?.sort(1, SortOrder::Descending)?;
    let picked = w.take(idx)?; // [2, 5]
    let gated = x.gt(0.0)?.select(&x.mul(c)?, &x.clamp(-0.5, 0.5)?)?;
    let window = gated.dynamic_slice(
        &[&x.graph().scalar(1.0, I64)?, &x.graph().scalar(2.0, I64)?],
        &[2, 2],
    )?;
    let best = h.argmax(-1)?.astype(F64)?;
    Ok(vec![scanned, picked, window, best, h.sum(&[0])?])
}

#[test]
fn vmap_equals_the_function_on_each_example() -> Result<()> {
    let mut rng = Rng::new(81);
    let b = 4;
    let g = Graph::new();
    // x batched along its axis 1, idx along 0; w unbatched; c captured.
    let xs = g.parameter("xs", F64, &[3, b, 4])?;
    let w = g.parameter("w", F64, &[4, 5])?;
    let idx = g.parameter("idx", I32, &[b, 2])?;
    let c = g.parameter("c", F64, &[3, 4])?;
    let out_axes = [0, 1, 0, 0, 0];
    let batched = g.vmap(
        &[&xs, &w, &idx],
        &[Some(1), None, Some(0)],
        &out_axes,
        |a| per_example(&a[0], &a[1], &a[2], &c),
    )?;
    // The same, one example at a time, stacked along each result's out axis.
    let mut each: Vec<Vec<Tensor>> = Vec::new();
    for e in 0..b {
        let x = xs.narrow(1, e, 1)?.reshape(&[3, 4])?;
        let i = idx.narrow(0, e, 1)?.reshape(&[2])?;
        each.push(per_example(&x, &w, &i, &c)?);
    }
    let mut outs = batched.clone();
    for (k, &axis) in out_axes.iter().enumerate() {
        let parts: Vec<Tensor> = each
            .iter()
            .map(|r| r[k].expand_dims(axis as isize))
            .collect::<Result<_>>()?;
        outs.push(Tensor::concat(
            &parts.iter().collect::<Vec<_>>(),
            axis as isize,
        )?);
    }
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        rng.array(F64, &[3, b, 4], -1.0, 1.0),
        rng.array(F64, &[4, 5], -1.0, 1.0),
        arr(&[b, 2], vec![0i32, 3, 2, 2, 1, 0, 3, 1]),
        rng.array(F64, &[3, 4], -1.0, 1.0),
    ];
    let host = g.evaluate(&ins)?;
    let dev = g.compile(&client())?.run(&ins)?;
    let n = out_axes.len();
    for out in [&host, &dev] {
        for k in 0..n {
            assert_eq!(out[k].dims(), out[n + k].dims(), "result {k}");
            for (a, e) in out[k].to_f64_vec().iter().zip(out[n + k].to_f64_vec()) {
                assert!((a - e).abs() <= 1e-12, "result {k}: {a} vs {e}");
            }
        }
    }
    Ok(())
}

#[test]
fn vmap_of_grad_gives_per_example_gradients() -> Result<()> {
    let mut rng = Rng::new(83);
    let b = 5;
    let g = Graph::new();
    let w1 = g.parameter("w1", F64, &[3, 8])?;
    let w2 = g.parameter("w2", F64, &[8, 2])?;
    let xs = g.parameter("xs", F64, &[b, 3])?;
    let ys = g.parameter("ys", I32, &[b])?;
    let loss = |x: &Tensor, y: &Tensor| -> Result<Tensor> {
        let h = x.reshape(&[1, 3])?.matmul(&w1)?.tanh()?.matmul(&w2)?;
        h.cross_entropy(&y.reshape(&[1])?, None)
    };
    let per = g.vmap(&[&xs, &ys], &[Some(0), Some(0)], &[], |a| {
        loss(&a[0], &a[1])?.grad(&[&w1, &w2])
    })?;
    let mut outs = per.clone();
    for e in 0..b {
        let x = xs.narrow(0, e, 1)?.reshape(&[3])?;
        let y = ys.narrow(0, e, 1)?.reshape(&[])?;
        outs.extend(loss(&x, &y)?.grad(&[&w1, &w2])?);
    }
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        rng.array(F64, &[3, 8], -1.0, 1.0),
        rng.array(F64, &[8, 2], -1.0, 1.0),
        rng.array(F64, &[b, 3], -1.0, 1.0),
        arr(&[b], vec![0i32, 1, 1, 0, 1]),
    ];
    let dev = g.compile(&client())?.run(&ins)?;
    assert_eq!(dev[0].dims(), &[b, 3, 8]);
    assert_eq!(dev[1].dims(), &[b, 8, 2]);
    for (k, sizes) in [(0usize, 24usize), (1, 16)] {
        let stacked = dev[k].to_f64_vec();
        for e in 0..b {
            let one = dev[2 + 2 * e + k].to_f64_vec();
            for (a, w) in stacked[e * sizes..(e + 1) * sizes].iter().zip(&one) {
                assert!(
                    (a - w).abs() <= 1e-12,
                    "example {e}, gradient {k}: {a} vs {w}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn vmap_nests() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F64, &[2, 3, 4])?;
    // For each of 2 x 3 pairs, the 4 values' sum of squares.
    let out = g.vmap(&[&x], &[Some(0)], &[], |a| {
        g.vmap(&[&a[0]], &[Some(0)], &[], |b| {
            Ok(vec![b[0].square()?.sum_all()?])
        })
    })?;
    let want = x.square()?.sum(&[2])?;
    g.set_outputs(&[&out[0], &want])?;
    let xs = Rng::new(85).array(F64, &[2, 3, 4], -1.0, 1.0);
    let r = g.evaluate(&[xs])?;
    assert_eq!(r[0].dims(), &[2, 3]);
    for (a, b) in r[0].to_f64_vec().iter().zip(r[1].to_f64_vec()) {
        assert!((a - b).abs() <= 1e-12);
    }
    Ok(())
}

#[test]
fn vmap_names_what_it_cannot_batch() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[4, 3])?;
    let i = g.parameter("i", I32, &[4])?;
    let msg = |r: Result<Vec<Tensor>>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = msg(g.vmap(&[&x], &[None], &[], |a| Ok(vec![a[0].clone()])));
    assert!(e.contains("no input is batched"), "{e}");
    let y = g.parameter("y", F32, &[5, 3])?;
    let e = msg(g.vmap(&[&x, &y], &[Some(0), Some(0)], &[], |a| {
        Ok(vec![a[0].add(&a[1])?])
    }));
    assert!(
        e.contains("input 1 has a batch of 5, an earlier one 4"),
        "{e}"
    );
    let flags = g.parameter("flags", Pred, &[4, 3])?;
    let e = msg(g.vmap(&[&flags, &i], &[Some(0), Some(0)], &[], |a| {
        let one = g.full(1.0, Pred, &[1])?;
        Ok(vec![a[0].dynamic_update_slice(&one, &[&a[1]])?])
    }));
    assert!(
        e.contains("dynamic_update_slice of booleans at batched positions has no rule yet"),
        "{e}"
    );
    let values = g.parameter("values", F32, &[4])?;
    let e = msg(g.vmap(&[&x, &values], &[Some(0), Some(0)], &[], |a| {
        Ok(vec![a[0].pad(&[1], &[1], &[0], &a[1])?])
    }));
    assert!(
        e.contains("pad with a batched padding value has no batching rule yet"),
        "{e}"
    );
    // A shard_map is refused even when nothing it reads carries the batch.
    let sharded = Graph::new();
    sharded.set_mesh(&stablegraph::Mesh::new(&[("d", 1)])?);
    let xs = sharded.parameter("xs", F32, &[4, 3])?;
    let w = sharded.parameter("w", F32, &[3])?;
    let spec = [stablegraph::PartitionSpec::new([None])];
    let e = msg(sharded.vmap(&[&xs, &w], &[Some(0), None], &[], |a| {
        let y = sharded.shard_map(&[&a[1]], &spec, &spec, |b| Ok(vec![b[0].neg()?]))?;
        Ok(vec![a[0].add(&y[0])?])
    }));
    assert!(
        e.contains("shard_map inside vmap is not supported yet"),
        "{e}"
    );
    Ok(())
}

#[test]
fn vmap_gathers_from_and_scatters_into_batched_tables() -> Result<()> {
    let mut rng = Rng::new(87);
    let b = 3;
    let g = Graph::new();
    let tables = g.parameter("tables", F64, &[b, 5, 2])?;
    let idx = g.parameter("idx", I32, &[b, 4])?;
    let shared = g.parameter("shared", I32, &[4])?;
    let updates = g.parameter("updates", F64, &[b, 4, 2])?;
    let emb = g.parameter("emb", F64, &[5, 2])?;
    // Distinct rows for index_set (of repeated ones the kept update is unspecified).
    let distinct = g.parameter("distinct", I32, &[b, 4])?;
    let per = |t: &Tensor, i: &Tensor, u: &Tensor, d: &Tensor| -> Result<Vec<Tensor>> {
        // Out-of-range indices clamp per example; repeated ones add up.
        let loss = emb.take(i)?.mul(u)?.sin()?.sum_all()?;
        Ok(vec![
            t.take(i)?,
            t.take(&shared)?,
            t.index_add(i, u)?,
            t.index_set(d, u)?,
            loss.grad(&[&emb])?.remove(0),
        ])
    };
    let batched = g.vmap(
        &[&tables, &idx, &updates, &distinct],
        &[Some(0), Some(0), Some(0), Some(0)],
        &[],
        |a| per(&a[0], &a[1], &a[2], &a[3]),
    )?;
    let mut outs = batched.clone();
    let mut each: Vec<Vec<Tensor>> = Vec::new();
    for e in 0..b {
        let t = tables.narrow(0, e, 1)?.reshape(&[5, 2])?;
        let i = idx.narrow(0, e, 1)?.reshape(&[4])?;
        let u = updates.narrow(0, e, 1)?.reshape(&[4, 2])?;
        let d = distinct.narrow(0, e, 1)?.reshape(&[4])?;
        each.push(per(&t, &i, &u, &d)?);
    }
    for k in 0..5 {
        let parts: Vec<Tensor> = each
            .iter()
            .map(|r| r[k].expand_dims(0))
            .collect::<Result<_>>()?;
        outs.push(Tensor::concat(&parts.iter().collect::<Vec<_>>(), 0)?);
    }
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    let ins = [
        rng.array(F64, &[b, 5, 2], -1.0, 1.0),
        arr(&[b, 4], vec![0i32, 4, 4, 9, -2, 1, 1, 3, 2, 2, 2, 0]),
        arr(&[4], vec![3i32, 0, 7, 1]),
        rng.array(F64, &[b, 4, 2], -1.0, 1.0),
        rng.array(F64, &[5, 2], -1.0, 1.0),
        arr(&[b, 4], vec![4i32, 0, 2, 1, 1, 3, 0, 2, 2, 4, 3, 0]),
    ];
    for out in [g.evaluate(&ins)?, g.compile(&client())?.run(&ins)?] {
        for k in 0..5 {
            assert_eq!(out[k].dims(), out[5 + k].dims(), "result {k}");
            for (a, e) in out[k].to_f64_vec().iter().zip(out[5 + k].to_f64_vec()) {
                assert!((a - e).abs() <= 1e-12, "result {k}: {a} vs {e}");
            }
        }
    }
    Ok(())
}

#[test]
fn vmap_over_conditionals_picks_each_examples_branch() -> Result<()> {
    let mut rng = Rng::new(89);
    let b = 6;
    let g = Graph::new();
    let xs = g.parameter("xs", F64, &[b, 3])?;
    let ks = g.parameter("ks", I32, &[b])?;
    let w = g.parameter("w", F64, &[3])?;
    let flag = g.parameter("flag", DType::Pred, &[])?;
    let per = |x: &Tensor, k: &Tensor| -> Result<Vec<Tensor>> {
        // A batched predicate, a batched switch index, an unbatched predicate, and the
        // gradient through a conditional (its VJP is one too).
        let big = x.sum_all()?.gt(0.0)?;
        let c = g.cond(&big, x, |x| x.mul(&w)?.exp(), |x| x.sin())?;
        let branches: [stablegraph::ops::Branch<'_, Tensor, Tensor>; 3] =
            [&|x| x.neg(), &|x| x.mul(2.0), &|x| x.tanh()];
        let s = g.switch(k, x, &branches)?;
        let u = g.cond(&flag, x, |x| x.add(1.0), |x| x.sub(&w))?;
        let loss = g.cond(
            &big,
            x,
            |x| x.mul(&w)?.sum_all()?.square(),
            |x| x.cos()?.sum_all(),
        )?;
        Ok(vec![c, s, u, loss.grad(&[&w])?.remove(0)])
    };
    let batched = g.vmap(&[&xs, &ks], &[Some(0), Some(0)], &[], |a| per(&a[0], &a[1]))?;
    let mut outs = batched.clone();
    let mut each = Vec::new();
    for e in 0..b {
        let x = xs.narrow(0, e, 1)?.reshape(&[3])?;
        let k = ks.narrow(0, e, 1)?.reshape(&[])?;
        each.push(per(&x, &k)?);
    }
    for k in 0..4 {
        let parts: Vec<Tensor> = each
            .iter()
            .map(|r: &Vec<Tensor>| r[k].expand_dims(0))
            .collect::<Result<_>>()?;
        outs.push(Tensor::concat(&parts.iter().collect::<Vec<_>>(), 0)?);
    }
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    for flag_value in [true, false] {
        let ins = [
            rng.array(F64, &[b, 3], -1.0, 1.0),
            arr(&[b], vec![0i32, 1, 2, 5, -1, 1]),
            rng.array(F64, &[3], -1.0, 1.0),
            HostArray::scalar(flag_value),
        ];
        for out in [g.evaluate(&ins)?, g.compile(&client())?.run(&ins)?] {
            for k in 0..4 {
                for (a, e) in out[k].to_f64_vec().iter().zip(out[4 + k].to_f64_vec()) {
                    assert!(
                        (a - e).abs() <= 1e-12,
                        "result {k}, flag {flag_value}: {a} vs {e}"
                    );
                }
            }
        }
    }
    Ok(())
}
