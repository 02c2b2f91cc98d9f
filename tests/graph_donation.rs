//! Donation through the graph DSL: `Graph::donate` marks a parameter, the lowering aliases it to
//! an output of its type, and running on device buffers consumes the donated buffer.

mod common;

use common::client;
use stablegraph::ops::Graph;
use stablegraph::DType;

/// The same pattern through the graph DSL: `Graph::donate` marks the state parameter, the
/// lowering aliases it to the output of its type, and `run_buffers` consumes the state buffer.
#[test]
fn a_graph_with_a_donated_state_updates_it_in_place() {
    const N: usize = 256;
    let g = Graph::new();
    let state = g.parameter("state", DType::F32, &[N, N]).unwrap();
    let row = g.parameter("row", DType::I32, &[]).unwrap();
    let zero = g.scalar(0.0, DType::I32).unwrap();
    let old = state.dynamic_slice(&[&row, &zero], &[1, N]).unwrap();
    let new = old.add(1.0).unwrap();
    let next = state.dynamic_update_slice(&new, &[&row, &zero]).unwrap();
    g.set_outputs(&[&next]).unwrap();
    g.donate(&state).unwrap();
    assert_eq!(g.output_aliases().unwrap(), vec![Some(0), None]);
    let program = g.compile(&client()).unwrap();
    assert!(
        program
            .stablehlo()
            .contains("{tf.aliasing_output = 0 : i32}"),
        "{}",
        program.stablehlo()
    );
    assert_eq!(program.executable().donated_inputs(), &[0]);

    let c = client();
    let mut buf = c.buffer_from_slice(&vec![0f32; N * N], &[N, N]).unwrap();
    let mut counts = vec![0f32; N];
    for step in 0..1000 {
        let r = (step * 7) % N;
        counts[r] += 1.0;
        let rb = c.buffer_from_scalar(r as i32).unwrap();
        let out = program.run_buffers(&[&buf, &rb]).unwrap();
        let err = buf.to_vec::<f32>().unwrap_err().to_string();
        assert!(err.contains("was donated"), "{err}");
        buf = out.into_iter().next().unwrap();
    }
    let got = buf.to_vec::<f32>().unwrap();
    for r in 0..N {
        assert!(
            got[r * N..(r + 1) * N].iter().all(|&v| v == counts[r]),
            "row {r}"
        );
    }

    // A donated parameter needs an output of its type to take over.
    let g2 = Graph::new();
    let p = g2.parameter("p", DType::F32, &[3]).unwrap();
    let s = p.sum_all().unwrap();
    g2.set_outputs(&[&s]).unwrap();
    g2.donate(&p).unwrap();
    let err = g2.to_stablehlo().unwrap_err().to_string();
    assert!(err.contains("donated") && err.contains("f32[3]"), "{err}");
}
