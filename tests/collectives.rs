//! `shard_map` and the collectives: the interpreter against formulas written here, the compiled
//! SPMD program on a 4-device CPU client against the interpreter, the lowering's text, and the
//! errors.

mod common;

use common::{client4, Rng};
use stablegraph::ops::{Graph, ReduceKind, Tensor};
use stablegraph::{DType, HostArray, Mesh, PartitionSpec, Result};

fn p(dims: &[Option<&str>]) -> PartitionSpec {
    PartitionSpec::new(dims.iter().copied())
}

fn mesh_x4() -> Mesh {
    Mesh::new(&[("x", 4)]).unwrap()
}

fn mesh_2x2() -> Mesh {
    Mesh::new(&[("x", 2), ("y", 2)]).unwrap()
}

/// A graph over `mesh` with one f32 parameter of shape `dims`, whose outputs `build` makes.
fn graph(
    mesh: &Mesh,
    dims: &[usize],
    build: impl FnOnce(&Graph, &Tensor) -> Result<Vec<Tensor>>,
) -> Graph {
    let g = Graph::new();
    g.set_mesh(mesh);
    let x = g.parameter("x", DType::F32, dims).unwrap();
    let outs = build(&g, &x).unwrap();
    let refs: Vec<&Tensor> = outs.iter().collect();
    g.set_outputs(&refs).unwrap();
    g
}

/// Seeded f32 input of shape `dims` (small integers, so that sums are exact).
fn input(seed: u64, dims: &[usize]) -> (HostArray, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.int(-8, 8) as f32).collect();
    (
        HostArray::from_vec(dims, v.clone()).unwrap(),
        v.iter().map(|&f| f as f64).collect(),
    )
}

/// The interpreter gives `want` (one flat vector per output, exactly), and the compiled
/// program on the 4-device client gives what the interpreter gives.
fn check(what: &str, g: &Graph, x: &HostArray, want: &[Vec<f64>]) {
    let got = g
        .evaluate(std::slice::from_ref(x))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (a, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(&a.to_f64_vec(), w, "{what}: interpreter output {k}");
    }
    let compiled = g
        .compile(&client4())
        .unwrap_or_else(|e| panic!("{what}: {e}\n{}", g.to_stablehlo().unwrap()));
    let run = compiled
        .run(std::slice::from_ref(x))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for (k, (a, b)) in run.iter().zip(&got).enumerate() {
        assert_eq!(a.ty(), b.ty(), "{what}: output {k}");
        assert_eq!(
            a.to_f64_vec(),
            b.to_f64_vec(),
            "{what}: compiled output {k}"
        );
    }
}

#[test]
fn all_reduce_over_one_and_both_axes() {
    let (x, v) = input(1, &[4, 4]);
    let at = |i: usize, j: usize| v[i * 4 + j];
    for (kind, fold) in [
        (
            ReduceKind::Sum,
            (|a: f64, b: f64| a + b) as fn(f64, f64) -> f64,
        ),
        (ReduceKind::Max, f64::max),
        (ReduceKind::Min, f64::min),
    ] {
        // 2x2 mesh, blocks [2, 2]; over "x": out[i, j] = fold over a of x[2a + i, j].
        let g = graph(&mesh_2x2(), &[4, 4], |g, x| {
            g.shard_map(
                &[x],
                &[p(&[Some("x"), Some("y")])],
                &[p(&[None, Some("y")])],
                |b| Ok(vec![b[0].all_reduce(&["x"], kind)?]),
            )
        });
        let want: Vec<f64> = (0..2)
            .flat_map(|i| (0..4).map(move |j| (i, j)))
            .map(|(i, j)| fold(at(i, j), at(2 + i, j)))
            .collect();
        check(&format!("{kind:?} over x"), &g, &x, &[want]);
        // Over both axes: out[i, j] = fold over a, b of x[2a + i, 2b + j].
        let g = graph(&mesh_2x2(), &[4, 4], |g, x| {
            g.shard_map(
                &[x],
                &[p(&[Some("x"), Some("y")])],
                &[PartitionSpec::replicated()],
                |b| Ok(vec![b[0].all_reduce(&["x", "y"], kind)?]),
            )
        });
        let want: Vec<f64> = (0..2)
            .flat_map(|i| (0..2).map(move |j| (i, j)))
            .map(|(i, j)| {
                let all = [at(i, j), at(i, j + 2), at(i + 2, j), at(i + 2, j + 2)];
                all[1..].iter().fold(all[0], |a, &b| fold(a, b))
            })
            .collect();
        check(&format!("{kind:?} over x and y"), &g, &x, &[want]);
    }
    // A 4-device axis: psum of row blocks.
    let g = graph(&mesh_x4(), &[4, 3], |g, x| {
        g.shard_map(
            &[x],
            &[p(&[Some("x")])],
            &[PartitionSpec::replicated()],
            |b| Ok(vec![b[0].psum(&["x"])?]),
        )
    });
    let (x, v) = input(2, &[4, 3]);
    let want: Vec<f64> = (0..3).map(|j| (0..4).map(|i| v[i * 3 + j]).sum()).collect();
    check("psum over x=4", &g, &x, &[want]);
}

#[test]
fn all_gather_tiled_and_stacked() {
    let (x, v) = input(3, &[8, 3]);
    // Gathering the row blocks gives the whole array on every device.
    let g = graph(&mesh_x4(), &[8, 3], |g, x| {
        g.shard_map(
            &[x],
            &[p(&[Some("x")])],
            &[PartitionSpec::replicated(), PartitionSpec::replicated()],
            |b| {
                Ok(vec![
                    b[0].all_gather("x", 0)?,
                    b[0].all_gather_stacked("x", 0)?,
                ])
            },
        )
    });
    check("all_gather over x=4", &g, &x, &[v.clone(), v.clone()]);
    // 2x2 mesh, blocks [4, 1] of [8, 2] split (x, y); gather over y along dim 1 gives rows.
    let (x, v) = input(4, &[8, 2]);
    let g = graph(&mesh_2x2(), &[8, 2], |g, x| {
        g.shard_map(
            &[x],
            &[p(&[Some("x"), Some("y")])],
            &[p(&[Some("x")]), p(&[None, Some("x")])],
            |b| {
                Ok(vec![
                    b[0].all_gather("y", 1)?,
                    b[0].all_gather_stacked("y", 2)?,
                ])
            },
        )
    });
    // Stacked along a new last dim of size 2 per device, blocks [4, 1, 2], out (None, x):
    // out[i, a, b] = x[4a + i, b].
    let stacked: Vec<f64> = (0..4)
        .flat_map(|i| (0..2).flat_map(move |a| (0..2).map(move |b| (i, a, b))))
        .map(|(i, a, b)| v[(4 * a + i) * 2 + b])
        .collect();
    check("all_gather over y", &g, &x, &[v.clone(), stacked]);
}

#[test]
fn reduce_scatter_sums_and_splits() {
    let (x, v) = input(5, &[4, 8]);
    // Device i holds row i; after the scatter it holds columns 2i..2i+2 of the column sums.
    let g = graph(&mesh_x4(), &[4, 8], |g, x| {
        g.shard_map(&[x], &[p(&[Some("x")])], &[p(&[Some("x")])], |b| {
            Ok(vec![b[0].reduce_scatter("x", 1)?])
        })
    });
    let want: Vec<f64> = (0..4)
        .flat_map(|i| (0..2).map(move |j| (i, j)))
        .map(|(i, j)| (0..4).map(|k| v[k * 8 + 2 * i + j]).sum())
        .collect();
    check("reduce_scatter over x=4", &g, &x, &[want]);
    // 2x2: blocks [2, 4] of [4, 4] split (x, None); scatter over y along dim 1 → [2, 2] per
    // device, out (x, y): out[2a + i, 2b + j] = sum over y of the block = 2 * x[2a + i, 2b + j].
    let (x, v) = input(6, &[4, 4]);
    let g = graph(&mesh_2x2(), &[4, 4], |g, x| {
        g.shard_map(
            &[x],
            &[p(&[Some("x")])],
            &[p(&[Some("x"), Some("y")])],
            |b| Ok(vec![b[0].reduce_scatter("y", 1)?]),
        )
    });
    let want: Vec<f64> = v.iter().map(|a| 2.0 * a).collect();
    check("reduce_scatter over y", &g, &x, &[want]);
}

#[test]
fn all_to_all_reshards_rows_to_columns() {
    let (x, v) = input(7, &[4, 8]);
    let g = graph(&mesh_x4(), &[4, 8], |g, x| {
        g.shard_map(
            &[x],
            &[p(&[Some("x")])],
            &[p(&[None, Some("x")]), p(&[Some("x")])],
            |b| {
                let t = b[0].all_to_all("x", 1, 0)?;
                Ok(vec![t.clone(), t])
            },
        )
    });
    // Device i gets part i of every row: out (None, x) is x itself; out (x) stacks the
    // devices' [4, 2] blocks: out[4i + k, j] = x[k, 2i + j].
    let stacked: Vec<f64> = (0..4)
        .flat_map(|i| (0..4).flat_map(move |k| (0..2).map(move |j| (i, k, j))))
        .map(|(i, k, j)| v[k * 8 + 2 * i + j])
        .collect();
    check("all_to_all over x=4", &g, &x, &[v.clone(), stacked]);
    // 2x2: over y, blocks [2, 4] of [4, 4] split (x); split dim 1, concat dim 0 → [4, 2].
    let (x, v) = input(8, &[4, 4]);
    let g = graph(&mesh_2x2(), &[4, 4], |g, x| {
        g.shard_map(
            &[x],
            &[p(&[Some("x")])],
            &[p(&[Some("x"), Some("y")])],
            |b| Ok(vec![b[0].all_to_all("y", 1, 0)?]),
        )
    });
    // Device (a, c) gets part c (columns 2c..2c+2) of its row block from both y devices, which
    // hold the same block: out block = rows 2a..2a+2 of x, columns 2c.., twice.
    let want: Vec<f64> = (0..2)
        .flat_map(|a| (0..4).flat_map(move |r| (0..4).map(move |col| (a, r, col))))
        .map(|(a, r, col)| v[(2 * a + r % 2) * 4 + col])
        .collect();
    check("all_to_all over y", &g, &x, &[want]);
}

#[test]
fn axis_index_counts_mesh_coordinates() {
    let g = graph(&mesh_2x2(), &[4], |g, x| {
        g.shard_map(
            &[x],
            &[PartitionSpec::replicated()],
            &[p(&[Some("x"), Some("y")]), p(&[Some("y")])],
            |_| {
                let ix = g.axis_index("x")?;
                let iy = g.axis_index("y")?;
                let both = ix.mul(2)?.add(&iy)?.convert(DType::F32)?.reshape(&[1, 1])?;
                Ok(vec![both, iy.convert(DType::F32)?.reshape(&[1])?])
            },
        )
    });
    let (x, _) = input(9, &[4]);
    check(
        "axis_index",
        &g,
        &x,
        &[vec![0.0, 1.0, 2.0, 3.0], vec![0.0, 1.0]],
    );
}

#[test]
fn captured_values_and_loops_inside_the_body() {
    // The body uses an outer value (captured, replicated) and runs a psum in a loop.
    let (x, v) = input(10, &[4, 2]);
    let g = graph(&mesh_x4(), &[4, 2], |g, x| {
        let scale = x.mul(0.0)?.add(1.0)?; // ones, outside the body
        g.shard_map(&[x], &[p(&[Some("x")])], &[p(&[Some("x")])], |b| {
            let y = g.fori_loop(0, 2, &b[0], |_, y| y.psum(&["x"]))?;
            Ok(vec![y.mul(&scale.slice(0, 0, 1, 1)?)?])
        })
    });
    // Twice psum: every row becomes 4 * (column sum).
    let want: Vec<f64> = (0..4)
        .flat_map(|_| (0..2).map(|j| 4.0 * (0..4).map(|k| v[k * 2 + j]).sum::<f64>()))
        .collect();
    check("psum in a loop with a capture", &g, &x, &[want]);
}

#[test]
fn lowering_writes_a_manual_computation() {
    let g = graph(&mesh_2x2(), &[4, 4], |g, x| {
        g.shard_map(
            &[x],
            &[p(&[Some("x"), Some("y")])],
            &[p(&[None, Some("y")])],
            |b| {
                Ok(vec![b[0]
                    .psum(&["x"])?
                    .all_gather("y", 1)?
                    .slice(1, 0, 2, 1)?])
            },
        )
    });
    let text = g.to_stablehlo().unwrap();
    for needle in [
        "sdy.manual_computation(%p0_x) in_shardings=[<@mesh, [{\"x\"}, {\"y\"}]>] \
         out_shardings=[<@mesh, [{}, {\"y\"}]>] manual_axes={\"x\", \"y\"}",
        "\"stablehlo.all_reduce\"",
        "replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>",
        "replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>",
        "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>",
        "channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>",
        "use_global_device_ids",
        "sdy.return",
    ] {
        assert!(text.contains(needle), "{needle} not in\n{text}");
    }
}

fn err_of<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn errors_name_the_op_and_the_problem() {
    // A collective outside a shard_map body.
    let g = Graph::new();
    g.set_mesh(&mesh_x4());
    let x = g.parameter("x", DType::F32, &[4]).unwrap();
    let m = err_of(x.psum(&["x"]));
    assert!(
        m.contains("all_reduce") && m.contains("shard_map body"),
        "{m}"
    );
    let m = err_of(x.all_to_all("x", 0, 0));
    assert!(
        m.contains("all_to_all") && m.contains("shard_map body"),
        "{m}"
    );
    let m = err_of(g.axis_index("x"));
    assert!(
        m.contains("axis_index") && m.contains("shard_map body"),
        "{m}"
    );
    // Unknown axis, non-dividing dimension, pred reduction.
    let r = g.shard_map(&[&x], &[p(&[Some("x")])], &[p(&[Some("x")])], |b| {
        Ok(vec![b[0].psum(&["z"])?])
    });
    let m = err_of(r);
    assert!(m.contains("all_reduce") && m.contains("\"z\""), "{m}");
    let r = g.shard_map(&[&x], &[PartitionSpec::replicated()], &[p(&[])], |b| {
        Ok(vec![b[0].reshape(&[2, 2])?.reduce_scatter("x", 0)?])
    });
    let m = err_of(r);
    assert!(
        m.contains("reduce_scatter") && m.contains("do not divide"),
        "{m}"
    );
    let r = g.shard_map(&[&x], &[p(&[Some("x")])], &[p(&[Some("x")])], |b| {
        Ok(vec![b[0].gt(0.0)?.psum(&["x"])?])
    });
    let m = err_of(r);
    assert!(m.contains("all_reduce") && m.contains("pred"), "{m}");
    // A spec that does not divide the input, and one naming an unknown axis.
    let y = g.parameter("y", DType::F32, &[3]).unwrap();
    let m = err_of(g.shard_map(&[&y], &[p(&[Some("x")])], &[p(&[])], |b| Ok(b.to_vec())));
    assert!(
        m.contains("shard_map") && m.contains("do not divide"),
        "{m}"
    );
    let m = err_of(g.shard_map(&[&x], &[p(&[Some("q")])], &[p(&[])], |b| Ok(b.to_vec())));
    assert!(m.contains("shard_map") && m.contains("\"q\""), "{m}");
    // No mesh.
    let h = Graph::new();
    let z = h.parameter("z", DType::F32, &[4]).unwrap();
    let m = err_of(h.shard_map(&[&z], &[p(&[])], &[p(&[])], |b| Ok(b.to_vec())));
    assert!(m.contains("shard_map") && m.contains("no mesh"), "{m}");
}

#[test]
fn devices_that_diverge_get_an_error_not_a_hang() {
    // Device i runs the loop i + 1 times: the devices stop meeting at the psum.
    let g = graph(&mesh_x4(), &[4], |g, x| {
        g.shard_map(&[x], &[p(&[Some("x")])], &[p(&[Some("x")])], |b| {
            let n = g.axis_index("x")?.add(1)?;
            Ok(vec![g.fori_loop(0, &n, &b[0], |_, y| y.psum(&["x"]))?])
        })
    });
    let (x, _) = input(11, &[4]);
    let m = err_of(g.evaluate(std::slice::from_ref(&x)));
    assert!(
        m.contains("all_reduce") && m.contains("without reaching"),
        "{m}"
    );
    // Device 0 waits at a psum in one loop while the others wait at a pmax in another.
    let g = graph(&mesh_x4(), &[4], |g, x| {
        g.shard_map(&[x], &[p(&[Some("x")])], &[p(&[Some("x")])], |b| {
            let n = g.axis_index("x")?.clamp(0, 1)?.add(1)?;
            let y = g.fori_loop(0, &n, &b[0], |_, y| y.psum(&["x"]))?;
            let m = g.axis_index("x")?.clamp(0, 1)?.neg()?.add(2)?;
            let z = g.fori_loop(0, &m, &y, |_, y| y.all_reduce(&["x"], ReduceKind::Max))?;
            Ok(vec![z])
        })
    });
    let m = err_of(g.evaluate(&[x]));
    assert!(
        m.contains("all_reduce") && m.contains("different collectives"),
        "{m}"
    );
}

#[test]
fn integer_reductions_and_a_shard_map_without_inputs() {
    let g = Graph::new();
    g.set_mesh(&mesh_2x2());
    let x = g.parameter("x", DType::I32, &[4, 2]).unwrap();
    let outs = g
        .shard_map(
            &[&x],
            &[p(&[Some("x"), Some("y")])],
            &[PartitionSpec::replicated(), PartitionSpec::replicated()],
            |b| {
                Ok(vec![
                    b[0].psum(&["x", "y"])?,
                    b[0].all_reduce(&["y", "x"], ReduceKind::Max)?,
                ])
            },
        )
        .unwrap();
    let ids = g
        .shard_map(&[], &[], &[p(&[Some("y"), Some("x")])], |_| {
            let i = g.axis_index("x")?.mul(10)?.add(&g.axis_index("y")?)?;
            i.reshape(&[1, 1]).map(|t| vec![t])
        })
        .unwrap();
    g.set_outputs(&[&outs[0], &outs[1], &ids[0]]).unwrap();
    let mut rng = Rng::new(12);
    let v: Vec<i32> = (0..8).map(|_| rng.int(-100, 100) as i32).collect();
    let x = HostArray::from_vec(&[4, 2], v.clone()).unwrap();
    let got = g.evaluate(std::slice::from_ref(&x)).unwrap();
    // Blocks [2, 1]: out[i, 0] = fold over a, b of x[2a + i, b].
    let block = |i: usize| [v[i * 2], v[i * 2 + 1], v[(2 + i) * 2], v[(2 + i) * 2 + 1]];
    let sums: Vec<i32> = (0..2).map(|i| block(i).iter().sum()).collect();
    let maxes: Vec<i32> = (0..2).map(|i| *block(i).iter().max().unwrap()).collect();
    assert_eq!(got[0], HostArray::from_vec(&[2, 1], sums).unwrap());
    assert_eq!(got[1], HostArray::from_vec(&[2, 1], maxes).unwrap());
    // Out (y, x): out[b, a] = 10a + b.
    assert_eq!(
        got[2],
        HostArray::from_vec(&[2, 2], vec![0, 10, 1, 11]).unwrap()
    );
    let run = g.compile(&client4()).unwrap().run(&[x]).unwrap();
    assert_eq!(run, got);
}

#[test]
fn shard_map_between_sharded_parameters_and_ordinary_ops() {
    let g = Graph::new();
    g.set_mesh(&mesh_x4());
    let x = g.parameter("x", DType::F32, &[8, 2]).unwrap();
    g.shard_parameter(&x, &p(&[Some("x")])).unwrap();
    let y = x.exp().unwrap().mul(0.0).unwrap().add(&x).unwrap();
    let s = g
        .shard_map(&[&y], &[p(&[Some("x")])], &[p(&[Some("x")])], |b| {
            Ok(vec![b[0].psum(&["x"])?])
        })
        .unwrap();
    let out = s[0].mul(2.0).unwrap();
    g.set_outputs(&[&out]).unwrap();
    g.set_output_shardings(&[p(&[Some("x")])]).unwrap();
    let (x, v) = input(13, &[8, 2]);
    // Every row block becomes the sum of the four row blocks, doubled.
    let want: Vec<f64> = (0..8)
        .flat_map(|i| (0..2).map(move |j| (i % 2, j)))
        .map(|(i, j)| 2.0 * (0..4).map(|k| v[(2 * k + i) * 2 + j]).sum::<f64>())
        .collect();
    check("sharded parameter into shard_map", &g, &x, &[want]);
}
