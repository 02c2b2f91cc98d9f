//! Lowering tests: every lowering is compiled by the XLA CPU plugin and run on small inputs whose
//! results are worked out by hand; the golden tests pin the exact text and need no plugin.

use std::sync::OnceLock;

use half::{bf16, f16};

use super::to_stablehlo;
use crate::dtype::{as_bytes, DType, Element, TensorType};
use crate::error::Error;
use crate::ops::{
    ArgKind, BinaryOp, Comparison, CumsumOptions, Graph, Op, ReduceKind, SortOrder, Tensor,
    UnaryOp, ValueId,
};
use crate::runtime::{Buffer, Client};

fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| Client::cpu().expect("the XLA CPU plugin loads"))
}

fn tt(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims)
}

fn param(g: &Graph, name: &str, dtype: DType, dims: &[usize]) -> Tensor {
    g.parameter(name, dtype, dims).expect("parameter")
}

/// Pushes a one-output node.
fn push(g: &Graph, op: Op, inputs: &[&Tensor], out: TensorType) -> Tensor {
    push_n(g, op, inputs, vec![out]).remove(0)
}

fn push_n(g: &Graph, op: Op, inputs: &[&Tensor], outs: Vec<TensorType>) -> Vec<Tensor> {
    g.push(op, inputs.iter().map(|t| t.id()).collect(), outs)
        .expect("push")
}

fn constant<T: Element>(g: &Graph, data: &[T], dims: &[usize]) -> Tensor {
    let op = Op::Constant {
        data: as_bytes(data).to_vec(),
    };
    push(g, op, &[], tt(T::DTYPE, dims))
}

fn unary(g: &Graph, u: UnaryOp, x: &Tensor) -> Tensor {
    push(g, Op::Unary(u), &[x], x.ty().clone())
}

fn binary(g: &Graph, b: BinaryOp, x: &Tensor, y: &Tensor) -> Tensor {
    push(g, Op::Binary(b), &[x, y], x.ty().clone())
}

fn buf<T: Element>(data: &[T], dims: &[usize]) -> Buffer {
    client().buffer_from_slice(data, dims).expect("buffer")
}

/// Sets the outputs, lowers, compiles (checking the executable's output types against the
/// graph's), and runs on `args`.
fn run(g: &Graph, outputs: &[&Tensor], args: &[&Buffer]) -> Vec<Buffer> {
    g.set_outputs(outputs).expect("outputs");
    let text = to_stablehlo(g).expect("lowers");
    let exe = client()
        .compile(&text)
        .unwrap_or_else(|e| panic!("{e}\n--- module ---\n{text}"));
    assert_eq!(exe.output_types(), g.output_types().as_slice(), "{text}");
    exe.execute(args).expect("executes")
}

fn v<T: Element>(b: &Buffer) -> Vec<T> {
    b.to_vec::<T>().expect("to_vec")
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        let ok = g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6 * w.abs().max(1.0);
        assert!(ok, "got {got:?}, want {want:?}");
    }
}

fn lower_err(g: &Graph) -> String {
    match to_stablehlo(g) {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("expected an InvalidArgument error, got {other:?}"),
    }
}

// ----- golden text -----

#[test]
fn golden_exp_add() {
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[2, 3]);
    let e = unary(&g, UnaryOp::Exp, &x);
    let s = binary(&g, BinaryOp::Add, &e, &x);
    g.set_outputs(&[&s]).unwrap();
    let want = "\
module @stablegraph {
  func.func public @main(%p0_x: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %v1 = stablehlo.exponential %p0_x : tensor<2x3xf32>
    %v2 = stablehlo.add %v1, %p0_x : tensor<2x3xf32>
    return %v2 : tensor<2x3xf32>
  }
}
";
    assert_eq!(to_stablehlo(&g).unwrap(), want);
}

/// f32 dots are lowered at HIGHEST precision (no TF32 passes on a GPU); bf16 dots, a bf16 dot
/// into f32 and integer dots carry no precision.
#[test]
fn golden_dot_precision() {
    let g = Graph::new();
    let a = param(&g, "a", DType::F32, &[2, 3]);
    let b = param(&g, "b", DType::BF16, &[2, 3]);
    let c = param(&g, "c", DType::I32, &[2, 3]);
    let f32_dot = a.dot_general(&a, &[], &[(1, 1)]).unwrap();
    let bf16_dot = b.dot_general(&b, &[], &[(1, 1)]).unwrap();
    let widened = b.dot_general_as(&b, &[], &[(1, 1)], DType::F32).unwrap();
    let int_dot = c.dot_general(&c, &[], &[(1, 1)]).unwrap();
    g.set_outputs(&[&f32_dot, &bf16_dot, &widened, &int_dot])
        .unwrap();
    let want = "\
module @stablegraph {
  func.func public @main(%p0_a: tensor<2x3xf32>, %p1_b: tensor<2x3xbf16>, %p2_c: tensor<2x3xi32>) -> (tensor<2x2xf32>, tensor<2x2xbf16>, tensor<2x2xf32>, tensor<2x2xi32>) {
    %v3 = stablehlo.dot_general %p0_a, %p0_a, contracting_dims = [1] x [1] {precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x2xf32>
    %v4 = stablehlo.dot_general %p1_b, %p1_b, contracting_dims = [1] x [1] : (tensor<2x3xbf16>, tensor<2x3xbf16>) -> tensor<2x2xbf16>
    %v5 = stablehlo.dot_general %p1_b, %p1_b, contracting_dims = [1] x [1] : (tensor<2x3xbf16>, tensor<2x3xbf16>) -> tensor<2x2xf32>
    %v6 = stablehlo.dot_general %p2_c, %p2_c, contracting_dims = [1] x [1] : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x2xi32>
    return %v3, %v4, %v5, %v6 : tensor<2x2xf32>, tensor<2x2xbf16>, tensor<2x2xf32>, tensor<2x2xi32>
  }
}
";
    assert_eq!(to_stablehlo(&g).unwrap(), want);
    // The CPU plugin takes the attribute; the products are exact here.
    let out = run(
        &g,
        &[&f32_dot, &bf16_dot, &widened, &int_dot],
        &[
            &buf(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]),
            &buf(&[bf16::ONE; 6], &[2, 3]),
            &buf(&[1i32; 6], &[2, 3]),
        ],
    );
    assert_eq!(v::<f32>(&out[0]), vec![14.0, 32.0, 32.0, 77.0]);
    assert_eq!(v::<f32>(&out[2]), vec![3.0; 4]);
    assert_eq!(v::<i32>(&out[3]), vec![3; 4]);
}

/// `x.in`, an unused parameter, a dead node, and outputs `(sum(x, 1) * [1, -2], x)`.
fn reduce_dead_code_graph() -> (Graph, Tensor, Tensor) {
    let g = Graph::new();
    let x = param(&g, "x.in", DType::I32, &[2, 3]);
    let _unused = param(&g, "unused", DType::F32, &[]);
    let _dead = unary(&g, UnaryOp::Neg, &x);
    let sum = push(
        &g,
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1],
        },
        &[&x],
        tt(DType::I32, &[2]),
    );
    let c = constant(&g, &[1i32, -2], &[2]);
    let m = binary(&g, BinaryOp::Mul, &sum, &c);
    g.set_outputs(&[&m, &x]).unwrap();
    (g, m, x)
}

#[test]
fn golden_reduce_dead_code_and_two_outputs() {
    let (g, _, _) = reduce_dead_code_graph();
    let want = "\
module @stablegraph {
  func.func public @main(%p0_x.in: tensor<2x3xi32>, %p1_unused: tensor<f32>) -> (tensor<2xi32>, tensor<2x3xi32>) {
    %v3_init = stablehlo.constant dense<0> : tensor<i32>
    %v3 = stablehlo.reduce(%p0_x.in init: %v3_init) applies stablehlo.add across dimensions = [1] : (tensor<2x3xi32>, tensor<i32>) -> tensor<2xi32>
    %v4 = stablehlo.constant dense<[1, -2]> : tensor<2xi32>
    %v5 = stablehlo.multiply %v3, %v4 : tensor<2xi32>
    return %v5, %p0_x.in : tensor<2xi32>, tensor<2x3xi32>
  }
}
";
    assert_eq!(to_stablehlo(&g).unwrap(), want);
}

/// The text of a graph with a node of every family (`testdata/families.mlir` was written by the
/// lowering before it was split by family, and rewritten when the arg-reductions became two
/// plain reductions; what the text computes is checked by the op suites, against the
/// interpreter).
#[test]
fn golden_families() {
    let g = family_graph().expect("builds");
    let want = include_str!("testdata/families.mlir");
    assert_eq!(to_stablehlo(&g).unwrap(), want);
}

/// One graph with a node of every lowering family: a float max reduction (NaN-propagating
/// region), an arg-reduction, a short and a long cumsum, a sort with indices, a gather, a
/// clamp, a dynamic update inside a loop that captures an outer value, and a dot.
fn family_graph() -> crate::Result<Graph> {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[2, 3])?;
    let idx = g.parameter("idx", DType::I32, &[4])?;
    let table = g.parameter("table", DType::BF16, &[5, 2])?;
    let long = g.parameter("long", DType::I64, &[20])?;
    let m = x.max(&[1])?;
    let a = x.argmin_keepdims(1)?;
    let c = x.cumsum_with(
        1,
        CumsumOptions {
            exclusive: true,
            reverse: false,
        },
    )?;
    let cl = long.cumsum_with(
        0,
        CumsumOptions {
            exclusive: false,
            reverse: true,
        },
    )?;
    let (s, order) = x.sort_with_indices(1, SortOrder::Descending)?;
    let rows = table.take(&idx)?;
    let k = x.clamp(-1.0, 1.0)?.maximum(&c)?;
    let buf = g.zeros(DType::F32, &[4, 3])?;
    let (_, buf) = g.fori_loop(0, 4, &(m.clone(), buf), |i, (m, buf)| {
        let row = x.sum_keepdims(&[0])?.mul(m.sum_all()?)?;
        let zero = g.scalar(0.0, DType::I64)?;
        Ok((m.exp()?, buf.dynamic_update_slice(&row, &[i, &zero])?))
    })?;
    let d = x.matmul(&buf.t()?)?;
    g.set_outputs(&[&m, &a, &k, &cl, &s, &order, &rows, &d])?;
    Ok(g)
}

#[test]
fn reduce_dead_code_and_two_outputs_run() {
    let (g, m, x) = reduce_dead_code_graph();
    let out = run(
        &g,
        &[&m, &x],
        &[&buf(&[1i32, 2, 3, 4, 5, 6], &[2, 3]), &buf(&[0f32], &[])],
    );
    assert_eq!(v::<i32>(&out[0]), vec![6, -30]);
    assert_eq!(v::<i32>(&out[1]), vec![1, 2, 3, 4, 5, 6]);
}

// ----- errors -----

#[test]
fn graph_without_outputs_is_an_error() {
    let g = Graph::new();
    let _x = param(&g, "x", DType::F32, &[2]);
    let m = lower_err(&g);
    assert!(m.contains("without outputs"), "{m}");
}

#[test]
fn malformed_graphs_are_errors() {
    // An operand defined after its user.
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[2]);
    let later = ValueId { node: 2, output: 0 };
    let bad = g
        .push(
            Op::Unary(UnaryOp::Neg),
            vec![later],
            vec![tt(DType::F32, &[2])],
        )
        .unwrap();
    let _filler = unary(&g, UnaryOp::Abs, &x);
    g.set_outputs(&[&bad[0]]).unwrap();
    assert!(lower_err(&g).contains("not a value defined before it"));

    // An operand that does not exist at all.
    let g = Graph::new();
    let missing = ValueId { node: 0, output: 3 };
    let bad = g
        .push(
            Op::Unary(UnaryOp::Neg),
            vec![missing],
            vec![tt(DType::F32, &[2])],
        )
        .unwrap();
    g.set_outputs(&[&bad[0]]).unwrap();
    lower_err(&g);

    // Wrong operand count.
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[2]);
    let sel = push(&g, Op::Select, &[&x, &x], tt(DType::F32, &[2]));
    g.set_outputs(&[&sel]).unwrap();
    assert!(lower_err(&g).contains("takes 3 operands, got 2"));

    // A dynamic slice with too few indices, and a sort with a wrong output count.
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[2, 2]);
    let i = param(&g, "i", DType::I32, &[]);
    let ds = push(
        &g,
        Op::DynamicSlice { sizes: vec![1, 1] },
        &[&x, &i],
        tt(DType::F32, &[1, 1]),
    );
    g.set_outputs(&[&ds]).unwrap();
    lower_err(&g);
    let s = push(
        &g,
        Op::Sort {
            axis: 0,
            descending: false,
        },
        &[&x],
        tt(DType::F32, &[2, 2]),
    );
    let bad_sort = push_n(
        &g,
        Op::Sort {
            axis: 5,
            descending: false,
        },
        &[&x],
        vec![tt(DType::F32, &[2, 2])],
    );
    g.set_outputs(&[&s, &bad_sort[0]]).unwrap();
    assert!(lower_err(&g).contains("axis 5"));

    // A constant whose bytes fit neither every element nor one.
    let g = Graph::new();
    let c = push(
        &g,
        Op::Constant { data: vec![0; 6] },
        &[],
        tt(DType::F32, &[3]),
    );
    g.set_outputs(&[&c]).unwrap();
    assert!(lower_err(&g).contains("6 bytes"));

    // A parameter node that is not in the parameter list.
    let g = Graph::new();
    let p = push(
        &g,
        Op::Parameter {
            index: 0,
            name: "ghost".into(),
        },
        &[],
        tt(DType::F32, &[]),
    );
    g.set_outputs(&[&p]).unwrap();
    assert!(lower_err(&g).contains("ghost"));

    // Dtypes an op is not defined for.
    let g = Graph::new();
    let i = param(&g, "i", DType::I32, &[2]);
    let e = unary(&g, UnaryOp::Exp, &i);
    g.set_outputs(&[&e]).unwrap();
    assert!(lower_err(&g).contains("exp is not defined for i32[2]"));
    let p = param(&g, "p", DType::Pred, &[2]);
    let s = push(
        &g,
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![0],
        },
        &[&p],
        tt(DType::Pred, &[]),
    );
    g.set_outputs(&[&s]).unwrap();
    lower_err(&g);
    let f = param(&g, "f", DType::F32, &[2]);
    let sh = binary(&g, BinaryOp::ShiftLeft, &f, &f);
    g.set_outputs(&[&sh]).unwrap();
    lower_err(&g);
    // Pred: no iota, bitcast, max, max reduction or arg-reduction (the rules reject them, so
    // the lowering has no code for them).
    let rejected = [
        push(&g, Op::Iota { dim: 0 }, &[], tt(DType::Pred, &[3])),
        push(&g, Op::BitcastConvert, &[&p], tt(DType::U8, &[2])),
        binary(&g, BinaryOp::Max, &p, &p),
        push(
            &g,
            Op::Reduce {
                kind: ReduceKind::Max,
                axes: vec![0],
            },
            &[&p],
            tt(DType::Pred, &[]),
        ),
        arg(&g, ArgKind::Max, &p, 0),
    ];
    for (k, t) in rejected.iter().enumerate() {
        g.set_outputs(&[t]).unwrap();
        assert!(lower_err(&g).contains("pred"), "case {k}");
    }
}

// ----- constants and iota -----

/// Lowers constants of every dtype (splats, full data, rank 0, zero-size, large ones written in
/// hex) and checks the device bytes exactly.
#[test]
fn constants_of_every_dtype_round_trip_exactly() {
    let g = Graph::new();
    let mut outs: Vec<Tensor> = Vec::new();
    let mut want: Vec<Vec<u8>> = Vec::new();
    let mut add = |t: Tensor, bytes: Vec<u8>| {
        outs.push(t);
        want.push(bytes);
    };
    let f32s = [1.5f32, -0.0, f32::NAN, f32::NEG_INFINITY, 1e-45, 0.1];
    add(constant(&g, &f32s, &[2, 3]), as_bytes(&f32s).to_vec());
    let f64s = [0.1f64, f64::INFINITY, -1e300, 5e-324];
    add(constant(&g, &f64s, &[4]), as_bytes(&f64s).to_vec());
    let f16s = [
        f16::from_f32(0.1),
        f16::NAN,
        f16::MIN_POSITIVE_SUBNORMAL,
        f16::MAX,
    ];
    add(constant(&g, &f16s, &[2, 2]), as_bytes(&f16s).to_vec());
    let bf16s = [
        bf16::from_f32(0.1),
        bf16::NEG_INFINITY,
        bf16::from_f32(-3.0e38),
    ];
    add(constant(&g, &bf16s, &[3]), as_bytes(&bf16s).to_vec());
    let u8s = [0u8, 7, 255];
    add(constant(&g, &u8s, &[3]), u8s.to_vec());
    let u32s = [u32::MAX, 0, 123_456_789];
    add(constant(&g, &u32s, &[3]), as_bytes(&u32s).to_vec());
    let u64s = [u64::MAX, 1 << 63];
    add(constant(&g, &u64s, &[2]), as_bytes(&u64s).to_vec());
    let i32s = [i32::MIN, -1, i32::MAX];
    add(constant(&g, &i32s, &[3, 1]), as_bytes(&i32s).to_vec());
    let i64s = [i64::MIN, i64::MAX];
    add(constant(&g, &i64s, &[1, 2]), as_bytes(&i64s).to_vec());
    let preds = [true, false, false, true];
    add(constant(&g, &preds, &[2, 2]), vec![1, 0, 0, 1]);
    // Splats: one element's bytes fill the shape.
    add(constant(&g, &[true], &[3]), vec![1, 1, 1]);
    add(constant(&g, &[false], &[]), vec![0]);
    add(
        constant(&g, &[bf16::from_f32(-2.5)], &[2]),
        as_bytes(&[bf16::from_f32(-2.5); 2]).to_vec(),
    );
    add(
        constant(&g, &[f16::NAN], &[2]),
        as_bytes(&[f16::NAN; 2]).to_vec(),
    );
    add(
        constant(&g, &[u64::MAX], &[2, 1]),
        as_bytes(&[u64::MAX; 2]).to_vec(),
    );
    add(
        constant(&g, &[f32::NAN], &[2]),
        as_bytes(&[f32::NAN; 2]).to_vec(),
    );
    // Rank 0.
    add(
        constant(&g, &[2.25f64], &[]),
        2.25f64.to_le_bytes().to_vec(),
    );
    // Zero-size.
    add(constant::<f32>(&g, &[], &[0]), vec![]);
    add(constant::<i32>(&g, &[], &[2, 0]), vec![]);
    add(constant::<bool>(&g, &[], &[0, 3]), vec![]);
    // Large: hex for numbers, lists for preds.
    let many: Vec<f32> = (0..50).map(|i| i as f32 * 0.37 - 3.0).collect();
    add(constant(&g, &many, &[5, 10]), as_bytes(&many).to_vec());
    let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
    add(constant(&g, &bytes, &[64]), bytes.clone());
    let many_preds: Vec<bool> = (0..40).map(|i| i % 3 == 0).collect();
    let pred_bytes: Vec<u8> = many_preds.iter().map(|&b| u8::from(b)).collect();
    add(constant(&g, &many_preds, &[4, 10]), pred_bytes);

    let refs: Vec<&Tensor> = outs.iter().collect();
    g.set_outputs(&refs).unwrap();
    let text = to_stablehlo(&g).unwrap();
    assert!(
        text.contains("dense<\"0x"),
        "large constants are hex:\n{text}"
    );
    assert!(text.contains("dense<[[true, false], [false, true]]> : tensor<2x2xi1>"));
    assert!(text.contains("dense<0x7FC00000> : tensor<2xf32>"));
    let out = run(&g, &refs, &[]);
    assert_eq!(out.len(), want.len());
    for (k, (b, w)) in out.iter().zip(&want).enumerate() {
        assert_eq!(&b.to_bytes().unwrap(), w, "constant {k}");
    }
}

#[test]
fn iota_of_several_dtypes() {
    let g = Graph::new();
    let a = push(&g, Op::Iota { dim: 1 }, &[], tt(DType::I32, &[2, 3]));
    let b = push(&g, Op::Iota { dim: 0 }, &[], tt(DType::F32, &[2, 2]));
    let d = push(&g, Op::Iota { dim: 1 }, &[], tt(DType::U64, &[1, 0]));
    let e = push(&g, Op::Iota { dim: 0 }, &[], tt(DType::BF16, &[3]));
    let out = run(&g, &[&a, &b, &d, &e], &[]);
    assert_eq!(v::<i32>(&out[0]), vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(v::<f32>(&out[1]), vec![0.0, 0.0, 1.0, 1.0]);
    assert_eq!(v::<u64>(&out[2]), Vec::<u64>::new());
    let bf: Vec<f32> = v::<bf16>(&out[3]).iter().map(|x| x.to_f32()).collect();
    assert_eq!(bf, vec![0.0, 1.0, 2.0]);
}

// ----- elementwise -----

#[test]
fn float_unary_ops() {
    let xs = [0.5f32, -1.25, 2.0, 0.0, -0.0, f32::NAN];
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[6]);
    let ops = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Expm1,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Logistic,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Sign,
        UnaryOp::Sin,
        UnaryOp::Cos,
    ];
    let outs: Vec<Tensor> = ops.iter().map(|&u| unary(&g, u, &x)).collect();
    let refs: Vec<&Tensor> = outs.iter().collect();
    let out = run(&g, &refs, &[&buf(&xs, &[6])]);
    for (u, b) in ops.iter().zip(&out) {
        let f: fn(f32) -> f32 = match u {
            UnaryOp::Neg => |x| -x,
            UnaryOp::Abs => f32::abs,
            UnaryOp::Exp => f32::exp,
            UnaryOp::Expm1 => f32::exp_m1,
            UnaryOp::Log => f32::ln,
            UnaryOp::Log1p => f32::ln_1p,
            UnaryOp::Sqrt => f32::sqrt,
            UnaryOp::Rsqrt => |x| 1.0 / x.sqrt(),
            UnaryOp::Tanh => f32::tanh,
            UnaryOp::Logistic => |x| 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Floor => f32::floor,
            UnaryOp::Ceil => f32::ceil,
            UnaryOp::Sign => |x| {
                if x == 0.0 || x.is_nan() {
                    x
                } else {
                    x.signum()
                }
            },
            UnaryOp::Sin => f32::sin,
            UnaryOp::Cos => f32::cos,
            UnaryOp::Not => unreachable!(),
        };
        let want: Vec<f32> = xs.iter().map(|&x| f(x)).collect();
        assert_close(&v::<f32>(b), &want);
    }
    // Signs of zeros survive negate and sign.
    assert!(v::<f32>(&out[0])[3].is_sign_negative());
    assert!(v::<f32>(&out[12])[4].is_sign_negative());
}

#[test]
fn integer_and_pred_unary_ops() {
    let g = Graph::new();
    let i = param(&g, "i", DType::I32, &[4]);
    let u = param(&g, "u", DType::U32, &[3]);
    let b = param(&g, "b", DType::U8, &[2]);
    let p = param(&g, "p", DType::Pred, &[2]);
    let outs = [
        unary(&g, UnaryOp::Neg, &i),
        unary(&g, UnaryOp::Abs, &i),
        unary(&g, UnaryOp::Sign, &i),
        unary(&g, UnaryOp::Not, &i),
        unary(&g, UnaryOp::Abs, &u),
        unary(&g, UnaryOp::Sign, &u),
        unary(&g, UnaryOp::Neg, &b),
        unary(&g, UnaryOp::Not, &p),
    ];
    let refs: Vec<&Tensor> = outs.iter().collect();
    let out = run(
        &g,
        &refs,
        &[
            &buf(&[i32::MIN, -5, 0, 7], &[4]),
            &buf(&[0u32, 1, u32::MAX], &[3]),
            &buf(&[1u8, 0], &[2]),
            &buf(&[true, false], &[2]),
        ],
    );
    assert_eq!(v::<i32>(&out[0]), vec![i32::MIN, 5, 0, -7]);
    assert_eq!(v::<i32>(&out[1]), vec![i32::MIN, 5, 0, 7]);
    assert_eq!(v::<i32>(&out[2]), vec![-1, -1, 0, 1]);
    assert_eq!(v::<i32>(&out[3]), vec![i32::MAX, 4, -1, -8]);
    assert_eq!(v::<u32>(&out[4]), vec![0, 1, u32::MAX]);
    assert_eq!(v::<u32>(&out[5]), vec![0, 1, 1]);
    assert_eq!(v::<u8>(&out[6]), vec![255, 0]);
    assert_eq!(v::<bool>(&out[7]), vec![false, true]);
}

#[test]
fn float_binary_ops() {
    let a = [7.5f32, -7.5, 1.0, f32::NAN, 2.0];
    let b = [2.0f32, 2.0, f32::NAN, 1.0, -0.5];
    let g = Graph::new();
    let x = param(&g, "a", DType::F32, &[5]);
    let y = param(&g, "b", DType::F32, &[5]);
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Rem,
    ];
    let outs: Vec<Tensor> = ops.iter().map(|&o| binary(&g, o, &x, &y)).collect();
    let refs: Vec<&Tensor> = outs.iter().collect();
    let out = run(&g, &refs, &[&buf(&a, &[5]), &buf(&b, &[5])]);
    for (o, r) in ops.iter().zip(&out) {
        let f: fn(f32, f32) -> f32 = match o {
            BinaryOp::Add => |a, b| a + b,
            BinaryOp::Sub => |a, b| a - b,
            BinaryOp::Mul => |a, b| a * b,
            BinaryOp::Div => |a, b| a / b,
            BinaryOp::Pow => f32::powf,
            // NaN if either is NaN.
            BinaryOp::Max => |a, b| {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else {
                    a.max(b)
                }
            },
            BinaryOp::Min => |a, b| {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else {
                    a.min(b)
                }
            },
            BinaryOp::Rem => |a, b| a % b,
            _ => unreachable!(),
        };
        let want: Vec<f32> = a.iter().zip(&b).map(|(&a, &b)| f(a, b)).collect();
        assert_close(&v::<f32>(r), &want);
    }
}

#[test]
fn integer_binary_ops_follow_xla_edge_cases() {
    let a = [7i32, -7, 5, i32::MIN, 1, -8];
    let b = [2i32, 2, 0, -1, 40, 3];
    let g = Graph::new();
    let x = param(&g, "a", DType::I32, &[6]);
    let y = param(&g, "b", DType::I32, &[6]);
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::ShiftLeft,
        BinaryOp::ShiftRightLogical,
        BinaryOp::Pow,
    ];
    let outs: Vec<Tensor> = ops.iter().map(|&o| binary(&g, o, &x, &y)).collect();
    let refs: Vec<&Tensor> = outs.iter().collect();
    let out = run(&g, &refs, &[&buf(&a, &[6]), &buf(&b, &[6])]);
    let got: Vec<Vec<i32>> = out.iter().map(v::<i32>).collect();
    assert_eq!(got[0], vec![9, -5, 5, i32::MAX, 41, -5]);
    assert_eq!(got[1], vec![5, -9, 5, i32::MIN + 1, -39, -11]);
    assert_eq!(got[2], vec![14, -14, 0, i32::MIN, 40, -24]);
    // Truncating division; x / 0 = -1 and MIN / -1 = MIN (XLA's definitions).
    assert_eq!(got[3], vec![3, -3, -1, i32::MIN, 0, -2]);
    // Remainder with the dividend's sign; x % 0 = x and MIN % -1 = 0.
    assert_eq!(got[4], vec![1, -1, 5, 0, 1, -2]);
    assert_eq!(got[5], vec![7, 2, 5, -1, 40, 3]);
    assert_eq!(got[6], vec![2, -7, 0, i32::MIN, 1, -8]);
    assert_eq!(got[7], vec![2, 0, 0, i32::MIN, 0, 0]);
    assert_eq!(got[8], vec![7, -5, 5, -1, 41, -5]);
    assert_eq!(got[9], vec![5, -5, 5, i32::MAX, 41, -5]);
    // Shifts by the bit width or more give 0.
    assert_eq!(got[10], vec![28, -28, 5, 0, 0, -64]);
    assert_eq!(got[11], vec![1, 0x3FFF_FFFE, 5, 0, 0, 0x1FFF_FFFF]);
    assert_eq!(got[12], vec![49, 49, 1, 0, 1, -512]);

    // Unsigned: x / 0 is all ones, x % 0 = x.
    let g = Graph::new();
    let x = param(&g, "a", DType::U32, &[2]);
    let y = param(&g, "b", DType::U32, &[2]);
    let d = binary(&g, BinaryOp::Div, &x, &y);
    let r = binary(&g, BinaryOp::Rem, &x, &y);
    let out = run(
        &g,
        &[&d, &r],
        &[&buf(&[9u32, u32::MAX], &[2]), &buf(&[0u32, 2], &[2])],
    );
    assert_eq!(v::<u32>(&out[0]), vec![u32::MAX, u32::MAX / 2]);
    assert_eq!(v::<u32>(&out[1]), vec![9, 1]);
}

#[test]
fn pred_and_half_binary_ops() {
    let g = Graph::new();
    let p = param(&g, "p", DType::Pred, &[4]);
    let q = param(&g, "q", DType::Pred, &[4]);
    let ops = [BinaryOp::And, BinaryOp::Or, BinaryOp::Xor];
    let mut outs: Vec<Tensor> = ops.iter().map(|&o| binary(&g, o, &p, &q)).collect();
    let h = param(&g, "h", DType::BF16, &[2]);
    let k = param(&g, "k", DType::F16, &[2]);
    outs.push(binary(&g, BinaryOp::Add, &h, &h));
    outs.push(binary(&g, BinaryOp::Mul, &k, &k));
    let refs: Vec<&Tensor> = outs.iter().collect();
    let out = run(
        &g,
        &refs,
        &[
            &buf(&[false, false, true, true], &[4]),
            &buf(&[false, true, false, true], &[4]),
            &buf(&[bf16::from_f32(1.5), bf16::from_f32(-3.0)], &[2]),
            &buf(&[f16::from_f32(0.5), f16::from_f32(300.0)], &[2]),
        ],
    );
    assert_eq!(v::<bool>(&out[0]), vec![false, false, false, true]);
    assert_eq!(v::<bool>(&out[1]), vec![false, true, true, true]);
    assert_eq!(v::<bool>(&out[2]), vec![false, true, true, false]);
    let bf: Vec<f32> = v::<bf16>(&out[3]).iter().map(|x| x.to_f32()).collect();
    assert_eq!(bf, vec![3.0, -6.0]);
    let hf: Vec<f32> = v::<f16>(&out[4]).iter().map(|x| x.to_f32()).collect();
    assert_eq!(hf, vec![0.25, f32::INFINITY]);
}

#[test]
fn comparisons_use_the_right_comparison_type() {
    let dirs = [
        Comparison::Eq,
        Comparison::Ne,
        Comparison::Lt,
        Comparison::Le,
        Comparison::Gt,
        Comparison::Ge,
    ];
    let g = Graph::new();
    let f = param(&g, "f", DType::F32, &[3]);
    let f2 = param(&g, "f2", DType::F32, &[3]);
    let i = param(&g, "i", DType::I64, &[2]);
    let u = param(&g, "u", DType::U32, &[2]);
    let p = param(&g, "p", DType::Pred, &[2]);
    let mut outs = Vec::new();
    for d in dirs {
        outs.push(push(&g, Op::Compare(d), &[&f, &f2], tt(DType::Pred, &[3])));
    }
    let zero_i = constant(&g, &[0i64, 0], &[2]);
    let one_u = constant(&g, &[1u32, 1], &[2]);
    let false_p = constant(&g, &[false], &[2]);
    outs.push(push(
        &g,
        Op::Compare(Comparison::Lt),
        &[&i, &zero_i],
        tt(DType::Pred, &[2]),
    ));
    outs.push(push(
        &g,
        Op::Compare(Comparison::Gt),
        &[&u, &one_u],
        tt(DType::Pred, &[2]),
    ));
    outs.push(push(
        &g,
        Op::Compare(Comparison::Gt),
        &[&p, &false_p],
        tt(DType::Pred, &[2]),
    ));
    let refs: Vec<&Tensor> = outs.iter().collect();
    let out = run(
        &g,
        &refs,
        &[
            &buf(&[1.0f32, f32::NAN, -0.0], &[3]),
            &buf(&[2.0f32, f32::NAN, 0.0], &[3]),
            &buf(&[-3i64, 3], &[2]),
            &buf(&[u32::MAX, 0], &[2]),
            &buf(&[true, false], &[2]),
        ],
    );
    let got: Vec<Vec<bool>> = out.iter().map(v::<bool>).collect();
    let (t, f) = (true, false);
    assert_eq!(got[0], vec![f, f, t]); // Eq: NaN != NaN, -0 == 0
    assert_eq!(got[1], vec![t, t, f]); // Ne
    assert_eq!(got[2], vec![t, f, f]); // Lt
    assert_eq!(got[3], vec![t, f, t]); // Le
    assert_eq!(got[4], vec![f, f, f]); // Gt
    assert_eq!(got[5], vec![f, f, t]); // Ge
    assert_eq!(got[6], vec![t, f]); // signed
    assert_eq!(got[7], vec![t, f]); // unsigned: u32::MAX > 1
    assert_eq!(got[8], vec![t, f]); // pred: true > false
}

#[test]
fn select_clamp_and_rank0() {
    let g = Graph::new();
    let p = param(&g, "p", DType::Pred, &[3]);
    let a = param(&g, "a", DType::F32, &[3]);
    let b = param(&g, "b", DType::F32, &[3]);
    let s = push(&g, Op::Select, &[&p, &a, &b], tt(DType::F32, &[3]));
    let lo = constant(&g, &[-1.0f32], &[3]);
    let hi = constant(&g, &[1.0f32], &[3]);
    let c = push(&g, Op::Clamp, &[&lo, &a, &hi], tt(DType::F32, &[3]));
    // Rank 0 throughout.
    let x = param(&g, "x", DType::I32, &[]);
    let lo0 = constant(&g, &[0i32], &[]);
    let hi0 = constant(&g, &[10i32], &[]);
    let c0 = push(&g, Op::Clamp, &[&lo0, &x, &hi0], tt(DType::I32, &[]));
    let out = run(
        &g,
        &[&s, &c, &c0],
        &[
            &buf(&[true, false, true], &[3]),
            &buf(&[-5.0f32, 0.5, f32::NAN], &[3]),
            &buf(&[9.0f32, 8.0, 7.0], &[3]),
            &client().buffer_from_scalar(42i32).unwrap(),
        ],
    );
    assert_close(&v::<f32>(&out[0]), &[-5.0, 8.0, f32::NAN]);
    assert_close(&v::<f32>(&out[1]), &[-1.0, 0.5, f32::NAN]);
    assert_eq!(out[2].to_scalar::<i32>().unwrap(), 10);
}

#[test]
fn conversions() {
    let g = Graph::new();
    let f = param(&g, "f", DType::F32, &[6]);
    let i = param(&g, "i", DType::I32, &[3]);
    let p = param(&g, "p", DType::Pred, &[2]);
    let dims6 = [6];
    let outs = [
        push(&g, Op::Convert, &[&f], tt(DType::I32, &dims6)),
        push(&g, Op::Convert, &[&f], tt(DType::Pred, &dims6)),
        push(&g, Op::Convert, &[&f], tt(DType::BF16, &dims6)),
        push(&g, Op::Convert, &[&p], tt(DType::F32, &[2])),
        push(&g, Op::Convert, &[&i], tt(DType::F16, &[3])),
        push(&g, Op::Convert, &[&i], tt(DType::Pred, &[3])),
        push(&g, Op::Convert, &[&i], tt(DType::U8, &[3])),
        push(&g, Op::BitcastConvert, &[&f], tt(DType::U32, &dims6)),
        push(&g, Op::BitcastConvert, &[&i], tt(DType::I32, &[3])),
    ];
    let refs: Vec<&Tensor> = outs.iter().collect();
    let fs = [2.7f32, -2.7, 0.0, -0.0, f32::NAN, 1.0 + 1.0 / 256.0];
    let out = run(
        &g,
        &refs,
        &[
            &buf(&fs, &[6]),
            &buf(&[2049i32, 0, 257], &[3]),
            &buf(&[true, false], &[2]),
        ],
    );
    // Toward zero; XLA converts NaN to 0 (saturating conversions).
    assert_eq!(v::<i32>(&out[0]), vec![2, -2, 0, 0, 0, 1]);
    // x != 0: NaN is true, -0.0 is false.
    assert_eq!(
        v::<bool>(&out[1]),
        vec![true, true, false, false, true, true]
    );
    // Round to nearest even: 1.00390625 is halfway between bf16 1.0 and 1.0078125.
    let bf: Vec<u16> = v::<bf16>(&out[2]).iter().map(|x| x.to_bits()).collect();
    let want: Vec<u16> = [2.703125f32, -2.703125, 0.0, -0.0, f32::NAN, 1.0]
        .iter()
        .map(|&x| bf16::from_f32(x).to_bits())
        .collect();
    assert_eq!(bf, want);
    assert_eq!(v::<f32>(&out[3]), vec![1.0, 0.0]);
    let h: Vec<f32> = v::<f16>(&out[4]).iter().map(|x| x.to_f32()).collect();
    assert_eq!(h, vec![2048.0, 0.0, 257.0]);
    assert_eq!(v::<bool>(&out[5]), vec![true, false, true]);
    assert_eq!(v::<u8>(&out[6]), vec![1, 0, 1]);
    let bits: Vec<u32> = fs.iter().map(|x| x.to_bits()).collect();
    assert_eq!(v::<u32>(&out[7]), bits);
    assert_eq!(v::<i32>(&out[8]), vec![2049, 0, 257]);

    // Out of range, XLA saturates (the op's semantics leave this open).
    let g = Graph::new();
    let f = param(&g, "f", DType::F32, &[4]);
    let to_i32 = push(&g, Op::Convert, &[&f], tt(DType::I32, &[4]));
    let to_u8 = push(&g, Op::Convert, &[&f], tt(DType::U8, &[4]));
    let out = run(
        &g,
        &[&to_i32, &to_u8],
        &[&buf(&[1e10f32, -1e10, -1.0, 300.0], &[4])],
    );
    assert_eq!(v::<i32>(&out[0]), vec![i32::MAX, i32::MIN, -1, 300]);
    assert_eq!(v::<u8>(&out[1]), vec![255, 0, 0, 255]);
}

// ----- shapes -----

#[test]
fn broadcast_reshape_transpose_reverse() {
    let g = Graph::new();
    let x = param(&g, "x", DType::I32, &[2, 3]);
    let row = param(&g, "row", DType::I32, &[1, 3]);
    let s = param(&g, "s", DType::I32, &[]);
    let b1 = push(
        &g,
        Op::BroadcastInDim { dims: vec![0, 2] },
        &[&row],
        tt(DType::I32, &[2, 2, 3]),
    );
    let b2 = push(
        &g,
        Op::BroadcastInDim { dims: vec![] },
        &[&s],
        tt(DType::I32, &[2]),
    );
    let r = push(&g, Op::Reshape, &[&x], tt(DType::I32, &[3, 1, 2]));
    let r0 = push(&g, Op::Reshape, &[&s], tt(DType::I32, &[1, 1]));
    let t = push(
        &g,
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[&r],
        tt(DType::I32, &[2, 3, 1]),
    );
    let rev = push(
        &g,
        Op::Reverse { axes: vec![0, 1] },
        &[&x],
        tt(DType::I32, &[2, 3]),
    );
    let out = run(
        &g,
        &[&b1, &b2, &r, &r0, &t, &rev],
        &[
            &buf(&[1i32, 2, 3, 4, 5, 6], &[2, 3]),
            &buf(&[7i32, 8, 9], &[1, 3]),
            &client().buffer_from_scalar(5i32).unwrap(),
        ],
    );
    assert_eq!(v::<i32>(&out[0]), vec![7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9]);
    assert_eq!(v::<i32>(&out[1]), vec![5, 5]);
    assert_eq!(v::<i32>(&out[2]), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(v::<i32>(&out[3]), vec![5]);
    // t[k, i, 0] = r[i, 0, k] = x_flat[2i + k]
    assert_eq!(v::<i32>(&out[4]), vec![1, 3, 5, 2, 4, 6]);
    assert_eq!(v::<i32>(&out[5]), vec![6, 5, 4, 3, 2, 1]);
}

#[test]
fn slices_static_and_dynamic() {
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[4, 4]);
    let i = param(&g, "i", DType::I32, &[]);
    let j = param(&g, "j", DType::I32, &[]);
    let s = param(&g, "s", DType::F32, &[]);
    let u = param(&g, "u", DType::U32, &[]);
    let sl = push(
        &g,
        Op::Slice {
            start: vec![1, 0],
            limit: vec![3, 4],
            stride: vec![1, 2],
        },
        &[&x],
        tt(DType::F32, &[2, 2]),
    );
    let empty = push(
        &g,
        Op::Slice {
            start: vec![2, 1],
            limit: vec![2, 4],
            stride: vec![1, 1],
        },
        &[&x],
        tt(DType::F32, &[0, 3]),
    );
    let sl0 = push(
        &g,
        Op::Slice {
            start: vec![],
            limit: vec![],
            stride: vec![],
        },
        &[&s],
        tt(DType::F32, &[]),
    );
    // i = 3 is clamped to 4 - 2 = 2; j = -1 to 0.
    let ds = push(
        &g,
        Op::DynamicSlice { sizes: vec![2, 3] },
        &[&x, &i, &j],
        tt(DType::F32, &[2, 3]),
    );
    let ds_u = push(
        &g,
        Op::DynamicSlice { sizes: vec![1, 1] },
        &[&x, &u, &u],
        tt(DType::F32, &[1, 1]),
    );
    let ds0 = push(
        &g,
        Op::DynamicSlice { sizes: vec![] },
        &[&s],
        tt(DType::F32, &[]),
    );
    let upd = constant(&g, &[-1.0f32, -2.0, -3.0, -4.0], &[2, 2]);
    let dus = push(
        &g,
        Op::DynamicUpdateSlice,
        &[&x, &upd, &j, &i],
        tt(DType::F32, &[4, 4]),
    );
    let xs: Vec<f32> = (0..16).map(|k| k as f32).collect();
    let out = run(
        &g,
        &[&sl, &empty, &sl0, &ds, &ds_u, &dus, &ds0],
        &[
            &buf(&xs, &[4, 4]),
            &client().buffer_from_scalar(3i32).unwrap(),
            &client().buffer_from_scalar(-1i32).unwrap(),
            &client().buffer_from_scalar(2.5f32).unwrap(),
            &client().buffer_from_scalar(9u32).unwrap(),
        ],
    );
    assert_eq!(v::<f32>(&out[0]), vec![4.0, 6.0, 8.0, 10.0]);
    assert_eq!(v::<f32>(&out[1]), Vec::<f32>::new());
    assert_eq!(v::<f32>(&out[2]), vec![2.5]);
    assert_eq!(v::<f32>(&out[3]), vec![8.0, 9.0, 10.0, 12.0, 13.0, 14.0]);
    assert_eq!(v::<f32>(&out[4]), vec![15.0]);
    // Update at (clamp(-1) = 0, clamp(3) = 2).
    let mut want = xs.clone();
    want[2] = -1.0;
    want[3] = -2.0;
    want[6] = -3.0;
    want[7] = -4.0;
    assert_eq!(v::<f32>(&out[5]), want);
    assert_eq!(v::<f32>(&out[6]), vec![2.5]);
}

#[test]
fn concatenate_and_pad() {
    let g = Graph::new();
    let a = param(&g, "a", DType::I32, &[2, 1]);
    let b = param(&g, "b", DType::I32, &[2, 2]);
    let e = constant::<i32>(&g, &[], &[2, 0]);
    let c = push(
        &g,
        Op::Concatenate { axis: 1 },
        &[&a, &e, &b],
        tt(DType::I32, &[2, 3]),
    );
    let zero = constant(&g, &[0i32], &[]);
    // Rows: low 1, 2 rows with 1 between them, high -1: 1 + 3 - 1 = 3.
    // Columns: low -1 (crops the first), 3 columns, high 2: -1 + 3 + 2 = 4.
    let p = push(
        &g,
        Op::Pad {
            low: vec![1, -1],
            high: vec![-1, 2],
            interior: vec![1, 0],
        },
        &[&c, &zero],
        tt(DType::I32, &[3, 4]),
    );
    let out = run(
        &g,
        &[&c, &p],
        &[&buf(&[1i32, 4], &[2, 1]), &buf(&[2i32, 3, 5, 6], &[2, 2])],
    );
    assert_eq!(v::<i32>(&out[0]), vec![1, 2, 3, 4, 5, 6]);
    // Rows before cropping: [0], [1 2 3], [0], [4 5 6], [0]; the last row is cropped.
    assert_eq!(v::<i32>(&out[1]), vec![0, 0, 0, 0, 2, 3, 0, 0, 0, 0, 0, 0]);
}

// ----- reductions and scans -----

fn reduce(g: &Graph, kind: ReduceKind, x: &Tensor, axes: &[usize]) -> Tensor {
    let dims: Vec<usize> = x
        .dims()
        .iter()
        .enumerate()
        .filter(|(d, _)| !axes.contains(d))
        .map(|(_, &n)| n)
        .collect();
    push(
        g,
        Op::Reduce {
            kind,
            axes: axes.to_vec(),
        },
        &[x],
        tt(x.dtype(), &dims),
    )
}

#[test]
fn reductions() {
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[2, 3]);
    let i = param(&g, "i", DType::I32, &[2, 2]);
    let h = param(&g, "h", DType::F16, &[2]);
    let z = param(&g, "z", DType::F32, &[0, 2]);
    let outs = [
        reduce(&g, ReduceKind::Sum, &x, &[1]),
        reduce(&g, ReduceKind::Prod, &x, &[0]),
        reduce(&g, ReduceKind::Max, &x, &[0, 1]),
        reduce(&g, ReduceKind::Min, &x, &[1]),
        reduce(&g, ReduceKind::Max, &i, &[1]),
        reduce(&g, ReduceKind::Min, &i, &[0]),
        reduce(&g, ReduceKind::Max, &h, &[0]),
        reduce(&g, ReduceKind::Max, &z, &[0]),
        reduce(&g, ReduceKind::Min, &z, &[0]),
        reduce(&g, ReduceKind::Prod, &z, &[0]),
        reduce(&g, ReduceKind::Sum, &x, &[]),
    ];
    let refs: Vec<&Tensor> = outs.iter().collect();
    let out = run(
        &g,
        &refs,
        &[
            &buf(&[1.0f32, 2.0, 3.0, 4.0, f32::NAN, -6.0], &[2, 3]),
            &buf(&[i32::MIN, -3, 4, i32::MAX], &[2, 2]),
            &buf(&[f16::NEG_INFINITY, f16::from_f32(-2.0)], &[2]),
            &buf::<f32>(&[], &[0, 2]),
        ],
    );
    assert_close(&v::<f32>(&out[0]), &[6.0, f32::NAN]);
    assert_close(&v::<f32>(&out[1]), &[4.0, f32::NAN, -18.0]);
    assert_close(&v::<f32>(&out[2]), &[f32::NAN]);
    assert_close(&v::<f32>(&out[3]), &[1.0, f32::NAN]);
    assert_eq!(v::<i32>(&out[4]), vec![-3, i32::MAX]);
    assert_eq!(v::<i32>(&out[5]), vec![i32::MIN, -3]);
    assert_eq!(v::<f16>(&out[6]), vec![f16::from_f32(-2.0)]);
    // Reducing nothing gives the identities.
    assert_eq!(v::<f32>(&out[7]), vec![f32::NEG_INFINITY; 2]);
    assert_eq!(v::<f32>(&out[8]), vec![f32::INFINITY; 2]);
    assert_eq!(v::<f32>(&out[9]), vec![1.0; 2]);
    assert_close(&v::<f32>(&out[10]), &[1.0, 2.0, 3.0, 4.0, f32::NAN, -6.0]);
}

fn arg(g: &Graph, kind: ArgKind, x: &Tensor, axis: usize) -> Tensor {
    let mut dims = x.dims().to_vec();
    dims.remove(axis);
    push(g, Op::ArgReduce { kind, axis }, &[x], tt(DType::I64, &dims))
}

#[test]
fn arg_reductions_pick_the_first_extreme_with_nan_largest() {
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[4, 4]);
    let i = param(&g, "i", DType::I32, &[2, 3]);
    let outs = [
        arg(&g, ArgKind::Max, &x, 1),
        arg(&g, ArgKind::Min, &x, 1),
        arg(&g, ArgKind::Max, &x, 0),
        arg(&g, ArgKind::Max, &i, 1),
        arg(&g, ArgKind::Min, &i, 1),
        arg(&g, ArgKind::Min, &i, 0),
    ];
    let refs: Vec<&Tensor> = outs.iter().collect();
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    #[rustfmt::skip]
    let xs = [
        1.0, 3.0, 3.0, -1.0,     // ties: first 3 wins the max
        -inf, -inf, -inf, -inf,  // all -inf: index 0 for both
        2.0, nan, 5.0, nan,      // NaN is the max; min ignores NaN
        nan, nan, nan, nan,      // all NaN: index 0 for both
    ];
    let out = run(
        &g,
        &refs,
        &[
            &buf(&xs, &[4, 4]),
            &buf(&[5i32, i32::MIN, i32::MIN, 7, 7, 2], &[2, 3]),
        ],
    );
    assert_eq!(v::<i64>(&out[0]), vec![1, 0, 1, 0]);
    assert_eq!(v::<i64>(&out[1]), vec![3, 0, 0, 0]);
    // Columns: [1, -inf, 2, nan] -> 3; [3, -inf, nan, nan] -> 2; [3, -inf, 5, nan] -> 3; ...
    assert_eq!(v::<i64>(&out[2]), vec![3, 2, 3, 2]);
    assert_eq!(v::<i64>(&out[3]), vec![0, 0]);
    assert_eq!(v::<i64>(&out[4]), vec![1, 2]);
    assert_eq!(v::<i64>(&out[5]), vec![0, 0, 0]);
}

#[test]
fn cumsum_is_inclusive_and_exact_for_integers() {
    let g = Graph::new();
    let x = param(&g, "x", DType::I64, &[2, 4]);
    let f = param(&g, "f", DType::F32, &[3, 1]);
    let e = param(&g, "e", DType::F32, &[2, 0]);
    let c1 = push(&g, Op::Cumsum { axis: 1 }, &[&x], tt(DType::I64, &[2, 4]));
    let c0 = push(&g, Op::Cumsum { axis: 0 }, &[&f], tt(DType::F32, &[3, 1]));
    let c_one = push(&g, Op::Cumsum { axis: 1 }, &[&f], tt(DType::F32, &[3, 1]));
    let c_empty = push(&g, Op::Cumsum { axis: 1 }, &[&e], tt(DType::F32, &[2, 0]));
    let c_empty0 = push(&g, Op::Cumsum { axis: 0 }, &[&e], tt(DType::F32, &[2, 0]));
    let big = 1i64 << 53;
    let out = run(
        &g,
        &[&c1, &c0, &c_one, &c_empty, &c_empty0],
        &[
            &buf(&[big, 1, 1, -3, 1, 2, 3, 4], &[2, 4]),
            &buf(&[0.5f32, 0.25, -1.0], &[3, 1]),
            &buf::<f32>(&[], &[2, 0]),
        ],
    );
    assert_eq!(
        v::<i64>(&out[0]),
        vec![big, big + 1, big + 2, big - 1, 1, 3, 6, 10]
    );
    assert_eq!(v::<f32>(&out[1]), vec![0.5, 0.75, -0.25]);
    assert_eq!(v::<f32>(&out[2]), vec![0.5, 0.25, -1.0]);
    assert!(v::<f32>(&out[3]).is_empty());
    assert!(v::<f32>(&out[4]).is_empty());
}

#[test]
fn long_cumsums_are_log_depth_scans() {
    // Lengths around the powers of two, past the reduce_window limit; i64 with wrapping values
    // (exact modulo 2^64 in any order) and f32 against an f64 running sum.
    for n in [17, 32, 33, 100, 1000] {
        let g = Graph::new();
        let x = param(&g, "x", DType::I64, &[2, n]);
        let f = param(&g, "f", DType::F32, &[n, 3]);
        let ci = push(&g, Op::Cumsum { axis: 1 }, &[&x], tt(DType::I64, &[2, n]));
        let cf = push(&g, Op::Cumsum { axis: 0 }, &[&f], tt(DType::F32, &[n, 3]));
        g.set_outputs(&[&ci, &cf]).unwrap();
        let text = to_stablehlo(&g).unwrap();
        assert!(!text.contains("reduce_window"), "{text}");
        let rounds = usize::BITS - (n - 1).leading_zeros();
        assert_eq!(text.matches("stablehlo.pad").count(), 2 * rounds as usize);
        let xs: Vec<i64> = (0..2 * n as i64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64))
            .collect();
        let fs: Vec<f32> = (0..3 * n)
            .map(|i| ((i * 37) % 17) as f32 / 8.0 - 1.0)
            .collect();
        let out = run(&g, &[&ci, &cf], &[&buf(&xs, &[2, n]), &buf(&fs, &[n, 3])]);
        let got = v::<i64>(&out[0]);
        for r in 0..2 {
            let mut sum = 0i64;
            for k in 0..n {
                sum = sum.wrapping_add(xs[r * n + k]);
                assert_eq!(got[r * n + k], sum, "n {n} row {r} at {k}");
            }
        }
        let got = v::<f32>(&out[1]);
        for c in 0..3 {
            let mut sum = 0f64;
            for k in 0..n {
                sum += f64::from(fs[k * 3 + c]);
                let err = (f64::from(got[k * 3 + c]) - sum).abs();
                assert!(
                    err <= 1e-5 * (k + 1) as f64,
                    "n {n} column {c} at {k}: {err}"
                );
            }
        }
    }
}

// ----- contraction, gather, sort -----

#[test]
fn dot_general_forms() {
    let g = Graph::new();
    let a = param(&g, "a", DType::F32, &[2, 3]);
    let b = param(&g, "b", DType::F32, &[3, 2]);
    let ba = param(&g, "ba", DType::I32, &[2, 1, 2]);
    let bb = param(&g, "bb", DType::I32, &[2, 2, 1]);
    let mm = push(
        &g,
        Op::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
        },
        &[&a, &b],
        tt(DType::F32, &[2, 2]),
    );
    let outer = push(
        &g,
        Op::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![],
            rhs_contract: vec![],
        },
        &[&a, &b],
        tt(DType::F32, &[2, 3, 3, 2]),
    );
    // Batch dims paired as [0] x [0]; lhs dim 2 with rhs dim 1.
    let batched = push(
        &g,
        Op::DotGeneral {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![2],
            rhs_contract: vec![1],
        },
        &[&ba, &bb],
        tt(DType::I32, &[2, 1, 1]),
    );
    let out = run(
        &g,
        &[&mm, &outer, &batched],
        &[
            &buf(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]),
            &buf(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]),
            &buf(&[1i32, 2, 3, 4], &[2, 1, 2]),
            &buf(&[5i32, 6, 7, 8], &[2, 2, 1]),
        ],
    );
    assert_eq!(v::<f32>(&out[0]), vec![4.0, 5.0, 10.0, 11.0]);
    let o = v::<f32>(&out[1]);
    assert_eq!(o.len(), 36);
    // outer[i, j, k, l] = a[i, j] * b[k, l]; [1, 2, 2, 0] = 6 * 1.
    assert_eq!(o[((3 + 2) * 3 + 2) * 2], 6.0);
    assert_eq!(v::<i32>(&out[2]), vec![17, 53]);
}

#[test]
fn take_gathers_rows_with_clamped_indices() {
    let g = Graph::new();
    let table = param(&g, "table", DType::F32, &[5, 2]);
    let idx = param(&g, "idx", DType::I32, &[2, 2]);
    let uidx = param(&g, "uidx", DType::U32, &[3]);
    let vec1 = param(&g, "vec", DType::I64, &[4]);
    let s = param(&g, "s", DType::I64, &[]);
    let t1 = push(&g, Op::Take, &[&table, &idx], tt(DType::F32, &[2, 2, 2]));
    let t2 = push(&g, Op::Take, &[&table, &uidx], tt(DType::F32, &[3, 2]));
    let t3 = push(&g, Op::Take, &[&vec1, &idx], tt(DType::I64, &[2, 2]));
    let t4 = push(&g, Op::Take, &[&table, &s], tt(DType::F32, &[2]));
    let empty = constant::<i32>(&g, &[], &[0]);
    let t5 = push(&g, Op::Take, &[&table, &empty], tt(DType::F32, &[0, 2]));
    let rows: Vec<f32> = (0..10).map(|k| k as f32).collect();
    let out = run(
        &g,
        &[&t1, &t2, &t3, &t4, &t5],
        &[
            &buf(&rows, &[5, 2]),
            &buf(&[4i32, -1, 7, 1], &[2, 2]),
            &buf(&[2u32, 9, u32::MAX], &[3]),
            &buf(&[10i64, 11, 12, 13], &[4]),
            &client().buffer_from_scalar(3i64).unwrap(),
        ],
    );
    assert_eq!(
        v::<f32>(&out[0]),
        vec![8.0, 9.0, 0.0, 1.0, 8.0, 9.0, 2.0, 3.0]
    );
    assert_eq!(v::<f32>(&out[1]), vec![4.0, 5.0, 8.0, 9.0, 8.0, 9.0]);
    assert_eq!(v::<i64>(&out[2]), vec![13, 10, 13, 11]);
    assert_eq!(v::<f32>(&out[3]), vec![6.0, 7.0]);
    assert!(v::<f32>(&out[4]).is_empty());
}

fn sort(g: &Graph, inputs: &[&Tensor], axis: usize, descending: bool) -> Vec<Tensor> {
    let outs = inputs.iter().map(|t| t.ty().clone()).collect();
    push_n(g, Op::Sort { axis, descending }, inputs, outs)
}

#[test]
fn sorts_are_stable_with_nan_last_ascending_and_first_descending() {
    let g = Graph::new();
    let k = param(&g, "k", DType::F32, &[7]);
    let pos = push(&g, Op::Iota { dim: 0 }, &[], tt(DType::I32, &[7]));
    let asc = sort(&g, &[&k, &pos], 0, false);
    let desc = sort(&g, &[&k, &pos], 0, true);
    let m = param(&g, "m", DType::I32, &[2, 3]);
    let rows = sort(&g, &[&m], 1, true);
    let cols = sort(&g, &[&m], 0, false);
    let u = param(&g, "u", DType::U32, &[3]);
    let us = sort(&g, &[&u], 0, false);
    let nan = f32::NAN;
    let neg_nan = -f32::NAN;
    let out = run(
        &g,
        &[
            &asc[0], &asc[1], &desc[0], &desc[1], &rows[0], &cols[0], &us[0],
        ],
        &[
            &buf(&[2.0f32, nan, -0.0, 1.0, neg_nan, 0.0, 1.0], &[7]),
            &buf(&[3i32, -1, 3, 0, 5, -7], &[2, 3]),
            &buf(&[u32::MAX, 0, 7], &[3]),
        ],
    );
    // -0.0 and 0.0 are equal (stable: -0.0 first); NaNs of either sign last, in order.
    assert_eq!(v::<i32>(&out[1]), vec![2, 5, 3, 6, 0, 1, 4]);
    let keys = v::<f32>(&out[0]);
    assert!(keys[0].is_sign_negative() && keys[0] == 0.0);
    assert!(keys[5].is_nan() && keys[6].is_nan());
    // Descending: NaNs first, ties keep their order.
    assert_eq!(v::<i32>(&out[3]), vec![1, 4, 0, 3, 6, 2, 5]);
    assert_eq!(v::<i32>(&out[4]), vec![3, 3, -1, 5, 0, -7]);
    assert_eq!(v::<i32>(&out[5]), vec![0, -1, -7, 3, 5, 3]);
    assert_eq!(v::<u32>(&out[6]), vec![0, 7, u32::MAX]);
}

#[test]
fn outputs_may_repeat_and_unused_parameters_stay() {
    let g = Graph::new();
    let a = param(&g, "a", DType::F64, &[2]);
    let _b = param(&g, "b", DType::U8, &[3]);
    let out = run(
        &g,
        &[&a, &a],
        &[&buf(&[1.5f64, -2.0], &[2]), &buf(&[1u8, 2, 3], &[3])],
    );
    assert_eq!(v::<f64>(&out[0]), vec![1.5, -2.0]);
    assert_eq!(v::<f64>(&out[1]), vec![1.5, -2.0]);
    let text = to_stablehlo(&g).unwrap();
    assert!(text.contains("%p1_b: tensor<3xui8>"), "{text}");
}

// ----- loops -----

#[test]
fn malformed_loops_are_errors() {
    for (what, g, needle) in crate::ops::malformed_loops() {
        let m = lower_err(&g);
        assert!(m.contains(needle), "{what}: {m}");
    }
}

/// Ops with regions of their own (a sort, a NaN-propagating max) inside a loop body, a
/// multi-result value returned as state, and a one-value loop (no `:1`), checked against the
/// interpreter; the regions' lines are indented by their depth.
#[test]
fn loops_nest_region_ops_and_single_value_states() {
    let g = Graph::new();
    let x = param(&g, "x", DType::F32, &[4]);
    let (y, n) = g
        .while_loop(
            &(x.clone(), g.scalar(0.0, DType::I32).unwrap()),
            |(_, n)| n.lt(3),
            |(x, n)| {
                let (sorted, idx) = x.sort_with_indices(0, crate::ops::SortOrder::Descending)?;
                let m = x.max(&[0])?;
                let y = sorted.sub(&m)?.add(&idx.astype(DType::F32)?)?;
                Ok((y.mul(0.5)?, n.add(1)?))
            },
        )
        .unwrap();
    let z = g
        .while_loop(
            &y,
            |y| y.sum_all()?.lt(100.0),
            |y| y.abs()?.mul(2.0)?.add(1.0),
        )
        .unwrap();
    g.set_outputs(&[&z, &n, &y]).unwrap();
    let text = to_stablehlo(&g).unwrap();
    assert_eq!(text.matches("\"stablehlo.while\"").count(), 2, "{text}");
    let single = text
        .lines()
        .find(|l| l.contains("\"stablehlo.while\"(%v"))
        .unwrap();
    assert!(!single.contains(':'), "{single}");
    // The sort's comparator is two levels deeper than the loop.
    assert!(
        text.lines()
            .any(|l| l.starts_with("        %v") && l.contains("_before = stablehlo.compare")),
        "{text}"
    );
    let input = [3.0f32, -1.0, 2.5, 0.25];
    let out = run(&g, &[&z, &n, &y], &[&buf(&input, &[4])]);
    let want = crate::interp::evaluate(
        &g,
        &[crate::array::HostArray::from_vec(&[4], input.to_vec()).unwrap()],
    )
    .unwrap();
    assert_close(
        &v::<f32>(&out[0]),
        &want[0]
            .as_array::<f32>()
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<_>>(),
    );
    assert_eq!(v::<i32>(&out[1]), vec![3]);
    assert_close(
        &v::<f32>(&out[2]),
        &want[2]
            .as_array::<f32>()
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<_>>(),
    );
}
