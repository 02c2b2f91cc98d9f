//! `associative_scan` compiled and interpreted against prefix combinations computed here by a
//! host loop: sums, linear recurrences over pairs (forward and reverse), integer maxima, every
//! length from 0 to 17 (odd and even levels of the recursion), another axis; its gradient
//! against finite differences; a recurrence and its gradient against JAX's
//! `lax.associative_scan` on recorded fixtures (`tests/fixtures/jax/make_fixtures.py`); its
//! errors.

use super::*;

/// Runs `g` compiled and interpreted; checks they agree (1e-5 relative) and returns the
/// compiled outputs as f64.
fn both(g: &Graph, inputs: &[HostArray]) -> Vec<Vec<f64>> {
    let dev = g.compile(&client()).unwrap().run(inputs).unwrap();
    let host = g.evaluate(inputs).unwrap();
    dev.iter()
        .zip(&host)
        .map(|(d, h)| {
            let (d, h) = (d.to_f64_vec(), h.to_f64_vec());
            for (a, b) in d.iter().zip(&h) {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{d:?} vs {h:?}");
            }
            d
        })
        .collect()
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

#[test]
fn sums_recurrences_and_maxima_match_a_host_loop_at_every_length() -> Result<()> {
    let mut rng = Rng::new(41);
    for n in 0..=17usize {
        let g = Graph::new();
        // Sums along axis 1 of [2, n, 3].
        let x = g.parameter("x", F32, &[2, n, 3])?;
        let sums = g.associative_scan(&x, 1, |a, b| a.add(b))?;
        // h_t = a_t h_{t-1} + u_t, forward and from the end.
        let a = g.parameter("a", F32, &[n])?;
        let u = g.parameter("u", F32, &[n])?;
        let pair = |(a, u): &(Tensor, Tensor), (a2, u2): &(Tensor, Tensor)| {
            Ok((a.mul(a2)?, a2.mul(u)?.add(u2)?))
        };
        let (_, h) = g.associative_scan(&(a.clone(), u.clone()), -1, pair)?;
        let (_, back) = g.associative_scan_reverse(&(a, u), 0, pair)?;
        let k = g.parameter("k", DType::I32, &[n])?;
        let maxima = g.associative_scan(&k, 0, |a, b| a.maximum(b))?;
        g.set_outputs(&[&sums, &h, &back, &maxima])?;

        let xs = rng.array(F32, &[2, n, 3], -1.0, 1.0);
        let av = rng.array(F32, &[n], -1.0, 1.0);
        let uv = rng.array(F32, &[n], -1.0, 1.0);
        let kv: Vec<i32> = (0..n).map(|_| rng.below(100) as i32 - 50).collect();
        let out = both(
            &g,
            &[xs.clone(), av.clone(), uv.clone(), arr(&[n], kv.clone())],
        );

        let x = xs.to_f64_vec();
        let mut want = x.clone();
        for b in 0..2 {
            for t in 1..n {
                for c in 0..3 {
                    want[(b * n + t) * 3 + c] += want[(b * n + t - 1) * 3 + c];
                }
            }
        }
        close(&out[0], &want, &format!("sums, n = {n}"));
        let (a, u) = (av.to_f64_vec(), uv.to_f64_vec());
        let mut h = vec![0.0; n];
        for t in 0..n {
            h[t] = if t == 0 { u[0] } else { a[t] * h[t - 1] + u[t] };
        }
        close(&out[1], &h, &format!("recurrence, n = {n}"));
        let mut r = vec![0.0; n];
        for t in (0..n).rev() {
            r[t] = if t + 1 == n {
                u[t]
            } else {
                a[t] * r[t + 1] + u[t]
            };
        }
        close(&out[2], &r, &format!("reverse recurrence, n = {n}"));
        let mut m = Vec::with_capacity(n);
        for &v in &kv {
            let last = m.last().copied().unwrap_or(i32::MIN);
            m.push(last.max(v));
        }
        let m: Vec<f64> = m.iter().map(|&v| v as f64).collect();
        assert_eq!(out[3], m, "maxima, n = {n}");
    }
    Ok(())
}

#[test]
fn the_gradient_of_a_scanned_recurrence_matches_finite_differences() -> Result<()> {
    let mut rng = Rng::new(43);
    let n = 11;
    let (a0, u0) = (
        rng.array(F64, &[n], -0.9, 0.9),
        rng.array(F64, &[n], -1.0, 1.0),
    );
    let g = Graph::new();
    let a = g.parameter("a", F64, &[n])?;
    let u = g.parameter("u", F64, &[n])?;
    let (_, h) = g.associative_scan(&(a.clone(), u.clone()), 0, |(a, u), (a2, u2)| {
        Ok((a.mul(a2)?, a2.mul(u)?.add(u2)?))
    })?;
    let loss = h.sin()?.sum_all()?;
    let grads = loss.grad(&[&a, &u])?;
    g.set_outputs(&[&loss, &grads[0], &grads[1]])?;
    let at = |which: usize, e: usize, d: f64| {
        let mut ins = [a0.to_f64_vec(), u0.to_f64_vec()];
        ins[which][e] += d;
        let ins: Vec<HostArray> = ins
            .into_iter()
            .map(|v| HostArray::from_vec(&[n], v).unwrap())
            .collect();
        g.evaluate(&ins).unwrap()
    };
    let here = at(0, 0, 0.0);
    for which in 0..2 {
        let analytic = here[which + 1].to_f64_vec();
        for (e, &want) in analytic.iter().enumerate() {
            let fd = (at(which, e, 1e-6)[0].to_f64_vec()[0]
                - at(which, e, -1e-6)[0].to_f64_vec()[0])
                / 2e-6;
            assert!(
                (fd - want).abs() <= 1e-6 * fd.abs().max(1.0),
                "d loss / d {}[{e}]: {want} vs {fd}",
                ["a", "u"][which]
            );
        }
    }
    Ok(())
}

#[test]
fn associative_scan_checks_its_elements() -> Result<()> {
    let g = Graph::new();
    let a = g.parameter("a", F32, &[4, 2])?;
    let b = g.parameter("b", F32, &[3, 2])?;
    let e = g
        .associative_scan(&(a.clone(), b), 0, |x, _| Ok(x.clone()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("element 1 (f32[3, 2]) has length 3 along the axis, element 0 has 4"),
        "{e}"
    );
    let e = g
        .associative_scan(&a, 2, |x, y| x.add(y))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("axis 2 is out of range for element 0, f32[4, 2]"),
        "{e}"
    );
    let e = g
        .associative_scan(&a, 0, |x, y| x.add(y)?.sum(&[-1]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("combine turned element 0 from f32[2, 2] into f32[2]"),
        "{e}"
    );
    Ok(())
}

/// Section `section` of the JAX fixtures, `tests/fixtures/jax/transforms.json`.
pub(crate) fn jax_fixture(section: &str) -> serde_json::Value {
    let text = std::fs::read_to_string("tests/fixtures/jax/transforms.json").unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    all[section].clone()
}

/// The values of `key` in a fixture section.
pub(crate) fn values(section: &serde_json::Value, key: &str) -> Vec<f64> {
    section[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in the fixture"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn a_recurrence_and_its_gradient_match_jax() -> Result<()> {
    let f = jax_fixture("assoc");
    let g = Graph::new();
    let a = g.parameter("a", F64, &[7, 3])?;
    let b = g.parameter("b", F64, &[7, 3])?;
    let r = g.parameter("r", F64, &[7, 3])?;
    // h[t] = a[t] h[t-1] + b[t]: (a1, b1) then (a2, b2) combine to (a1 a2, a2 b1 + b2).
    let combine = |x: &(Tensor, Tensor), y: &(Tensor, Tensor)| -> Result<(Tensor, Tensor)> {
        Ok((x.0.mul(&y.0)?, y.0.mul(&x.1)?.add(&y.1)?))
    };
    let (_, h) = g.associative_scan(&(a.clone(), b.clone()), 0, combine)?;
    let (_, hr) = g.associative_scan_reverse(&(a.clone(), b.clone()), 0, combine)?;
    let loss = h.add(&hr.mul(2.0)?)?.mul(&r)?.sum_all()?;
    let grads = loss.grad(&[&a, &b])?;
    g.set_outputs(&[&h, &hr, &grads[0], &grads[1]])?;
    let input = |k: &str| HostArray::from_vec(&[7, 3], values(&f, k)).unwrap();
    let out = both(&g, &[input("a"), input("b"), input("r")]);
    for (k, key) in ["h", "hr", "ga", "gb"].iter().enumerate() {
        let want = values(&f, key);
        assert_eq!(out[k].len(), want.len(), "{key}");
        for (a, b) in out[k].iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                "{key}: {a} vs JAX {b}"
            );
        }
    }
    Ok(())
}
