//! No public function panics on bad input: each case calls one with wrong ranks, zero or huge
//! sizes, or mismatched configs inside `catch_unwind`, and must get an `Err` whose message names
//! the bad argument (a panic or an `Ok` is a failure naming the case). All cases run, and every
//! failure is reported at once.

use std::panic::{catch_unwind, AssertUnwindSafe};

use stablegraph::ops::Graph;
use stablegraph::{DType, Result};

/// What a case must give.
enum Expect {
    /// An error whose message contains every one of these words.
    Err(&'static [&'static str]),
    /// Anything but a panic (the input is odd but has a well-defined answer).
    NoPanic,
}

/// One call to make.
struct Case {
    name: &'static str,
    expect: Expect,
    run: Box<dyn FnOnce() -> Result<()>>,
}

fn case(name: &'static str, expect: Expect, run: impl FnOnce() -> Result<()> + 'static) -> Case {
    Case {
        name,
        expect,
        run: Box::new(run),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Runs every case; fails listing each one that panicked, succeeded when it should not, or
/// gave an error that does not name what was wrong.
fn check(cases: Vec<Case>) {
    let mut failures = Vec::new();
    let count = cases.len();
    for c in cases {
        match catch_unwind(AssertUnwindSafe(c.run)) {
            Err(payload) => failures.push(format!(
                "{}: panicked: {}",
                c.name,
                panic_message(payload.as_ref())
            )),
            Ok(result) => match (c.expect, result) {
                (Expect::NoPanic, _) => {}
                (Expect::Err(_), Ok(())) => {
                    failures.push(format!("{}: returned Ok, expected an error", c.name))
                }
                (Expect::Err(words), Err(e)) => {
                    let text = e.to_string();
                    let missing: Vec<&str> = words
                        .iter()
                        .copied()
                        .filter(|w| !text.contains(w))
                        .collect();
                    if !missing.is_empty() {
                        failures.push(format!(
                            "{}: the error does not name {missing:?}: {text}",
                            c.name
                        ));
                    }
                }
            },
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A graph callback that builds the graph it reads: `with_nodes` and `with_structure` hand it
/// a snapshot, so building (nodes, a loop, outputs) works, and the snapshot does not change.
#[test]
fn reading_a_graph_while_building_it_does_not_panic() {
    let outcome = catch_unwind(|| -> Result<()> {
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[4])?;
        let before = g.nodes().len();
        let (seen, z) = g.with_nodes(|nodes| -> Result<_> {
            let y = x.exp()?.add(1.0)?;
            let z = g.fori_loop(0, 3, &y, |_, s| s.tanh())?;
            g.set_outputs(&[&z])?;
            // Nested reads see the graph as it is now.
            let inner = g.with_structure(|n, r| (n.len(), r.len()));
            assert!(inner.0 > before && inner.1 == 3, "{inner:?}");
            Ok((nodes.len(), z))
        })?;
        assert_eq!(seen, before);
        assert!(g.nodes().len() > before);
        // Reading the structure from inside a loop body that is being built.
        let w = g.fori_loop(0, 2, &x, |_, s| {
            let regions = g.with_structure(|_, regions| regions.len());
            s.mul(regions as f64)
        })?;
        g.set_outputs(&[&z, &w])?;
        let text = g.to_stablehlo()?;
        assert_eq!(text.matches("stablehlo.while").count(), 2, "{text}");
        Ok(())
    });
    match outcome {
        Ok(result) => result.unwrap(),
        Err(p) => panic!(
            "with_nodes/with_structure panicked: {}",
            panic_message(p.as_ref())
        ),
    }
}

/// Sizes whose arithmetic overflows in the graph builders.
#[test]
fn graph_builders_refuse_overflowing_sizes() {
    let huge = usize::MAX;
    check(vec![
        case(
            "reshape to a product past usize::MAX",
            Expect::Err(&["reshape"]),
            || {
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[0])?;
                x.reshape(&[isize::MAX, 4, 0]).map(drop)
            },
        ),
        case(
            "reshape with -1 next to a product past usize::MAX",
            Expect::Err(&["reshape"]),
            || {
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[0])?;
                x.reshape(&[isize::MAX, 4, -1]).map(drop)
            },
        ),
        case(
            "narrow past usize::MAX",
            Expect::Err(&["narrow"]),
            move || {
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[4])?;
                x.narrow(0, huge, 2).map(drop)
            },
        ),
        case(
            "concat past usize::MAX",
            Expect::Err(&["concat"]),
            move || {
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[0, huge])?;
                let y = g.parameter("y", DType::F32, &[0, 2])?;
                stablegraph::ops::Tensor::concat(&[&x, &y], 1).map(drop)
            },
        ),
        case(
            "pad with a huge interior",
            Expect::Err(&["pad"]),
            move || {
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[3])?;
                x.pad(&[0], &[0], &[huge], 0.0).map(drop)
            },
        ),
        case("pad past i64::MAX", Expect::Err(&["pad"]), || {
            let g = Graph::new();
            let x = g.parameter("x", DType::F32, &[3])?;
            x.pad(&[i64::MAX], &[i64::MAX], &[0], 0.0).map(drop)
        }),
        case(
            "random_bits of more elements than a usize holds",
            Expect::Err(&["random_bits"]),
            move || {
                let g = Graph::new();
                let key = g.parameter("key", DType::U32, &[2])?;
                g.random_bits(&key, &[huge, 2]).map(drop)
            },
        ),
        case(
            "mean over huge axes of an empty tensor",
            Expect::NoPanic,
            move || {
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[0, huge, 2])?;
                x.mean(&[1, 2], false).map(drop)
            },
        ),
    ]);
}
