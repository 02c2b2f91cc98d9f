//! The chunked SSD equals the naive recurrence, on random inputs, in the interpreter and on the
//! device; the groups-to-heads mapping and segsum follow their definitions.

use crate::common;

use common::{array_diff, client, Rng};
use stablegraph::models::mamba2::ssd::{groups_to_heads, segsum, ssd_chunked, ssd_recurrent};
use stablegraph::ops::Graph;
use stablegraph::{DType, HostArray};

#[test]
fn chunked_ssd_equals_the_recurrence() {
    let (bs, len, h, p, n, chunk) = (2, 12, 4, 3, 5, 4);
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[bs, len, h, p]).unwrap();
    let dt = g.parameter("dt", DType::F32, &[bs, len, h]).unwrap();
    let a = g.parameter("a", DType::F32, &[h]).unwrap();
    let b = g.parameter("b", DType::F32, &[bs, len, h, n]).unwrap();
    let c = g.parameter("c", DType::F32, &[bs, len, h, n]).unwrap();
    let init = g.parameter("init", DType::F32, &[bs, h, p, n]).unwrap();
    let (y1, s1) = ssd_chunked(&x, &dt, &a, &b, &c, Some(&init), chunk).unwrap();
    let (y2, s2) = ssd_recurrent(&x, &dt, &a, &b, &c, &init).unwrap();
    g.set_outputs(&[&y1, &s1, &y2, &s2]).unwrap();

    let mut rng = Rng::new(11);
    let inputs = [
        rng.array(DType::F32, &[bs, len, h, p], -1.0, 1.0),
        rng.array(DType::F32, &[bs, len, h], 0.01, 0.3),
        rng.array(DType::F32, &[h], -2.0, -0.5),
        rng.array(DType::F32, &[bs, len, h, n], -1.0, 1.0),
        rng.array(DType::F32, &[bs, len, h, n], -1.0, 1.0),
        rng.array(DType::F32, &[bs, h, p, n], -1.0, 1.0),
    ];
    let reference = g.evaluate(&inputs).unwrap();
    let device = g.compile(&client()).unwrap().run(&inputs).unwrap();
    for out in [&reference, &device] {
        let dy = array_diff(&out[0], &out[2]);
        let ds = array_diff(&out[1], &out[3]);
        assert!(
            dy < 1e-5 && ds < 1e-5,
            "chunked vs recurrent: y {dy:e}, state {ds:e}"
        );
    }
    assert!(array_diff(&reference[0], &device[0]) < 1e-5);
    assert!(array_diff(&reference[1], &device[1]) < 1e-5);
}

#[test]
fn segsum_and_groups_follow_their_definitions() {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[2, 4]).unwrap();
    let s = segsum(&x).unwrap();
    let grp = g.parameter("grp", DType::F32, &[1, 1, 2, 3]).unwrap();
    let heads = groups_to_heads(&grp, 4).unwrap();
    g.set_outputs(&[&s, &heads]).unwrap();
    let xs = [0.5f32, -1.0, 2.0, 0.25, 1.0, 1.0, -3.0, 0.5];
    let gv: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let out = g
        .evaluate(&[
            HostArray::from_vec(&[2, 4], xs.to_vec()).unwrap(),
            HostArray::from_vec(&[1, 1, 2, 3], gv.clone()).unwrap(),
        ])
        .unwrap();
    let seg = out[0].to_f64_vec();
    for r in 0..2 {
        for i in 0..4 {
            for j in 0..4 {
                let got = seg[r * 16 + i * 4 + j];
                if j > i {
                    assert_eq!(got, f64::NEG_INFINITY);
                } else {
                    let want: f64 = (j + 1..=i).map(|k| f64::from(xs[r * 4 + k])).sum();
                    assert!((got - want).abs() < 1e-6, "[{r},{i},{j}] {got} vs {want}");
                }
            }
        }
    }
    // Heads 0 and 1 read group 0, heads 2 and 3 group 1.
    let hv = out[1].to_f64_vec();
    for head in 0..4 {
        for k in 0..3 {
            assert_eq!(hv[head * 3 + k], f64::from(gv[(head / 2) * 3 + k]));
        }
    }
}

#[test]
fn segsum_is_accurate_over_a_long_chunk() {
    // Decays A*dt of a 256-step chunk, all negative (as in the model), summing to about -256.
    let (rows, t) = (3, 256);
    let mut rng = Rng::new(11);
    let xs = rng.f32s(rows * t, -2.0, 0.0);
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[rows, t]).unwrap();
    g.set_outputs(&[&segsum(&x).unwrap()]).unwrap();
    let input = HostArray::from_vec(&[rows, t], xs.clone()).unwrap();
    let device = g
        .compile(&client())
        .unwrap()
        .run(std::slice::from_ref(&input))
        .unwrap();
    let interp = g.evaluate(&[input]).unwrap();
    for (name, out) in [("device", &device[0]), ("interpreter", &interp[0])] {
        let seg = out.to_f64_vec();
        let mut worst: f64 = 0.0;
        for r in 0..rows {
            for i in 0..t {
                for j in 0..=i {
                    // The exact segment sum (f64 sums of at most 256 f32 values are exact to
                    // ~1e-13 here), and one f32 ulp of it.
                    let want: f64 = (j + 1..=i).map(|k| f64::from(xs[r * t + k])).sum();
                    let ulp =
                        f64::from(f32::EPSILON) * want.abs().max(f64::from(f32::MIN_POSITIVE));
                    let err = (seg[(r * t + i) * t + j] - want).abs();
                    worst = worst.max(err / ulp);
                }
            }
        }
        assert!(worst <= 0.5 + 1e-3, "{name}: worst error {worst} f32 ulps");
    }
}
