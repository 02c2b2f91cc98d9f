//! General convolution and pooling compiled and interpreted against a direct host loop over the
//! definition (every output position, every tap, the input's coordinate worked out through
//! padding and both dilations): 1-, 2- and 3-D, strides, VALID / SAME / explicit (negative
//! included) padding, input and kernel dilation, feature groups; and the errors.

use super::*;
use stablegraph::ops::{ConvOptions, Padding};

/// One convolution's settings: input dims, kernel dims and the options.
struct Case {
    x: Vec<usize>,
    k: Vec<usize>,
    opts: ConvOptions,
}

/// The padding `(low, high)` per axis as the definition gives it (JAX's SAME rule).
fn host_pads(c: &Case, window: &[usize], strides: &[usize]) -> Vec<(isize, isize)> {
    let d = c.x.len() - 2;
    match &c.opts.padding {
        Padding::Valid => vec![(0, 0); d],
        Padding::Explicit(p) => p.clone(),
        Padding::Same => (0..d)
            .map(|i| {
                let n = c.x[2 + i];
                let out = n.div_ceil(strides[i]);
                let total = ((out - 1) * strides[i] + window[i]).saturating_sub(n) as isize;
                (total / 2, total - total / 2)
            })
            .collect(),
    }
}

fn or_ones(v: &[usize], d: usize) -> Vec<usize> {
    if v.is_empty() {
        vec![1; d]
    } else {
        v.to_vec()
    }
}

/// The convolution by its definition.
fn host_conv(c: &Case, x: &[f64], k: &[f64]) -> (Vec<usize>, Vec<f64>) {
    let d = c.x.len() - 2;
    let (s, ld, rd) = (
        or_ones(&c.opts.strides, d),
        or_ones(&c.opts.lhs_dilation, d),
        or_ones(&c.opts.rhs_dilation, d),
    );
    let window: Vec<usize> = (0..d).map(|i| (c.k[2 + i] - 1) * rd[i] + 1).collect();
    let pads = host_pads(c, &window, &s);
    let padded: Vec<isize> = (0..d)
        .map(|i| ((c.x[2 + i] - 1) * ld[i] + 1) as isize + pads[i].0 + pads[i].1)
        .collect();
    let out: Vec<usize> = (0..d)
        .map(|i| ((padded[i] - window[i] as isize) / s[i] as isize + 1) as usize)
        .collect();
    let groups = c.opts.feature_group_count;
    let (n, cin, o) = (c.x[0], c.x[1], c.k[0]);
    let (cg, og) = (cin / groups, o / groups);
    let mut dims = vec![n, o];
    dims.extend(&out);
    let total: usize = dims.iter().product();
    let taps: usize = c.k[2..].iter().product();
    let mut y = vec![0.0; total];
    for (flat, yv) in y.iter_mut().enumerate() {
        let idx = unravel(flat, &dims);
        let (b, oc) = (idx[0], idx[1]);
        let g = oc / og;
        for ci in 0..cg {
            for t in 0..taps {
                let tap = unravel(t, &c.k[2..]);
                let mut xi = vec![b, g * cg + ci];
                let mut inside = true;
                for i in 0..d {
                    // Position in the padded, dilated input, then in the original one.
                    let p = (idx[2 + i] * s[i] + tap[i] * rd[i]) as isize - pads[i].0;
                    if p < 0 || p % ld[i] as isize != 0 || p / ld[i] as isize >= c.x[2 + i] as isize
                    {
                        inside = false;
                        break;
                    }
                    xi.push((p / ld[i] as isize) as usize);
                }
                if inside {
                    let mut ki = vec![oc, ci];
                    ki.extend(&tap);
                    *yv += x[ravel(&xi, &c.x)] * k[ravel(&ki, &c.k)];
                }
            }
        }
    }
    (dims, y)
}

fn cases() -> Vec<Case> {
    let o = |strides: &[usize], padding: Padding, ld: &[usize], rd: &[usize], groups| ConvOptions {
        strides: strides.to_vec(),
        padding,
        lhs_dilation: ld.to_vec(),
        rhs_dilation: rd.to_vec(),
        feature_group_count: groups,
        ..ConvOptions::default()
    };
    vec![
        Case {
            x: vec![2, 3, 9],
            k: vec![4, 3, 3],
            opts: o(&[], Padding::Valid, &[], &[], 1),
        },
        Case {
            x: vec![1, 2, 10],
            k: vec![2, 2, 4],
            opts: o(&[3], Padding::Same, &[], &[2], 1),
        },
        Case {
            x: vec![2, 4, 7, 6],
            k: vec![6, 2, 3, 2],
            opts: o(&[2, 1], Padding::Same, &[], &[], 2),
        },
        Case {
            x: vec![1, 2, 5, 6],
            k: vec![3, 2, 2, 3],
            opts: o(
                &[1, 2],
                Padding::Explicit(vec![(2, 1), (-1, 2)]),
                &[2, 1],
                &[1, 2],
                1,
            ),
        },
        Case {
            x: vec![1, 3, 4, 5, 4],
            k: vec![3, 1, 2, 2, 3],
            opts: o(&[2, 1, 1], Padding::Same, &[], &[], 3),
        },
        Case {
            x: vec![3, 1, 8, 8],
            k: vec![2, 1, 5, 5],
            opts: o(&[], Padding::Same, &[2, 2], &[], 1),
        },
    ]
}

#[test]
fn convolutions_match_their_definition() -> Result<()> {
    let mut rng = Rng::new(51);
    for (i, c) in cases().into_iter().enumerate() {
        let g = Graph::new();
        let x = g.parameter("x", F64, &c.x)?;
        let k = g.parameter("k", F64, &c.k)?;
        let y = x.conv_general_dilated(&k, &c.opts)?;
        g.set_outputs(&[&y])?;
        let (xv, kv) = (
            rng.array(F64, &c.x, -1.0, 1.0),
            rng.array(F64, &c.k, -1.0, 1.0),
        );
        let (dims, want) = host_conv(&c, &xv.to_f64_vec(), &kv.to_f64_vec());
        assert_eq!(y.dims(), dims.as_slice(), "case {i}: {:?}", c.opts);
        let host = g.evaluate(&[xv.clone(), kv.clone()])?;
        let dev = g.compile(&client())?.run(&[xv, kv])?;
        for (what, got) in [("interpreter", &host[0]), ("compiled", &dev[0])] {
            for (a, b) in got.to_f64_vec().iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                    "case {i} ({what}): {a} vs {b}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn pools_match_their_definition() -> Result<()> {
    let mut rng = Rng::new(53);
    let g = Graph::new();
    let x = g.parameter("x", F64, &[2, 3, 7, 6])?;
    let max = x.max_pool(&[2, 3], &[2, 2], &Padding::Same)?;
    let avg = x.avg_pool(&[3, 2], &[], &Padding::Valid)?;
    g.set_outputs(&[&max, &avg])?;
    let xv = rng.array(F64, &[2, 3, 7, 6], -1.0, 1.0);
    let host = g.evaluate(std::slice::from_ref(&xv))?;
    let dev = g.compile(&client())?.run(std::slice::from_ref(&xv))?;
    let x = xv.to_f64_vec();
    let at = |b: usize, c: usize, h: isize, w: isize| -> Option<f64> {
        ((0..7).contains(&h) && (0..6).contains(&w))
            .then(|| x[((b * 3 + c) * 7 + h as usize) * 6 + w as usize])
    };
    // max: SAME over 7 x 6 with stride 2: 4 x 3 outputs, padding (0, 1) and (0, 1).
    let mut want_max = Vec::new();
    let mut want_avg = Vec::new();
    for b in 0..2 {
        for c in 0..3 {
            for oh in 0..4isize {
                for ow in 0..3isize {
                    let vals = (0..2)
                        .flat_map(|i| (0..3).filter_map(move |j| at(b, c, 2 * oh + i, 2 * ow + j)));
                    want_max.push(vals.fold(f64::NEG_INFINITY, f64::max));
                }
            }
            // avg: VALID 3 x 2 windows, stride = window: 2 x 3 outputs.
            for oh in 0..2isize {
                for ow in 0..3isize {
                    let sum: f64 = (0..3)
                        .flat_map(|i| (0..2).filter_map(move |j| at(b, c, 3 * oh + i, 2 * ow + j)))
                        .sum();
                    want_avg.push(sum / 6.0);
                }
            }
        }
    }
    assert_eq!(max.dims(), &[2, 3, 4, 3]);
    assert_eq!(avg.dims(), &[2, 3, 2, 3]);
    for out in [&host, &dev] {
        for (k, want) in [(0, &want_max), (1, &want_avg)] {
            for (a, b) in out[k].to_f64_vec().iter().zip(want.iter()) {
                assert!((a - b).abs() <= 1e-12, "output {k}: {a} vs {b}");
            }
        }
    }
    Ok(())
}

#[test]
fn convolutions_check_their_operands() -> Result<()> {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[1, 4, 5, 5])?;
    let msg = |r: Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let k = g.parameter("k", F32, &[2, 3, 3, 3])?;
    let e = msg(x.conv_general_dilated(&k, &ConvOptions::default()));
    assert!(
        e.contains("the input has 4 features, but the kernel takes 3"),
        "{e}"
    );
    let k = g.parameter("k2", F32, &[2, 4, 3, 3])?;
    let opts = ConvOptions {
        strides: vec![1],
        ..ConvOptions::default()
    };
    let e = msg(x.conv_general_dilated(&k, &opts));
    assert!(
        e.contains("strides [1]: needs one entry of at least 1 per spatial axis (2)"),
        "{e}"
    );
    let k = g.parameter("k3", F32, &[2, 4, 7, 1])?;
    let e = msg(x.conv_general_dilated(&k, &ConvOptions::default()));
    assert!(
        e.contains("a window of 7 does not fit the padded size 5"),
        "{e}"
    );
    let e = msg(x.max_pool(&[2], &[], &Padding::Valid));
    assert!(e.contains("a window per spatial axis"), "{e}");
    let k = g.parameter("k4", F32, &[2, 4, 3, 3])?;
    let e = msg(x.conv2d(&k, Some(&x), &ConvOptions::default()));
    assert!(
        e.contains("the bias must be f32[2], got f32[1, 4, 5, 5]"),
        "{e}"
    );
    Ok(())
}
