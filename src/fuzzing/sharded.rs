//! The `sharded_graph` target: a `random_graph` graph laid out over a random mesh, with random
//! partition specs on its parameters, outputs and sometimes an intermediate value, and for half
//! of them the gradient of the first float output as more outputs; lowered, compiled as one SPMD
//! program, run sharded, and checked against the interpreter.

use super::graph_builder::GraphBuilder;
use super::graphs::{comparable, compare_outputs, compilable, gradients, inputs, runnable};
use super::Bytes;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::ops::{Graph, Tensor};
use crate::runtime::{Client, ShardedBuffer};
use crate::sharding::{Mesh, PartitionSpec};

/// At most this many top-level builder calls per graph (fewer than `random_graph`: every
/// program is compiled for several devices).
const GRAPH_STEPS: usize = 12;

/// A mesh's axes, and device lists for it.
type MeshChoice = (
    &'static [(&'static str, usize)],
    &'static [&'static [usize]],
);

/// The meshes: their axes, and device lists (the first is the default order) on a client of at
/// least four devices.
const MESHES: &[MeshChoice] = &[
    (&[("x", 2)], &[&[0, 1], &[1, 0], &[3, 2]]),
    (&[("x", 4)], &[&[0, 1, 2, 3], &[2, 0, 3, 1]]),
    (&[("x", 2), ("y", 2)], &[&[0, 1, 2, 3], &[3, 1, 0, 2]]),
];

/// A random graph (as `random_graph` builds it) over a random mesh of up to four devices: each
/// parameter and output laid out by a random partition spec that divides its shape (one axis,
/// several axes on one dimension, or replicated), sometimes with a sharding constraint on the
/// last value built.
///
/// Every spec divides its value, so setting it must succeed and the graph must lower; with a
/// `client` (of at least four devices), the program must compile or be refused with an `Err`.
/// A small program that compiles runs with [`crate::CompiledGraph::run`] (inputs split, outputs
/// gathered) and agrees with the interpreter under `random_graph`'s rules; its
/// [`crate::CompiledGraph::run_sharded`] outputs, laid out as the program says on the mesh's
/// devices, download to the same bytes.
pub fn sharded_graph(data: &[u8], client: Option<&Client>) {
    let mut b = Bytes::new(data);
    let g = Graph::new();
    let (mut pool, robust, parameters) = {
        let mut builder = GraphBuilder::new(&g, &mut b);
        let pool = builder.build(GRAPH_STEPS);
        (pool, builder.robust(), builder.parameters().to_vec())
    };
    let (axes, orders) = b.pick(MESHES);
    let mesh = match Mesh::with_devices(axes, b.pick(orders)) {
        Ok(mesh) => mesh,
        Err(e) => panic!("mesh {axes:?}: {e}"),
    };
    g.set_mesh(&mesh);
    lay_out(&mut b, &g, &mesh, &parameters, &mut pool);
    let count = 1 + b.below(3);
    let mut outputs: Vec<Tensor> = pool.iter().rev().take(count).cloned().collect();
    if b.below(2) == 0 {
        outputs.extend(gradients(&g, &outputs));
    }
    let outputs: Vec<&Tensor> = outputs.iter().collect();
    if outputs.is_empty() || g.set_outputs(&outputs).is_err() {
        return;
    }
    let specs: Vec<PartitionSpec> = outputs
        .iter()
        .map(|t| random_spec(&mut b, &mesh, t.dims()))
        .collect();
    if let Err(e) = g.set_output_shardings(&specs) {
        panic!("output specs {specs:?}: {e}");
    }
    let text = match g.to_stablehlo() {
        Ok(text) => text,
        Err(e) => panic!("a sharded graph that built did not lower: {e}"),
    };
    let Some(client) = client else {
        return;
    };
    // `compile` refuses what aborts XLA's partitioner (a pad with interior and negative edge
    // padding: the input in tests/fuzz_regressions/sharded_graph/).
    if !compilable(&g) {
        return;
    }
    let Ok(program) = g.compile(client) else {
        return;
    };
    assert!(program.is_sharded());
    assert_eq!(program.executable().devices(), mesh.devices(), "{text}");
    if !runnable(&g) {
        return;
    }
    let inputs = inputs(&g);
    let on_device = program.run(&inputs);
    let interpreted = g.evaluate(&inputs);
    if let (Ok(device), Ok(host), true) = (&on_device, &interpreted, comparable(&g, robust)) {
        compare_outputs(device, host, &text);
    }
    let Ok(gathered) = on_device else {
        return;
    };
    check_run_sharded(client, &program, &mesh, &inputs, &gathered, &text);
}

/// Lays out some of `parameters` by random specs over `mesh` and, sometimes, adds a sharding
/// constraint on the last value of `pool` (pushing the constrained value).
fn lay_out(b: &mut Bytes, g: &Graph, mesh: &Mesh, parameters: &[Tensor], pool: &mut Vec<Tensor>) {
    for p in parameters {
        if b.bool() {
            let spec = random_spec(b, mesh, p.dims());
            if let Err(e) = g.shard_parameter(p, &spec) {
                panic!("{spec} on parameter {}: {e}", p.ty());
            }
        }
    }
    if b.one_in(3) {
        if let Some(last) = pool.last() {
            let spec = random_spec(b, mesh, last.dims());
            match last.with_sharding_constraint(&spec) {
                Ok(t) => pool.push(t),
                // A value made inside a loop body may not be used out here.
                Err(e) => assert!(e.to_string().contains("inside a loop"), "{spec}: {e}"),
            }
        }
    }
}

/// `program`'s [`crate::CompiledGraph::run_sharded`] on `inputs` (uploaded as the program lays
/// them out) gives outputs laid out as it says, on the devices of `mesh`, that download to the
/// bytes of `gathered` (what `run` gave); `text` is the program, for messages.
fn check_run_sharded(
    client: &Client,
    program: &CompiledGraph,
    mesh: &Mesh,
    inputs: &[HostArray],
    gathered: &[HostArray],
    text: &str,
) {
    let uploaded = inputs
        .iter()
        .zip(program.input_shardings())
        .map(|(x, s)| client.sharded_buffer_from_host_array(x, s))
        .collect::<crate::Result<Vec<ShardedBuffer>>>();
    let uploaded = match uploaded {
        Ok(u) => u,
        Err(e) => panic!("inputs that run took did not upload: {e}\n{text}"),
    };
    let args: Vec<&ShardedBuffer> = uploaded.iter().collect();
    let sharded = match program.run_sharded(&args) {
        Ok(s) => s,
        Err(e) => panic!("run succeeded but run_sharded failed: {e}\n{text}"),
    };
    assert_eq!(sharded.len(), gathered.len(), "{text}");
    for (k, ((s, want), layout)) in sharded
        .iter()
        .zip(gathered)
        .zip(program.output_shardings())
        .enumerate()
    {
        assert_eq!(s.sharding(), layout, "output {k}\n{text}");
        let devices: Vec<usize> = s.shards().iter().map(|b| b.device()).collect();
        assert_eq!(devices, mesh.devices(), "output {k}\n{text}");
        let host = match s.to_host_array() {
            Ok(h) => h,
            Err(e) => panic!("output {k} did not download: {e}\n{text}"),
        };
        assert_eq!(host.ty(), want.ty(), "output {k}\n{text}");
        assert!(
            host.to_bytes() == want.to_bytes(),
            "output {k}: run_sharded and run differ\n{text}"
        );
    }
}

/// A random spec for a value of shape `dims` over `mesh` that divides it: each dimension split
/// over none, one or several unused axes whose sizes' product divides it; sometimes shorter
/// than the rank, sometimes replicated.
fn random_spec(b: &mut Bytes, mesh: &Mesh, dims: &[usize]) -> PartitionSpec {
    if b.one_in(4) {
        return PartitionSpec::replicated();
    }
    let mut unused: Vec<(&str, usize)> = mesh.axes().collect();
    let listed = b.below(dims.len() + 1);
    let mut spec: Vec<Vec<&str>> = Vec::new();
    for &d in &dims[..listed] {
        let mut axes = Vec::new();
        let mut parts = 1;
        for _ in 0..b.below(3) {
            if unused.is_empty() {
                break;
            }
            let (name, size) = unused[b.below(unused.len())];
            if d % (parts * size) == 0 {
                parts *= size;
                axes.push(name);
                unused.retain(|&(n, _)| n != name);
            }
        }
        spec.push(axes);
    }
    let dims: Vec<&[&str]> = spec.iter().map(Vec::as_slice).collect();
    PartitionSpec::from_axes(&dims)
}
