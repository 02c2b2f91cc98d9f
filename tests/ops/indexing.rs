//! Indexing: dynamic slices (and indices out of range), tril / triu / masked_fill, take /
//! index_add / index_set / one_hot, take_along_axis / take_axis.

use super::*;

#[test]
fn dynamic_slices() {
    let mut s = Suite::new("dynamic_slices", 1401);
    for k in 0..40 {
        let dtype = any_dtype(&mut s.rng);
        let dims = shape(&mut s.rng, if k == 0 { 0 } else { 1 }, 3);
        let idx_dtype = match k % 5 {
            0 | 1 => I32,
            2 | 3 => I64,
            _ => U32,
        };
        let sizes: Vec<usize> = dims
            .iter()
            .map(|&d| s.rng.int(0, d as i64) as usize)
            .collect();
        let update: Vec<usize> = dims
            .iter()
            .map(|&d| s.rng.int(0, d as i64) as usize)
            .collect();
        s.case(format!(
            "dynamic slice {dtype}{dims:?} sizes {sizes:?} update {update:?} {idx_dtype} starts"
        ));
        let x = s.param("x", dtype, &dims, &bits_dist(dtype));
        let starts: Vec<Tensor> = dims
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let lo = if idx_dtype == U32 { 0 } else { -3 };
                s.param(
                    &format!("i{i}_"),
                    idx_dtype,
                    &[],
                    &Dist::Int(lo, d as i64 + 3),
                )
            })
            .collect();
        let refs: Vec<&Tensor> = starts.iter().collect();
        s.check_tol(&x.dynamic_slice(&refs, &sizes).unwrap(), Tol::Bits);
        let up = s.param("u", dtype, &update, &bits_dist(dtype));
        s.check_tol(&x.dynamic_update_slice(&up, &refs).unwrap(), Tol::Bits);
    }
    s.run();
}

/// Unsigned indices beyond the signed range still clamp to the top (they are large, not
/// negative).
#[test]
fn huge_unsigned_indices_clamp_high() {
    let mut s = Suite::new("huge_unsigned_indices", 1402);
    s.case("dynamic_slice with u32 index 0xFFFFFFFF");
    let x = s.input("x", array_of(F32, &[5], &[0.0, 1.0, 2.0, 3.0, 4.0]));
    let i = s.input("i", HostArray::scalar(u32::MAX));
    let want = array_of(F32, &[2], &[3.0, 4.0]);
    s.check_exact(&x.dynamic_slice(&[&i], &[2]).unwrap(), want);
    s.case("dynamic_slice with u64 index 2^63");
    let j = s.input("j", HostArray::scalar(1u64 << 63));
    let want = array_of(F32, &[2], &[3.0, 4.0]);
    s.check_exact(&x.dynamic_slice(&[&j], &[2]).unwrap(), want);
    s.case("take with u32 index 0xFFFFFFFF and u64 index 2^63");
    let t = s.input("t", HostArray::from_vec(&[2], vec![u32::MAX, 1]).unwrap());
    let want = array_of(F32, &[2], &[4.0, 1.0]);
    s.check_exact(&x.take(&t).unwrap(), want);
    let t = s.input("w", HostArray::from_vec(&[2], vec![1u64 << 63, 2]).unwrap());
    let want = array_of(F32, &[2], &[4.0, 2.0]);
    s.check_exact(&x.take(&t).unwrap(), want);
    s.run();
}

#[test]
fn tril_triu_masked_fill() {
    let mut s = Suite::new("tril_triu", 1701);
    for offset in -2isize..=2 {
        for dtype in [F32, F64, BF16, I32, U8, I64] {
            let dims = shape(&mut s.rng, 2, 3);
            s.case(format!("tril/triu {dtype}{dims:?} offset {offset}"));
            let x = s.param("x", dtype, &dims, &Dist::Bits);
            let v = s.value(&x).clone();
            let r = dims.len();
            let keep = |i: usize, lower: bool| {
                let idx = unravel(i, &dims);
                let d = idx[r - 1] as isize - idx[r - 2] as isize;
                if lower {
                    d <= offset
                } else {
                    d >= offset
                }
            };
            let n: usize = dims.iter().product();
            let zero = array_of(dtype, &dims, &vec![0.0; n]);
            for lower in [true, false] {
                // Elements kept are copied; the others are zero.
                let mut bytes = Vec::new();
                let sz = dtype.size_in_bytes();
                let (vb, zb) = (v.to_bytes(), zero.to_bytes());
                for i in 0..n {
                    let src = if keep(i, lower) { &vb } else { &zb };
                    bytes.extend_from_slice(&src[i * sz..(i + 1) * sz]);
                }
                let want = HostArray::from_bytes(&TensorType::new(dtype, &dims), &bytes).unwrap();
                let y = if lower {
                    x.tril(offset)
                } else {
                    x.triu(offset)
                }
                .unwrap();
                s.check_bits(&y, want);
            }
        }
        let (rows, cols) = (dim(&mut s.rng), dim(&mut s.rng));
        s.case(format!("tril_mask/triu_mask {rows}x{cols} offset {offset}"));
        let lm = s.g.tril_mask(rows, cols, offset).unwrap();
        let um = s.g.triu_mask(rows, cols, offset).unwrap();
        let lw: Vec<f64> = (0..rows * cols)
            .map(|i| {
                f64::from(u8::from(
                    (i % cols) as isize - (i / cols) as isize <= offset,
                ))
            })
            .collect();
        let uw: Vec<f64> = (0..rows * cols)
            .map(|i| {
                f64::from(u8::from(
                    (i % cols) as isize - (i / cols) as isize >= offset,
                ))
            })
            .collect();
        s.check_exact(&lm, array_of(Pred, &[rows, cols], &lw));
        s.check_exact(&um, array_of(Pred, &[rows, cols], &uw));
    }
    for k in 0..20 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dims = shape(&mut s.rng, 0, 3);
        let dm = sub_broadcast(&mut s.rng, &dims);
        s.case(format!("masked_fill {dtype}{dims:?} mask {dm:?}"));
        let x = s.param("x", dtype, &dims, &Dist::Bits);
        let m = s.param("m", Pred, &dm, &Dist::Bool(0.4));
        let value = if dtype.is_float() { -1e9 } else { 7.0 };
        let value = if dtype == F16 {
            f64::NEG_INFINITY
        } else {
            value
        };
        s.check_tol(&x.masked_fill(&m, value).unwrap(), Tol::Bits);
    }
    // The fill value may be a rank-0 tensor (here a parameter) instead of a number.
    for dtype in [F32, I32] {
        s.case(format!("masked_fill {dtype} with a tensor value"));
        let x = s.param("x", dtype, &[2, 3], &Dist::Int(0, 9));
        let m = s.param("m", Pred, &[3], &Dist::Bool(0.5));
        let v = s.param("v", dtype, &[], &Dist::Int(-9, -1));
        let (xv, mv, vv) = (
            s.value(&x).to_f64_vec(),
            s.value(&m).to_f64_vec(),
            s.value(&v).to_f64_vec()[0],
        );
        let want: Vec<f64> = (0..6)
            .map(|i| if mv[i % 3] != 0.0 { vv } else { xv[i] })
            .collect();
        let want = array_of(dtype, &[2, 3], &want);
        s.check_exact(&x.masked_fill(&m, &v).unwrap(), want);
    }
    s.run();
}

#[test]
fn take_index_add_index_set_and_one_hot() {
    let mut s = Suite::new("take_one_hot", 1801);
    for k in 0..30 {
        let dtype = any_dtype(&mut s.rng);
        let mut tdims = shape(&mut s.rng, 1, 3);
        tdims[0] = nz_dim(&mut s.rng);
        let n = tdims[0] as i64;
        let idims = shape(&mut s.rng, 0, 2);
        let idx_dtype = [I32, I64, U32, U8, U64][k % 5];
        s.case(format!("take {dtype}{tdims:?} by {idx_dtype}{idims:?}"));
        let table = s.param("t", dtype, &tdims, &bits_dist(dtype));
        let lo = if idx_dtype.is_unsigned() { 0 } else { -3 };
        let idx = s.param("i", idx_dtype, &idims, &Dist::Int(lo, n + 3));
        // Formula: rows picked by the clamped indices.
        let row: usize = tdims[1..].iter().product();
        let flat: Vec<usize> = s
            .value(&idx)
            .to_f64_vec()
            .into_iter()
            .flat_map(|i| {
                let r = (i as i64).clamp(0, n - 1) as usize;
                (0..row).map(move |j| r * row + j)
            })
            .collect();
        let mut odims = idims.clone();
        odims.extend_from_slice(&tdims[1..]);
        let want = gather(s.value(&table), &odims, &flat);
        s.check_bits(&table.take(&idx).unwrap(), want);
    }
    for k in 0..30 {
        // index_add: each update row added at its clamped index, repeats adding up.
        let dtype = [F32, F64, I32, I64, U8, U32][k % 6];
        let mut tdims = shape(&mut s.rng, 1, 3);
        tdims[0] = nz_dim(&mut s.rng);
        let n = tdims[0] as i64;
        let idims = shape(&mut s.rng, 0, 2);
        let idx_dtype = [I32, I64, U32, U8, U64][k % 5];
        s.case(format!(
            "index_add {dtype}{tdims:?} by {idx_dtype}{idims:?}"
        ));
        let dist = if dtype.is_float() {
            u(-2.0, 2.0)
        } else {
            Dist::Int(0, 9)
        };
        let table = s.param("t", dtype, &tdims, &dist);
        let lo = if idx_dtype.is_unsigned() { 0 } else { -3 };
        let idx = s.param("i", idx_dtype, &idims, &Dist::Int(lo, n + 3));
        let mut udims = idims.clone();
        udims.extend_from_slice(&tdims[1..]);
        let upd = s.param("u", dtype, &udims, &dist);
        let row: usize = tdims[1..].iter().product();
        let mut want = s.value(&table).to_f64_vec();
        let updates = s.value(&upd).to_f64_vec();
        for (p, i) in s.value(&idx).to_f64_vec().into_iter().enumerate() {
            let r = (i as i64).clamp(0, n - 1) as usize;
            for j in 0..row {
                want[r * row + j] += updates[p * row + j];
            }
        }
        let tol = if dtype.is_float() {
            Tol::Close {
                rtol: 1e-5,
                atol: 1e-6,
            }
        } else {
            Tol::Exact
        };
        s.check_formula(
            &table.index_add(&idx, &upd).unwrap(),
            tol,
            array_of(dtype, &tdims, &want),
            tol,
        );
    }
    for k in 0..30 {
        // index_set: each update row written at its clamped index; the indices are distinct
        // rows (row 0 written as -2, the last as n + 2, both clamped back) since of repeated
        // ones the kept update is unspecified.
        let dtype = any_dtype(&mut s.rng);
        let mut tdims = shape(&mut s.rng, 1, 3);
        tdims[0] = nz_dim(&mut s.rng);
        let n = tdims[0];
        let idx_dtype = [I32, I64, I8][k % 3];
        let mut rows: Vec<usize> = (0..n).collect();
        s.rng.shuffle(&mut rows);
        rows.truncate(s.rng.int(1, n as i64) as usize);
        s.case(format!(
            "index_set {dtype}{tdims:?} at {idx_dtype} rows {rows:?}"
        ));
        let table = s.param("t", dtype, &tdims, &bits_dist(dtype));
        let written: Vec<f64> = rows
            .iter()
            .map(|&r| match r {
                0 => -2.0,
                r if r == n - 1 => (n + 2) as f64,
                r => r as f64,
            })
            .collect();
        let idx = s.input("i", array_of(idx_dtype, &[rows.len()], &written));
        let mut udims = vec![rows.len()];
        udims.extend_from_slice(&tdims[1..]);
        let upd = s.param("u", dtype, &udims, &bits_dist(dtype));
        let row: usize = tdims[1..].iter().product();
        let mut flat: Vec<usize> = (0..n * row).collect();
        for (p, &r) in rows.iter().enumerate() {
            for j in 0..row {
                flat[r * row + j] = n * row + p * row + j;
            }
        }
        // The table's elements, then the updates': `flat` indexes both.
        let mut bytes = s.value(&table).to_bytes();
        bytes.extend(s.value(&upd).to_bytes());
        let both = TensorType::new(dtype, &[bytes.len() / dtype.size_in_bytes()]);
        let want = gather(
            &HostArray::from_bytes(&both, &bytes).unwrap(),
            &tdims,
            &flat,
        );
        s.check_bits(&table.index_set(&idx, &upd).unwrap(), want);
    }
    for k in 0..20 {
        let idx_dtype = [I32, I64, U8, U32, U64][k % 5];
        let out = DType::ALL[k % DType::ALL.len()];
        let idims = shape(&mut s.rng, 0, 2);
        let depth = s.rng.int(0, 5) as usize;
        s.case(format!(
            "one_hot {idx_dtype}{idims:?} depth {depth} as {out}"
        ));
        let lo = if idx_dtype.is_unsigned() { 0 } else { -2 };
        let idx = s.param("i", idx_dtype, &idims, &Dist::Int(lo, depth as i64 + 2));
        let want: Vec<f64> = s
            .value(&idx)
            .to_f64_vec()
            .into_iter()
            .flat_map(|i| (0..depth).map(move |c| f64::from(u8::from(i == c as f64))))
            .collect();
        let mut odims = idims.clone();
        odims.push(depth);
        let y = idx.one_hot(depth, out).unwrap();
        s.check_exact(&y, array_of(out, &odims, &want));
    }
    s.run();
}

const INDEX_TYPES: [DType; 5] = [I32, I64, U8, U32, U64];

#[test]
fn take_along_axis_and_take_axis() {
    let mut c = Suite::new("take_along_axis", 16);
    for k in 0..30 {
        let tdims = c.nonempty_shape(1, 3);
        let rank = tdims.len();
        let axis = c.rng.below(rank);
        let n = tdims[axis] as i64;
        // The indices' shape: its own length along the axis, elsewhere the table's size, or 1
        // (indices broadcast), or larger where the table's size is 1 (the table broadcasts).
        let idims: Vec<usize> = (0..rank)
            .map(|d| match (d == axis, tdims[d], c.rng.below(3)) {
                (true, _, _) => c.rng.int(0, 4) as usize,
                (false, _, 0) => 1,
                (false, 1, _) => c.rng.int(1, 3) as usize,
                (false, t, _) => t,
            })
            .collect();
        let odims: Vec<usize> = (0..rank)
            .map(|d| {
                if d == axis {
                    idims[d]
                } else {
                    tdims[d].max(idims[d])
                }
            })
            .collect();
        let idtype = INDEX_TYPES[k % 5];
        let dtype = [F32, I32, F64][k % 3];
        let (t, tv) = c.uniform(dtype, &tdims, -100.0, 100.0);
        let lo = if idtype.is_unsigned() { 0 } else { -3 };
        let (i, iv) = c.ints(idtype, &idims, lo, n + 3);
        let want: Vec<f64> = (0..odims.iter().product())
            .map(|o| {
                let oc = unravel(o, &odims);
                let mut tc: Vec<usize> = (0..rank)
                    .map(|d| if tdims[d] == 1 { 0 } else { oc[d] })
                    .collect();
                let j = iv[broadcast_index(&oc, &idims)] as i64;
                tc[axis] = j.clamp(0, n - 1) as usize;
                tv[ravel(&tc, &tdims)]
            })
            .collect();
        let axis_arg = if k % 2 == 0 {
            axis as isize
        } else {
            axis as isize - rank as isize
        };
        let y = t.take_along_axis(&i, axis_arg).unwrap();
        assert_eq!(y.dims(), odims.as_slice());
        let label =
            format!("take_along_axis {dtype}{tdims:?} by {idtype}{idims:?} axis {axis_arg}");
        c.check_values_tol(label, &y, want, Tol::Exact);
    }
    for k in 0..20 {
        let tdims = c.nonempty_shape(1, 3);
        let rank = tdims.len();
        let axis = c.rng.below(rank);
        let n = tdims[axis] as i64;
        let idims = c.nonempty_shape(0, 2);
        let idtype = INDEX_TYPES[k % 5];
        let (t, tv) = c.uniform(F32, &tdims, -100.0, 100.0);
        let lo = if idtype.is_unsigned() { 0 } else { -3 };
        let (i, iv) = c.ints(idtype, &idims, lo, n + 3);
        let mut odims = tdims[..axis].to_vec();
        odims.extend_from_slice(&idims);
        odims.extend_from_slice(&tdims[axis + 1..]);
        let want: Vec<f64> = (0..odims.iter().product())
            .map(|o| {
                let oc = unravel(o, &odims);
                let ic = &oc[axis..axis + idims.len()];
                let j = (iv[ravel(ic, &idims)] as i64).clamp(0, n - 1) as usize;
                let mut tc = oc[..axis].to_vec();
                tc.push(j);
                tc.extend_from_slice(&oc[axis + idims.len()..]);
                tv[ravel(&tc, &tdims)]
            })
            .collect();
        let y = t.take_axis(&i, axis as isize).unwrap();
        assert_eq!(y.dims(), odims.as_slice());
        c.check_values_tol(
            format!("take_axis {tdims:?} by {idtype}{idims:?} axis {axis}"),
            &y,
            want,
            Tol::Exact,
        );
    }
    // The largest u64 index clamps to the last entry.
    let (t, tv) = c.uniform(F32, &[2, 3], -1.0, 1.0);
    let i = c.input(
        "i",
        HostArray::from_vec(&[2, 1], vec![u64::MAX, 1u64]).unwrap(),
    );
    c.check_values_tol(
        "take_along_axis u64::MAX",
        &t.take_along_axis(&i, 1).unwrap(),
        vec![tv[2], tv[4]],
        Tol::Exact,
    );
    c.run();
}
