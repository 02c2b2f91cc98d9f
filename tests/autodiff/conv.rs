//! Convolution and pooling with their gradients against JAX's `lax.conv_general_dilated` and
//! `lax.reduce_window` on recorded fixtures (`tests/fixtures/jax/make_fixtures.py`; NHWC /
//! HWIO layouts at the highest precision from `make_functions.py`), and against finite
//! differences; other layouts against the default one on transposed operands.

use super::{check, common};
use common::jax::JaxFixture;
use stablegraph::ops::{ConvDimensionNumbers, ConvOptions, Graph, Padding, Precision, Tensor};
use stablegraph::{DType, HostArray};

use DType::F64;

#[test]
fn convolution_and_pooling_match_jax_with_their_gradients() {
    let c = JaxFixture::load("transforms.json", "conv");
    let get = |k: &str| c.values(k);
    let g = Graph::new();
    let x = g.parameter("x", F64, &[2, 4, 6, 5]).unwrap();
    let w = g.parameter("w", F64, &[6, 2, 3, 2]).unwrap();
    let opts = ConvOptions {
        strides: vec![2, 1],
        padding: Padding::Explicit(vec![(1, 0), (2, 1)]),
        lhs_dilation: vec![1, 2],
        rhs_dilation: vec![2, 1],
        feature_group_count: 2,
        ..ConvOptions::default()
    };
    let y = x.conv_general_dilated(&w, &opts).unwrap();
    assert_eq!(y.dims(), &[2, 6, 2, 11]);
    let r = g.parameter("r", F64, y.dims()).unwrap();
    let grads = y
        .mul(&r)
        .unwrap()
        .sum_all()
        .unwrap()
        .grad(&[&x, &w])
        .unwrap();
    let p = g.parameter("p", F64, &[2, 3, 7, 6]).unwrap();
    let max = p.max_pool(&[2, 3], &[2, 2], &Padding::Same).unwrap();
    let avg = p.avg_pool(&[3, 2], &[], &Padding::Valid).unwrap();
    let rm = g.parameter("rm", F64, max.dims()).unwrap();
    let ra = g.parameter("ra", F64, avg.dims()).unwrap();
    let pooled = max.mul(&rm).unwrap().sum_all().unwrap();
    let pooled = pooled
        .add(avg.mul(&ra).unwrap().sum_all().unwrap())
        .unwrap();
    let gp = pooled.grad(&[&p]).unwrap().remove(0);
    g.set_outputs(&[&y, &grads[0], &grads[1], &max, &avg, &gp])
        .unwrap();
    let arr = |k: &str, dims: &[usize]| HostArray::from_vec(dims, get(k)).unwrap();
    let inputs = [
        arr("x", &[2, 4, 6, 5]),
        arr("w", &[6, 2, 3, 2]),
        arr("r", &[2, 6, 2, 11]),
        arr("p", &[2, 3, 7, 6]),
        arr("rm", max.dims()),
        arr("ra", avg.dims()),
    ];
    let host = g.evaluate(&inputs).unwrap();
    let compiled = g.compile(&common::client()).unwrap().run(&inputs).unwrap();
    for (k, key) in ["y", "gx", "gw", "max", "avg", "gp"].iter().enumerate() {
        let want = get(key);
        for (what, got) in [("interpreter", &host[k]), ("compiled", &compiled[k])] {
            let got = got.to_f64_vec();
            assert_eq!(got.len(), want.len(), "{key}");
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                    "{key} ({what}): {a} vs JAX {b}"
                );
            }
        }
    }
}

#[test]
fn convolution_and_pooling_gradients_match_finite_differences() {
    let mut rng = common::Rng::new(61);
    check(
        "conv_general_dilated",
        vec![
            rng.array(F64, &[1, 4, 5, 4], -1.0, 1.0),
            rng.array(F64, &[4, 2, 2, 3], -1.0, 1.0),
        ],
        |p| {
            let opts = ConvOptions {
                strides: vec![1, 2],
                padding: Padding::Same,
                lhs_dilation: vec![2, 1],
                rhs_dilation: vec![1, 2],
                feature_group_count: 2,
                ..ConvOptions::default()
            };
            p[0].conv_general_dilated(&p[1], &opts)
        },
    );
    check(
        "conv1d_cropped_3d",
        vec![
            rng.array(F64, &[2, 2, 9], -1.0, 1.0),
            rng.array(F64, &[3, 2, 2], -1.0, 1.0),
        ],
        |p| {
            // Negative padding crops, and a stride of 3 leaves the input's tail unread.
            let opts = ConvOptions {
                strides: vec![3],
                padding: Padding::Explicit(vec![(-1, 1)]),
                ..ConvOptions::default()
            };
            p[0].conv_general_dilated(&p[1], &opts)
        },
    );
    check(
        "conv3d_grouped",
        vec![
            rng.array(F64, &[1, 4, 3, 4, 3], -1.0, 1.0),
            rng.array(F64, &[2, 2, 2, 2, 1], -1.0, 1.0),
        ],
        |p| {
            let opts = ConvOptions {
                strides: vec![1, 2, 1],
                padding: Padding::Explicit(vec![(0, 1), (1, 0), (0, 0)]),
                rhs_dilation: vec![2, 1, 1],
                feature_group_count: 2,
                ..ConvOptions::default()
            };
            p[0].conv_general_dilated(&p[1], &opts)
        },
    );
    check(
        "conv2d_bias",
        vec![
            rng.array(F64, &[2, 3, 5, 5], -1.0, 1.0),
            rng.array(F64, &[2, 3, 3, 3], -1.0, 1.0),
            rng.array(F64, &[2], -1.0, 1.0),
        ],
        |p| {
            let opts = ConvOptions {
                padding: Padding::Explicit(vec![(1, 1), (1, 1)]),
                ..ConvOptions::default()
            };
            p[0].conv2d(&p[1], Some(&p[2]), &opts)
        },
    );
    check(
        "pools",
        vec![rng.array(F64, &[1, 2, 5, 6], -1.0, 1.0)],
        |p| {
            let max = p[0].max_pool(&[2, 2], &[1, 2], &Padding::Valid)?;
            let avg = p[0].avg_pool(&[2, 3], &[2, 1], &Padding::Same)?;
            max.sum_all()?.add(&avg.sum_all()?)?.reshape(&[1])
        },
    );
}

/// The options of the `conv_nhwc` fixture (`make_functions.py`): JAX's
/// `conv_general_dilated(x, w, (2, 1), ((1, 0), (2, 1)), (1, 2), (2, 1), ("NHWC", "HWIO",
/// "NHWC"), feature_group_count=2, precision=HIGHEST)`.
fn nhwc_options() -> ConvOptions {
    ConvOptions {
        strides: vec![2, 1],
        padding: Padding::Explicit(vec![(1, 0), (2, 1)]),
        lhs_dilation: vec![1, 2],
        rhs_dilation: vec![2, 1],
        feature_group_count: 2,
        dimension_numbers: Some(ConvDimensionNumbers::new("NHWC", "HWIO", "NHWC")),
        precision: Precision::Highest,
    }
}

#[test]
fn nhwc_convolution_at_highest_precision_matches_jax_with_its_gradients() {
    let c = JaxFixture::load("functions.json", "conv_nhwc");
    let get = |k: &str| c.values(k);
    let out_dims: Vec<usize> = JaxFixture::load("functions.json", "conv_nhwc_out_dims")
        .0
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let g = Graph::new();
    let x = g.parameter("x", F64, &[2, 6, 5, 4]).unwrap();
    let w = g.parameter("w", F64, &[3, 2, 2, 6]).unwrap();
    let y = x.conv_general_dilated(&w, &nhwc_options()).unwrap();
    assert_eq!(y.dims(), out_dims.as_slice());
    assert_eq!(y.dims(), &[2, 2, 11, 6]);
    let r = g.parameter("r", F64, y.dims()).unwrap();
    let loss = y.mul(&r).unwrap().sum_all().unwrap();
    let grads = loss.grad(&[&x, &w]).unwrap();
    g.set_outputs(&[&y, &grads[0], &grads[1]]).unwrap();
    let inputs = [
        HostArray::from_vec(&[2, 6, 5, 4], get("x")).unwrap(),
        HostArray::from_vec(&[3, 2, 2, 6], get("w")).unwrap(),
        HostArray::from_vec(&out_dims, get("r")).unwrap(),
    ];
    let host = g.evaluate(&inputs).unwrap();
    let compiled = g.compile(&common::client()).unwrap().run(&inputs).unwrap();
    for (k, key) in ["y", "gx", "gw"].iter().enumerate() {
        let want = get(key);
        for (what, got) in [("interpreter", &host[k]), ("compiled", &compiled[k])] {
            let got = got.to_f64_vec();
            assert_eq!(got.len(), want.len(), "{key}");
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-10 * b.abs().max(1.0),
                    "{key} ({what}): {a} vs JAX {b}"
                );
            }
        }
    }
    // The precision is in the program, on the convolution and on both of its transposes.
    let text = g.to_stablehlo().unwrap();
    let highest = "precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision \
                   HIGHEST>]";
    // One forward, one for the input's cotangent, one per group for the kernel's.
    assert_eq!(text.matches("stablehlo.convolution").count(), 4, "{text}");
    assert_eq!(text.matches(highest).count(), 4, "{text}");
}

#[test]
fn conv2d_adds_its_bias_on_the_output_layouts_feature_axis() {
    let mut rng = common::Rng::new(71);
    let g = Graph::new();
    let x = g.parameter("x", F64, &[2, 5, 4, 3]).unwrap();
    let w = g.parameter("w", F64, &[2, 2, 3, 4]).unwrap();
    let b = g.parameter("b", F64, &[4]).unwrap();
    let nhwc = ConvOptions {
        dimension_numbers: Some(ConvDimensionNumbers::new("NHWC", "HWIO", "NHWC")),
        ..ConvOptions::default()
    };
    let y = x.conv2d(&w, Some(&b), &nhwc).unwrap();
    let want = x.conv_general_dilated(&w, &nhwc).unwrap().add(&b).unwrap();
    assert_eq!(y.dims(), &[2, 4, 3, 4]);
    g.set_outputs(&[&y, &want]).unwrap();
    let out = g
        .evaluate(&[
            rng.array(F64, &[2, 5, 4, 3], -1.0, 1.0),
            rng.array(F64, &[2, 2, 3, 4], -1.0, 1.0),
            rng.array(F64, &[4], -1.0, 1.0),
        ])
        .unwrap();
    assert_eq!(out[0].to_f64_vec(), out[1].to_f64_vec());
}

#[test]
fn the_default_precision_writes_no_precision_config() {
    let g = Graph::new();
    let x = g.parameter("x", F64, &[1, 2, 5]).unwrap();
    let w = g.parameter("w", F64, &[3, 2, 2]).unwrap();
    let high = ConvOptions {
        precision: Precision::High,
        ..ConvOptions::default()
    };
    let y = x.conv_general_dilated(&w, &ConvOptions::default()).unwrap();
    let z = x.conv_general_dilated(&w, &high).unwrap();
    g.set_outputs(&[&y, &z]).unwrap();
    let text = g.to_stablehlo().unwrap();
    assert_eq!(text.matches("precision_config").count(), 1, "{text}");
    assert!(text
        .contains("precision_config = [#stablehlo<precision HIGH>, #stablehlo<precision HIGH>]"));
}

/// A convolution in the layouts `dn` of `x` and `k` (given in those layouts) equals the default
/// layout's on the operands transposed by `to_x` and `to_k`, its result transposed back by
/// `from_y`; interpreted and compiled, with the gradients (which follow the transposes).
fn same_as_nchw(dn: [&str; 3], x: HostArray, k: HostArray, perms: [&[isize]; 3], o: ConvOptions) {
    let g = Graph::new();
    let xp = g.parameter("x", F64, x.dims()).unwrap();
    let kp = g.parameter("k", F64, k.dims()).unwrap();
    let laid = ConvOptions {
        dimension_numbers: Some(ConvDimensionNumbers::new(dn[0], dn[1], dn[2])),
        ..o.clone()
    };
    let y = xp.conv_general_dilated(&kp, &laid).unwrap();
    let nchw = xp
        .transpose(perms[0])
        .unwrap()
        .conv_general_dilated(&kp.transpose(perms[1]).unwrap(), &o)
        .unwrap()
        .transpose(perms[2])
        .unwrap();
    assert_eq!(y.dims(), nchw.dims(), "{dn:?}");
    let weights = |t: &Tensor| t.mul(t.sin().unwrap()).unwrap().sum_all().unwrap();
    let gy = weights(&y).grad(&[&xp, &kp]).unwrap();
    let gn = weights(&nchw).grad(&[&xp, &kp]).unwrap();
    g.set_outputs(&[&y, &nchw, &gy[0], &gn[0], &gy[1], &gn[1]])
        .unwrap();
    let inputs = [x, k];
    let host = g.evaluate(&inputs).unwrap();
    let compiled = g.compile(&common::client()).unwrap().run(&inputs).unwrap();
    for out in [&host, &compiled] {
        for pair in out.chunks(2) {
            let (a, b) = (pair[0].to_f64_vec(), pair[1].to_f64_vec());
            assert_eq!(pair[0].dims(), pair[1].dims(), "{dn:?}");
            assert!(common::max_abs(&a, &b) <= 1e-12, "{dn:?}");
        }
    }
}

#[test]
fn any_layout_equals_the_default_one_on_transposed_operands() {
    let mut rng = common::Rng::new(67);
    let mut arr = |dims: &[usize]| rng.array(F64, dims, -1.0, 1.0);
    let grouped = ConvOptions {
        strides: vec![1, 2],
        padding: Padding::Same,
        rhs_dilation: vec![2, 1],
        feature_group_count: 2,
        ..ConvOptions::default()
    };
    // NHWC / HWIO / NCHW: [N, H, W, C] -> [N, C, H, W]; [H, W, I, O] -> [O, I, H, W].
    same_as_nchw(
        ["NHWC", "HWIO", "NCHW"],
        arr(&[2, 5, 6, 4]),
        arr(&[3, 2, 2, 6]),
        [&[0, 3, 1, 2], &[3, 2, 0, 1], &[0, 1, 2, 3]],
        grouped.clone(),
    );
    // The kernel's order of the spatial letters is the one the options follow: W before H.
    // CWHN / WIHO / WNHC with strides (2, 1) along (W, H).
    same_as_nchw(
        ["CWHN", "WIHO", "WNHC"],
        arr(&[4, 7, 5, 2]),
        arr(&[2, 2, 3, 6]),
        [&[3, 0, 1, 2], &[3, 1, 0, 2], &[2, 0, 3, 1]],
        ConvOptions {
            strides: vec![2, 1],
            feature_group_count: 2,
            ..ConvOptions::default()
        },
    );
    // 1-D and 3-D.
    same_as_nchw(
        ["NWC", "WIO", "NWC"],
        arr(&[2, 7, 3]),
        arr(&[3, 3, 2]),
        [&[0, 2, 1], &[2, 1, 0], &[0, 2, 1]],
        ConvOptions {
            lhs_dilation: vec![2],
            ..ConvOptions::default()
        },
    );
    same_as_nchw(
        ["NDHWC", "DHWIO", "NDHWC"],
        arr(&[1, 3, 4, 3, 2]),
        arr(&[2, 2, 1, 2, 3]),
        [&[0, 4, 1, 2, 3], &[4, 3, 0, 1, 2], &[0, 2, 3, 4, 1]],
        ConvOptions::default(),
    );
}
