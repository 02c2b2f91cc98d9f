//! Sharding end to end: hand-written programs over meshes of a four-device CPU client, checked
//! against the interpreter and against the same graph on one device; layouts, donation, errors
//! and cache keys. (The `sharded_graph` fuzz target runs in `tests/fuzz_props.rs`.)

mod common;

use common::{assert_matches, tol, uncached_client4 as client};
use stablegraph::ops::Graph;
use stablegraph::runtime::{Client, CompileCache, ShardedBuffer};
use stablegraph::{CompiledGraph, DType, HostArray, Mesh, PartitionSpec, Sharding};

// ---- helpers ----------------------------------------------------------------------------------

/// The 2x2 mesh `[("data", 2), ("model", 2)]` over devices 0..4.
fn mesh22() -> Mesh {
    Mesh::new(&[("data", 2), ("model", 2)]).unwrap()
}

/// An f32 array of shape `dims` with small distinct values (varied by `seed`).
fn f32_array(dims: &[usize], seed: usize) -> HostArray {
    let n: usize = dims.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + seed * 3) % 17) as f32 / 4.0 - 2.0)
        .collect();
    HostArray::from_vec(dims, data).unwrap()
}

/// Compiles `build(true)` (the sharded graph) and `build(false)` (the same graph without a
/// mesh) and checks, on `inputs`: the sharded program's gathered outputs against the
/// interpreter and against the one-device program, and each device's block of every output
/// against that block of the interpreter's output.
fn check_sharded(build: impl Fn(bool) -> Graph, inputs: &[HostArray]) {
    let g = build(true);
    let program = g.compile(client()).unwrap();
    assert!(program.is_sharded());
    let want = g.evaluate(inputs).unwrap();
    let got = program.run(inputs).unwrap();
    let plain = build(false).compile(client()).unwrap();
    assert!(!plain.is_sharded());
    let single = plain.run(inputs).unwrap();
    assert_eq!(got.len(), want.len());
    // The f32 bound for every output: shards add in another order, and narrower outputs agree
    // to it too.
    let t = tol(DType::F32);
    for (k, ((g, w), s)) in got.iter().zip(&want).zip(&single).enumerate() {
        assert_matches(g, w, t, &format!("output {k} vs the interpreter"));
        assert_matches(g, s, t, &format!("output {k} vs one device"));
    }
    let uploaded: Vec<ShardedBuffer> = inputs
        .iter()
        .zip(program.input_shardings())
        .map(|(x, s)| client().sharded_buffer_from_host_array(x, s).unwrap())
        .collect();
    let args: Vec<&ShardedBuffer> = uploaded.iter().collect();
    let outputs = program.run_sharded(&args).unwrap();
    for (k, (out, w)) in outputs.iter().zip(&want).enumerate() {
        let blocks = out.sharding().split(w).unwrap();
        for (p, (shard, block)) in out.shards().iter().zip(&blocks).enumerate() {
            let what = format!("output {k}, block of position {p}");
            assert_matches(&shard.to_host_array().unwrap(), block, t, &what);
        }
    }
}

// ---- sharded programs vs the interpreter and one device ----------------------------------------

/// `x @ w` with `x`'s rows over "data" and `w`'s columns over "model": each device computes one
/// block of the product, which stays split over both axes.
#[test]
fn matmul_rows_over_data_columns_over_model() {
    let build = |sharded: bool| {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[4, 6]).unwrap();
        let w = g.parameter("w", DType::F32, &[6, 8]).unwrap();
        let y = x.matmul(&w).unwrap();
        g.set_outputs(&[&y]).unwrap();
        if sharded {
            g.set_mesh(&mesh22());
            g.shard_parameter(&x, &PartitionSpec::new([Some("data"), None]))
                .unwrap();
            g.shard_parameter(&w, &PartitionSpec::new([None, Some("model")]))
                .unwrap();
            g.set_output_shardings(&[PartitionSpec::new([Some("data"), Some("model")])])
                .unwrap();
        }
        g
    };
    let g = build(true);
    let text = g.to_stablehlo().unwrap();
    assert!(
        text.contains(r#"#sdy.sharding<@mesh, [{"data"}, {}]>"#),
        "{text}"
    );
    assert!(
        text.contains(r#"#sdy.sharding<@mesh, [{}, {"model"}]>"#),
        "{text}"
    );
    check_sharded(build, &[f32_array(&[4, 6], 1), f32_array(&[6, 8], 2)]);
}

/// Sums over an axis split over all four devices (XLA inserts an all-reduce), with the result
/// replicated and, in a second output, split over the axis that remains.
#[test]
fn reduction_over_a_sharded_axis() {
    let build = |sharded: bool| {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[8, 6]).unwrap();
        let s = x.sum(&[0]).unwrap();
        let m = x.mean(&[0, 1]).unwrap();
        g.set_outputs(&[&s, &m]).unwrap();
        if sharded {
            g.set_mesh(&Mesh::new(&[("x", 4)]).unwrap());
            g.shard_parameter(&x, &PartitionSpec::new([Some("x")]))
                .unwrap();
        }
        g
    };
    check_sharded(build, &[f32_array(&[8, 6], 3)]);
    // The first output by formula too: column sums.
    let x = f32_array(&[8, 6], 3).to_f64_vec();
    let want: Vec<f64> = (0..6).map(|j| (0..8).map(|i| x[i * 6 + j]).sum()).collect();
    let got = build(true).compile(client()).unwrap();
    let got = got.run(&[f32_array(&[8, 6], 3)]).unwrap()[0].to_f64_vec();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
}

/// A conditional over sharded operands: rows over "data", the predicate from a sharded
/// reduction, one branch a matmul with a captured weight split over "model"; both branches
/// taken in turn.
#[test]
fn a_conditional_over_sharded_values() {
    let build = |sharded: bool| {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[4, 6]).unwrap();
        let w = g.parameter("w", DType::F32, &[6, 6]).unwrap();
        let big = x.sum_all().unwrap().gt(0.0).unwrap();
        let y = g
            .cond(&big, &x, |x| x.matmul(&w)?.tanh(), |x| x.mul(-2.0))
            .unwrap();
        g.set_outputs(&[&y]).unwrap();
        if sharded {
            g.set_mesh(&mesh22());
            g.shard_parameter(&x, &PartitionSpec::new([Some("data"), None]))
                .unwrap();
            g.shard_parameter(&w, &PartitionSpec::new([None, Some("model")]))
                .unwrap();
        }
        g
    };
    let x = f32_array(&[4, 6], 5);
    let negated =
        HostArray::from_vec(&[4, 6], x.to_f64_vec().iter().map(|v| -v as f32).collect()).unwrap();
    let sums = [
        x.to_f64_vec().iter().sum::<f64>(),
        -x.to_f64_vec().iter().sum::<f64>(),
    ];
    assert!(
        sums[0] * sums[1] < 0.0,
        "the two inputs must take different branches"
    );
    for x in [x, negated] {
        check_sharded(build, &[x, f32_array(&[6, 6], 6)]);
    }
}

/// Softmax, max, min and argmax along an axis split over "model" (their reductions need
/// collectives), rows over "data"; with NaNs in some rows, which the max and min must keep.
/// (A program over a mesh lowers float max/min reductions as a plain reduction plus a NaN
/// test: XLA's CPU all-reduce refuses the NaN-propagating region a one-device program uses.)
#[test]
fn max_min_argmax_and_softmax_over_a_sharded_axis() {
    let build = |sharded: bool| {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[4, 8]).unwrap();
        let soft = x.softmax(-1).unwrap();
        let max = x.max(&[1]).unwrap();
        let min = x.min(&[1]).unwrap();
        let arg = x.argmax(1).unwrap();
        g.set_outputs(&[&soft, &max, &min, &arg]).unwrap();
        if sharded {
            g.set_mesh(&mesh22());
            let spec = PartitionSpec::new([Some("data"), Some("model")]);
            g.shard_parameter(&x, &spec).unwrap();
            let rows = PartitionSpec::new([Some("data")]);
            g.set_output_shardings(&[spec, rows.clone(), rows.clone(), rows])
                .unwrap();
        }
        g
    };
    check_sharded(build, &[f32_array(&[4, 8], 4)]);
    let mut with_nan = f32_array(&[4, 8], 5).as_array::<f32>().unwrap().clone();
    with_nan[[1, 6]] = f32::NAN;
    with_nan[[3, 0]] = f32::NAN;
    let with_nan = HostArray::F32(with_nan);
    check_sharded(build, std::slice::from_ref(&with_nan));
    let out = build(true)
        .compile(client())
        .unwrap()
        .run(&[with_nan])
        .unwrap();
    let max = out[1].to_f64_vec();
    assert!(max[1].is_nan() && max[3].is_nan() && !max[0].is_nan() && !max[2].is_nan());
}

/// An output with no elements, split in the graph: XLA returns it whole on every device, and
/// the program reports it replicated.
#[test]
fn an_empty_output_is_replicated() {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[4, 0]).unwrap();
    let y = (&x * 2.0).unwrap();
    g.set_outputs(&[&y]).unwrap();
    g.set_mesh(&mesh22());
    let spec = PartitionSpec::new([Some("data"), None]);
    g.shard_parameter(&x, &spec).unwrap();
    g.set_output_shardings(&[spec]).unwrap();
    let program = g.compile(client()).unwrap();
    let out = program.run(&[f32_array(&[4, 0], 0)]).unwrap();
    assert_eq!(out[0].dims(), &[4, 0]);
    let s = &program.output_shardings()[0];
    assert_eq!(s.shard_dims(&[4, 0]), vec![4, 0], "{s:?}");
}

// ---- sharded buffers ---------------------------------------------------------------------------

/// Every partition spec of a rank-2 array on the 2x2 mesh.
fn all_specs() -> Vec<PartitionSpec> {
    let one = |d: usize, a: &str| PartitionSpec::replicated().with_dim(d, a);
    vec![
        PartitionSpec::replicated(),
        one(0, "data"),
        one(0, "model"),
        one(1, "data"),
        one(1, "model"),
        PartitionSpec::new([Some("data"), Some("model")]),
        PartitionSpec::new([Some("model"), Some("data")]),
        PartitionSpec::from_axes(&[&["data", "model"]]),
        PartitionSpec::from_axes(&[&["model", "data"]]),
        PartitionSpec::from_axes(&[&[], &["data", "model"]]),
        PartitionSpec::from_axes(&[&[], &["model", "data"]]),
    ]
}

/// Uploads `array` as `sharding` says and checks each shard (its device, its block of the
/// array, computed here by index arithmetic, and the bytes per device) and the gathered array.
fn check_round_trip(array: &HostArray, sharding: &Sharding) {
    let what = format!("{} over {:?}", sharding.spec(), sharding.mesh());
    let b = client()
        .sharded_buffer_from_host_array(array, sharding)
        .unwrap();
    assert_eq!(b.ty(), &array.ty(), "{what}");
    assert_eq!(b.to_host_array().unwrap(), *array, "{what}");
    let dims = array.dims();
    let values = array.to_f64_vec();
    let parts = |d: usize| -> usize {
        sharding
            .spec()
            .axes_of(d)
            .iter()
            .map(|a| sharding.mesh().axis_size(a).unwrap())
            .product()
    };
    let block = [dims[0] / parts(0), dims[1] / parts(1)];
    let size = array.dtype().size_in_bytes();
    assert_eq!(b.bytes_per_device(), block[0] * block[1] * size, "{what}");
    let axes: Vec<(String, usize)> = sharding
        .mesh()
        .axes()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
    for (p, shard) in b.shards().iter().enumerate() {
        assert_eq!(shard.device(), sharding.mesh().devices()[p], "{what}");
        assert_eq!(shard.dims(), &block, "{what}");
        // The position's coordinate along each axis (row-major), then its block index per dim.
        let coordinate = |name: &str| {
            let mut rest = p;
            let mut coords = vec![0; axes.len()];
            for (i, (_, s)) in axes.iter().enumerate().rev() {
                coords[i] = rest % s;
                rest /= s;
            }
            coords[axes.iter().position(|(n, _)| n == name).unwrap()]
        };
        let index = |d: usize| {
            sharding.spec().axes_of(d).iter().fold(0, |i, a| {
                i * sharding.mesh().axis_size(a).unwrap() + coordinate(a)
            })
        };
        let (r0, c0) = (index(0) * block[0], index(1) * block[1]);
        let want: Vec<f64> = (0..block[0])
            .flat_map(|i| (0..block[1]).map(move |j| (r0 + i, c0 + j)))
            .map(|(i, j)| values[i * dims[1] + j])
            .collect();
        assert_eq!(
            shard.to_host_array().unwrap().to_f64_vec(),
            want,
            "{what} position {p}"
        );
    }
}

#[test]
fn every_spec_round_trips_on_a_2x2_mesh() {
    let permuted = Mesh::with_devices(&[("data", 2), ("model", 2)], &[3, 1, 0, 2]).unwrap();
    let n = 16usize;
    let f32s = f32_array(&[4, 4], 5);
    let i32s = HostArray::from_vec(&[4, 4], (0..n as i32).map(|i| i * 3 - 20).collect()).unwrap();
    let preds = HostArray::from_vec(&[4, 4], (0..n).map(|i| i % 3 == 0).collect()).unwrap();
    let bf16s = HostArray::from_vec(
        &[4, 4],
        (0..n)
            .map(|i| half::bf16::from_f32(i as f32 - 7.5))
            .collect(),
    )
    .unwrap();
    for mesh in [mesh22(), permuted] {
        for spec in all_specs() {
            let sharding = Sharding::new(&mesh, &spec).unwrap();
            for array in [&f32s, &i32s, &preds, &bf16s] {
                check_round_trip(array, &sharding);
            }
        }
    }
}

/// `x + 1` with `x` (f32[4, 4]) laid out as `spec` on the 2x2 mesh, optionally donated.
fn add_one(spec: &PartitionSpec, donate: bool) -> CompiledGraph {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[4, 4]).unwrap();
    let y = (&x + 1.0).unwrap();
    g.set_outputs(&[&y]).unwrap();
    g.set_mesh(&mesh22());
    g.shard_parameter(&x, spec).unwrap();
    g.set_output_shardings(std::slice::from_ref(spec)).unwrap();
    if donate {
        g.donate(&x).unwrap();
    }
    g.compile(client()).unwrap()
}

#[test]
fn an_input_of_the_wrong_layout_is_an_error_naming_the_parameter() {
    let rows = PartitionSpec::new([Some("data")]);
    let program = add_one(&rows, false);
    let x = f32_array(&[4, 4], 6);
    for spec in [
        PartitionSpec::new([Some("model")]),
        PartitionSpec::replicated(),
    ] {
        let wrong = client()
            .sharded_buffer_from_host_array(&x, &Sharding::new(&mesh22(), &spec).unwrap())
            .unwrap();
        let e = program.run_sharded(&[&wrong]).unwrap_err().to_string();
        assert!(e.contains("parameter 0 (x)"), "{e}");
        assert!(e.contains(&spec.to_string()), "{e}");
    }
    // The same layout on other devices is another layout.
    let moved = Mesh::with_devices(&[("data", 2), ("model", 2)], &[1, 0, 3, 2]).unwrap();
    let wrong = client()
        .sharded_buffer_from_host_array(&x, &Sharding::new(&moved, &rows).unwrap())
        .unwrap();
    let e = program.run_sharded(&[&wrong]).unwrap_err().to_string();
    assert!(e.contains("parameter 0 (x)"), "{e}");
    // The right layout runs: x + 1 by formula.
    let right = client()
        .sharded_buffer_from_host_array(&x, &program.input_shardings()[0])
        .unwrap();
    let out = program.run_sharded(&[&right]).unwrap();
    let want: Vec<f64> = x.to_f64_vec().iter().map(|v| v + 1.0).collect();
    assert_eq!(out[0].to_host_array().unwrap().to_f64_vec(), want);
}

#[test]
fn run_buffers_refuses_a_sharded_program() {
    let program = add_one(&PartitionSpec::new([Some("data")]), false);
    let x = client()
        .buffer_from_host_array(&f32_array(&[4, 4], 7))
        .unwrap();
    let e = program.run_buffers(&[&x]).unwrap_err().to_string();
    assert!(e.contains("run_sharded"), "{e}");
}

#[test]
fn a_donated_sharded_parameter_gives_up_every_shard() {
    for spec in [
        PartitionSpec::new([Some("data"), Some("model")]),
        PartitionSpec::replicated(),
    ] {
        let program = add_one(&spec, true);
        let x = f32_array(&[4, 4], 8);
        let b = client()
            .sharded_buffer_from_host_array(&x, &program.input_shardings()[0])
            .unwrap();
        assert!(!b.is_donated());
        let out = program.run_sharded(&[&b]).unwrap();
        assert!(b.shards().iter().all(|s| s.is_donated()), "{spec}");
        let want: Vec<f64> = x.to_f64_vec().iter().map(|v| v + 1.0).collect();
        assert_eq!(out[0].to_host_array().unwrap().to_f64_vec(), want, "{spec}");
        assert!(program.run_sharded(&[&b]).is_err(), "{spec}");
        // The output is fresh and usable as the next input.
        let again = program.run_sharded(&[&out[0]]).unwrap();
        let want: Vec<f64> = want.iter().map(|v| v + 1.0).collect();
        assert_eq!(
            again[0].to_host_array().unwrap().to_f64_vec(),
            want,
            "{spec}"
        );
    }
}

// ---- errors ------------------------------------------------------------------------------------

/// A graph with parameter `x: f32[3, 4]` and mesh [`mesh22`]; returns the graph and `x`.
fn graph_with_mesh() -> (Graph, stablegraph::ops::Tensor) {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[3, 4]).unwrap();
    g.set_mesh(&mesh22());
    (g, x)
}

#[test]
fn a_spec_that_does_not_divide_is_an_error() {
    let (g, x) = graph_with_mesh();
    let rows = PartitionSpec::new([Some("data")]);
    let e = g.shard_parameter(&x, &rows).unwrap_err().to_string();
    assert!(
        e.contains("do not divide") && e.contains("shard_parameter"),
        "{e}"
    );
    let e = x.with_sharding_constraint(&rows).unwrap_err().to_string();
    assert!(e.contains("do not divide"), "{e}");
    // Dimension 1 (4) is divided by both axes together.
    let both = PartitionSpec::from_axes(&[&[], &["data", "model"]]);
    g.shard_parameter(&x, &both).unwrap();
    // An output spec is checked against the output when the graph is lowered.
    let y = (&x * 2.0).unwrap();
    g.set_outputs(&[&y]).unwrap();
    g.set_output_shardings(std::slice::from_ref(&rows)).unwrap();
    let e = g.compile(client()).unwrap_err().to_string();
    assert!(e.contains("output 0") && e.contains("do not divide"), "{e}");
    // A spec with more dimensions than the value.
    let long = PartitionSpec::new([None, None, Some("data")]);
    let e = g.shard_parameter(&x, &long).unwrap_err().to_string();
    assert!(e.contains("rank 2"), "{e}");
}

#[test]
fn an_unknown_axis_or_an_axis_used_twice_is_an_error() {
    let (g, x) = graph_with_mesh();
    let unknown = PartitionSpec::new([None, Some("batch")]);
    let e = g.shard_parameter(&x, &unknown).unwrap_err().to_string();
    assert!(e.contains("\"batch\""), "{e}");
    let e = x
        .with_sharding_constraint(&unknown)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"batch\""), "{e}");
    let e = g.set_output_shardings(&[unknown]).unwrap_err().to_string();
    assert!(e.contains("\"batch\""), "{e}");
    let twice = PartitionSpec::from_axes(&[&[], &["model", "model"]]);
    let e = g.shard_parameter(&x, &twice).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
    let twice = PartitionSpec::new([Some("data"), Some("data")]);
    let e = x.with_sharding_constraint(&twice).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
}

#[test]
fn a_mesh_larger_than_the_client_is_an_error() {
    // `Client::cpu()` takes the plugin's default device count (4 on some hosts): ask for one.
    let one = Client::cpu_with_devices(1).unwrap();
    assert_eq!(one.device_count(), 1);
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[4]).unwrap();
    g.set_outputs(&[&x]).unwrap();
    g.set_mesh(&Mesh::new(&[("x", 2)]).unwrap());
    let e = g.compile(&one).unwrap_err().to_string();
    assert!(e.contains("cpu_device_count"), "{e}");
    // A mesh on a device the four-device client lacks.
    g.set_mesh(&Mesh::with_devices(&[("x", 2)], &[0, 4]).unwrap());
    let e = g.compile(client()).unwrap_err().to_string();
    assert!(e.contains("device 4"), "{e}");
}

#[test]
fn output_specs_must_match_the_outputs_in_number() {
    let (g, x) = graph_with_mesh();
    let y = (&x + 1.0).unwrap();
    g.set_outputs(&[&x, &y]).unwrap();
    g.set_output_shardings(&[PartitionSpec::replicated()])
        .unwrap();
    let e = g.shardings().unwrap_err().to_string();
    assert!(e.contains("2 outputs") && e.contains("1 specs"), "{e}");
    assert!(g.compile(client()).is_err());
    g.set_output_shardings(&[
        PartitionSpec::replicated(),
        PartitionSpec::new([None, Some("model")]),
    ])
    .unwrap();
    let s = g.shardings().unwrap().unwrap();
    assert_eq!(s.outputs.len(), 2);
    assert_eq!(s.outputs[1].shard_dims(&[3, 4]), vec![3, 2]);
}

#[test]
fn shard_parameter_on_a_non_parameter_is_an_error() {
    let (g, x) = graph_with_mesh();
    let y = (&x + 1.0).unwrap();
    let e = g
        .shard_parameter(&y, &PartitionSpec::replicated())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a parameter"), "{e}");
    let other = Graph::new();
    other.set_mesh(&mesh22());
    assert!(other
        .shard_parameter(&x, &PartitionSpec::replicated())
        .is_err());
}

#[test]
fn shardings_without_a_mesh_are_errors() {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[4, 4]).unwrap();
    let spec = PartitionSpec::new([Some("data")]);
    let e = x.with_sharding_constraint(&spec).unwrap_err().to_string();
    assert!(e.contains("no mesh"), "{e}");
    let e = g.shard_parameter(&x, &spec).unwrap_err().to_string();
    assert!(e.contains("no mesh"), "{e}");
    let e = g.set_output_shardings(&[spec]).unwrap_err().to_string();
    assert!(e.contains("no mesh"), "{e}");
    assert!(g.shardings().unwrap().is_none());
}

// ---- the compile cache and devices -------------------------------------------------------------

/// `x * 3` over f32[4, 4] with `x` and the output laid out as `spec` over `mesh`.
fn times_three(mesh: &Mesh, spec: &PartitionSpec) -> Graph {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[4, 4]).unwrap();
    let y = (&x * 3.0).unwrap();
    g.set_outputs(&[&y]).unwrap();
    g.set_mesh(mesh);
    g.shard_parameter(&x, spec).unwrap();
    g.set_output_shardings(std::slice::from_ref(spec)).unwrap();
    g
}

#[test]
fn specs_and_device_orders_are_separate_cache_entries() {
    let c = Client::cpu_with_devices(4).unwrap();
    c.set_compile_cache(CompileCache::memory_only());
    let rows = PartitionSpec::new([Some("data")]);
    let cols = PartitionSpec::new([None, Some("data")]);
    let permuted = Mesh::with_devices(&[("data", 2), ("model", 2)], &[2, 3, 0, 1]).unwrap();
    let x = f32_array(&[4, 4], 9);
    let want: Vec<f64> = x.to_f64_vec().iter().map(|v| v * 3.0).collect();
    let mut compiles = 0;
    for (mesh, spec) in [
        (mesh22(), &rows),
        (mesh22(), &cols),
        (permuted.clone(), &rows),
    ] {
        let program = times_three(&mesh, spec).compile(&c).unwrap();
        compiles += 1;
        assert_eq!(c.cache_stats().compiles, compiles, "{spec} over {mesh:?}");
        assert_eq!(c.cache_stats().memory_hits, 0);
        assert_eq!(
            program.run(std::slice::from_ref(&x)).unwrap()[0].to_f64_vec(),
            want
        );
    }
    // The same graph again is a hit, and runs on the permuted devices.
    let program = times_three(&permuted, &rows).compile(&c).unwrap();
    assert_eq!(c.cache_stats().compiles, 3);
    assert_eq!(c.cache_stats().memory_hits, 1);
    assert_eq!(program.executable().devices(), &[2, 3, 0, 1]);
    let input = c
        .sharded_buffer_from_host_array(&x, &program.input_shardings()[0])
        .unwrap();
    let out = program.run_sharded(&[&input]).unwrap();
    let devices: Vec<usize> = out[0].shards().iter().map(|b| b.device()).collect();
    assert_eq!(devices, vec![2, 3, 0, 1]);
    assert_eq!(out[0].to_host_array().unwrap().to_f64_vec(), want);
}

#[test]
fn a_sharded_programs_outputs_land_on_the_mesh_devices() {
    for devices in [[0, 1, 2, 3], [3, 1, 0, 2]] {
        let mesh = Mesh::with_devices(&[("data", 2), ("model", 2)], &devices).unwrap();
        let spec = PartitionSpec::new([Some("model"), Some("data")]);
        let program = times_three(&mesh, &spec).compile(client()).unwrap();
        let x = f32_array(&[4, 4], 10);
        let input = client()
            .sharded_buffer_from_host_array(&x, &program.input_shardings()[0])
            .unwrap();
        let out = program.run_sharded(&[&input]).unwrap();
        let on: Vec<usize> = out[0].shards().iter().map(|b| b.device()).collect();
        assert_eq!(on, devices);
        // Each block is its slice of 3x, split here by the same spec.
        let want = HostArray::from_vec(
            &[4, 4],
            x.to_f64_vec().iter().map(|v| (v * 3.0) as f32).collect(),
        )
        .unwrap();
        let blocks = Sharding::new(&mesh, &spec).unwrap().split(&want).unwrap();
        for (shard, block) in out[0].shards().iter().zip(&blocks) {
            assert_eq!(shard.to_host_array().unwrap(), *block, "{devices:?}");
        }
    }
}

/// A pad with interior and negative edge padding aborts XLA's SPMD partitioner (found by the
/// fuzz target); compiling it over a mesh is an error instead, and without a mesh it runs.
#[test]
fn a_pad_that_aborts_the_partitioner_is_refused() {
    let build = |sharded: bool| {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[4, 8]).unwrap();
        let y = x.pad(&[0, -1], &[0, 0], &[0, 1], 0.0).unwrap();
        g.set_outputs(&[&y]).unwrap();
        if sharded {
            g.set_mesh(&mesh22());
            g.shard_parameter(&x, &PartitionSpec::new([None, Some("model")]))
                .unwrap();
        }
        g
    };
    let e = build(true).compile(client()).unwrap_err().to_string();
    assert!(e.contains("partitioner"), "{e}");
    let out = build(false)
        .compile(client())
        .unwrap()
        .run(&[f32_array(&[4, 8], 1)]);
    assert_eq!(out.unwrap()[0].dims(), &[4, 14]);
}

/// The optimized program's collectives: a sum over a dimension split over "model" is one
/// all-reduce of each device's partial sums (its rows' block), and a one-device program has none.
#[test]
fn the_optimized_program_lists_the_inserted_all_reduce() {
    let build = |sharded: bool| {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[4, 8]).unwrap();
        let y = x.sum(&[1]).unwrap();
        g.set_outputs(&[&y]).unwrap();
        if sharded {
            g.set_mesh(&mesh22());
            g.shard_parameter(&x, &PartitionSpec::new([Some("data"), Some("model")]))
                .unwrap();
            g.set_output_shardings(&[PartitionSpec::new([Some("data")])])
                .unwrap();
        }
        g
    };
    let sharded = build(true).compile(client()).unwrap();
    let found = sharded.executable().collectives().unwrap();
    let reduces: Vec<u64> = found
        .iter()
        .filter(|c| c.opcode == "all-reduce")
        .map(|c| c.elements)
        .collect();
    assert_eq!(reduces, vec![2], "{found:?}");
    let plain = build(false).compile(client()).unwrap();
    assert!(plain.executable().collectives().unwrap().is_empty());
}

/// The raw per-device execution refuses blocks of the wrong shape (the program's parameters
/// are blocks there, not the global shapes its text declares) and argument lists on the wrong
/// devices, before anything runs.
#[test]
fn execute_partitioned_checks_each_devices_blocks() {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[4, 8]).unwrap();
    let y = (&x * 2.0).unwrap();
    g.set_outputs(&[&y]).unwrap();
    g.set_mesh(&mesh22());
    let spec = PartitionSpec::new([Some("data"), Some("model")]);
    g.shard_parameter(&x, &spec).unwrap();
    g.set_output_shardings(&[spec]).unwrap();
    let program = g.compile(client()).unwrap();
    let exe = program.executable();
    let c = client();
    let upload = |dims: &[usize], device: usize| {
        let n: usize = dims.iter().product();
        c.buffer_from_bytes(DType::F32, dims, &vec![0u8; 4 * n], device)
            .unwrap()
    };
    // Right: one [2, 4] block per device.
    let good: Vec<_> = exe.devices().iter().map(|&d| upload(&[2, 4], d)).collect();
    let lists: Vec<Vec<&stablegraph::runtime::Buffer>> = good.iter().map(|b| vec![b]).collect();
    let out = exe
        .execute_partitioned(&lists, stablegraph::runtime::ExecuteOptions::default())
        .unwrap();
    assert_eq!(out.len(), 4);
    assert_eq!(out[0][0].dims(), &[2, 4]);
    // The global shape on every device.
    let whole: Vec<_> = exe.devices().iter().map(|&d| upload(&[4, 8], d)).collect();
    let lists: Vec<Vec<&stablegraph::runtime::Buffer>> = whole.iter().map(|b| vec![b]).collect();
    let e = exe
        .execute_partitioned(&lists, stablegraph::runtime::ExecuteOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2, 4]") || e.contains("2,4"), "{e}");
    // Lists in another device order.
    let mut swapped: Vec<Vec<&stablegraph::runtime::Buffer>> =
        good.iter().map(|b| vec![b]).collect();
    swapped.swap(0, 1);
    let e = exe
        .execute_partitioned(&swapped, stablegraph::runtime::ExecuteOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("device"), "{e}");
}

/// A wrong result from XLA's SPMD partitioner (lammps-jax-pjrt-cpu 0.11.2, Shardy), found by the
/// `sharded_graph` fuzz target once it took gradients (2026-12-03): a replicated constraint on a
/// constant that feeds a pad with interior padding, multiplied by a value derived from a sort
/// whose indices are an output split over the mesh. The interpreter and a one-device program
/// agree; the 4-device program differs in 25 of 256 elements. Ignored until XLA is fixed: it
/// documents the case (run it with `--ignored` against a new plugin).
#[test]
#[ignore = "XLA partitioner bug: wrong values, see the doc comment"]
fn xla_partitions_a_constrained_interior_pad_wrongly() {
    use stablegraph::ops::SortOrder;
    let rep = |n: usize| PartitionSpec::new(vec![None; n]);
    let g = Graph::new();
    let a = g.parameter("a", DType::F32, &[4, 4, 4]).unwrap();
    let b = g.parameter("b", DType::F32, &[4, 4, 4]).unwrap();
    g.set_mesh(&Mesh::new(&[("x", 4)]).unwrap());
    let (_, idx) = a
        .dot_general(&b, &[], &[(0, 2)])
        .unwrap()
        .sort_with_indices(3, SortOrder::Descending)
        .unwrap();
    let ones = g
        .ones(DType::F32, &[2, 2, 4, 3])
        .unwrap()
        .with_sharding_constraint(&rep(4))
        .unwrap();
    let padded = ones
        .pad(&[0, 1, 0, 0], &[1, 0, 0, 1], &[1, 1, 0, 0], 0.0)
        .unwrap();
    let masked = g.tril_mask(4, 4, 0).unwrap().select(&padded, 0.0).unwrap();
    let (_, back) = idx
        .astype(DType::I32)
        .unwrap()
        .sort_with_indices(3, SortOrder::Ascending)
        .unwrap();
    let out = back.astype(DType::F32).unwrap().mul(&masked).unwrap();
    g.set_outputs(&[&idx, &out]).unwrap();
    g.set_output_shardings(&[PartitionSpec::new([Some("x"), None, None, None]), rep(4)])
        .unwrap();
    let v = |i: usize| -> Vec<f32> {
        (0..64)
            .map(|k| ((k * 7 + i * 5) % 9) as f32 - 4.0)
            .collect()
    };
    let inputs = [
        HostArray::from_vec(&[4, 4, 4], v(0)).unwrap(),
        HostArray::from_vec(&[4, 4, 4], v(1)).unwrap(),
    ];
    let want = g.evaluate(&inputs).unwrap();
    let client = Client::cpu_with_devices(4).unwrap();
    let got = g.compile(&client).unwrap().run(&inputs).unwrap();
    assert_eq!(got[1].to_f64_vec(), want[1].to_f64_vec());
}

/// `vmap` of a function that constrains its per-example values: the batched constraint keeps
/// the spec with the batch axis not split, and the program computes what one device does.
#[test]
fn vmap_keeps_a_sharding_constraint_past_the_batch() {
    let build = |sharded: bool| {
        let g = Graph::new();
        let xs = g.parameter("xs", DType::F32, &[3, 4, 6]).unwrap();
        let w = g.parameter("w", DType::F32, &[6, 8]).unwrap();
        if sharded {
            g.set_mesh(&mesh22());
        }
        let out = g
            .vmap(&[&xs], &[Some(0)], &[], |a| {
                let y = a[0].matmul(&w)?.tanh()?;
                let y = match sharded {
                    true => y.with_sharding_constraint(&PartitionSpec::new([
                        Some("data"),
                        Some("model"),
                    ]))?,
                    false => y,
                };
                Ok(vec![y.sum(&[1])?])
            })
            .unwrap();
        g.set_outputs(&[&out[0]]).unwrap();
        g
    };
    check_sharded(build, &[f32_array(&[3, 4, 6], 1), f32_array(&[6, 8], 2)]);
}
