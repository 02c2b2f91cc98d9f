//! No public function panics on bad input: each case calls one with wrong ranks, zero or huge
//! sizes, or mismatched configs inside `catch_unwind`, and must get an `Err` whose message names
//! the bad argument (a panic or an `Ok` is a failure naming the case). All cases run, and every
//! failure is reported at once.

use super::*;
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
            x.pad(&[isize::MAX], &[isize::MAX], &[0], 0.0).map(drop)
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
            "chunk into more pieces than chunk builds",
            Expect::Err(&["chunk", "1099511627776 chunks", "65536"]),
            || {
                // Found by the random_graph fuzzer: one piece per element of a huge empty axis
                // aborted allocating the list of sizes.
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[0, 1 << 40])?;
                x.chunk(1, 1 << 40).map(drop)
            },
        ),
        case(
            "causal_conv1d with a kernel of 2^40 taps",
            Expect::Err(&["causal_conv1d", "1099511627776 taps", "4096"]),
            || {
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[1, 2, 0])?;
                let w = g.parameter("w", DType::F32, &[0, 1 << 40])?;
                x.causal_conv1d(&w, None).map(drop)
            },
        ),
        case(
            "mean over huge axes of an empty tensor",
            Expect::NoPanic,
            move || {
                let g = Graph::new();
                let x = g.parameter("x", DType::F32, &[0, huge, 2])?;
                x.mean(&[1, 2]).map(drop)
            },
        ),
    ]);
}

// ---- models::mamba2 ---------------------------------------------------------------------------

use stablegraph::models::mamba2::block;
use stablegraph::models::mamba2::ssd;
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2State, Mamba2Weights, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::models::LayerState;
use stablegraph::ops::Tensor;
use stablegraph::TensorType;

/// A tiny valid config (`common::micro_mamba2`).
fn tiny() -> Mamba2Config {
    common::micro_mamba2()
}

/// `tiny()` changed by `f`.
fn tiny_with(f: impl FnOnce(&mut Mamba2Config)) -> Mamba2Config {
    let mut c = tiny();
    f(&mut c);
    c
}

/// Configs that `validate` must refuse, with the field each error must name.
fn bad_configs() -> Vec<(&'static str, Mamba2Config, &'static str)> {
    let huge = usize::MAX / 2;
    vec![
        (
            "hidden_size 0",
            tiny_with(|c| c.hidden_size = 0),
            "hidden_size",
        ),
        (
            "num_layers 0",
            tiny_with(|c| c.num_layers = 0),
            "num_layers",
        ),
        (
            "num_layers above the bound",
            tiny_with(|c| c.num_layers = 1 << 60),
            "num_layers (1152921504606846976) is more than 65536",
        ),
        (
            "state_size 0",
            tiny_with(|c| c.state_size = 0),
            "state_size",
        ),
        ("head_dim 0", tiny_with(|c| c.head_dim = 0), "head_dim"),
        ("num_heads 0", tiny_with(|c| c.num_heads = 0), "num_heads"),
        ("n_groups 0", tiny_with(|c| c.n_groups = 0), "n_groups"),
        (
            "conv_kernel 0",
            tiny_with(|c| c.conv_kernel = 0),
            "conv_kernel",
        ),
        (
            "chunk_size 0",
            tiny_with(|c| c.chunk_size = 0),
            "chunk_size",
        ),
        (
            "vocab_size 0",
            tiny_with(|c| c.vocab_size = 0),
            "vocab_size",
        ),
        (
            "n_groups not dividing num_heads",
            tiny_with(|c| c.n_groups = 3),
            "n_groups (3)",
        ),
        (
            "num_heads overflowing",
            tiny_with(|c| c.num_heads = huge),
            "num_heads",
        ),
        (
            "head_dim overflowing d_inner",
            tiny_with(|c| c.head_dim = huge),
            "head_dim",
        ),
        (
            "vocab_size past the i32 token ids",
            tiny_with(|c| c.vocab_size = 1 << 31),
            "vocab_size",
        ),
        (
            "time_step_limit NaN",
            tiny_with(|c| c.time_step_limit = (f64::NAN, 1.0)),
            "time_step_limit",
        ),
        (
            "time_step_limit from infinity",
            tiny_with(|c| c.time_step_limit = (f64::INFINITY, f64::INFINITY)),
            "time_step_limit",
        ),
        (
            "time_step_max infinite",
            tiny_with(|c| c.time_step_init = (1e-3, f64::INFINITY, 1e-4)),
            "time_step_max",
        ),
        (
            "norm_eps infinite",
            tiny_with(|c| c.norm_eps = f64::INFINITY),
            "norm_eps",
        ),
        (
            "scan_dtype i32",
            tiny_with(|c| c.scan_dtype = DType::I32),
            "scan_dtype",
        ),
    ]
}

#[test]
fn configs_are_validated_whatever_their_source() {
    tiny().validate().unwrap();
    Mamba2Config::mamba2_130m().validate().unwrap();
    let mut cases = Vec::new();
    for (name, cfg, field) in bad_configs() {
        let words: &'static [&'static str] = Box::leak(Box::new([field]));
        let c = cfg.clone();
        cases.push(case(name, Expect::Err(words), move || c.validate()));
        // Every entry point that takes a config refuses it before using it.
        let c = cfg.clone();
        cases.push(case(name, Expect::Err(words), move || {
            Mamba2Weights::<TensorType>::types(&c, DType::F32).map(drop)
        }));
        let c = cfg.clone();
        cases.push(case(name, Expect::Err(words), move || {
            Mamba2Weights::random(&c, DType::F32, 0).map(drop)
        }));
        let c = cfg.clone();
        cases.push(case(name, Expect::Err(words), move || {
            let dir = std::path::Path::new("tests/fixtures/mamba2/tiny");
            Mamba2Weights::load(dir, &c, DType::F32).map(drop)
        }));
        let c = cfg.clone();
        cases.push(case(name, Expect::Err(words), move || {
            let w = Mamba2Weights::random(&tiny(), DType::F32, 0)?;
            Mamba2::new(&common::client(), c, &w).map(drop)
        }));
        let c = cfg.clone();
        cases.push(case(name, Expect::Err(words), move || {
            let g = Graph::new();
            let w = block::weight_parameters(&g, &Mamba2Weights::types(&tiny(), DType::F32)?)?;
            let tokens = g.parameter("tokens", DType::I32, &[1, 8])?;
            let mask = g.parameter("mask", DType::F32, &[1, 8])?;
            block::prefill(&tokens, &mask, &w, &c, None).map(drop)
        }));
        let c = cfg;
        cases.push(case(name, Expect::Err(words), move || {
            let (g, w) = graph_weights(&tiny())?;
            let hidden = g.parameter("hidden", DType::F32, &[1, 16])?;
            let state = layer_state(&g, &tiny(), 1)?;
            block::block_step(&hidden, &state, &w.layers[0], &c).map(drop)
        }));
    }
    // Parsed configs whose sizes overflow.
    let hf = |extra: &str| {
        format!(
            r#"{{"hidden_size": 16, "num_hidden_layers": 2, "state_size": 4, "head_dim": 8,
            "vocab_size": 24 {extra}}}"#
        )
    };
    let text = hf(&format!(r#", "expand": {}"#, u64::MAX));
    cases.push(case(
        "from_json: expand * hidden_size overflowing",
        Expect::Err(&["expand"]),
        move || Mamba2Config::from_json(&text).map(drop),
    ));
    let text = format!(
        r#"{{"hidden_size": 16, "num_hidden_layers": 2, "state_size": 4, "head_dim": 8,
        "vocab_size": {}, "pad_vocab_size_multiple": {}}}"#,
        u64::MAX - 1,
        1u64 << 63
    );
    cases.push(case(
        "from_json: padded vocab overflowing",
        Expect::Err(&["pad_vocab_size_multiple"]),
        move || Mamba2Config::from_json(&text).map(drop),
    ));
    let text = format!(
        r#"{{"d_model": 16, "n_layer": 2, "vocab_size": 24, "ssm_cfg": {{"expand": {}}}}}"#,
        u64::MAX
    );
    cases.push(case(
        "from_json (mamba_ssm): expand * d_model overflowing",
        Expect::Err(&["expand"]),
        move || Mamba2Config::from_json(&text).map(drop),
    ));
    check(cases);
}

/// The tiny model's weights as graph parameters.
fn graph_weights(cfg: &Mamba2Config) -> Result<(Graph, Mamba2Weights<Tensor>)> {
    let g = Graph::new();
    let w = block::weight_parameters(&g, &Mamba2Weights::types(cfg, DType::F32)?)?;
    Ok((g, w))
}

/// A zero layer state of `batch` rows as parameters.
fn layer_state(g: &Graph, cfg: &Mamba2Config, batch: usize) -> Result<LayerState<Tensor>> {
    Ok(LayerState {
        conv: g.zeros(DType::F32, &[batch, cfg.conv_dim(), cfg.conv_kernel])?,
        ssm: g.zeros(
            DType::F32,
            &[batch, cfg.num_heads, cfg.head_dim, cfg.state_size],
        )?,
    })
}

/// Parameters of the given f32 shapes, named `p0`, `p1`, ...
fn params(g: &Graph, shapes: &[&[usize]]) -> Result<Vec<Tensor>> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, dims)| g.parameter(&format!("p{i}"), DType::F32, dims))
        .collect()
}

#[test]
fn ssd_functions_check_their_arguments() {
    // Good shapes: b 1, L 8, H 4, P 2, N 3.
    const X: &[usize] = &[1, 8, 4, 2];
    const DT: &[usize] = &[1, 8, 4];
    const A: &[usize] = &[4];
    const BC: &[usize] = &[1, 8, 4, 3];
    const S: &[usize] = &[1, 4, 2, 3];
    type Shapes = [&'static [usize]; 6];
    let chunked = |shapes: Shapes, chunk: usize| {
        move || -> Result<()> {
            let g = Graph::new();
            let p = params(&g, &shapes)?;
            ssd::ssd_chunked(&p[0], &p[1], &p[2], &p[3], &p[4], Some(&p[5]), chunk).map(drop)
        }
    };
    let recurrent = |shapes: Shapes| {
        move || -> Result<()> {
            let g = Graph::new();
            let p = params(&g, &shapes)?;
            ssd::ssd_recurrent(&p[0], &p[1], &p[2], &p[3], &p[4], &p[5]).map(drop)
        }
    };
    let step = |shapes: Shapes| {
        move || -> Result<()> {
            let g = Graph::new();
            let p = params(&g, &shapes)?;
            ssd::ssd_step(&p[0], &p[1], &p[2], &p[3], &p[4], &p[5]).map(drop)
        }
    };
    const SX: &[usize] = &[1, 4, 2];
    const SDT: &[usize] = &[1, 4];
    const SBC: &[usize] = &[1, 4, 3];
    let mut cases = vec![
        case(
            "ssd_chunked: good",
            Expect::NoPanic,
            chunked([X, DT, A, BC, BC, S], 4),
        ),
        case(
            "ssd_chunked: chunk 0",
            Expect::Err(&["ssd_chunked", "chunk"]),
            chunked([X, DT, A, BC, BC, S], 0),
        ),
        case(
            "ssd_chunked: chunk not dividing L",
            Expect::Err(&["ssd_chunked", "chunk"]),
            chunked([X, DT, A, BC, BC, S], 3),
        ),
        case(
            "ssd_chunked: x of rank 3",
            Expect::Err(&["ssd_chunked", "`x`"]),
            chunked([&[1, 8, 4], DT, A, BC, BC, S], 4),
        ),
        case(
            "ssd_chunked: dt of rank 2",
            Expect::Err(&["ssd_chunked", "`dt`"]),
            chunked([X, &[1, 8], A, BC, BC, S], 4),
        ),
        case(
            "ssd_chunked: a of rank 0",
            Expect::Err(&["ssd_chunked", "`a`"]),
            chunked([X, DT, &[], BC, BC, S], 4),
        ),
        case(
            "ssd_chunked: b_ of rank 1",
            Expect::Err(&["ssd_chunked", "`b_`"]),
            chunked([X, DT, A, &[3], BC, S], 4),
        ),
        case(
            "ssd_chunked: c of another N",
            Expect::Err(&["ssd_chunked", "`c`"]),
            chunked([X, DT, A, BC, &[1, 8, 4, 5], S], 4),
        ),
        case(
            "ssd_chunked: init of another P",
            Expect::Err(&["ssd_chunked", "`init`"]),
            chunked([X, DT, A, BC, BC, &[1, 4, 3, 3]], 4),
        ),
        case(
            "ssd_recurrent: good",
            Expect::NoPanic,
            recurrent([X, DT, A, BC, BC, S]),
        ),
        case(
            "ssd_recurrent: x of rank 2",
            Expect::Err(&["ssd_recurrent", "`x`"]),
            recurrent([&[8, 4], DT, A, BC, BC, S]),
        ),
        case(
            "ssd_recurrent: b_ of rank 2",
            Expect::Err(&["ssd_recurrent", "`b_`"]),
            recurrent([X, DT, A, &[8, 4], BC, S]),
        ),
        case(
            "ssd_recurrent: init of rank 1",
            Expect::Err(&["ssd_recurrent", "`init`"]),
            recurrent([X, DT, A, BC, BC, &[3]]),
        ),
        case(
            "ssd_step: good",
            Expect::NoPanic,
            step([SX, SDT, A, SBC, SBC, S]),
        ),
        case(
            "ssd_step: x of rank 4",
            Expect::Err(&["ssd_step", "`x`"]),
            step([X, SDT, A, SBC, SBC, S]),
        ),
        case(
            "ssd_step: b_ of rank 1",
            Expect::Err(&["ssd_step", "`b_`"]),
            step([SX, SDT, A, &[3], SBC, S]),
        ),
        case(
            "ssd_step: dt of rank 1",
            Expect::Err(&["ssd_step", "`dt`"]),
            step([SX, &[4], A, SBC, SBC, S]),
        ),
        case(
            "ssd_step: state of rank 3",
            Expect::Err(&["ssd_step", "`state`"]),
            step([SX, SDT, A, SBC, SBC, &[1, 4, 2]]),
        ),
    ];
    cases.push(case(
        "segsum: rank 0",
        Expect::Err(&["segsum", "`x`"]),
        || {
            let g = Graph::new();
            ssd::segsum(&g.parameter("x", DType::F32, &[])?).map(drop)
        },
    ));
    cases.push(case(
        "groups_to_heads: rank 1",
        Expect::Err(&["groups_to_heads", "`t`"]),
        || {
            let g = Graph::new();
            ssd::groups_to_heads(&g.parameter("t", DType::F32, &[3])?, 4).map(drop)
        },
    ));
    cases.push(case(
        "groups_to_heads: 0 groups",
        Expect::Err(&["groups_to_heads", "`heads`"]),
        || {
            let g = Graph::new();
            ssd::groups_to_heads(&g.parameter("t", DType::F32, &[1, 8, 0, 3])?, 4).map(drop)
        },
    ));
    cases.push(case(
        "groups_to_heads: heads not a multiple of the groups",
        Expect::Err(&["groups_to_heads", "`heads`"]),
        || {
            let g = Graph::new();
            ssd::groups_to_heads(&g.parameter("t", DType::F32, &[1, 8, 2, 3])?, 3).map(drop)
        },
    ));
    check(cases);
}

#[test]
fn block_builders_check_their_arguments() {
    let cfg = tiny();
    let (h, conv_dim, k) = (cfg.hidden_size, cfg.conv_dim(), cfg.conv_kernel);
    let mut cases = Vec::new();
    // block_prefill
    let prefill_block = |hidden: &'static [usize], mask: &'static [usize], cfg: Mamba2Config| {
        move || -> Result<()> {
            let (g, w) = graph_weights(&tiny())?;
            let p = params(&g, &[hidden, mask])?;
            block::block_prefill(&p[0], &p[1], &w.layers[0], &cfg, None).map(drop)
        }
    };
    cases.push(case(
        "block_prefill: good",
        Expect::NoPanic,
        prefill_block(&[1, 8, 16], &[1, 8], tiny()),
    ));
    cases.push(case(
        "block_prefill: hidden of rank 2",
        Expect::Err(&["block_prefill", "`hidden`"]),
        prefill_block(&[8, 16], &[1, 8], tiny()),
    ));
    cases.push(case(
        "block_prefill: L not a multiple of the chunk",
        Expect::Err(&["block_prefill", "`hidden`", "chunk_size"]),
        prefill_block(&[1, 5, 16], &[1, 5], tiny()),
    ));
    cases.push(case(
        "block_prefill: mask of another length",
        Expect::Err(&["block_prefill", "`mask`"]),
        prefill_block(&[1, 8, 16], &[1, 16], tiny()),
    ));
    cases.push(case(
        "block_prefill: weights of another config",
        Expect::Err(&["block_prefill", "`w`", "mixer.in_proj"]),
        prefill_block(&[1, 8, 32], &[1, 8], tiny_with(|c| c.hidden_size = 32)),
    ));
    cases.push(case(
        "block_prefill: init state of another batch",
        Expect::Err(&["block_prefill", "`init.conv`"]),
        || {
            let (g, w) = graph_weights(&tiny())?;
            let p = params(&g, &[&[1, 8, 16], &[1, 8]])?;
            let init = layer_state(&g, &tiny(), 2)?;
            block::block_prefill(&p[0], &p[1], &w.layers[0], &tiny(), Some(&init)).map(drop)
        },
    ));
    cases.push(case(
        "prefill: init with too few layers",
        Expect::Err(&["prefill", "`init`", "num_layers"]),
        || {
            let (g, w) = graph_weights(&tiny())?;
            let tokens = g.parameter("tokens", DType::I32, &[1, 8])?;
            let mask = g.parameter("mask", DType::F32, &[1, 8])?;
            let init = vec![layer_state(&g, &tiny(), 1)?];
            block::prefill(&tokens, &mask, &w, &tiny(), Some(&init)).map(drop)
        },
    ));
    // block_step
    let step_block = move |hidden: Vec<usize>, conv: Vec<usize>, cfg: Mamba2Config| {
        move || -> Result<()> {
            let (g, w) = graph_weights(&tiny())?;
            let p = params(&g, &[&hidden, &conv])?;
            let mut state = layer_state(&g, &tiny(), 1)?;
            state.conv = p[1].clone();
            block::block_step(&p[0], &state, &w.layers[0], &cfg).map(drop)
        }
    };
    cases.push(case(
        "block_step: good",
        Expect::NoPanic,
        step_block(vec![1, h], vec![1, conv_dim, k], tiny()),
    ));
    cases.push(case(
        "block_step: conv_kernel 0",
        Expect::Err(&["conv_kernel"]),
        step_block(
            vec![1, h],
            vec![1, conv_dim, 0],
            tiny_with(|c| c.conv_kernel = 0),
        ),
    ));
    cases.push(case(
        "block_step: hidden of rank 3",
        Expect::Err(&["block_step", "`hidden`"]),
        step_block(vec![1, 1, h], vec![1, conv_dim, k], tiny()),
    ));
    cases.push(case(
        "block_step: state.conv of another kernel",
        Expect::Err(&["block_step", "`state.conv`"]),
        step_block(vec![1, h], vec![1, conv_dim, k + 1], tiny()),
    ));
    cases.push(case(
        "block_step: a layer without its conv bias",
        Expect::Err(&["block_step", "`w`", "mixer.conv1d_bias"]),
        || {
            let (g, mut w) = graph_weights(&tiny())?;
            w.layers[0].conv_bias = None;
            let hidden = g.parameter("hidden", DType::F32, &[1, 16])?;
            let state = layer_state(&g, &tiny(), 1)?;
            block::block_step(&hidden, &state, &w.layers[0], &tiny()).map(drop)
        },
    ));
    // head, embed
    cases.push(case(
        "head: hidden of another width",
        Expect::Err(&["head", "`hidden`"]),
        || {
            let (g, w) = graph_weights(&tiny())?;
            let hidden = g.parameter("hidden", DType::F32, &[1, 15])?;
            block::head(&hidden, &w, &tiny()).map(drop)
        },
    ));
    cases.push(case(
        "head: untied config, no lm_head",
        Expect::Err(&["head", "`w`", "lm_head"]),
        || {
            let (g, w) = graph_weights(&tiny())?;
            let hidden = g.parameter("hidden", DType::F32, &[1, 16])?;
            let untied = tiny_with(|c| c.tie_word_embeddings = false);
            block::head(&hidden, &w, &untied).map(drop)
        },
    ));
    cases.push(case(
        "embed: float tokens",
        Expect::Err(&["embed", "`tokens`"]),
        || {
            let (g, w) = graph_weights(&tiny())?;
            let tokens = g.parameter("tokens", DType::F32, &[1, 8])?;
            block::embed(&tokens, &w).map(drop)
        },
    ));
    cases.push(case(
        "embed: embedding of rank 1",
        Expect::Err(&["embed", "`w`"]),
        || {
            let (g, mut w) = graph_weights(&tiny())?;
            w.embedding = g.parameter("e", DType::F32, &[24])?;
            let tokens = g.parameter("tokens", DType::I32, &[1, 8])?;
            block::embed(&tokens, &w).map(drop)
        },
    ));
    // prefill, step
    let model_prefill = |tokens: &'static [usize], mask: &'static [usize], layers: usize| {
        move || -> Result<()> {
            let (g, mut w) = graph_weights(&tiny())?;
            w.layers.truncate(layers);
            let t = g.parameter("tokens", DType::I32, tokens)?;
            let m = g.parameter("mask", DType::F32, mask)?;
            block::prefill(&t, &m, &w, &tiny(), None).map(drop)
        }
    };
    cases.push(case(
        "prefill: good",
        Expect::NoPanic,
        model_prefill(&[1, 8], &[1, 8], 2),
    ));
    cases.push(case(
        "prefill: tokens of rank 1",
        Expect::Err(&["prefill", "`tokens`"]),
        model_prefill(&[8], &[8], 2),
    ));
    cases.push(case(
        "prefill: mask of another shape",
        Expect::Err(&["prefill", "`mask`"]),
        model_prefill(&[1, 8], &[2, 8], 2),
    ));
    cases.push(case(
        "prefill: weights with one layer of two",
        Expect::Err(&["prefill", "`w`", "num_layers = 2"]),
        model_prefill(&[1, 8], &[1, 8], 1),
    ));
    let model_step = |tokens: &'static [usize], states: usize| {
        move || -> Result<()> {
            let (g, w) = graph_weights(&tiny())?;
            let t = g.parameter("tokens", DType::I32, tokens)?;
            let s = (0..states)
                .map(|_| layer_state(&g, &tiny(), 1))
                .collect::<Result<Vec<_>>>()?;
            block::step(&t, &s, &w, &tiny()).map(drop)
        }
    };
    cases.push(case("step: good", Expect::NoPanic, model_step(&[1], 2)));
    cases.push(case(
        "step: one state for two layers",
        Expect::Err(&["step", "`states`"]),
        model_step(&[1], 1),
    ));
    cases.push(case(
        "step: tokens of rank 2",
        Expect::Err(&["step", "`tokens`"]),
        model_step(&[1, 1], 2),
    ));
    check(cases);
}

#[test]
fn model_entry_points_check_their_arguments() {
    let model = || -> Result<Mamba2> {
        let w = Mamba2Weights::random(&tiny(), DType::F32, 0)?;
        Mamba2::new(&common::client(), tiny(), &w)
    };
    let greedy = common::greedy(4);
    let mut cases = Vec::new();
    cases.push(case(
        "Mamba2Weights::random: f16 matrices",
        Expect::Err(&["matmul dtype"]),
        || Mamba2Weights::random(&tiny(), DType::F16, 0).map(drop),
    ));
    cases.push(case(
        "Mamba2::new: weights of a config with 3 layers",
        Expect::Err(&["Mamba2::new", "`weights`", "layers.2"]),
        || {
            let w = Mamba2Weights::random(&tiny(), DType::F32, 0)?;
            let three = tiny_with(|c| c.num_layers = 3);
            Mamba2::new(&common::client(), three, &w).map(drop)
        },
    ));
    cases.push(case(
        "Mamba2::new: weights of another width",
        Expect::Err(&["Mamba2::new", "`weights`", "norm_f"]),
        || {
            let w = Mamba2Weights::random(&tiny_with(|c| c.hidden_size = 8), DType::F32, 0)?;
            Mamba2::new(&common::client(), tiny(), &w).map(drop)
        },
    ));
    let options = greedy.clone();
    cases.push(case(
        "Mamba2::stablehlo: batch 0",
        Expect::Err(&["stablehlo", "batch"]),
        move || model()?.stablehlo(0, 8, &options).map(drop),
    ));
    let options = greedy.clone();
    cases.push(case(
        "Mamba2::stablehlo: bucket 0",
        Expect::Err(&["stablehlo", "bucket"]),
        move || model()?.stablehlo(1, 0, &options).map(drop),
    ));
    let options = greedy.clone();
    cases.push(case(
        "Mamba2::stablehlo: bucket not a multiple of the chunk",
        Expect::Err(&["stablehlo", "bucket"]),
        move || model()?.stablehlo(1, 5, &options).map(drop),
    ));
    let options = GenerateOptions {
        eos: Some(24),
        ..greedy.clone()
    };
    cases.push(case(
        "Mamba2::stablehlo: eos outside the vocabulary",
        Expect::Err(&["eos"]),
        move || model()?.stablehlo(1, 8, &options).map(drop),
    ));
    let options = GenerateOptions {
        sampling: Sampling::Sample {
            temperature: -1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        },
        ..greedy.clone()
    };
    cases.push(case(
        "Mamba2::generate: a negative temperature",
        Expect::Err(&["sampling", "temperature"]),
        move || model()?.generate(&[vec![1]], &options).map(drop),
    ));
    let options = greedy.clone();
    cases.push(case(
        "Mamba2::generate: an empty prompt",
        Expect::Err(&["prompt"]),
        move || model()?.generate(&[vec![]], &options).map(drop),
    ));
    cases.push(case(
        "Mamba2::prefill: no prompts",
        Expect::Err(&["prompt"]),
        move || model()?.prefill(&[]).map(drop),
    ));
    cases.push(case(
        "Mamba2::step: a state with no layers",
        Expect::Err(&["state"]),
        move || {
            model()?
                .step(&[1], Mamba2State { layers: Vec::new() })
                .map(drop)
        },
    ));
    check(cases);
}

// ---- training: optim and models::mamba2::train ------------------------------------------------

#[test]
fn training_entry_points_check_their_arguments() {
    use stablegraph::models::mamba2::train::{lm_loss, loss_and_grads, Trainer};
    use stablegraph::optim::{global_norm, AdamW, AdamWState, ParamState};
    fn weights() -> Result<Mamba2Weights<stablegraph::HostArray>> {
        Mamba2Weights::random(&tiny(), DType::F32, 0)
    }
    fn trainer(batch: usize, seq: usize, micro: usize) -> Result<()> {
        Trainer::new(
            &common::client(),
            &tiny(),
            weights()?,
            AdamW::default(),
            batch,
            seq,
            micro,
        )
        .map(drop)
    }
    let mut cases = Vec::new();
    for (name, cfg, field) in bad_configs() {
        let words: &'static [&'static str] = Box::leak(Box::new([field]));
        let c = cfg.clone();
        cases.push(case(name, Expect::Err(words), move || {
            Trainer::new(&common::client(), &c, weights()?, AdamW::default(), 1, 8, 1).map(drop)
        }));
        let c = cfg.clone();
        cases.push(case(name, Expect::Err(words), move || {
            loss_and_grads(&common::client(), &c, &weights()?, &[vec![1, 2]]).map(drop)
        }));
        let c = cfg;
        cases.push(case(name, Expect::Err(words), move || {
            let (g, w) = graph_weights(&tiny())?;
            let ids = g.parameter("ids", DType::I32, &[1, 8])?;
            let ones = g.ones(DType::F32, &[1, 8])?;
            lm_loss(&ids, &ids, &ones, &ones, &w, &c).map(drop)
        }));
    }
    cases.push(case(
        "Trainer::new: batch 0",
        Expect::Err(&["Trainer::new", "batch"]),
        move || trainer(0, 8, 1),
    ));
    cases.push(case(
        "Trainer::new: micro_steps 0",
        Expect::Err(&["Trainer::new", "micro_steps"]),
        move || trainer(1, 8, 0),
    ));
    cases.push(case(
        "Trainer::new: seq_len 0",
        Expect::Err(&["Trainer::new", "seq_len"]),
        move || trainer(1, 0, 1),
    ));
    cases.push(case(
        "Trainer::new: an overflowing batch",
        Expect::Err(&["Trainer::new", "overflows"]),
        move || trainer(usize::MAX / 4, 8, 3),
    ));
    cases.push(case(
        "Trainer::new: more tokens than an i32 counts",
        Expect::Err(&["Trainer::new", "overflows"]),
        move || trainer(1 << 40, 8, 1),
    ));
    cases.push(case(
        "Trainer::new: weights of another width",
        Expect::Err(&["Trainer::new", "`weights`", "norm_f"]),
        move || {
            let w = Mamba2Weights::random(&tiny_with(|c| c.hidden_size = 8), DType::F32, 0)?;
            Trainer::new(&common::client(), &tiny(), w, AdamW::default(), 1, 8, 1).map(drop)
        },
    ));
    cases.push(case(
        "Trainer::new: a learning rate of NaN",
        Expect::Err(&["lr"]),
        move || {
            let opt = AdamW {
                lr: f64::NAN,
                ..AdamW::default()
            };
            Trainer::new(&common::client(), &tiny(), weights()?, opt, 1, 8, 1).map(drop)
        },
    ));
    cases.push(case(
        "loss_and_grads: no prompts",
        Expect::Err(&["loss_and_grads", "prompts"]),
        move || loss_and_grads(&common::client(), &tiny(), &weights()?, &[]).map(drop),
    ));
    cases.push(case(
        "loss_and_grads: an id outside the vocabulary",
        Expect::Err(&["loss_and_grads", "token id 24"]),
        move || loss_and_grads(&common::client(), &tiny(), &weights()?, &[vec![1, 24]]).map(drop),
    ));
    cases.push(case(
        "lm_loss: float inputs",
        Expect::Err(&["lm_loss", "`inputs`"]),
        || {
            let (g, w) = graph_weights(&tiny())?;
            let x = g.ones(DType::F32, &[1, 8])?;
            lm_loss(&x, &x, &x, &x, &w, &tiny()).map(drop)
        },
    ));
    cases.push(case(
        "lm_loss: rows not a multiple of the chunk",
        Expect::Err(&["prefill", "chunk"]),
        || {
            let (g, w) = graph_weights(&tiny())?;
            let ids = g.parameter("ids", DType::I32, &[1, 5])?;
            let ones = g.ones(DType::F32, &[1, 5])?;
            lm_loss(&ids, &ids, &ones, &ones, &w, &tiny()).map(drop)
        },
    ));
    /// An optimizer state over fresh parameters of `dims`, the matrices decayed.
    fn state(g: &Graph, dims: &[&[usize]]) -> Result<AdamWState> {
        let p = params(g, dims)?;
        AdamWState::new(
            p.into_iter()
                .map(|t| {
                    let decay = t.rank() >= 2;
                    ParamState::new(t, decay)
                })
                .collect::<Result<_>>()?,
        )
    }
    cases.push(case(
        "AdamW::update: m of another shape",
        Expect::Err(&["AdamW::update", "m[1]"]),
        || {
            let g = Graph::new();
            let mut s = state(&g, &[&[2, 3], &[4]])?;
            s.params[1].m = g.zeros(DType::F32, &[5])?;
            let grads = s.params();
            AdamW::default().update(&s, &grads, None).map(drop)
        },
    ));
    cases.push(case(
        "AdamW::update: a negative weight decay",
        Expect::Err(&["weight_decay"]),
        || {
            let g = Graph::new();
            let s = state(&g, &[&[2]])?;
            let opt = AdamW {
                weight_decay: -1.0,
                ..AdamW::default()
            };
            opt.update(&s, &s.params(), None).map(drop)
        },
    ));
    cases.push(case(
        "AdamW::update: no parameters",
        Expect::NoPanic,
        || {
            let g = Graph::new();
            let s = AdamWState {
                params: Vec::new(),
                step: g.scalar(1.0, DType::I32)?,
            };
            AdamW::default().update(&s, &[], None).map(drop)?;
            let clipping = AdamW {
                clip_norm: Some(1.0),
                ..AdamW::default()
            };
            clipping.update(&s, &[], None).map(drop)
        },
    ));
    cases.push(case(
        "global_norm: integer gradients",
        Expect::Err(&["global_norm", "grads[0]"]),
        || {
            let g = Graph::new();
            let ids = g.parameter("ids", DType::I32, &[3])?;
            global_norm(&[ids]).map(drop)
        },
    ));
    check(cases);
}

/// A model refuses tokens outside its vocabulary, empty batches and prompts, and a state of
/// another batch size; generating no tokens is not an error.
#[test]
fn a_model_refuses_bad_prompts_and_states() {
    let m = common::tiny_model(DType::F32);
    let v = m.config().vocab_size as u32;
    assert_err(m.prefill(&[vec![1, v]]), &["outside the vocabulary"]);
    assert!(m.prefill(&[]).is_err());
    assert!(m.prefill(&[vec![]]).is_err());
    let none = common::greedy(0);
    assert_eq!(
        m.generate(&[vec![1], vec![2, 3]], &none).unwrap(),
        vec![Vec::<u32>::new(); 2]
    );
    let pre = m.prefill(&[vec![1, 2]]).unwrap();
    assert!(
        m.step(&[1, 2], pre.state).is_err(),
        "batch of 2 against a state of 1"
    );
}
