//! The rules on their own: what each primitive accepts and the types it gives, written out by
//! hand here.

// Operand lists are written as arrays of owned types, one clone each, to read like the op.
#![allow(clippy::cloned_ref_to_slice_refs)]

use super::{check_node, infer};
use crate::dtype::{DType, TensorType};
use crate::ops::{ArgKind, BinaryOp, Comparison, Graph, Op, ReduceKind, UnaryOp};

const ALL: [DType; 11] = DType::ALL;
const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
const INTS: [DType; 6] = [
    DType::U8,
    DType::U32,
    DType::U64,
    DType::I8,
    DType::I32,
    DType::I64,
];

fn t(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims)
}

/// The rule's result types for `op` on `operands`.
fn ok(op: Op, operands: &[TensorType], target: Option<TensorType>) -> Vec<TensorType> {
    let refs: Vec<&TensorType> = operands.iter().collect();
    infer(&op, &refs, target.as_ref())
        .unwrap_or_else(|m| panic!("{op:?} on {operands:?} was rejected: {m}"))
}

/// The single result type of `op` on `operands`.
fn ok1(op: Op, operands: &[TensorType]) -> TensorType {
    let mut out = ok(op, operands, None);
    assert_eq!(out.len(), 1);
    out.remove(0)
}

/// Asserts the rule rejects `op` on `operands` with a message containing `needle`.
fn rejects(op: Op, operands: &[TensorType], target: Option<TensorType>, needle: &str) {
    let refs: Vec<&TensorType> = operands.iter().collect();
    match infer(&op, &refs, target.as_ref()) {
        Err(m) => assert!(m.contains(needle), "{op:?}: {m:?} lacks {needle:?}"),
        Ok(out) => panic!("{op:?} on {operands:?} gave {out:?}, expected an error"),
    }
}

/// Whether the rule accepts `op` on two (or one) operands of `dtype`.
fn accepts(op: &Op, n: usize, dtype: DType) -> bool {
    let x = t(dtype, &[2]);
    let operands = vec![&x; n];
    infer(op, &operands, None).is_ok()
}

/// Every dtype but pred.
fn numbers() -> Vec<DType> {
    ALL.into_iter().filter(|&d| d != DType::Pred).collect()
}

/// Pred and the integers.
fn logical() -> Vec<DType> {
    ALL.into_iter().filter(|d| !d.is_float()).collect()
}

#[test]
fn unary_dtypes() {
    let (numbers, logical) = (numbers(), logical());
    let cases: [(UnaryOp, &[DType]); 16] = [
        (UnaryOp::Neg, &numbers),
        (UnaryOp::Abs, &numbers),
        (UnaryOp::Sign, &numbers),
        (UnaryOp::Not, &logical),
        (UnaryOp::Exp, &FLOATS),
        (UnaryOp::Expm1, &FLOATS),
        (UnaryOp::Log, &FLOATS),
        (UnaryOp::Log1p, &FLOATS),
        (UnaryOp::Sqrt, &FLOATS),
        (UnaryOp::Rsqrt, &FLOATS),
        (UnaryOp::Tanh, &FLOATS),
        (UnaryOp::Logistic, &FLOATS),
        (UnaryOp::Floor, &FLOATS),
        (UnaryOp::Ceil, &FLOATS),
        (UnaryOp::Sin, &FLOATS),
        (UnaryOp::Cos, &FLOATS),
    ];
    for (u, defined) in cases {
        for d in ALL {
            let op = Op::Unary(u);
            assert_eq!(accepts(&op, 1, d), defined.contains(&d), "{u:?} on {d}");
        }
    }
    assert_eq!(
        ok1(Op::Unary(UnaryOp::Exp), &[t(DType::F32, &[2, 3])]),
        t(DType::F32, &[2, 3])
    );
    rejects(
        Op::Unary(UnaryOp::Exp),
        &[t(DType::I32, &[2])],
        None,
        "exp is not defined for i32[2]",
    );
    rejects(
        Op::Unary(UnaryOp::Neg),
        &[t(DType::F32, &[2]), t(DType::F32, &[2])],
        None,
        "takes 1 operands, got 2",
    );
}

#[test]
fn binary_dtypes() {
    let (numbers, logical) = (numbers(), logical());
    let arithmetic = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Rem,
        // Max and min of pred (or, and) are not defined: use `or` and `and`.
        BinaryOp::Max,
        BinaryOp::Min,
    ];
    for d in ALL {
        for b in arithmetic {
            assert_eq!(
                accepts(&Op::Binary(b), 2, d),
                numbers.contains(&d),
                "{b:?} {d}"
            );
        }
        for b in [BinaryOp::And, BinaryOp::Or, BinaryOp::Xor] {
            assert_eq!(
                accepts(&Op::Binary(b), 2, d),
                logical.contains(&d),
                "{b:?} {d}"
            );
        }
        for b in [BinaryOp::ShiftLeft, BinaryOp::ShiftRightLogical] {
            assert_eq!(
                accepts(&Op::Binary(b), 2, d),
                INTS.contains(&d),
                "{b:?} {d}"
            );
        }
    }
    rejects(
        Op::Binary(BinaryOp::Max),
        &[t(DType::Pred, &[4]), t(DType::Pred, &[4])],
        None,
        "max is not defined for pred[4]",
    );
    rejects(
        Op::Binary(BinaryOp::Add),
        &[t(DType::F32, &[2]), t(DType::F32, &[3])],
        None,
        "differ in type",
    );
}

#[test]
fn compare_select_clamp() {
    for d in ALL {
        let x = t(d, &[2, 3]);
        let out = ok1(Op::Compare(Comparison::Lt), &[x.clone(), x]);
        assert_eq!(out, t(DType::Pred, &[2, 3]));
    }
    rejects(
        Op::Compare(Comparison::Eq),
        &[t(DType::F32, &[2]), t(DType::F64, &[2])],
        None,
        "differ in type",
    );
    let (c, x) = (t(DType::Pred, &[2]), t(DType::I32, &[2]));
    assert_eq!(ok1(Op::Select, &[c.clone(), x.clone(), x.clone()]), x);
    rejects(
        Op::Select,
        &[x.clone(), x.clone(), x.clone()],
        None,
        "the condition must be pred[2], got i32[2]",
    );
    rejects(
        Op::Select,
        &[t(DType::Pred, &[3]), x.clone(), x.clone()],
        None,
        "pred[2]",
    );
    rejects(
        Op::Select,
        &[c, x.clone(), t(DType::U32, &[2])],
        None,
        "the branches",
    );
    assert_eq!(ok1(Op::Clamp, &[x.clone(), x.clone(), x.clone()]), x);
    // Bounds have the operand's type (the builder broadcasts them) and pred has no order.
    rejects(
        Op::Clamp,
        &[t(DType::I32, &[]), x.clone(), x.clone()],
        None,
        "one numeric type",
    );
    let p = t(DType::Pred, &[2]);
    rejects(
        Op::Clamp,
        &[p.clone(), p.clone(), p],
        None,
        "one numeric type",
    );
}

#[test]
fn conversions_take_their_target() {
    let x = t(DType::F32, &[2, 3]);
    let to = t(DType::I64, &[2, 3]);
    assert_eq!(ok(Op::Convert, &[x.clone()], Some(to.clone())), vec![to]);
    rejects(Op::Convert, &[x.clone()], None, "needs its result type");
    rejects(
        Op::Convert,
        &[x.clone()],
        Some(t(DType::I64, &[6])),
        "the shapes differ",
    );
    let bits = t(DType::U32, &[2, 3]);
    assert_eq!(
        ok(Op::BitcastConvert, &[x.clone()], Some(bits.clone())),
        vec![bits]
    );
    rejects(
        Op::BitcastConvert,
        &[x],
        Some(t(DType::F64, &[2, 3])),
        "the element sizes differ",
    );
    // Pred has no bit layout, either way (convert instead).
    rejects(
        Op::BitcastConvert,
        &[t(DType::Pred, &[2])],
        Some(t(DType::U8, &[2])),
        "pred",
    );
    rejects(
        Op::BitcastConvert,
        &[t(DType::U8, &[2])],
        Some(t(DType::Pred, &[2])),
        "pred",
    );
}

#[test]
fn sources_take_their_target() {
    let ty = t(DType::F32, &[3]);
    let constant = |n: usize| Op::Constant { data: vec![0; n] };
    // Every element's bytes, or one element's (a splat); nothing else.
    assert_eq!(ok(constant(12), &[], Some(ty.clone())), vec![ty.clone()]);
    assert_eq!(ok(constant(4), &[], Some(ty.clone())), vec![ty.clone()]);
    rejects(
        constant(6),
        &[],
        Some(ty.clone()),
        "6 bytes do not fit f32[3]",
    );
    rejects(
        constant(8),
        &[],
        Some(t(DType::F64, &[1 << 40, 1 << 40])),
        "too large to address",
    );
    let iota = |dim| Op::Iota { dim };
    let i = t(DType::I32, &[2, 3]);
    assert_eq!(ok(iota(1), &[], Some(i.clone())), vec![i.clone()]);
    rejects(iota(2), &[], Some(i.clone()), "dimension 2 is out of range");
    rejects(iota(0), &[], Some(t(DType::Pred, &[3])), "not pred");
    rejects(iota(0), &[i.clone()], Some(i.clone()), "takes 0 operands");
    let param = Op::Parameter {
        index: 0,
        name: "x".into(),
    };
    assert_eq!(ok(param.clone(), &[], Some(i.clone())), vec![i]);
    rejects(param, &[], Some(t(DType::U8, &[usize::MAX])), "too large");
    rejects(Op::BlockArg, &[], None, "needs its result type");
}

#[test]
fn shape_rules() {
    let x = t(DType::F32, &[2, 1, 3]);
    // Broadcast: operand dimension i goes to dims[i], where it is 1 or the size.
    let to = t(DType::F32, &[4, 2, 5, 3]);
    let bcast = |dims: &[usize]| Op::BroadcastInDim {
        dims: dims.to_vec(),
    };
    assert_eq!(
        ok(bcast(&[1, 2, 3]), &[x.clone()], Some(to.clone())),
        vec![to.clone()]
    );
    for dims in [&[0, 2, 3][..], &[2, 1, 3], &[1, 2], &[1, 2, 4]] {
        rejects(
            bcast(dims),
            &[x.clone()],
            Some(to.clone()),
            "cannot broadcast",
        );
    }
    // Reshape keeps the element count and the dtype.
    let flat = t(DType::F32, &[6]);
    assert_eq!(
        ok(Op::Reshape, &[x.clone()], Some(flat.clone())),
        vec![flat]
    );
    rejects(
        Op::Reshape,
        &[x.clone()],
        Some(t(DType::F32, &[5])),
        "cannot reshape",
    );
    rejects(
        Op::Reshape,
        &[x.clone()],
        Some(t(DType::I32, &[6])),
        "cannot reshape",
    );
    // Transpose: output dimension i is operand dimension perm[i].
    let perm = |p: &[usize]| Op::Transpose { perm: p.to_vec() };
    assert_eq!(
        ok1(perm(&[2, 0, 1]), &[x.clone()]),
        t(DType::F32, &[3, 2, 1])
    );
    rejects(perm(&[0, 0, 1]), &[x.clone()], None, "does not fit");
    rejects(perm(&[0, 1]), &[x.clone()], None, "does not fit");
    // Slice: ceil((limit - start) / stride) per dimension.
    let y = t(DType::I32, &[10, 4]);
    let slice = |start: &[usize], limit: &[usize], stride: &[usize]| Op::Slice {
        start: start.to_vec(),
        limit: limit.to_vec(),
        stride: stride.to_vec(),
    };
    assert_eq!(
        ok1(slice(&[1, 0], &[8, 4], &[3, 1]), &[y.clone()]),
        t(DType::I32, &[3, 4])
    );
    rejects(
        slice(&[0, 0], &[11, 4], &[1, 1]),
        &[y.clone()],
        None,
        "do not fit",
    );
    rejects(
        slice(&[0, 0], &[4, 4], &[0, 1]),
        &[y.clone()],
        None,
        "do not fit",
    );
    rejects(
        slice(&[5, 0], &[4, 4], &[1, 1]),
        &[y.clone()],
        None,
        "do not fit",
    );
    rejects(slice(&[0], &[4], &[1]), &[y.clone()], None, "do not fit");
    // Reverse: distinct axes in range.
    let rev = |axes: &[usize]| Op::Reverse {
        axes: axes.to_vec(),
    };
    assert_eq!(ok1(rev(&[1, 0]), &[y.clone()]), y);
    rejects(rev(&[1, 1]), &[y.clone()], None, "not distinct");
    rejects(rev(&[2]), &[y], None, "not distinct");
}

#[test]
fn concatenate_and_pad() {
    let cat = |axis| Op::Concatenate { axis };
    let (a, b) = (t(DType::U8, &[2, 3]), t(DType::U8, &[2, 5]));
    assert_eq!(ok1(cat(1), &[a.clone(), b.clone()]), t(DType::U8, &[2, 8]));
    assert_eq!(ok1(cat(0), &[a.clone()]), a);
    rejects(cat(0), &[a.clone(), b], None, "cannot join");
    rejects(
        cat(0),
        &[a.clone(), t(DType::I32, &[2, 3])],
        None,
        "cannot join",
    );
    rejects(cat(2), &[a.clone()], None, "axis 2 is out of range");
    rejects(cat(0), &[], None, "at least one operand");
    let huge = t(DType::U8, &[0, usize::MAX]);
    rejects(cat(1), &[huge.clone(), huge], None, "too large");
    // Pad: low + d + (d - 1) * interior + high per dimension; empty stays empty inside.
    let pad = |low: &[i64], high: &[i64], interior: &[usize]| Op::Pad {
        low: low.to_vec(),
        high: high.to_vec(),
        interior: interior.to_vec(),
    };
    let x = t(DType::F32, &[3, 0]);
    let v = t(DType::F32, &[]);
    assert_eq!(
        ok1(pad(&[1, 2], &[-1, 0], &[2, 5]), &[x.clone(), v.clone()]),
        t(DType::F32, &[1 + 3 + 2 * 2 - 1, 2])
    );
    rejects(
        pad(&[-4, 0], &[0, 0], &[0, 0]),
        &[x.clone(), v.clone()],
        None,
        "negative",
    );
    rejects(
        pad(&[0], &[0], &[0]),
        &[x.clone(), v.clone()],
        None,
        "one entry",
    );
    rejects(
        pad(&[0, 0], &[0, 0], &[0, 0]),
        &[x.clone(), t(DType::F64, &[])],
        None,
        "scalar of the operand's dtype",
    );
    rejects(
        pad(&[i64::MAX, 0], &[i64::MAX, 0], &[0, 0]),
        &[x.clone(), v.clone()],
        None,
        "too large",
    );
    rejects(
        pad(&[0, 0], &[0, 0], &[usize::MAX, 0]),
        &[t(DType::F32, &[3, 0]), v],
        None,
        "too large",
    );
}

#[test]
fn index_rules() {
    let x = t(DType::F32, &[4, 5]);
    let i = t(DType::I32, &[]);
    let ds = |sizes: &[usize]| Op::DynamicSlice {
        sizes: sizes.to_vec(),
    };
    assert_eq!(
        ok1(ds(&[2, 5]), &[x.clone(), i.clone(), i.clone()]),
        t(DType::F32, &[2, 5])
    );
    rejects(
        ds(&[2, 6]),
        &[x.clone(), i.clone(), i.clone()],
        None,
        "sizes [2, 6]",
    );
    rejects(
        ds(&[2, 5]),
        &[x.clone(), i.clone()],
        None,
        "2 rank-0 integer",
    );
    let j = t(DType::I64, &[]);
    rejects(ds(&[2, 5]), &[x.clone(), i.clone(), j], None, "one dtype");
    let f = t(DType::F32, &[]);
    rejects(ds(&[2, 5]), &[x.clone(), f.clone(), f], None, "integer");
    rejects(ds(&[]), &[], None, "no operands");
    let dus = Op::DynamicUpdateSlice;
    let u = t(DType::F32, &[4, 2]);
    assert_eq!(ok1(dus.clone(), &[x.clone(), u, i.clone(), i.clone()]), x);
    let big = t(DType::F32, &[5, 1]);
    rejects(
        dus.clone(),
        &[x.clone(), big, i.clone(), i.clone()],
        None,
        "does not fit",
    );
    rejects(dus, &[x.clone()], None, "takes an operand, an update");
    // Take: indices of any shape, then the table's rows.
    let table = t(DType::BF16, &[7, 3]);
    let idx = t(DType::U8, &[2, 4]);
    assert_eq!(
        ok1(Op::Take, &[table.clone(), idx.clone()]),
        t(DType::BF16, &[2, 4, 3])
    );
    rejects(
        Op::Take,
        &[table, t(DType::F32, &[2])],
        None,
        "integer indices",
    );
    rejects(
        Op::Take,
        &[t(DType::F32, &[0, 3]), idx.clone()],
        None,
        "with rows",
    );
    rejects(
        Op::Take,
        &[t(DType::F32, &[]), idx.clone()],
        None,
        "rank >= 1",
    );
    // ScatterAdd: the table's type, updates of the indices' shape then the rows.
    let table = t(DType::F32, &[7, 3]);
    let upd = t(DType::F32, &[2, 4, 3]);
    assert_eq!(
        ok1(Op::ScatterAdd, &[table.clone(), idx.clone(), upd.clone()]),
        table
    );
    rejects(
        Op::ScatterAdd,
        &[table.clone(), idx.clone(), t(DType::F32, &[2, 4])],
        None,
        "the updates must be f32[2, 4, 3]",
    );
    rejects(
        Op::ScatterAdd,
        &[table.clone(), idx.clone(), t(DType::F64, &[2, 4, 3])],
        None,
        "the updates must be",
    );
    rejects(
        Op::ScatterAdd,
        &[
            t(DType::Pred, &[7, 3]),
            idx.clone(),
            t(DType::Pred, &[2, 4, 3]),
        ],
        None,
        "adds numbers",
    );
    rejects(
        Op::ScatterAdd,
        &[table, t(DType::F32, &[2, 4]), upd],
        None,
        "integer indices",
    );
    rejects(
        Op::ScatterAdd,
        &[t(DType::F32, &[7])],
        None,
        "takes 3 operands",
    );
}

#[test]
fn scatter_set_rules() {
    // The table's type, any dtype (pred too), updates of the indices' shape then the rows.
    let idx = t(DType::I32, &[2, 4]);
    let table = t(DType::Pred, &[7, 3]);
    let upd = t(DType::Pred, &[2, 4, 3]);
    assert_eq!(
        ok1(Op::ScatterSet, &[table.clone(), idx.clone(), upd]),
        table
    );
    rejects(
        Op::ScatterSet,
        &[table.clone(), idx.clone(), t(DType::Pred, &[2, 3])],
        None,
        "the updates must be pred[2, 4, 3]",
    );
    rejects(
        Op::ScatterSet,
        &[t(DType::F32, &[0, 3]), idx, t(DType::F32, &[2, 4, 3])],
        None,
        "scatter_set needs a table of rank >= 1 with rows",
    );
}

#[test]
fn reduce_rules() {
    let x = t(DType::I32, &[2, 3, 4]);
    let reduce = |kind, axes: &[usize]| Op::Reduce {
        kind,
        axes: axes.to_vec(),
    };
    assert_eq!(
        ok1(reduce(ReduceKind::Sum, &[0, 2]), &[x.clone()]),
        t(DType::I32, &[3])
    );
    assert_eq!(ok1(reduce(ReduceKind::Max, &[]), &[x.clone()]), x);
    for axes in [&[2, 0][..], &[1, 1], &[3]] {
        rejects(reduce(ReduceKind::Sum, axes), &[x.clone()], None, "axes");
    }
    for kind in [
        ReduceKind::Sum,
        ReduceKind::Prod,
        ReduceKind::Max,
        ReduceKind::Min,
    ] {
        let p = t(DType::Pred, &[2]);
        rejects(reduce(kind, &[0]), &[p], None, "not defined for pred[2]");
    }
    let arg = |axis| Op::ArgReduce {
        kind: ArgKind::Min,
        axis,
    };
    // The index dtype is the builder's: any integer dtype holding the last index.
    for index in INTS {
        let want = t(index, &[2, 4]);
        assert_eq!(ok(arg(1), &[x.clone()], Some(want.clone())), vec![want]);
    }
    let long = t(DType::F32, &[300]);
    let u8_index = Some(t(DType::U8, &[]));
    rejects(arg(0), &[long], u8_index, "a dtype holding 299");
    for wrong in [t(DType::F32, &[2, 4]), t(DType::I64, &[2, 3])] {
        rejects(arg(1), &[x.clone()], Some(wrong), "was asked for");
    }
    rejects(arg(1), &[x.clone()], None, "needs its result type");
    let i64_out = |dims: &[usize]| Some(t(DType::I64, dims));
    rejects(
        arg(3),
        &[x.clone()],
        i64_out(&[2, 3]),
        "axis 3 is out of range",
    );
    rejects(
        arg(1),
        &[t(DType::F32, &[2, 0])],
        i64_out(&[2]),
        "non-empty axis 1",
    );
    rejects(
        arg(0),
        &[t(DType::Pred, &[2])],
        i64_out(&[]),
        "non-empty axis 0",
    );
    let cumsum = |axis| Op::Cumsum { axis };
    assert_eq!(ok1(cumsum(2), &[x.clone()]), x);
    rejects(cumsum(3), &[x.clone()], None, "axis 3");
    rejects(
        cumsum(0),
        &[t(DType::Pred, &[2])],
        None,
        "cumsum is not defined",
    );
    let sort = |axis| Op::Sort {
        axis,
        descending: false,
    };
    let keys = t(DType::F16, &[3, 4]);
    let payload = t(DType::I64, &[3, 4]);
    assert_eq!(
        ok(sort(1), &[keys.clone(), payload.clone()], None),
        vec![keys.clone(), payload]
    );
    assert_eq!(ok(sort(0), &[keys.clone()], None), vec![keys.clone()]);
    rejects(sort(2), &[keys.clone()], None, "axis 2");
    rejects(sort(0), &[t(DType::Pred, &[3])], None, "cannot sort");
    rejects(
        sort(0),
        &[keys.clone(), t(DType::I64, &[4, 3])],
        None,
        "the keys' shape",
    );
    rejects(
        sort(0),
        &[keys.clone(), keys.clone(), keys],
        None,
        "at most one more",
    );
}

#[test]
fn convolution_rules() {
    let conv = |strides: &[usize], padding: &[(i64, i64)], lhs: &[usize], rhs: &[usize], g| {
        Op::Convolution(crate::ops::ConvWindow {
            strides: strides.to_vec(),
            padding: padding.to_vec(),
            lhs_dilation: lhs.to_vec(),
            rhs_dilation: rhs.to_vec(),
            feature_groups: g,
            precision: crate::ops::Precision::Default,
        })
    };
    let x = t(DType::F32, &[2, 4, 7, 6]);
    let k = t(DType::F32, &[6, 2, 3, 2]);
    // JAX's own shapes for these settings: (7 + 1 - 5) / 2 + 1 and (11 + 1 - 2) / 1 + 1.
    let op = conv(&[2, 1], &[(-1, 2), (1, 0)], &[1, 2], &[2, 1], 2);
    assert_eq!(
        ok1(op.clone(), &[x.clone(), k.clone()]),
        t(DType::F32, &[2, 6, 2, 11])
    );
    rejects(
        op.clone(),
        &[x.clone(), t(DType::F32, &[6, 4, 3, 2])],
        None,
        "the input has 4 features, but the kernel takes 4 per feature group (8 in 2 groups)",
    );
    rejects(
        op.clone(),
        &[x.clone(), t(DType::F32, &[5, 2, 3, 2])],
        None,
        "the kernel's 5 output features do not split into 2 feature groups",
    );
    rejects(
        op.clone(),
        &[t(DType::I32, &[2, 4, 7, 6]), t(DType::I32, &[6, 2, 3, 2])],
        None,
        "needs float operands, not i32",
    );
    rejects(
        op.clone(),
        &[t(DType::F64, &[2, 4, 7, 6]), k.clone()],
        None,
        super::ONE_DTYPE,
    );
    rejects(
        op.clone(),
        &[t(DType::F32, &[2, 4, 7]), k.clone()],
        None,
        "input (rank 3) and kernel (rank 4) need one rank",
    );
    rejects(
        conv(&[2], &[(0, 0)], &[1], &[1], 2),
        &[x.clone(), k.clone()],
        None,
        "per spatial axis",
    );
    rejects(
        conv(&[0, 1], &[(0, 0), (0, 0)], &[1, 1], &[1, 1], 2),
        &[x.clone(), k.clone()],
        None,
        "at least 1",
    );
    rejects(
        conv(&[1, 1], &[(-5, 0), (0, 0)], &[1, 1], &[1, 1], 2),
        &[x, k],
        None,
        "does not fit the padded size",
    );
}

#[test]
fn dot_general_rules() {
    let dot = |lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]| Op::DotGeneral {
        lhs_batch: lb.to_vec(),
        rhs_batch: rb.to_vec(),
        lhs_contract: lc.to_vec(),
        rhs_contract: rc.to_vec(),
    };
    // [b, m, k] x [k, b, n]: batch b, contract k; batch, then lhs free, then rhs free.
    let l = t(DType::F32, &[2, 3, 4]);
    let r = t(DType::F32, &[4, 2, 5]);
    assert_eq!(
        ok1(dot(&[0], &[1], &[2], &[0]), &[l.clone(), r.clone()]),
        t(DType::F32, &[2, 3, 5])
    );
    // An outer product contracts nothing.
    assert_eq!(
        ok1(
            dot(&[], &[], &[], &[]),
            &[t(DType::I32, &[2]), t(DType::I32, &[3])]
        ),
        t(DType::I32, &[2, 3])
    );
    let lr = [l.clone(), r.clone()];
    rejects(
        dot(&[0], &[1], &[1], &[0]),
        &lr,
        None,
        "lhs axis 1 (size 3)",
    );
    rejects(dot(&[0], &[], &[2], &[0]), &lr, None, "must pair up");
    rejects(
        dot(&[0], &[1], &[0], &[0]),
        &lr,
        None,
        "both batch and contracting",
    );
    rejects(
        dot(&[], &[], &[3], &[0]),
        &lr,
        None,
        "out of range or repeat",
    );
    rejects(dot(&[], &[], &[2, 2], &[0, 0]), &lr, None, "repeat");
    rejects(
        dot(&[], &[], &[2], &[0]),
        &[l, t(DType::F64, &[4, 2, 5])],
        None,
        super::ONE_DTYPE,
    );
    let p = t(DType::Pred, &[2]);
    rejects(
        dot(&[], &[], &[0], &[0]),
        &[p.clone(), p],
        None,
        "pred operands have no product",
    );
}

#[test]
fn check_node_compares_recorded_types_with_the_rule() {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[2]).unwrap();
    let good = g
        .push(
            Op::Unary(UnaryOp::Neg),
            vec![x.id()],
            vec![t(DType::F32, &[2])],
        )
        .unwrap();
    let wrong = g
        .push(
            Op::Unary(UnaryOp::Neg),
            vec![x.id()],
            vec![t(DType::F32, &[3])],
        )
        .unwrap();
    g.with_structure(|nodes, regions| {
        assert_eq!(check_node(nodes, regions, good[0].id().node), Ok(()));
        let m = check_node(nodes, regions, wrong[0].id().node).unwrap_err();
        assert!(
            m.contains("declared (f32[3]), but the op gives (f32[2])"),
            "{m}"
        );
        assert!(check_node(nodes, regions, 9).is_err());
    });
    // Builders record what the rules give.
    let y = x.mul(&x).unwrap().sum(&[0]).unwrap();
    assert_eq!(y.ty(), &t(DType::F32, &[]));
    g.with_structure(|nodes, regions| {
        for i in 0..nodes.len() {
            if i != wrong[0].id().node {
                assert_eq!(check_node(nodes, regions, i), Ok(()), "node {i}");
            }
        }
    });
}

#[test]
fn collective_rules() {
    use crate::sharding::Mesh;
    let mesh = Mesh::new(&[("x", 2), ("y", 3)]).unwrap();
    let x = t(DType::F32, &[6, 4]);
    let reduce = |axes: &[&str]| Op::AllReduce {
        kind: ReduceKind::Sum,
        axes: axes.iter().map(|a| a.to_string()).collect(),
        mesh: mesh.clone(),
    };
    assert_eq!(ok1(reduce(&["x", "y"]), &[x.clone()]), x);
    rejects(reduce(&["z"]), &[x.clone()], None, "no axis \"z\"");
    rejects(reduce(&["x", "x"]), &[x.clone()], None, "twice");
    rejects(reduce(&[]), &[x.clone()], None, "at least one");
    rejects(reduce(&["x"]), &[t(DType::Pred, &[2])], None, "numbers");
    let gather = |dim, tiled| Op::AllGather {
        axis: "y".into(),
        dim,
        tiled,
        mesh: mesh.clone(),
    };
    assert_eq!(ok1(gather(1, true), &[x.clone()]), t(DType::F32, &[6, 12]));
    assert_eq!(
        ok1(gather(2, false), &[x.clone()]),
        t(DType::F32, &[6, 4, 3])
    );
    rejects(gather(2, true), &[x.clone()], None, "out of range");
    let scatter = |axis: &str, dim| Op::ReduceScatter {
        axis: axis.into(),
        dim,
        mesh: mesh.clone(),
    };
    assert_eq!(ok1(scatter("y", 0), &[x.clone()]), t(DType::F32, &[2, 4]));
    rejects(scatter("y", 1), &[x.clone()], None, "do not divide");
    let a2a = |split_dim, concat_dim| Op::AllToAll {
        axis: "x".into(),
        split_dim,
        concat_dim,
        mesh: mesh.clone(),
    };
    assert_eq!(ok1(a2a(0, 1), &[x.clone()]), t(DType::F32, &[3, 8]));
    assert_eq!(ok1(a2a(1, 1), &[x.clone()]), x);
    rejects(a2a(0, 2), &[x.clone()], None, "out of range");
    let index = Op::AxisIndex {
        axis: "y".into(),
        mesh: mesh.clone(),
    };
    assert_eq!(ok1(index, &[]), t(DType::I32, &[]));
}

#[test]
fn collectives_outside_a_shard_map_are_rejected_by_the_walk() {
    use crate::sharding::Mesh;
    // Built below the DSL: a psum in the program itself.
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[2]).unwrap();
    let op = Op::AllReduce {
        kind: ReduceKind::Sum,
        axes: vec!["x".into()],
        mesh: Mesh::new(&[("x", 2)]).unwrap(),
    };
    let s = g.push(op, vec![x.id()], vec![t(DType::F32, &[2])]).unwrap();
    g.set_outputs(&[&s[0]]).unwrap();
    let (params, outputs) = (g.parameters(), g.outputs());
    let m = g
        .with_structure(|nodes, regions| crate::ops::live_nodes(nodes, regions, &params, &outputs))
        .unwrap_err();
    assert!(m.contains("outside a shard_map body"), "{m}");
}
