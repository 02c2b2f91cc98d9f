//! Convolution and pooling with their gradients against JAX's `lax.conv_general_dilated` and
//! `lax.reduce_window` on recorded fixtures (`tests/fixtures/jax/make_fixtures.py`), and
//! against finite differences.

use super::{check, common};
use stablegraph::ops::{ConvOptions, Graph, Padding};
use stablegraph::{DType, HostArray};

use DType::F64;

#[test]
fn convolution_and_pooling_match_jax_with_their_gradients() {
    let text = std::fs::read_to_string("tests/fixtures/jax/transforms.json").unwrap();
    let fixtures: serde_json::Value = serde_json::from_str(&text).unwrap();
    let c = &fixtures["conv"];
    let get = |k: &str| -> Vec<f64> {
        c[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let g = Graph::new();
    let x = g.parameter("x", F64, &[2, 4, 6, 5]).unwrap();
    let w = g.parameter("w", F64, &[6, 2, 3, 2]).unwrap();
    let opts = ConvOptions {
        strides: vec![2, 1],
        padding: Padding::Explicit(vec![(1, 0), (2, 1)]),
        lhs_dilation: vec![1, 2],
        rhs_dilation: vec![2, 1],
        feature_group_count: 2,
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
