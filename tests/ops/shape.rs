//! Creating arrays (constants, full, iota) and changing their shape: reshape, transpose,
//! broadcast, squeeze, slices, reverse, pad, concat, split and chunk.

use super::*;

#[test]
fn constants_of_every_dtype() {
    let mut s = Suite::new("constants", 1001);
    for dtype in DType::ALL {
        for k in 0..4 {
            let dims = match k {
                0 => vec![],
                1 => vec![2, 0, 3],
                _ => shape(&mut s.rng, 0, 3),
            };
            s.case(format!("constant {dtype}{dims:?}"));
            let d = if dtype == Pred {
                Dist::Bool(0.5)
            } else if k == 3 && dtype.is_float() {
                with(Dist::LogU(-40.0, 40.0), &SPECIALS, 0.3)
            } else {
                Dist::Bits
            };
            let v = random_array(&mut s.rng, dtype, &dims, &d);
            let c = s.g.constant(&v).unwrap();
            s.check_bits(&c, v);
        }
    }
    // Constants used by an op (not only returned).
    s.case("constant + parameter");
    let v = array_of(F32, &[2, 3], &[1.0, -2.0, 0.5, 1e-30, -0.0, 3e38]);
    let x = s.param("x", F32, &[2, 3], &u(-1.0, 1.0));
    let c = s.g.constant(&v).unwrap();
    s.check(&x.add(&c).unwrap());
    s.run();
}

#[test]
fn full_zeros_ones_scalar() {
    let mut s = Suite::new("full", 1002);
    let values = |d: DType| -> Vec<f64> {
        match d {
            Pred => vec![0.0, 1.0],
            U8 => vec![0.0, 255.0, 17.0],
            I8 => vec![-128.0, 127.0, -5.0],
            U32 => vec![0.0, 4294967295.0, 7.0],
            U64 => vec![0.0, 1e19, 123456789.0],
            I32 => vec![-2147483648.0, 2147483647.0, -5.0],
            I64 => vec![-9.223_372_036_854_776e18, 1e18, -5.0],
            _ => vec![-0.0, 1.5, -2.25, f64::INFINITY, f64::NAN, 65504.0, 1e-3],
        }
    };
    for dtype in DType::ALL {
        for v in values(dtype) {
            let dims = shape(&mut s.rng, 0, 3);
            s.case(format!("full({v}) {dtype}{dims:?}"));
            let n: usize = dims.iter().product();
            let want = array_of(dtype, &dims, &vec![v; n]);
            let t = s.g.full(v, dtype, &dims).unwrap();
            s.check_bits(&t, want);
        }
        let dims = shape(&mut s.rng, 0, 3);
        let n: usize = dims.iter().product();
        s.case(format!("zeros/ones/scalar {dtype}{dims:?}"));
        let z = s.g.zeros(dtype, &dims).unwrap();
        s.check_bits(&z, array_of(dtype, &dims, &vec![0.0; n]));
        let o = s.g.ones(dtype, &dims).unwrap();
        s.check_bits(&o, array_of(dtype, &dims, &vec![1.0; n]));
        let one = s.g.scalar(1.0, dtype).unwrap();
        s.check_bits(&one, array_of(dtype, &[], &[1.0]));
    }
    s.run();
}

#[test]
fn iota_over_every_dim() {
    let mut s = Suite::new("iota", 1003);
    for dtype in NUMERIC {
        for _ in 0..3 {
            let dims = shape(&mut s.rng, 1, 3);
            for d in 0..dims.len() {
                s.case(format!("iota {dtype}{dims:?} dim {d}"));
                let axis = if s.rng.chance(0.5) {
                    d as isize
                } else {
                    d as isize - dims.len() as isize
                };
                let t = s.g.iota(dtype, &dims, axis).unwrap();
                let n: usize = dims.iter().product();
                let want: Vec<f64> = (0..n).map(|i| unravel(i, &dims)[d] as f64).collect();
                s.check_exact(&t, array_of(dtype, &dims, &want));
            }
        }
    }
    s.run();
}

#[test]
fn constant_array_from_ndarray_round_trips() {
    let g = Graph::new();
    let a = ndarray::arr2(&[[1.5f32, -2.0, 0.25], [4.0, 5.5, -6.0]]);
    let c = g.constant_array(&a.t()).unwrap(); // not row-major in memory
    let doubled = c.mul(2.0).unwrap();
    g.set_outputs(&[&doubled]).unwrap();
    let want = HostArray::from((a.t().to_owned() * 2.0).into_dyn());
    assert_eq!(g.evaluate(&[]).unwrap(), vec![want.clone()]);
    assert_eq!(
        g.compile(&common::client()).unwrap().run(&[]).unwrap(),
        vec![want]
    );
}

/// A random shape with the same element count as `dims`, with one `-1` sometimes.
fn reshape_target(rng: &mut Rng, dims: &[usize]) -> Vec<isize> {
    let n: usize = dims.iter().product();
    let r = rng.int(if n == 1 { 0 } else { 1 }, 4) as usize;
    let mut out = vec![1usize; r];
    if n == 0 {
        for d in out.iter_mut() {
            *d = rng.pick(&[1, 2, 3]);
        }
        let z = rng.below(r);
        out[z] = 0;
    } else {
        let mut m = n;
        for p in [2, 3, 5] {
            while m.is_multiple_of(p) {
                m /= p;
                let i = rng.below(r);
                out[i] *= p;
            }
        }
    }
    let mut t: Vec<isize> = out.iter().map(|&d| d as isize).collect();
    if n > 0 && r > 0 && rng.chance(0.5) {
        let i = rng.below(r);
        t[i] = -1;
    }
    t
}

#[test]
fn reshape_transpose_broadcast_squeeze() {
    let mut s = Suite::new("reshape_transpose", 1201);
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let target = reshape_target(&mut s.rng, &dims);
        s.case(format!("reshape {dtype}{dims:?} to {target:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.reshape(&target).unwrap(), Tol::Bits);
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 4);
        let mut perm: Vec<isize> = (0..dims.len() as isize).collect();
        s.rng.shuffle(&mut perm);
        let perm: Vec<isize> = perm
            .into_iter()
            .map(|p| {
                if s.rng.chance(0.3) {
                    p - dims.len() as isize
                } else {
                    p
                }
            })
            .collect();
        s.case(format!("transpose {dtype}{dims:?} by {perm:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.transpose(&perm).unwrap(), Tol::Bits);
        if dims.len() >= 2 {
            s.check_tol(&x.t().unwrap(), Tol::Bits);
        }
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let out = shape(&mut s.rng, 0, 4);
        let dims = sub_broadcast(&mut s.rng, &out);
        s.case(format!("broadcast_to {dtype}{dims:?} to {out:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.broadcast_to(&out).unwrap(), Tol::Bits);
    }
    for _ in 0..15 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let r = dims.len() as i64;
        let axis = s.rng.int(-(r + 1), r) as isize;
        s.case(format!("expand_dims {dtype}{dims:?} at {axis}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.expand_dims(axis).unwrap(), Tol::Bits);
    }
    for _ in 0..15 {
        let dtype = any_dtype(&mut s.rng);
        let dims: Vec<usize> = (0..s.rng.int(0, 4))
            .map(|_| {
                if s.rng.chance(0.5) {
                    1
                } else {
                    dim(&mut s.rng)
                }
            })
            .collect();
        let r = dims.len() as isize;
        let mut ones: Vec<isize> = Vec::new();
        for i in 0..r {
            if dims[i as usize] == 1 && s.rng.chance(0.6) {
                ones.push(if s.rng.chance(0.5) { i } else { i - r });
            }
        }
        s.case(format!("squeeze {dtype}{dims:?} axes {ones:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.squeeze(&ones).unwrap(), Tol::Bits);
        s.check_tol(&x.squeeze(&[]).unwrap(), Tol::Bits);
    }
    s.run();
}

#[test]
fn slices_reverse_pad_concat() {
    let mut s = Suite::new("slices", 1301);
    for _ in 0..25 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 1, 3);
        let r = dims.len();
        let a = s.rng.below(r);
        let n = dims[a] as i64;
        let (start, stop) = (
            s.rng.int(-n - 2, n + 2) as isize,
            s.rng.int(-n - 2, n + 2) as isize,
        );
        let step = s.rng.int(1, 3) as usize;
        let axis = if s.rng.chance(0.5) {
            a as isize
        } else {
            a as isize - r as isize
        };
        s.case(format!(
            "slice {dtype}{dims:?} axis {axis} [{start}:{stop}:{step}]"
        ));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.slice(axis, start, stop, step).unwrap(), Tol::Bits);
        let st = s.rng.int(0, n) as usize;
        let len = s.rng.int(0, n - st as i64) as usize;
        s.check_tol(&x.narrow(axis, st, len).unwrap(), Tol::Bits);
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let mut start = Vec::new();
        let mut limit = Vec::new();
        let mut stride = Vec::new();
        for &d in &dims {
            let a = s.rng.int(0, d as i64);
            let b = s.rng.int(a, d as i64);
            start.push(a as usize);
            limit.push(b as usize);
            stride.push(s.rng.int(1, 3) as usize);
        }
        s.case(format!(
            "slice_all {dtype}{dims:?} {start:?}..{limit:?} by {stride:?}"
        ));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.slice_all(&start, &limit, &stride).unwrap(), Tol::Bits);
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let axes = random_axes(&mut s.rng, dims.len());
        s.case(format!("flip {dtype}{dims:?} axes {axes:?}"));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.flip(&axes).unwrap(), Tol::Bits);
    }
    for _ in 0..25 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 0, 3);
        let (mut low, mut high, mut interior) = (Vec::new(), Vec::new(), Vec::new());
        for &d in &dims {
            let i = s.rng.int(0, 2);
            let inner = if d == 0 {
                0
            } else {
                d as i64 + (d as i64 - 1) * i
            };
            let mut l = s.rng.int(-2, 3);
            let mut h = s.rng.int(-2, 3);
            while l + inner + h < 0 {
                if l < 0 {
                    l += 1;
                } else {
                    h += 1;
                }
            }
            low.push(l as isize);
            high.push(h as isize);
            interior.push(i as usize);
        }
        let value = match dtype {
            Pred => 1.0,
            _ if dtype.is_unsigned() => 7.0,
            _ => -7.0,
        };
        s.case(format!(
            "pad {dtype}{dims:?} low {low:?} high {high:?} interior {interior:?}"
        ));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        s.check_tol(&x.pad(&low, &high, &interior, value).unwrap(), Tol::Bits);
    }
    for _ in 0..20 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, 1, 3);
        let a = s.rng.below(dims.len());
        let k = s.rng.int(2, 3);
        s.case(format!("concat {k} x {dtype}{dims:?} along {a}"));
        let parts: Vec<Tensor> = (0..k)
            .map(|i| {
                let mut d = dims.clone();
                d[a] = dim(&mut s.rng);
                s.param(&format!("x{i}_"), dtype, &d, &bits_dist(dtype))
            })
            .collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let axis = if s.rng.chance(0.5) {
            a as isize
        } else {
            a as isize - dims.len() as isize
        };
        s.check_tol(&Tensor::concat(&refs, axis).unwrap(), Tol::Bits);
    }
    s.run();
}

#[test]
fn split_and_chunk() {
    let mut c = Suite::new("split_chunk", 15);
    for dtype in [F32, I32] {
        let dims = [4, 6, 3];
        let (x, xv) = c.ints(dtype, &dims, -100, 100);
        let sizes = [1, 0, 2, 3];
        let parts = x.split(1, &sizes).unwrap();
        assert_eq!(parts.len(), 4);
        let mut at = 0;
        for (p, &n) in parts.iter().zip(&sizes) {
            assert_eq!(p.dims(), &[4, n, 3]);
            let want = slice_ref(&xv, &dims, 1, at, at + n);
            c.check_values_tol(
                format!("split {dtype} [{at}, {})", at + n),
                p,
                want,
                Tol::Exact,
            );
            at += n;
        }
        for (axis, n) in [(-1, 3), (0, 2), (1, 1), (1, 6)] {
            let a = norm_axis(axis, 3);
            let len = dims[a] / n;
            let parts = x.chunk(axis, n).unwrap();
            assert_eq!(parts.len(), n);
            for (k, p) in parts.iter().enumerate() {
                let want = slice_ref(&xv, &dims, a, k * len, (k + 1) * len);
                c.check_values_tol(
                    format!("chunk {dtype} axis {axis} into {n}: {k}"),
                    p,
                    want,
                    Tol::Exact,
                );
            }
        }
    }
    let (x, _) = c.uniform(F32, &[0, 3], 0.0, 1.0);
    let parts = x.chunk(0, 1).unwrap();
    assert_eq!(parts[0].dims(), &[0, 3]);
    c.run();
}
