//! Elementwise ops: unary and binary arithmetic over every dtype and special value, integer
//! edge cases, logic and shifts, comparisons, broadcasting and every operand form of the
//! operators, select / where / clamp, conversions between every pair of dtypes and bitcasts.

use super::*;

fn unary_float_ops() -> Vec<(&'static str, Unary, Dist)> {
    vec![
        ("neg", Tensor::neg as Unary, u(-10.0, 10.0)),
        ("abs", Tensor::abs, u(-10.0, 10.0)),
        ("exp", Tensor::exp, u(-10.0, 10.0)),
        (
            "expm1",
            Tensor::expm1,
            one_of(&[u(-5.0, 5.0), u(-1e-3, 1e-3)]),
        ),
        ("log", Tensor::log, Dist::PosLogU(-3.0, 3.0)),
        (
            "log1p",
            Tensor::log1p,
            one_of(&[u(-0.99, 10.0), u(-1e-3, 1e-3)]),
        ),
        ("sqrt", Tensor::sqrt, with(u(0.0, 100.0), &[0.0], 0.1)),
        ("rsqrt", Tensor::rsqrt, Dist::PosLogU(-2.0, 3.0)),
        ("tanh", Tensor::tanh, u(-6.0, 6.0)),
        ("logistic", Tensor::logistic, u(-12.0, 12.0)),
        ("sigmoid", Tensor::sigmoid, u(-12.0, 12.0)),
        ("floor", Tensor::floor, u(-10.0, 10.0)),
        ("ceil", Tensor::ceil, u(-10.0, 10.0)),
        ("sign", Tensor::sign, with(u(-3.0, 3.0), &[0.0, -0.0], 0.2)),
        ("sin", Tensor::sin, u(-4.0, 4.0)),
        ("cos", Tensor::cos, u(-4.0, 4.0)),
    ]
}

#[test]
fn unary_float() {
    let mut s = Suite::new("unary_float", 101);
    for (name, f, dist) in unary_float_ops() {
        for dtype in FLOATS {
            for _ in 0..2 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let x = s.param("x", dtype, &dims, &dist);
                let y = f(&x).unwrap();
                s.check(&y);
            }
        }
    }
    s.run();
}

/// NaN, infinities, signed zeros and domain edges through every float unary op.
#[test]
fn unary_float_specials() {
    let mut s = Suite::new("unary_float_specials", 102);
    for (name, f, _) in unary_float_ops() {
        for dtype in FLOATS {
            s.case(format!("{name} {dtype} specials"));
            let x = s.input("x", array_of(dtype, &[SPECIALS.len()], &SPECIALS));
            let y = f(&x).unwrap();
            s.check(&y);
        }
    }
    s.run();
}

/// A NaN made inside the program stays NaN through `logistic` and whatever follows it. XLA's
/// CPU backend let a fused sine or cosine of `logistic(0 / 0)` assume a number (0.84, 1 or -0,
/// depending on memory contents; found by the random_graph fuzzer); the lowering now selects
/// the NaN operand. Device against the interpreter, NaN for NaN.
#[test]
fn logistic_of_a_nan_made_in_the_program_stays_nan() {
    let consumers: [(&str, Unary); 4] = [
        ("logistic", |l| Ok(l.clone())),
        ("sin", Tensor::sin),
        ("cos", Tensor::cos),
        ("exp(sin)", |l| l.sin()?.exp()),
    ];
    let client = client();
    for ((name, f), n) in consumers
        .into_iter()
        .flat_map(|c| [3usize, 17, 100, 1000].map(|n| (c, n)))
    {
        let g = Graph::new();
        let i = g.iota(F32, &[n], 0).unwrap();
        let y = f(&i.div(&i).unwrap().logistic().unwrap()).unwrap();
        g.set_outputs(&[&y]).unwrap();
        let want = stablegraph::interp::evaluate(&g, &[]).unwrap()[0].to_f64_vec();
        let got = g.compile(&client).unwrap().run(&[]).unwrap()[0].to_f64_vec();
        assert!(want[0].is_nan(), "{name}: the interpreter gave {}", want[0]);
        for (j, (x, y)) in got.iter().zip(&want).enumerate() {
            let same = (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-6;
            assert!(
                same,
                "{name} of {n}, element {j}: device {x}, interpreter {y}"
            );
        }
    }
}

#[test]
fn unary_int_and_pred() {
    let mut s = Suite::new("unary_int_and_pred", 103);
    let ops: [(&str, Unary); 4] = [
        ("neg", Tensor::neg),
        ("abs", Tensor::abs),
        ("sign", Tensor::sign),
        ("not", Tensor::not),
    ];
    let dist = one_of(&[Dist::Bits, Dist::Int(-3, 3), pick(&[0.0])]);
    let udist = one_of(&[Dist::Bits, Dist::Int(0, 3)]);
    for (name, f) in ops {
        for dtype in INTS {
            for _ in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let d = if dtype.is_unsigned() { &udist } else { &dist };
                let x = s.param("x", dtype, &dims, d);
                s.check(&f(&x).unwrap());
            }
        }
    }
    for _ in 0..4 {
        let dims = shape(&mut s.rng, 0, 3);
        s.case(format!("not pred{dims:?}"));
        let x = s.param("x", Pred, &dims, &Dist::Bool(0.5));
        s.check(&x.not().unwrap());
    }
    // The method and the operator are the same op.
    s.case("-x operator");
    let x = s.param("x", F32, &[3], &u(-1.0, 1.0));
    s.check(&(-&x).unwrap());
    s.run();
}

fn float_binary_ops() -> Vec<(&'static str, Binary)> {
    vec![
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("div", |a, b| a.div(b)),
        ("pow", |a, b| a.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
        ("rem", |a, b| a.rem(b)),
    ]
}

#[test]
fn binary_float() {
    let mut s = Suite::new("binary_float", 201);
    let plain = u(-10.0, 10.0);
    let with_nan = with(u(-10.0, 10.0), &[f64::NAN, 0.0, 1.0], 0.15);
    let away_from_zero = one_of(&[u(-10.0, -0.5), u(0.5, 10.0)]);
    for (name, f) in float_binary_ops() {
        for dtype in FLOATS {
            for k in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let (a, b) = match name {
                    "div" | "rem" => (
                        s.param("x", dtype, &dims, &plain),
                        s.param("y", dtype, &dims, &away_from_zero),
                    ),
                    // Positive bases with real exponents, or any base with small integral ones.
                    "pow" if k < 2 => (
                        s.param("x", dtype, &dims, &u(0.01, 4.0)),
                        s.param("y", dtype, &dims, &u(0.0, 3.0)),
                    ),
                    "pow" => (
                        s.param("x", dtype, &dims, &u(-4.0, 4.0)),
                        s.param("y", dtype, &dims, &Dist::Int(0, 3)),
                    ),
                    "maximum" | "minimum" => (
                        s.param("x", dtype, &dims, &with_nan),
                        s.param("y", dtype, &dims, &with_nan),
                    ),
                    _ => (
                        s.param("x", dtype, &dims, &plain),
                        s.param("y", dtype, &dims, &plain),
                    ),
                };
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    // IEEE specials where the result is fully defined (x/0, inf-inf, NaN propagation, ...).
    for (name, f) in float_binary_ops() {
        if name == "pow" || name == "rem" {
            continue; // see `float_specials_pow_and_rem`
        }
        for dtype in FLOATS {
            s.case(format!("{name} {dtype} specials"));
            let (a, b) = specials_grid(&mut s, dtype);
            s.check(&f(&a, &b).unwrap());
        }
    }
    s.run();
}

/// Two parameters of `dtype` that pair every special value with every other: `x[i, j] =
/// SPECIALS[i]`, `y[i, j] = SPECIALS[j]`.
fn specials_grid(s: &mut Suite, dtype: DType) -> (Tensor, Tensor) {
    let n = SPECIALS.len();
    let xs: Vec<f64> = (0..n * n).map(|i| SPECIALS[i / n]).collect();
    let ys: Vec<f64> = (0..n * n).map(|i| SPECIALS[i % n]).collect();
    let a = s.input("x", array_of(dtype, &[n, n], &xs));
    (a, s.input("y", array_of(dtype, &[n, n], &ys)))
}

/// `pow` and `rem` on specials: C's `pow`/`fmod` conventions (`pow(x, 0) = 1`, `pow(1, y) = 1`,
/// `fmod(x, 0) = NaN`, `fmod(x, inf) = x`, ...).
#[test]
fn float_specials_pow_and_rem() {
    let mut s = Suite::new("float_specials_pow_and_rem", 202);
    for (name, f) in float_binary_ops() {
        if name != "pow" && name != "rem" {
            continue;
        }
        for dtype in FLOATS {
            s.case(format!("{name} {dtype} specials"));
            let (a, b) = specials_grid(&mut s, dtype);
            s.check(&f(&a, &b).unwrap());
        }
    }
    s.run();
}

#[test]
fn binary_int() {
    let mut s = Suite::new("binary_int", 203);
    let ops: Vec<(&str, Binary)> = vec![
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("div", |a, b| a.div(b)),
        ("pow", |a, b| a.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
        ("rem", |a, b| a.rem(b)),
    ];
    for (name, f) in ops {
        for dtype in INTS {
            let signed = !dtype.is_unsigned();
            for k in 0..3 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let small = if signed {
                    Dist::Int(-100, 100)
                } else {
                    Dist::Int(0, 200)
                };
                let (a, b) = match name {
                    "div" | "rem" => {
                        let den = if signed {
                            nonzero(Dist::Int(-20, 20))
                        } else {
                            Dist::Int(1, 20)
                        };
                        (
                            s.param("x", dtype, &dims, &one_of(&[Dist::Bits, small])),
                            s.param("y", dtype, &dims, &den),
                        )
                    }
                    "pow" => {
                        let base = if k == 2 {
                            Dist::Bits // wraps
                        } else if signed {
                            Dist::Int(-6, 6)
                        } else {
                            Dist::Int(0, 6)
                        };
                        (
                            s.param("x", dtype, &dims, &base),
                            s.param("y", dtype, &dims, &Dist::Int(0, 5)),
                        )
                    }
                    _ => {
                        let d = if k == 0 { small } else { Dist::Bits };
                        (
                            s.param("x", dtype, &dims, &d),
                            s.param("y", dtype, &dims, &d),
                        )
                    }
                };
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    s.run();
}

/// Integer division and remainder by zero and the signed overflow case, as documented on
/// `BinaryOp` (XLA's definitions: `x / 0 = -1`, `x % 0 = x`, `MIN / -1 = MIN`, `MIN % -1 = 0`).
#[test]
fn int_division_edge_cases() {
    let mut s = Suite::new("int_division_edge_cases", 204);
    for dtype in INTS {
        let xs: Vec<f64> = match dtype {
            U8 => vec![0.0, 1.0, 7.0, 255.0],
            U32 => vec![0.0, 1.0, 7.0, 4294967295.0],
            U64 => vec![0.0, 1.0, 7.0, 1e19],
            I32 => vec![0.0, 1.0, -7.0, -2147483648.0],
            _ => vec![0.0, 1.0, -7.0, -9.223_372_036_854_776e18],
        };
        let ys = if dtype.is_unsigned() {
            vec![0.0, 0.0, 0.0, 0.0]
        } else {
            vec![0.0, 0.0, 0.0, -1.0]
        };
        s.case(format!("div/rem {dtype} by zero"));
        let a = s.input("x", array_of(dtype, &[4], &xs));
        let b = s.input("y", array_of(dtype, &[4], &ys));
        s.check(&a.div(&b).unwrap());
        s.check(&a.rem(&b).unwrap());
    }
    s.run();
}

#[test]
fn logical_and_shifts() {
    let mut s = Suite::new("logical_and_shifts", 301);
    let ops: Vec<(&str, Binary)> = vec![
        ("and", |a, b| a.and(b)),
        ("or", |a, b| a.or(b)),
        ("xor", |a, b| a.xor(b)),
    ];
    for (name, f) in &ops {
        for dtype in [Pred, U8, U32, U64, I32, I64] {
            for _ in 0..2 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let d = if dtype == Pred {
                    Dist::Bool(0.5)
                } else {
                    Dist::Bits
                };
                let a = s.param("x", dtype, &dims, &d);
                let b = s.param("y", dtype, &dims, &d);
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    let shifts: Vec<(&str, Binary)> = vec![
        ("shift_left", |a, b| a.shift_left(b)),
        ("shift_right", |a, b| a.shift_right_logical(b)),
    ];
    for (name, f) in &shifts {
        for (dtype, reps) in [(U32, 4), (I32, 4), (U8, 1), (U64, 1), (I64, 1)] {
            let bits = 8 * dtype.size_in_bytes() as i64;
            for _ in 0..reps {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let a = s.param("x", dtype, &dims, &Dist::Bits);
                let b = s.param("y", dtype, &dims, &Dist::Int(0, bits + 8));
                s.check(&f(&a, &b).unwrap());
            }
            // Every amount from 0 to past the width, on one value.
            s.case(format!("{name} {dtype} all amounts"));
            let n = (bits + 9) as usize;
            let a = s.param("x", dtype, &[n], &pick(&[1.0, 3.0, 100.0]));
            let amounts: Vec<f64> = (0..n).map(|i| i as f64).collect();
            let b = s.input("y", array_of(dtype, &[n], &amounts));
            s.check(&f(&a, &b).unwrap());
        }
    }
    s.run();
}

/// A shift by a negative amount of a signed type (an amount >= the width as unsigned).
#[test]
fn shift_by_negative_amount() {
    let mut s = Suite::new("shift_by_negative_amount", 302);
    for dtype in [I32, I64] {
        s.case(format!("{dtype} shifts by -1, -32, -64"));
        let a = s.input("x", array_of(dtype, &[3], &[-8.0, 12345.0, -1.0]));
        let b = s.input("y", array_of(dtype, &[3], &[-1.0, -32.0, -64.0]));
        s.check(&a.shift_left(&b).unwrap());
        s.check(&a.shift_right_logical(&b).unwrap());
    }
    s.run();
}

#[test]
fn comparisons() {
    let mut s = Suite::new("comparisons", 401);
    let ops: Vec<(&str, Binary)> = vec![
        ("eq", |a, b| a.eq(b)),
        ("ne", |a, b| a.ne(b)),
        ("lt", |a, b| a.lt(b)),
        ("le", |a, b| a.le(b)),
        ("gt", |a, b| a.gt(b)),
        ("ge", |a, b| a.ge(b)),
    ];
    let float = with(
        pick(&[-1.0, 0.0, 1.0, 2.5]),
        &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0],
        0.3,
    );
    for (name, f) in &ops {
        for dtype in [Pred, U8, U32, U64, I32, I64, F16, BF16, F32, F64] {
            for k in 0..2 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("{name} {dtype}{dims:?}"));
                let d = match dtype {
                    Pred => Dist::Bool(0.5),
                    _ if dtype.is_float() => float.clone(),
                    _ if k == 0 => Dist::Int(0, 3), // many ties
                    _ => Dist::Bits,
                };
                let a = s.param("x", dtype, &dims, &d);
                let b = s.param("y", dtype, &dims, &d);
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    s.run();
}

#[test]
fn broadcasting_and_number_operands() {
    let mut s = Suite::new("broadcasting", 501);
    let ops: Vec<(&str, Binary)> = vec![
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("lt", |a, b| a.lt(b)),
        ("&a + &b", |a, b| a + b),
        ("&a * &b", |a, b| a * b),
        ("&a - &b", |a, b| a - b),
        ("(&a + &b) * &a", |a, b| (a + b) * a),
        ("&b * (&a - &b)", |a, b| b * (a - b)),
    ];
    for (name, f) in &ops {
        for dtype in [F32, F64, I32] {
            for _ in 0..3 {
                let out = shape(&mut s.rng, 0, 3);
                let (da, db) = (
                    sub_broadcast(&mut s.rng, &out),
                    sub_broadcast(&mut s.rng, &out),
                );
                s.case(format!("{name} {dtype}{da:?} with {dtype}{db:?}"));
                let a = s.param("x", dtype, &da, &Dist::Int(-5, 5));
                let b = s.param("y", dtype, &db, &Dist::Int(-5, 5));
                s.check(&f(&a, &b).unwrap());
            }
        }
    }
    let scalar_ops: Vec<(&str, Unary)> = vec![
        ("&a + 2.0", |a| a + 2.0),
        ("a + 2.0 (owned)", |a| a.clone() + 2.0),
        ("2.0 * &a", |a| 2.0 * a),
        ("2.0 - &a", |a| 2.0 - a),
        ("&a / 4.0", |a| a / 4.0),
        ("2.0 / a (owned)", |a| 2.0 / a.clone()),
        ("a.add(3i64)", |a| a.add(3i64)),
        ("a.mul(2i32)", |a| a.mul(2i32)),
        ("a.sub(1u32)", |a| a.sub(1u32)),
        ("a.maximum(0.5f32)", |a| a.maximum(0.5f32)),
        ("a.lt(1.0)", |a| a.lt(1.0)),
        ("a.ge(0usize)", |a| a.ge(0usize)),
    ];
    for (name, f) in &scalar_ops {
        for dtype in [F32, F64, F16, BF16] {
            let dims = shape(&mut s.rng, 0, 3);
            s.case(format!("{name} {dtype}{dims:?}"));
            let a = s.param("x", dtype, &dims, &nonzero(Dist::Int(-5, 5)));
            s.check(&f(&a).unwrap());
        }
    }
    for dtype in [I32, I64, U32] {
        let dims = shape(&mut s.rng, 0, 3);
        s.case(format!("int number operands {dtype}{dims:?}"));
        let a = s.param("x", dtype, &dims, &Dist::Int(1, 9));
        s.check(&a.add(3i64).unwrap());
        s.check(&(&a * 2.0).unwrap());
        s.check(&(7.0 - &a).unwrap());
        s.check(&a.rem(4u32).unwrap());
        s.check(&a.eq(5i32).unwrap());
    }
    s.run();
}

/// An operator applied to two tensors (in any of the operand forms) and the same arithmetic on
/// the host.
type OperatorCase = (&'static str, Binary, fn(f64, f64) -> f64);

/// Every operand form of the operators (`Tensor`, `&Tensor`, `Result<Tensor>`, numbers of each
/// kind on either side), against the interpreter and the same arithmetic on the host. Values
/// are small integers, so every result is exact in every dtype used.
#[test]
fn operators_every_operand_form() {
    let mut s = Suite::new("operators", 502);
    let forms: Vec<OperatorCase> = vec![
        ("a + b", |a, b| a.clone() + b.clone(), |x, y| x + y),
        ("&a - b", |a, b| a - b.clone(), |x, y| x - y),
        ("a * &b", |a, b| a.clone() * b, |x, y| x * y),
        ("&a % &b", |a, b| a % b, |x, y| x % y),
        ("a / (&b * 1)", |a, b| a.clone() / (b * 1), |x, y| x / y),
        ("(&a + &b) - b", |a, b| (a + b) - b.clone(), |x, _| x),
        (
            "a - (&a * &b)",
            |a, b| a.clone() - (a * b),
            |x, y| x - x * y,
        ),
        ("&b * (&a + 2)", |a, b| b * (a + 2), |x, y| y * (x + 2.0)),
        (
            "(&a * 3i64) + &b",
            |a, b| (a * 3i64) + b,
            |x, y| 3.0 * x + y,
        ),
        ("-(a) + &b", |a, b| -(a.clone()) + b, |x, y| y - x),
        (
            "&a * 10 - 4u32",
            |a, _| (a * 10)? - 4u32,
            |x, _| 10.0 * x - 4.0,
        ),
        ("6i64 - &a", |a, _| 6i64 - a, |x, _| 6.0 - x),
        (
            "2 * a + 1usize",
            |a, _| (2 * a.clone())? + 1usize,
            |x, _| 2.0 * x + 1.0,
        ),
        ("-&b", |_, b| -b, |_, y| -y),
    ];
    let float_forms: Vec<OperatorCase> = vec![
        ("&a * 0.5", |a, _| a * 0.5, |x, _| 0.5 * x),
        ("1.5 - a", |a, _| 1.5 - a.clone(), |x, _| 1.5 - x),
        ("&a / 2.0f32", |a, _| a / 2.0f32, |x, _| x / 2.0),
    ];
    for dtype in [F64, F32, BF16, I32, I64] {
        let ours = forms.iter().chain(if dtype.is_float() {
            &float_forms[..]
        } else {
            &[]
        });
        for (name, f, host) in ours {
            let dims = [2, 3];
            s.case(format!("{name} {dtype}"));
            let a = s.param("a", dtype, &dims, &Dist::Int(1, 6));
            let b = s.param("b", dtype, &dims, &Dist::Int(1, 4));
            let (av, bv) = (s.value(&a).to_f64_vec(), s.value(&b).to_f64_vec());
            let want: Vec<f64> = av
                .iter()
                .zip(&bv)
                .map(|(&x, &y)| {
                    let v = host(x, y);
                    // Integer division truncates.
                    if dtype.is_int() && name.contains('/') {
                        v.trunc()
                    } else {
                        v
                    }
                })
                .collect();
            let want = array_of(dtype, &dims, &want);
            s.check_exact(&f(&a, &b).unwrap(), want);
        }
    }
    // Integer numbers keep every bit: 2^60 + 1 does not round through an f64.
    let big = (1i64 << 60) + 1;
    s.case("i64 + 2^60 + 1");
    let a = s.param("a", I64, &[3], &Dist::Int(-5, 5));
    let want: Vec<i64> = s
        .value(&a)
        .to_f64_vec()
        .iter()
        .map(|&x| x as i64 + big)
        .collect();
    let want = HostArray::from_vec(&[3], want).unwrap();
    s.check_exact(&(&a + big).unwrap(), want);
    s.case("u64 * 3 + 2^63");
    let u = s.param("u", U64, &[3], &Dist::Int(0, 5));
    let want: Vec<u64> = s
        .value(&u)
        .to_f64_vec()
        .iter()
        .map(|&x| x as u64 * 3 + (1u64 << 63))
        .collect();
    let want = HostArray::from_vec(&[3], want).unwrap();
    let y = ((&u * 3).unwrap() + (1u64 << 63)).unwrap();
    s.check_exact(&y, want);
    s.run();
}

#[test]
fn select_where_clamp() {
    let mut s = Suite::new("select_where_clamp", 601);
    for k in 0..24 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dtype = if k % 10 == 9 { Pred } else { dtype };
        let out = shape(&mut s.rng, 0, 3);
        let (dc, dt, df) = (
            sub_broadcast(&mut s.rng, &out),
            sub_broadcast(&mut s.rng, &out),
            sub_broadcast(&mut s.rng, &out),
        );
        s.case(format!("select pred{dc:?} {dtype}{dt:?} {dtype}{df:?}"));
        let c = s.param("c", Pred, &dc, &Dist::Bool(0.5));
        let d = if dtype == Pred {
            Dist::Bool(0.5)
        } else {
            Dist::Bits
        };
        let t = s.param("t", dtype, &dt, &d);
        let f = s.param("f", dtype, &df, &d);
        s.check_tol(&c.select(&t, &f).unwrap(), Tol::Bits);
        s.check_tol(&t.where_(&c, &f).unwrap(), Tol::Bits);
        let one = if dtype == Pred { 1.0 } else { 7.0 };
        s.check_tol(&t.where_(&c, one).unwrap(), Tol::Bits);
        // A number for either branch takes the other's dtype.
        s.check_tol(&c.select(one, &f).unwrap(), Tol::Bits);
        s.check_tol(&c.select(&t, one).unwrap(), Tol::Bits);
    }
    for k in 0..24 {
        let dtype = NUMERIC[k % NUMERIC.len()];
        let dims = shape(&mut s.rng, 0, 3);
        // NaN operands: see `clamp_propagates_nan`.
        let x_dist = if dtype.is_unsigned() {
            Dist::Int(0, 20)
        } else {
            Dist::Int(-10, 10)
        };
        s.case(format!("clamp {dtype}{dims:?}"));
        let x = s.param("x", dtype, &dims, &x_dist);
        let (lo, hi) = if dtype.is_unsigned() {
            (3.0, 12.0)
        } else {
            (-3.0, 4.0)
        };
        s.check(&x.clamp(lo, hi).unwrap());
        // Tensor bounds that broadcast to x (sometimes lo > hi: the result is then hi).
        let dl = sub_broadcast(&mut s.rng, &dims);
        let dh = sub_broadcast(&mut s.rng, &dims);
        let bound = if dtype.is_unsigned() {
            Dist::Int(0, 15)
        } else {
            Dist::Int(-8, 8)
        };
        let l = s.param("lo", dtype, &dl, &bound);
        let h = s.param("hi", dtype, &dh, &bound);
        s.check(&x.clamp(&l, &h).unwrap());
        s.check(&x.clamp(&l, hi).unwrap());
    }
    s.run();
}

/// `Clamp` is `min(max(x, lo), hi)` with the NaN-propagating float max and min of `BinaryOp`: a
/// NaN operand (x, lo or hi) gives NaN.
#[test]
fn clamp_propagates_nan() {
    let mut s = Suite::new("clamp_propagates_nan", 602);
    let nan = f64::NAN;
    for dtype in FLOATS {
        s.case(format!("clamp {dtype} with NaN operands"));
        let x = s.input("x", array_of(dtype, &[4], &[nan, 0.5, 0.5, nan]));
        let lo = s.input("lo", array_of(dtype, &[4], &[-1.0, nan, -1.0, 2.0]));
        let hi = s.input("hi", array_of(dtype, &[4], &[1.0, 1.0, nan, -2.0]));
        let want = array_of(dtype, &[4], &[nan, nan, nan, nan]);
        let y = x.clamp(&lo, &hi).unwrap();
        s.check_exact(&y, want);
        let want = array_of(dtype, &[4], &[nan, 0.5, 0.5, nan]);
        let y = x.clamp(-1.0, 1.0).unwrap();
        s.check_exact(&y, want);
    }
    s.run();
}

/// Source values for converting `src` to `dst` whose result is fully determined by the op's
/// documentation: in the target's range, away from float rounding midpoints.
fn convert_dist(src: DType, dst: DType) -> Dist {
    if src == Pred {
        return Dist::Bool(0.5);
    }
    if src.is_int() {
        if dst.is_int() || dst == Pred || dst == F32 || dst == F64 {
            return one_of(&[Dist::Bits, Dist::Int(0, 3)]);
        }
        // Within +-2^24, where every integer is an f32.
        let lim = 1 << 24;
        return match src {
            U8 => Dist::Bits,
            _ if src.is_unsigned() => one_of(&[Dist::Int(0, lim), Dist::Int(0, 300)]),
            _ => one_of(&[Dist::Int(-lim, lim), Dist::Int(-300, 300)]),
        };
    }
    // Float sources.
    let src_max = match src {
        F16 => 65504.0,
        _ => f64::MAX,
    };
    match dst {
        Pred => with(u(-2.0, 2.0), &[0.0, -0.0, f64::NAN, f64::INFINITY], 0.3),
        _ if dst.is_int() => {
            let hi: f64 = match dst {
                U8 => 255.0,
                U32 => 4294967295.0,
                U64 => 1.8e19,
                I32 => 2147483647.0,
                _ => 9.2e18,
            };
            let hi = (0.9 * hi).min(src_max);
            let lo = if dst.is_unsigned() { 0.0 } else { -hi };
            let small = if dst.is_unsigned() {
                u(0.0, 10.0)
            } else {
                u(-10.0, 10.0)
            };
            one_of(&[u(lo, hi), small])
        }
        _ => {
            let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0];
            // Widening is exact (bf16 -> f16 too, in the range used here); narrowing rounds.
            let wide = dst.size_in_bytes() > src.size_in_bytes() || (src == BF16 && dst == F16);
            let base = if src == F16 || dst == F16 {
                Dist::LogU(-3.0, 4.0)
            } else {
                Dist::LogU(-6.0, 6.0)
            };
            let base = if wide {
                base
            } else {
                Dist::AwayFromMid(Box::new(base), src, dst)
            };
            with(base, &specials, 0.15)
        }
    }
}

#[test]
fn convert_every_pair() {
    let mut s = Suite::new("convert_every_pair", 701);
    for src in DType::ALL {
        for dst in DType::ALL {
            for _ in 0..2 {
                let dims = shape(&mut s.rng, 0, 3);
                s.case(format!("convert {src}{dims:?} to {dst}"));
                let x = s.param("x", src, &dims, &convert_dist(src, dst));
                s.check_tol(&x.astype(dst).unwrap(), Tol::Exact);
            }
        }
    }
    s.run();
}

/// Conversions at the edges of the documented semantics: narrowing rounds once, to nearest even,
/// from the exact source value (no double rounding through f32); f16 subnormals; huge integers.
#[test]
fn convert_rounding_edge_cases() {
    let mut s = Suite::new("convert_rounding_edge_cases", 702);
    // 1 + 2^-8 + 2^-30: directly to bf16 rounds up to 1 + 2^-7; through f32 it would first
    // become 1 + 2^-8 exactly (a bf16 tie) and then round to even, 1.
    let one = 1.0 + 2f64.powi(-8) + 2f64.powi(-30);
    // 1 + 2^-11 + 2^-40: same for f16, where f64 converts through f32 on every processor.
    let one_h = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    s.case("f64 -> bf16 / f16 just above a tie");
    let x = s.input("x", array_of(F64, &[4], &[one, -one, one_h, -one_h]));
    s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    // Exact ties round to even.
    s.case("exact ties");
    let ties = [
        1.0 + 2f64.powi(-8),
        1.0 + 3.0 * 2f64.powi(-8),
        1.0 + 2f64.powi(-11),
        1.0 + 3.0 * 2f64.powi(-11),
    ];
    let x = s.input("x", array_of(F32, &[4], &ties));
    s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    let x = s.input("y", array_of(F64, &[4], &ties));
    s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    // 2^25 + 2^17 + 1: directly to bf16 rounds up to 2^25 + 2^18; through f32 it would become
    // the tie 2^25 + 2^17 and round to even, 2^25.
    s.case("i64/i32/u32/u64 -> bf16 just above a tie");
    let v = 33_685_505.0;
    for dtype in [I32, I64, U32, U64] {
        let x = s.input("x", array_of(dtype, &[1], &[v]));
        s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    }
    // f16 subnormals and overflow.
    s.case("f32 -> f16 subnormals and overflow");
    let vals = [1e-5, -3e-6, 6e-8, 2.9e-8, 65519.0, 65520.0, 1e6, -1e6];
    let x = s.input("x", array_of(F32, &[vals.len()], &vals));
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    let x = s.input("y", array_of(F64, &[vals.len()], &vals));
    s.check_tol(&x.astype(F16).unwrap(), Tol::Exact);
    s.case("f16 subnormals to wider types");
    let x = s.input(
        "x",
        HostArray::from_vec(
            &[3],
            vec![
                f16::from_bits(1),
                f16::from_bits(0x3ff),
                f16::from_bits(0x8001),
            ],
        )
        .unwrap(),
    );
    s.check_tol(&x.astype(F32).unwrap(), Tol::Exact);
    s.check_tol(&x.astype(BF16).unwrap(), Tol::Exact);
    s.run();
}

#[test]
fn bitcast_same_size_pairs() {
    let mut s = Suite::new("bitcast", 801);
    let groups: [&[DType]; 4] = [&[U8], &[F16, BF16], &[U32, I32, F32], &[U64, I64, F64]];
    for group in groups {
        for &src in group {
            for &dst in group {
                for _ in 0..2 {
                    let dims = shape(&mut s.rng, 0, 3);
                    s.case(format!("bitcast {src}{dims:?} to {dst}"));
                    let x = s.param("x", src, &dims, &Dist::Bits);
                    let v = s.value(&x).clone();
                    let want =
                        HostArray::from_bytes(&TensorType::new(dst, &dims), &v.to_bytes()).unwrap();
                    s.check_bits(&x.bitcast(dst).unwrap(), want);
                }
            }
        }
    }
    s.case("u32 -> f32 -> u32 round trip");
    let x = s.param("x", U32, &[16], &Dist::Bits);
    let v = s.value(&x).clone();
    let y = x.bitcast(F32).unwrap().bitcast(U32).unwrap();
    s.check_exact(&y, v);
    s.run();
}
