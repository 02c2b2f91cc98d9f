//! Random numbers: the device against the interpreter, their statistics and keys, and
//! Threefry's known answer.

use super::*;

#[test]
fn random_agrees_with_interpreter() {
    let mut s = Suite::new("random", 2101);
    for k in 0..12 {
        let dims = shape(&mut s.rng, 0, 3);
        let (a, b) = (s.rng.next_u64() as u32, s.rng.next_u64() as u32);
        s.case(format!("random {dims:?} key [{a}, {b}]"));
        let kt = s.input("k", key(a, b));
        s.check(&s.g.random_bits(&kt, &dims).unwrap());
        // Floats are drawn in f32 and converted: f32's tolerance at least.
        let dtype = FLOATS[k % 4];
        let t = if dtype == F64 { tol(F32) } else { tol(dtype) };
        s.check_tol(&s.g.random_uniform(&kt, dtype, &dims).unwrap(), t);
        s.check_tol(&s.g.random_normal(&kt, dtype, &dims).unwrap(), t);
    }
    s.run();
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
    (m, var.sqrt())
}

#[test]
fn random_statistics_and_keys() {
    const N: usize = 10_000;
    let mut s = Suite::new("random_statistics", 2102);
    s.case("key 1");
    let k1 = s.input("k", key(0, 42));
    let bits = s.check(&s.g.random_bits(&k1, &[N]).unwrap());
    let uni = s.check(&s.g.random_uniform(&k1, F32, &[N]).unwrap());
    let nor = s.check(&s.g.random_normal(&k1, F32, &[100, 100]).unwrap());
    let mut small = Vec::new();
    for dtype in [F64, F16, BF16] {
        small.push(s.check(&s.g.random_uniform(&k1, dtype, &[1000]).unwrap()));
    }
    // The same key used twice in one graph gives the same values.
    let again = s.check(&s.g.random_bits(&k1, &[N]).unwrap());
    s.case("key 2");
    let k2 = s.input("k", key(0, 43));
    let bits2 = s.check(&s.g.random_bits(&k2, &[N]).unwrap());
    let ran = s.run();
    let got = &ran.got;

    let b1 = got[bits].as_array::<u32>().unwrap();
    let b2 = got[bits2].as_array::<u32>().unwrap();
    assert_eq!(got[bits], got[again], "the same key gave different bits");
    let same = b1.iter().zip(b2.iter()).filter(|(a, b)| a == b).count();
    assert!(
        same < 10,
        "keys [0, 42] and [0, 43] share {same} of {N} words"
    );
    let distinct: std::collections::HashSet<u32> = b1.iter().copied().collect();
    assert!(
        distinct.len() > N - 10,
        "only {} distinct words",
        distinct.len()
    );
    let ones: u32 = b1.iter().map(|w| w.count_ones()).sum();
    let frac = f64::from(ones) / (32 * N) as f64;
    assert!((frac - 0.5).abs() < 0.01, "fraction of one bits {frac}");

    let u = got[uni].to_f64_vec();
    assert!(
        u.iter().all(|&x| (0.0..1.0).contains(&x)),
        "uniform outside [0, 1)"
    );
    let (m, sd) = mean_std(&u);
    assert!((m - 0.5).abs() < 0.02, "uniform mean {m}");
    assert!(
        (sd - (1.0f64 / 12.0).sqrt()).abs() < 0.02,
        "uniform std {sd}"
    );
    for &i in &small {
        let v = got[i].to_f64_vec();
        assert!(
            v.iter().all(|&x| (0.0..1.0).contains(&x)),
            "uniform {} outside [0, 1)",
            got[i].dtype()
        );
        let (m, _) = mean_std(&v);
        assert!(
            (m - 0.5).abs() < 0.05,
            "uniform {} mean {m}",
            got[i].dtype()
        );
    }
    let n = got[nor].to_f64_vec();
    assert!(n.iter().all(|x| x.is_finite()), "normal not finite");
    let (m, sd) = mean_std(&n);
    assert!(m.abs() < 0.05, "normal mean {m}");
    assert!((sd - 1.0).abs() < 0.05, "normal std {sd}");

    // A second run of the same executable on the same key gives the same values; another key
    // gives other values.
    let again = ran.compiled.run(&ran.inputs).unwrap();
    assert_eq!(again, *got, "a second run gave different values");
    let mut other = ran.inputs.clone();
    other[0] = key(7, 42);
    let third = ran.compiled.run(&other).unwrap();
    assert_ne!(
        third[bits], got[bits],
        "keys [0, 42] and [7, 42] gave the same bits"
    );
    assert_eq!(third[bits2], got[bits2], "an unrelated key's bits changed");
    assert_eq!(ran.want[bits], got[bits]);
}

/// Random123's known answer for Threefry-2x32-20 with key (0, 0) and counter (0, 0) is
/// (0x6b200159, 0x99ba4efe); `random_bits` returns the first word for counter 0.
#[test]
fn threefry_known_answer() {
    let g = Graph::new();
    let key = g.parameter("key", DType::U32, &[2]).unwrap();
    let bits = g.random_bits(&key, &[3]).unwrap();
    g.set_outputs(&[&bits]).unwrap();
    let inputs = [HostArray::from_vec(&[2], vec![0u32, 0]).unwrap()];
    let reference = g.evaluate(&inputs).unwrap();
    let device = g.compile(&common::client()).unwrap().run(&inputs).unwrap();
    let words = reference[0].as_array::<u32>().unwrap();
    assert_eq!(words[[0]], 0x6b20_0159);
    assert_eq!(reference, device);
}

/// `random_bits_rows` gives row `r` exactly what `random_bits` gives `keys[r]` alone, on the
/// device and in the interpreter; and a row's bits do not change with the other rows' keys.
#[test]
fn row_keys_draw_each_row_from_its_own_key() {
    let mut s = Suite::new("random_rows", 2104);
    let rows: [(u32, u32); 3] = [(0, 42), (7, 9), (u32::MAX, 1)];
    let flat: Vec<u32> = rows.iter().flat_map(|&(a, b)| [a, b]).collect();
    s.case("three rows");
    let keys = s.input("keys", HostArray::from_vec(&[3, 2], flat).unwrap());
    let together = s.check(&s.g.random_bits_rows(&keys, 5).unwrap());
    let alone: Vec<usize> = rows
        .iter()
        .map(|&(a, b)| {
            let k = s.input("k", key(a, b));
            s.check(&s.g.random_bits(&k, &[5]).unwrap())
        })
        .collect();
    s.case("the first row's neighbours changed");
    let other = s.input(
        "keys",
        HostArray::from_vec(&[3, 2], vec![0u32, 42, 1, 1, 2, 2]).unwrap(),
    );
    let moved = s.check(&s.g.random_bits_rows(&other, 5).unwrap());
    let ran = s.run();
    let got = |i: usize| {
        ran.got[i]
            .as_array::<u32>()
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<_>>()
    };
    let all = got(together);
    for (r, &i) in alone.iter().enumerate() {
        assert_eq!(all[r * 5..r * 5 + 5], got(i)[..], "row {r}");
    }
    assert_eq!(got(moved)[..5], all[..5]);
    assert_ne!(got(moved)[5..], all[5..]);
}
