//! Linear algebra: dot_general with random dimension numbers, matmul, a table of einsum specs
//! and their lowering, and the causal depthwise convolution.

use super::*;

/// A naive einsum in f64 (`spec` with explicit or implicit output) and the number of terms
/// summed per output element.
fn einsum_ref(spec: &str, ops: &[&HostArray]) -> (HostArray, usize) {
    let (lhs, out) = match spec.split_once("->") {
        Some((l, o)) => (l, Some(o)),
        None => (spec, None),
    };
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    let mut letters: Vec<char> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    for (t, a) in terms.iter().zip(ops) {
        for (c, &d) in t.iter().zip(a.dims()) {
            if !letters.contains(c) {
                letters.push(*c);
                sizes.push(d);
            }
        }
    }
    let out: Vec<char> = match out {
        Some(o) => o.chars().collect(),
        None => {
            let all: Vec<char> = terms.iter().flatten().copied().collect();
            let mut once: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| all.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    let size = |c: char| sizes[letters.iter().position(|d| *d == c).unwrap()];
    let out_dims: Vec<usize> = out.iter().map(|&c| size(c)).collect();
    let summed: usize = letters
        .iter()
        .filter(|c| !out.contains(c))
        .map(|&c| size(c))
        .product();
    let vals: Vec<Vec<f64>> = ops.iter().map(|a| a.to_f64_vec()).collect();
    let mut res = vec![0.0; out_dims.iter().product()];
    let total: usize = sizes.iter().product();
    for flat in 0..total {
        let assign = unravel(flat, &sizes);
        let at = |c: char| assign[letters.iter().position(|d| *d == c).unwrap()];
        let mut p = 1.0;
        for (t, (v, a)) in terms.iter().zip(vals.iter().zip(ops)) {
            let idx: Vec<usize> = t.iter().map(|&c| at(c)).collect();
            p *= v[ravel(&idx, a.dims())];
        }
        let oi: Vec<usize> = out.iter().map(|&c| at(c)).collect();
        res[ravel(&oi, &out_dims)] += p;
    }
    (f64_array(&out_dims, res), summed)
}

/// Operands for `spec` with random sizes per index letter (from `sizes`).
fn einsum_operands(s: &mut Suite, spec: &str, dtype: DType, sizes: &[usize]) -> Vec<Tensor> {
    let lhs = spec.split("->").next().unwrap();
    let mut letters: Vec<(char, usize)> = Vec::new();
    let mut ops = Vec::new();
    for (k, term) in lhs.split(',').enumerate() {
        let dims: Vec<usize> = term
            .chars()
            .map(|c| match letters.iter().find(|(d, _)| *d == c) {
                Some(&(_, n)) => n,
                None => {
                    let n = s.rng.pick(sizes);
                    letters.push((c, n));
                    n
                }
            })
            .collect();
        let d = if dtype.is_float() {
            u(-1.0, 1.0)
        } else {
            Dist::Int(-3, 3)
        };
        ops.push(s.param(&format!("x{k}_"), dtype, &dims, &d));
    }
    ops
}

#[test]
fn dot_general_random_dimension_numbers() {
    let mut s = Suite::new("dot_general", 1501);
    for k in 0..40 {
        let dtype = [F32, F64, F16, BF16, I32, I64][k % 6];
        let nb = s.rng.below(3);
        let nc = s.rng.below(3);
        let nl = s.rng.below(3).min(4 - nb - nc);
        let nr = s.rng.below(3).min(4 - nb - nc);
        // Roles: ('b', i) batch, ('c', i) contracting, ('l', i) / ('r', i) free.
        let mut lroles: Vec<(char, usize)> = (0..nb)
            .map(|i| ('b', i))
            .chain((0..nc).map(|i| ('c', i)))
            .chain((0..nl).map(|i| ('l', i)))
            .collect();
        let mut rroles: Vec<(char, usize)> = (0..nb)
            .map(|i| ('b', i))
            .chain((0..nc).map(|i| ('c', i)))
            .chain((0..nr).map(|i| ('r', i)))
            .collect();
        s.rng.shuffle(&mut lroles);
        s.rng.shuffle(&mut rroles);
        let letter = |(role, i): (char, usize)| -> char {
            let base = match role {
                'b' => b'a',
                'c' => b'f',
                'l' => b'k',
                _ => b'p',
            };
            (base + i as u8) as char
        };
        let mut size_of: Vec<(char, usize)> = Vec::new();
        for &r in lroles.iter().chain(&rroles) {
            let c = letter(r);
            if !size_of.iter().any(|(d, _)| *d == c) {
                let n = if s.rng.chance(0.1) {
                    0
                } else {
                    nz_dim(&mut s.rng)
                };
                size_of.push((c, n));
            }
        }
        let size = |c: char| size_of.iter().find(|(d, _)| *d == c).unwrap().1;
        let ldims: Vec<usize> = lroles.iter().map(|&r| size(letter(r))).collect();
        let rdims: Vec<usize> = rroles.iter().map(|&r| size(letter(r))).collect();
        let pos = |roles: &[(char, usize)], r: (char, usize), neg: bool| -> isize {
            let p = roles.iter().position(|&q| q == r).unwrap() as isize;
            if neg {
                p - roles.len() as isize
            } else {
                p
            }
        };
        let mut batch_order: Vec<usize> = (0..nb).collect();
        s.rng.shuffle(&mut batch_order);
        let batch: Vec<(isize, isize)> = batch_order
            .iter()
            .map(|&i| {
                let n = s.rng.chance(0.3);
                (pos(&lroles, ('b', i), n), pos(&rroles, ('b', i), !n))
            })
            .collect();
        let contract: Vec<(isize, isize)> = (0..nc)
            .map(|i| {
                let n = s.rng.chance(0.3);
                (pos(&lroles, ('c', i), n), pos(&rroles, ('c', i), n))
            })
            .collect();
        let lspec: String = lroles.iter().map(|&r| letter(r)).collect();
        let rspec: String = rroles.iter().map(|&r| letter(r)).collect();
        let ospec: String = batch_order
            .iter()
            .map(|&i| letter(('b', i)))
            .chain(lroles.iter().filter(|r| r.0 == 'l').map(|&r| letter(r)))
            .chain(rroles.iter().filter(|r| r.0 == 'r').map(|&r| letter(r)))
            .collect();
        let spec = format!("{lspec},{rspec}->{ospec}");
        s.case(format!(
            "dot_general {dtype}{ldims:?} x {dtype}{rdims:?} batch {batch:?} contract {contract:?} ({spec})"
        ));
        let d = if dtype.is_float() {
            u(-1.0, 1.0)
        } else {
            Dist::Int(-5, 5)
        };
        let a = s.param("x", dtype, &ldims, &d);
        let b = s.param("y", dtype, &rdims, &d);
        let y = a.dot_general(&b, &batch, &contract).unwrap();
        let (want, terms) = einsum_ref(&spec, &[s.value(&a), s.value(&b)]);
        let scale = if dtype.is_float() { 1.0 } else { 25.0 };
        let t = acc_tol(dtype, terms, scale);
        s.check_formula(&y, t, want, t);
    }
    s.run();
}

#[test]
fn widening_dot_general_products() {
    // The widening products XLA's CPU backend hands to YNNPACK (an 8-bit matrix against int8
    // columns, bf16 into f32), on the interpreter and the device, against an f64 einsum.
    let mut s = Suite::new("dot_general_as", 1502);
    type Case = (
        DType,
        DType,
        DType,
        &'static [usize],
        &'static [usize],
        &'static str,
    );
    let cases: [Case; 6] = [
        (U8, I8, I32, &[5, 7], &[7, 2], "ik,kj->ij"),
        (U8, I8, I32, &[33, 64], &[64, 3], "ik,kj->ij"),
        (I8, I8, I32, &[4, 9], &[9, 2], "ik,kj->ij"),
        (I8, I8, I32, &[2, 3, 5], &[2, 5, 4], "bik,bkj->bij"),
        (BF16, BF16, F32, &[6, 16], &[16, 2], "ik,kj->ij"),
        (BF16, BF16, F32, &[3, 40], &[5, 40], "ik,jk->ij"),
    ];
    for (lt, rt, out, ld, rd, spec) in cases {
        s.case(format!(
            "dot_general_as {lt}{ld:?} x {rt}{rd:?} -> {out} ({spec})"
        ));
        let dist = |t: DType| match t {
            U8 => Dist::Int(0, 255),
            I8 => Dist::Int(-127, 127),
            _ => u(-1.0, 1.0),
        };
        let a = s.param("x", lt, ld, &dist(lt));
        let b = s.param("y", rt, rd, &dist(rt));
        let batched = ld.len() == 3;
        type Pairs = Vec<(isize, isize)>;
        let (batch, contract): (Pairs, Pairs) = match spec {
            "ik,jk->ij" => (vec![], vec![(1, 1)]),
            _ if batched => (vec![(0, 0)], vec![(2, 1)]),
            _ => (vec![], vec![(1, 0)]),
        };
        let y = a.dot_general_as(&b, &batch, &contract, out).unwrap();
        assert_eq!(y.dtype(), out);
        let (want, terms) = einsum_ref(spec, &[s.value(&a), s.value(&b)]);
        let t = acc_tol(out, terms, 1.0);
        s.check_formula(&y, t, want, t);
    }
    s.run();
}

#[test]
fn dot_general_as_refuses_other_mixes_by_name() {
    let g = Graph::new();
    let a = g.parameter("a", U8, &[2, 3]).unwrap();
    let b = g.parameter("b", U8, &[3, 2]).unwrap();
    let e = a
        .dot_general_as(&b, &[], &[(1, 0)], I32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no i32 product of u8 and u8"), "{e}");
    let f = g.parameter("f", F32, &[3, 2]).unwrap();
    let e = f
        .dot_general_as(&f, &[], &[(0, 0)], F64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no f64 product of f32 and f32"), "{e}");
    // Out of range axes are an error naming the builder.
    let e = a
        .dot_general_as(&b, &[], &[(2, 0)], I32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("dot_general_as"), "{e}");
}

#[test]
fn matmul_forms() {
    let mut s = Suite::new("matmul", 1502);
    let forms: [(&str, &str); 8] = [
        ("[m,k] @ [k,n]", "mk,kn->mn"),
        ("[b,m,k] @ [b,k,n]", "bmk,bkn->bmn"),
        ("[a,b,m,k] @ [a,b,k,n]", "abmk,abkn->abmn"),
        ("[b,m,k] @ [k,n]", "bmk,kn->bmn"),
        ("[a,b,m,k] @ [k,n]", "abmk,kn->abmn"),
        ("[k] @ [k,n]", "k,kn->n"),
        ("[b,m,k] @ [k]", "bmk,k->bm"),
        ("[k] @ [k]", "k,k->"),
    ];
    for (name, spec) in forms {
        for dtype in [F32, F64, F16, BF16, I32] {
            s.case(format!("matmul {name} {dtype}"));
            let ops = einsum_operands(&mut s, spec, dtype, &[0, 1, 2, 3, 5]);
            let y = ops[0].matmul(&ops[1]).unwrap();
            let (want, terms) = einsum_ref(spec, &[s.value(&ops[0]), s.value(&ops[1])]);
            let scale = if dtype.is_float() { 1.0 } else { 9.0 };
            let t = acc_tol(dtype, terms, scale);
            s.check_formula(&y, t, want, t);
        }
    }
    s.run();
}

const EINSUM_SPECS: [&str; 16] = [
    // Mamba-2 SSD
    "bclhn,bcshn->bclhs",
    "bclhn,bchpn,bhcl->bclhp",
    "bhzc,bchpn->bzhpn",
    "bcln,bhcl,bclhp->bchpn",
    "bclhn,bhcl,bclhp->bchpn",
    "bclhs,bcshp->bclhp",
    "bclhn,bcshn,bhcls,bcshp->bclhp",
    // classic
    "ij,jk->ik",
    "bij,bjk->bik",
    "i,j->ij",
    "ij->ji",
    "ij->i",
    "ij->",
    "ijk,ik->j",
    "ij,jk",
    "ijk,kj",
];

#[test]
fn einsum_table() {
    let mut s = Suite::new("einsum", 1601);
    for spec in EINSUM_SPECS {
        for (k, dtype) in [F32, F32, F64, BF16].into_iter().enumerate() {
            let sizes: &[usize] = if k == 1 { &[0, 1, 2] } else { &[1, 2, 3] };
            s.case(format!("einsum {spec} {dtype}"));
            let ops = einsum_operands(&mut s, spec, dtype, sizes);
            let refs: Vec<&Tensor> = ops.iter().collect();
            let y = Tensor::einsum(spec, &refs).unwrap();
            let vals: Vec<&HostArray> = ops.iter().map(|t| s.value(t)).collect();
            let (want, terms) = einsum_ref(spec, &vals);
            // Multi-operand specs round intermediate products in the dtype.
            let terms = terms * ops.len();
            s.check_formula(
                &y,
                acc_tol(dtype, terms, 1.0),
                want,
                acc_tol(dtype, terms, 1.0),
            );
        }
    }
    s.run();
}

/// Every einsum contracts each pair of operands with exactly one `dot_general`.
#[test]
fn einsum_lowers_to_one_dot_general_per_pair() {
    let mut rng = Rng::new(1602);
    for spec in EINSUM_SPECS {
        let g = Graph::new();
        let lhs = spec.split("->").next().unwrap();
        let mut sizes: Vec<(char, usize)> = Vec::new();
        let ops: Vec<Tensor> = lhs
            .split(',')
            .enumerate()
            .map(|(k, term)| {
                let dims: Vec<usize> = term
                    .chars()
                    .map(|c| match sizes.iter().find(|(d, _)| *d == c) {
                        Some(&(_, n)) => n,
                        None => {
                            let n = rng.int(2, 4) as usize;
                            sizes.push((c, n));
                            n
                        }
                    })
                    .collect();
                g.parameter(&format!("x{k}"), F32, &dims).unwrap()
            })
            .collect();
        let refs: Vec<&Tensor> = ops.iter().collect();
        let y = Tensor::einsum(spec, &refs).unwrap();
        g.set_outputs(&[&y]).unwrap();
        let text = g.to_stablehlo().unwrap();
        let dots = text.matches("stablehlo.dot_general").count();
        assert_eq!(
            dots,
            ops.len() - 1,
            "einsum {spec:?} with {} operands lowered to {dots} dot_general ops:\n{text}",
            ops.len()
        );
        assert!(
            !text.contains("stablehlo.dot "),
            "einsum {spec:?} used a plain dot:\n{text}"
        );
    }
}

#[test]
fn causal_conv1d_kernels() {
    let mut s = Suite::new("causal_conv1d", 1901);
    for k in 1..=4usize {
        for (j, dtype) in [F32, F64, F16, BF16, F32, F64].into_iter().enumerate() {
            let dims = [
                s.rng.pick(&[0, 1, 2]),
                s.rng.pick(&[0, 1, 2, 3, 5]),
                s.rng.pick(&[1, 2, 3]),
            ];
            let with_bias = j % 2 == 0;
            s.case(format!(
                "causal_conv1d {dtype}{dims:?} k {k} bias {with_bias}"
            ));
            let x = s.param("x", dtype, &dims, &u(-1.0, 1.0));
            let w = s.param("w", dtype, &[dims[2], k], &u(-1.0, 1.0));
            let b = with_bias.then(|| s.param("b", dtype, &[dims[2]], &u(-1.0, 1.0)));
            let y = x.causal_conv1d(&w, b.as_ref()).unwrap();
            let (xv, wv) = (s.value(&x).to_f64_vec(), s.value(&w).to_f64_vec());
            let bv = b.as_ref().map(|b| s.value(b).to_f64_vec());
            let [nb, nt, nc] = dims;
            let mut want = vec![0.0; nb * nt * nc];
            for bi in 0..nb {
                for t in 0..nt {
                    for c in 0..nc {
                        let mut acc = bv.as_ref().map_or(0.0, |b| b[c]);
                        for q in 0..k {
                            let ti = t as i64 - (k as i64 - 1) + q as i64;
                            if ti >= 0 {
                                acc += wv[c * k + q] * xv[(bi * nt + ti as usize) * nc + c];
                            }
                        }
                        want[(bi * nt + t) * nc + c] = acc;
                    }
                }
            }
            let t = acc_tol(dtype, k + 1, 1.0);
            s.check_formula(
                &y,
                t,
                f64_array(&dims, want),
                acc_tol(dtype, 2 * k + 1, 1.0),
            );
        }
    }
    s.run();
}
