//! Reductions (sum, prod, max, min, mean, logsumexp) and the other ops along one axis: argmax /
//! argmin, cumsum in every mode, sort and top_k.

use super::*;

fn reduced_count(dims: &[usize], axes: &[isize]) -> usize {
    let r = dims.len() as isize;
    axes.iter()
        .map(|&a| dims[((a + r) % r.max(1)) as usize])
        .product()
}

#[test]
fn reductions() {
    let mut s = Suite::new("reductions", 1101);
    type Red = fn(&Tensor, &[isize], bool) -> Result<Tensor>;
    let ops: Vec<(&str, Red)> = vec![
        (
            "sum",
            |t, a, k| if k { t.sum_keepdims(a) } else { t.sum(a) },
        ),
        (
            "prod",
            |t, a, k| if k { t.prod_keepdims(a) } else { t.prod(a) },
        ),
        (
            "max",
            |t, a, k| if k { t.max_keepdims(a) } else { t.max(a) },
        ),
        (
            "min",
            |t, a, k| if k { t.min_keepdims(a) } else { t.min(a) },
        ),
        (
            "mean",
            |t, a, k| if k { t.mean_keepdims(a) } else { t.mean(a) },
        ),
        ("logsumexp", |t, a, k| {
            if k {
                t.logsumexp_keepdims(a)
            } else {
                t.logsumexp(a)
            }
        }),
    ];
    for (name, f) in &ops {
        let dtypes: &[DType] = match *name {
            "mean" | "logsumexp" => &FLOATS,
            _ => &NUMERIC,
        };
        for &dtype in dtypes {
            for k in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                let axes = random_axes(&mut s.rng, dims.len());
                let keep = s.rng.chance(0.5);
                s.case(format!(
                    "{name} {dtype}{dims:?} axes {axes:?} keepdims {keep}"
                ));
                let d = match (*name, dtype.is_float()) {
                    ("prod", true) => u(0.5, 1.6),
                    ("prod", false) if k == 0 => Dist::Bits, // wraps
                    ("prod", false) if dtype.is_unsigned() => Dist::Int(0, 3),
                    ("prod", false) => Dist::Int(-3, 3),
                    ("max" | "min", true) if k == 2 => with(
                        u(-5.0, 5.0),
                        &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
                        0.1,
                    ),
                    ("logsumexp", _) if k == 2 => with(u(-5.0, 5.0), &[f64::NEG_INFINITY], 0.6),
                    ("logsumexp", _) => u(-5.0, 5.0),
                    (_, true) => u(-1.0, 1.0),
                    (_, false) => Dist::Bits,
                };
                let x = s.param("x", dtype, &dims, &d);
                let y = f(&x, &axes, keep).unwrap();
                let terms = reduced_count(&dims, &axes);
                let t = match *name {
                    // Max and min are exact; a product's error is relative.
                    "max" | "min" => Tol::Exact,
                    "prod" => acc_tol(dtype, terms, 0.0).scaled(terms.max(1) as f64, 1.0),
                    "logsumexp" => acc_tol(dtype, terms, 1.0),
                    _ => acc_tol(dtype, terms, largest_abs(s.value(&x))),
                };
                s.check_tol(&y, t);
            }
        }
    }
    // logsumexp with whole rows of -inf (and of +inf, NaN).
    for dtype in FLOATS {
        s.case(format!("logsumexp {dtype} -inf rows"));
        let ninf = f64::NEG_INFINITY;
        let v = [
            ninf,
            ninf,
            ninf, // all -inf: -inf
            0.0,
            ninf,
            1.0, // some -inf
            f64::INFINITY,
            0.0,
            ninf, // +inf: +inf
            f64::NAN,
            0.0,
            1.0, // NaN
        ];
        let x = s.input("x", array_of(dtype, &[4, 3], &v));
        s.check_tol(&x.logsumexp(&[1]).unwrap(), acc_tol(dtype, 3, 1.0));
        s.check_tol(
            &x.logsumexp_keepdims(&[-1]).unwrap(),
            acc_tol(dtype, 3, 1.0),
        );
        let e = s.input("e", array_of(dtype, &[2, 0], &[]));
        s.check(&e.logsumexp(&[1]).unwrap());
        s.check(&e.mean(&[1]).unwrap());
        s.check(&e.max(&[1]).unwrap());
        s.check(&e.min_keepdims(&[1]).unwrap());
        s.check(&e.prod(&[1]).unwrap());
    }
    for dtype in NUMERIC {
        let dims = shape(&mut s.rng, 0, 3);
        s.case(format!("sum_all {dtype}{dims:?}"));
        let d = if dtype.is_float() {
            u(-1.0, 1.0)
        } else {
            Dist::Bits
        };
        let x = s.param("x", dtype, &dims, &d);
        let n = dims.iter().product();
        s.check_tol(&x.sum_all().unwrap(), acc_tol(dtype, n, 1.0));
    }
    s.run();
}

#[test]
fn argmax_argmin() {
    let mut s = Suite::new("argmax_argmin", 1102);
    for dtype in NUMERIC {
        for k in 0..4 {
            let mut dims = shape(&mut s.rng, 1, 3);
            let axis = s.rng.below(dims.len());
            dims[axis] = nz_dim(&mut s.rng);
            let a = if s.rng.chance(0.5) {
                axis as isize
            } else {
                axis as isize - dims.len() as isize
            };
            let keep = s.rng.chance(0.5);
            s.case(format!("arg {dtype}{dims:?} axis {a} keepdims {keep}"));
            let d = match k {
                0 | 1 => pick(&[0.0, 1.0, 2.0]), // ties
                2 if dtype.is_float() => with(
                    pick(&[0.0, 1.0, 2.0]),
                    &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
                    0.3,
                ),
                _ => Dist::Bits,
            };
            let x = s.param("x", dtype, &dims, &d);
            if keep {
                s.check(&x.argmax_keepdims(a).unwrap());
                s.check(&x.argmin_keepdims(a).unwrap());
            } else {
                s.check(&x.argmax(a).unwrap());
                s.check(&x.argmin(a).unwrap());
            }
        }
    }
    // Lanes the random ones rarely make: all NaN, NaN beside infinities, signed zeros tied;
    // against the interpreter and the definition (NaN above every number, the first of equals).
    let nan = f64::NAN;
    let (inf, ninf) = (f64::INFINITY, f64::NEG_INFINITY);
    let lanes: [[f64; 4]; 6] = [
        [nan, nan, nan, nan],
        [inf, nan, ninf, nan],
        [ninf, inf, inf, ninf],
        [-0.0, 0.0, -0.0, 0.0],
        [1.0, nan, 1.0, inf],
        [ninf, ninf, ninf, ninf],
    ];
    let (want_max, want_min) = (
        [0.0, 1.0, 1.0, 0.0, 1.0, 0.0],
        [0.0, 2.0, 0.0, 0.0, 0.0, 0.0],
    );
    for dtype in [F32, F64, BF16] {
        s.case(format!("arg {dtype} special lanes"));
        let values: Vec<f64> = lanes.iter().flatten().copied().collect();
        let x = s.input("x", array_of(dtype, &[6, 4], &values));
        s.check_exact(&x.argmax(1).unwrap(), array_of(I64, &[6], &want_max));
        s.check_exact(&x.argmin(1).unwrap(), array_of(I64, &[6], &want_min));
    }
    // Every integer index dtype, against the interpreter and a host argmax (first extreme).
    for (k, index) in INTS.into_iter().enumerate() {
        let dtype = NUMERIC[(3 * k) % NUMERIC.len()];
        let mut dims = shape(&mut s.rng, 1, 3);
        let axis = s.rng.below(dims.len());
        dims[axis] = nz_dim(&mut s.rng);
        s.case(format!("arg_as {index} {dtype}{dims:?} axis {axis}"));
        let x = s.param("x", dtype, &dims, &pick(&[0.0, 1.0, 2.0, 3.0]));
        let v = s.value(&x).to_f64_vec();
        for max in [true, false] {
            let want = arg_ref(&v, &dims, axis, max);
            let mut out_dims = dims.clone();
            out_dims.remove(axis);
            let a = axis as isize;
            let y = if max {
                x.argmax_as(a, index)
            } else {
                x.argmin_as(a, index)
            };
            let want = array_of(index, &out_dims, &want);
            s.check_exact(&y.unwrap(), want);
        }
    }
    s.run();
}

/// The index of the first maximum (or minimum) of each lane of `v` (row-major, shape `dims`,
/// no NaN) along `axis`.
fn arg_ref(v: &[f64], dims: &[usize], axis: usize, max: bool) -> Vec<f64> {
    let n = dims[axis];
    let stride: usize = dims[axis + 1..].iter().product();
    let lanes = v.len() / n;
    (0..lanes)
        .map(|lane| {
            let base = (lane / stride) * stride * n + lane % stride;
            let at = |i: usize| v[base + i * stride];
            let mut best = 0;
            for i in 1..n {
                if (max && at(i) > at(best)) || (!max && at(i) < at(best)) {
                    best = i;
                }
            }
            best as f64
        })
        .collect()
}

#[test]
fn cumsum_every_mode() {
    let mut s = Suite::new("cumsum", 1103);
    for dtype in NUMERIC {
        for exclusive in [false, true] {
            for reverse in [false, true] {
                for _ in 0..2 {
                    let dims = shape(&mut s.rng, 1, 3);
                    let axis = s.rng.below(dims.len()) as isize
                        - if s.rng.chance(0.5) {
                            dims.len() as isize
                        } else {
                            0
                        };
                    s.case(format!(
                        "cumsum {dtype}{dims:?} axis {axis} exclusive {exclusive} reverse {reverse}"
                    ));
                    let d = if dtype.is_float() {
                        u(-1.0, 1.0)
                    } else {
                        Dist::Bits
                    };
                    let x = s.param("x", dtype, &dims, &d);
                    let n = dims[((axis + dims.len() as isize) as usize) % dims.len()];
                    let t = acc_tol(dtype, n, largest_abs(s.value(&x)));
                    let options = CumsumOptions { exclusive, reverse };
                    s.check_tol(&x.cumsum_with(axis, options).unwrap(), t);
                }
            }
        }
    }
    // The plain cumsum is the inclusive forward sum: against a running sum on the host.
    for dtype in [F64, I64, I32] {
        let dims = [3, 4];
        s.case(format!("cumsum {dtype}{dims:?}"));
        let x = s.param("x", dtype, &dims, &Dist::Int(-9, 9));
        let v = s.value(&x).to_f64_vec();
        let want: Vec<f64> = (0..12).map(|i| v[i - i % 4..=i].iter().sum()).collect();
        let want = array_of(dtype, &dims, &want);
        s.check_exact(&x.cumsum(-1).unwrap(), want);
    }
    s.run();
}

/// The stable sort of `v` along `axis`: values and source indices (NaN last ascending, first
/// descending).
fn sort_ref(v: &HostArray, axis: usize, descending: bool) -> (HostArray, Vec<f64>) {
    let dims = v.dims().to_vec();
    let vals = v.to_f64_vec();
    let n = dims[axis];
    let st = strides(&dims);
    let total: usize = dims.iter().product();
    let mut flat = vec![0usize; total];
    let mut idx = vec![0.0; total];
    for base in 0..total {
        if unravel(base, &dims)[axis] != 0 {
            continue;
        }
        let lane: Vec<usize> = (0..n).map(|i| base + i * st[axis]).collect();
        let mut order: Vec<usize> = (0..n).collect();
        // NaN is the largest value.
        let key = |i: usize| vals[lane[i]];
        order.sort_by(|&a, &b| {
            let (x, y) = (key(a), key(b));
            let o = match (x.is_nan(), y.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                _ => x.partial_cmp(&y).unwrap(),
            };
            if descending {
                o.reverse()
            } else {
                o
            }
        });
        for (i, &o) in order.iter().enumerate() {
            flat[lane[i]] = lane[o];
            idx[lane[i]] = o as f64;
        }
    }
    (gather(v, &dims, &flat), idx)
}

#[test]
fn sort_and_top_k() {
    let mut s = Suite::new("sort", 2001);
    for k in 0..36 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dims = shape(&mut s.rng, 1, 3);
        let axis = s.rng.below(dims.len());
        let descending = s.rng.chance(0.5);
        let a = if s.rng.chance(0.5) {
            axis as isize
        } else {
            axis as isize - dims.len() as isize
        };
        s.case(format!(
            "sort {dtype}{dims:?} axis {a} descending {descending}"
        ));
        let d = match (k / NUMERIC.len()) % 3 {
            0 => pick(&[0.0, 1.0, 2.0, 3.0]), // ties
            1 if dtype.is_float() => with(
                pick(&[-1.0, 0.0, 1.0, 2.5]),
                &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
                0.3,
            ),
            _ if dtype.is_float() => u(-100.0, 100.0),
            _ => Dist::Bits,
        };
        let x = s.param("x", dtype, &dims, &d);
        let (want, widx) = sort_ref(s.value(&x), axis, descending);
        let order = if descending {
            SortOrder::Descending
        } else {
            SortOrder::Ascending
        };
        s.check_bits(&x.sort(a, order).unwrap(), want.clone());
        let (v, i) = x.sort_with_indices(a, order).unwrap();
        s.check_bits(&v, want);
        s.check_exact(&i, array_of(I64, &dims, &widx));
    }
    for k in 0..27 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dims = shape(&mut s.rng, 1, 3);
        let n = *dims.last().unwrap();
        let kk = s.rng.int(0, n as i64) as usize;
        s.case(format!("top_k {dtype}{dims:?} k {kk}"));
        let d = if k % 2 == 0 {
            pick(&[0.0, 1.0, 2.0])
        } else if dtype.is_float() {
            with(u(-10.0, 10.0), &[f64::NAN, f64::INFINITY], 0.2)
        } else {
            Dist::Bits
        };
        let x = s.param("x", dtype, &dims, &d);
        let (sorted, sidx) = sort_ref(s.value(&x), dims.len() - 1, true);
        let mut odims = dims.clone();
        *odims.last_mut().unwrap() = kk;
        let total: usize = odims.iter().product();
        let flat: Vec<usize> = (0..total)
            .map(|i| {
                let mut idx = unravel(i, &odims);
                let last = idx.len() - 1;
                idx[last] = idx[last].min(n.saturating_sub(1));
                ravel(&idx, &dims)
            })
            .collect();
        let want = gather(&sorted, &odims, &flat);
        let widx: Vec<f64> = flat.iter().map(|&f| sidx[f]).collect();
        let (v, i) = x.top_k(kk).unwrap();
        s.check_bits(&v, want);
        s.check_exact(&i, array_of(I64, &odims, &widx));
    }
    s.run();
}
