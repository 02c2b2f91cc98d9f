//! Every shape rule rejects bad operands with an `Error::Graph` that names the op, the operand
//! types and the caller's line; nothing panics. Then the composites (softmax, the norms, split,
//! take_along_axis, scan, ...), gradients and AdamW, whose errors say what was wrong.

use super::assert_err;
use stablegraph::nn::Linear;
use stablegraph::ops::{
    ConvDimensionNumbers, ConvOptions, CumsumOptions, Graph, SortOrder, Tensor,
};
use stablegraph::optim::{global_norm, AdamW, AdamWState, ParamState};
use stablegraph::{DType, Error, Result};

use DType::{F32, F64, I32};

/// Asserts `$e` is a graph error for `$op` raised from this file within a few lines of the macro
/// call, whose message contains every needle.
macro_rules! expect_err {
    ($e:expr, $op:expr $(, $needle:expr)* $(,)?) => {{
        let line = line!();
        match $e {
            Err(Error::Graph { op, message, location }) => {
                assert_eq!(op, $op, "{message}");
                let (file, rest) = location.split_once(':').expect("file:line:col");
                assert!(file.ends_with("errors/graph.rs"), "{location}");
                let at: u32 = rest.split(':').next().unwrap().parse().unwrap();
                assert!((line..line + 6).contains(&at), "reported line {at}, macro at {line}");
                $( assert!(message.contains($needle), "message {message:?} lacks {:?}", $needle); )*
            }
            other => panic!("expected a graph error for {}, got {other:?}", $op),
        }
    }};
}

fn f32s(g: &Graph, name: &str, dims: &[usize]) -> Tensor {
    g.parameter(name, DType::F32, dims).unwrap()
}

#[test]
fn elementwise_rules() {
    let g = Graph::new();
    let a = f32s(&g, "a", &[2, 3]);
    let b = f32s(&g, "b", &[4, 3]);
    let i = g.parameter("i", DType::I32, &[2, 3]).unwrap();
    let p = g.parameter("p", DType::Pred, &[2, 3]).unwrap();
    expect_err!(a.add(&b), "add", "f32[2, 3]", "f32[4, 3]", "broadcast");
    expect_err!(&a + &b, "add", "f32[2, 3]", "f32[4, 3]");
    expect_err!(
        a.mul(&i),
        "mul",
        "lhs is f32[2, 3] and rhs is i32[2, 3]: operands need one dtype; convert rhs with \
         `.astype(DType::F32)`"
    );
    expect_err!(i.exp(), "exp", "i32[2, 3]");
    expect_err!(i.softplus(), "softplus", "i32[2, 3]");
    expect_err!(p.neg(), "neg", "pred[2, 3]");
    expect_err!(a.not(), "not", "f32[2, 3]");
    expect_err!(a.shift_left(&a), "shift_left", "f32");
    expect_err!(i.add(2.5), "add", "2.5", "i32");
    expect_err!(a.select(&a, &a), "select", "pred", "f32[2, 3]");
    expect_err!(
        p.select(&a, &i),
        "select",
        "on_true is f32[2, 3] and on_false is i32[2, 3]: operands need one dtype"
    );
    expect_err!(a.clamp(0.0, &i), "clamp", "i32");
    expect_err!(a.bitcast(DType::F64), "bitcast", "f32[2, 3]", "f64");
    expect_err!(
        a.broadcast_to(&[3, 3]),
        "broadcast_to",
        "f32[2, 3]",
        "[3, 3]"
    );
    expect_err!(g.full(300.0, DType::U8, &[2]), "full", "300", "u8");
    expect_err!(g.full(2f64.powi(63), DType::I64, &[]), "full", "i64");
    expect_err!(g.full(2f64.powi(64), DType::U64, &[]), "full", "u64");
    expect_err!(g.full(-1.0, DType::U32, &[]), "full", "u32");
    assert!(g.full(-(2f64.powi(63)), DType::I64, &[]).is_ok());
    expect_err!(g.iota(DType::F32, &[2, 3], 2), "iota", "axis 2");
    expect_err!(g.iota(DType::Pred, &[2], 0), "iota", "pred");
}

#[test]
fn tensors_of_two_graphs_do_not_mix() {
    let g1 = Graph::new();
    let g2 = Graph::new();
    let a = f32s(&g1, "a", &[2]);
    let b = f32s(&g2, "b", &[2]);
    expect_err!(a.add(&b), "add", "belongs to graph");
    expect_err!(Tensor::concat(&[&a, &b], 0), "concat", "belongs to graph");
    expect_err!(
        Tensor::einsum("i,i->", &[&a, &b]),
        "einsum",
        "belongs to graph"
    );
    expect_err!(g1.set_outputs(&[&b]), "set_outputs", "belongs to graph");
    // select checks the branches' graph before a number becomes a constant in it.
    let c = g1.parameter("c", DType::Pred, &[2]).unwrap();
    let before = g2.nodes().len();
    expect_err!(c.select(&b, 0.0), "select", "belongs to graph");
    expect_err!(c.select(&a, &b), "select", "belongs to graph");
    expect_err!(b.where_(&c, 1.0), "where_", "belongs to graph");
    expect_err!(b.masked_fill(&c, 1.0), "masked_fill", "belongs to graph");
    assert_eq!(
        g2.nodes().len(),
        before,
        "no stray constants in the other graph"
    );
}

#[test]
fn parameter_rules() {
    let g = Graph::new();
    let x = f32s(&g, "x", &[1]);
    expect_err!(
        g.parameter("huge", DType::F32, &[usize::MAX, 2]),
        "parameter",
        "too large"
    );
    expect_err!(
        g.zeros(DType::F64, &[1 << 40, 1 << 40]),
        "full",
        "too large"
    );
    expect_err!(
        x.broadcast_to(&[1 << 62, 1 << 3]),
        "broadcast_to",
        "too large"
    );
    expect_err!(
        g.parameter("x", DType::F32, &[2]),
        "parameter",
        "already exists"
    );
    expect_err!(
        g.parameter("bad name", DType::F32, &[2]),
        "parameter",
        "bad name"
    );
    expect_err!(g.parameter("", DType::F32, &[2]), "parameter");
}

#[test]
fn shape_rules() {
    let g = Graph::new();
    let a = f32s(&g, "a", &[2, 3]);
    let i0 = g.parameter("i0", DType::I32, &[]).unwrap();
    let i1 = g.parameter("i1", DType::I64, &[]).unwrap();
    expect_err!(a.reshape(&[4, 2]), "reshape", "f32[2, 3]", "[4, 2]");
    expect_err!(a.reshape(&[-1, -1]), "reshape", "f32[2, 3]");
    expect_err!(a.reshape(&[4, -1]), "reshape", "6 elements");
    expect_err!(a.transpose(&[0, 0]), "transpose", "twice");
    expect_err!(a.transpose(&[0]), "transpose", "f32[2, 3]");
    expect_err!(a.transpose(&[0, 2]), "transpose", "axis 2");
    expect_err!(
        a.t().and_then(|t| t.t()?.expand_dims(4)),
        "expand_dims",
        "axis 4"
    );
    expect_err!(a.squeeze(&[0]), "squeeze", "dimension 0", "not 1");
    expect_err!(a.slice(5, 0, 1, 1), "slice", "axis 5");
    expect_err!(a.slice(0, 0, 1, 0), "slice", "step");
    expect_err!(a.narrow(1, 2, 2), "narrow", "[2, 4)", "f32[2, 3]");
    expect_err!(a.slice_all(&[0, 0], &[3, 3], &[1, 1]), "slice", "f32[2, 3]");
    expect_err!(
        a.dynamic_slice(&[&i0], &[1, 1]),
        "dynamic_slice",
        "2 rank-0 integer"
    );
    expect_err!(
        a.dynamic_slice(&[&i0, &i1], &[1, 1]),
        "dynamic_slice",
        "one dtype"
    );
    expect_err!(
        a.dynamic_slice(&[&i0, &i0], &[3, 1]),
        "dynamic_slice",
        "sizes [3, 1]"
    );
    let big = f32s(&g, "big", &[3, 3]);
    expect_err!(
        a.dynamic_update_slice(&big, &[&i0, &i0]),
        "dynamic_update_slice",
        "f32[3, 3]",
        "does not fit"
    );
    let c = f32s(&g, "c", &[2, 4]);
    expect_err!(
        Tensor::concat(&[&a, &c], 0),
        "concat",
        "f32[2, 3]",
        "f32[2, 4]"
    );
    expect_err!(Tensor::concat(&[], 0), "concat", "at least one");
    expect_err!(a.pad(&[0, -2], &[0, -2], &[0, 0], 0.0), "pad", "negative");
    expect_err!(
        a.pad(&[0], &[0], &[0], 0.0),
        "pad",
        "one entry per dimension"
    );
    expect_err!(a.flip(&[2]), "flip", "axis 2");
}

#[test]
fn reduction_rules() {
    let g = Graph::new();
    let a = f32s(&g, "a", &[2, 0]);
    let p = g.parameter("p", DType::Pred, &[2]).unwrap();
    let i = g.parameter("i", DType::I32, &[2]).unwrap();
    expect_err!(a.sum(&[2]), "sum", "axis 2", "f32[2, 0]");
    expect_err!(a.sum(&[1, -1]), "sum", "twice");
    expect_err!(p.sum(&[0]), "sum", "pred[2]");
    expect_err!(a.argmax(1), "argmax", "non-empty axis 1");
    expect_err!(i.mean(&[0]), "mean", "i32[2]");
    expect_err!(i.logsumexp(&[0]), "logsumexp", "i32[2]");
    expect_err!(p.cumsum(0), "cumsum", "pred[2]");
    expect_err!(a.cumsum(3), "cumsum", "axis 3");
}

#[test]
fn linalg_rules() {
    let g = Graph::new();
    let a = f32s(&g, "a", &[2, 3]);
    let b = f32s(&g, "b", &[4, 5]);
    let i = g.parameter("i", DType::I32, &[3, 4]).unwrap();
    expect_err!(
        a.dot_general(&b, &[], &[(1, 0)]),
        "dot_general",
        "lhs is f32[2, 3] and rhs is f32[4, 5]: the contracted lhs axis 1 (size 3) and rhs \
         axis 0 (size 4) differ"
    );
    expect_err!(
        a.dot_general(&i, &[], &[(1, 0)]),
        "dot_general",
        "operands need one dtype; convert rhs with `.astype(DType::F32)`"
    );
    expect_err!(
        a.dot_general(&a, &[(0, 0)], &[(0, 1)]),
        "dot_general",
        "lhs axis 0 is both batch and contracting"
    );
    expect_err!(
        a.dot_general_as(&a, &[], &[(1, 1)], DType::I32),
        "dot_general_as",
        "no i32 product of f32 and f32 operands"
    );
    let s = f32s(&g, "s", &[]);
    expect_err!(
        s.matmul(&a),
        "matmul",
        "f32[]",
        "a scalar has no matrix product"
    );
    let v = f32s(&g, "v", &[3]);
    expect_err!(
        v.matmul(&f32s(&g, "y3", &[2, 3, 4])),
        "matmul",
        "a vector lhs takes a rhs of rank 1 or 2, not 3"
    );
    let x = f32s(&g, "x", &[2, 3, 4]);
    expect_err!(
        x.matmul(&f32s(&g, "y", &[5, 4, 2])),
        "matmul",
        "the batch lhs axis 0 (size 2) and rhs axis 0 (size 5) differ"
    );
    expect_err!(
        x.matmul(&f32s(&g, "y4", &[1, 2, 4, 2])),
        "matmul",
        "leading (batch) dimensions are not broadcast"
    );
}

/// A convolution's layouts must name the same axes the operands have; the error names the
/// strings.
#[test]
fn convolution_layouts_are_checked() {
    let g = Graph::new();
    let x = f32s(&g, "x", &[1, 5, 5, 4]);
    let k = f32s(&g, "k", &[3, 3, 4, 2]);
    let with = |lhs: &str, rhs: &str, out: &str| ConvOptions {
        dimension_numbers: Some(ConvDimensionNumbers::new(lhs, rhs, out)),
        ..ConvOptions::default()
    };
    assert!(x
        .conv_general_dilated(&k, &with("NHWC", "HWIO", "NHWC"))
        .is_ok());
    expect_err!(
        x.conv_general_dilated(&k, &with("NHXC", "HWIO", "NHWC")),
        "conv_general_dilated",
        "layouts \"NHXC\", \"HWIO\" -> \"NHWC\" where input is f32[1, 5, 5, 4] and kernel is \
         f32[3, 3, 4, 2]: the layouts \"NHXC\", \"HWIO\" and \"NHWC\" name different spatial axes"
    );
    expect_err!(
        x.conv_general_dilated(&k, &with("NHWX", "HWIO", "NHWC")),
        "conv_general_dilated",
        "the lhs layout \"NHWX\" needs one N, one C"
    );
    expect_err!(
        x.conv_general_dilated(&k, &with("NDHWC", "HWIO", "NHWC")),
        "conv_general_dilated",
        "the lhs layout \"NDHWC\" has 5 axes, but the input's rank is 4"
    );
    expect_err!(
        x.conv_general_dilated(&k, &with("NHWC", "HWII", "NHWC")),
        "conv_general_dilated",
        "the rhs layout \"HWII\" needs one O, one I and other letters for the spatial axes, \
         each once"
    );
    expect_err!(
        x.conv_general_dilated(&k, &with("NHWC", "HWIO", "NHHC")),
        "conv_general_dilated",
        "the out layout \"NHHC\" needs one N, one C"
    );
    // Whatever the strings, an error or a convolution; never a panic.
    let odd = [
        "", "N", "NC", "NCW", "CN", "NNHW", "ÑHWC", "NCHW", "HWIO", "OIHW", "IOWH",
    ];
    for lhs in odd {
        for rhs in odd {
            for out in odd {
                let _ = x.conv_general_dilated(&k, &with(lhs, rhs, out));
            }
        }
    }
    // The rule's message after a layout's transposes speaks of features, not axes.
    let k3 = f32s(&g, "k3", &[3, 3, 3, 2]);
    expect_err!(
        x.conv2d(&k3, None, &with("NHWC", "HWIO", "NHWC")),
        "conv2d",
        "the input has 4 features, but the kernel takes 3"
    );
    let b = f32s(&g, "b", &[5]);
    expect_err!(
        x.conv2d(&k, Some(&b), &with("NHWC", "HWIO", "NHWC")),
        "conv2d",
        "the bias must be f32[2], got f32[5]"
    );
}

/// A builder that lowers to a primitive of another name reports the call the user made, its
/// operands by their roles, and how to fix a dtype mismatch.
#[test]
fn errors_name_the_call_the_user_made() {
    let g = Graph::new();
    let x = f32s(&g, "x", &[2, 3]);
    let y = f32s(&g, "y", &[4, 5]);
    let y64 = g.parameter("y64", F64, &[3, 4]).unwrap();
    let here = |e: Result<Tensor>| match e {
        Err(Error::Graph {
            op,
            message,
            location,
        }) => {
            assert!(location.contains("errors/graph.rs"), "{location}");
            format!("{op}: {message}")
        }
        other => panic!("expected a graph error, got {other:?}"),
    };
    assert_eq!(
        here(x.matmul(&y)),
        "matmul: lhs is f32[2, 3] and rhs is f32[4, 5]: the contracted lhs axis 1 (size 3) and \
         rhs axis 0 (size 4) differ"
    );
    assert_eq!(
        here(x.matmul(&y64)),
        "matmul: lhs is f32[2, 3] and rhs is f64[3, 4]: operands need one dtype; convert lhs \
         with `.astype(DType::F64)`"
    );
    assert_eq!(
        here(Tensor::einsum("ij,jk->ik", &[&x, &y64])),
        "einsum: 'ij,jk->ik' where operand 0 is f32[2, 3] and operand 1 is f64[3, 4]: operands \
         need one dtype; convert operand 0 with `.astype(DType::F64)`"
    );
    assert_eq!(
        here(Tensor::einsum("ij,jk->ik", &[&x, &y])),
        "einsum: 'ij,jk->ik' where operand 0 is f32[2, 3] and operand 1 is f32[4, 5]: index \
         'j' has sizes 3 and 4"
    );
    assert_eq!(
        here(x.add(y64.t().unwrap())),
        "add: lhs is f32[2, 3] and rhs is f64[4, 3]: operands need one dtype; convert lhs with \
         `.astype(DType::F64)`"
    );
    // Neither converts to the other without loss: both go to the dtype that holds each.
    let h = g.parameter("h", DType::F16, &[2]).unwrap();
    let b = g.parameter("b", DType::BF16, &[2]).unwrap();
    assert_eq!(
        here(h.mul(&b)),
        "mul: lhs is f16[2] and rhs is bf16[2]: operands need one dtype; convert both with \
         `.astype(DType::F32)`"
    );
    // A linear layer names its own operands, in the rule's message too.
    let layer = Linear {
        weight: f32s(&g, "w", &[4, 5]),
        bias: None,
    };
    assert_eq!(
        here(layer.forward(&x)),
        "Linear::forward: x is f32[2, 3] and weight is f32[4, 5]: the contracted x axis 1 \
         (size 3) and weight axis 1 (size 5) differ"
    );
    // Convolutions: the functional forms name the input and the kernel.
    let img = f32s(&g, "img", &[1, 4, 5, 5]);
    let k64 = g.parameter("k64", F64, &[2, 4, 3, 3]).unwrap();
    assert_eq!(
        here(img.conv2d(&k64, None, &ConvOptions::default())),
        "conv2d: input is f32[1, 4, 5, 5] and kernel is f64[2, 4, 3, 3]: operands need one \
         dtype; convert input with `.astype(DType::F64)`"
    );
    let k = f32s(&g, "k", &[2, 3, 3, 3]);
    assert_eq!(
        here(img.conv_general_dilated(&k, &ConvOptions::default())),
        "conv_general_dilated: input is f32[1, 4, 5, 5] and kernel is f32[2, 3, 3, 3]: the \
         input has 4 features, but the kernel takes 3"
    );
}

#[test]
fn einsum_rules() {
    let g = Graph::new();
    let a = f32s(&g, "a", &[2, 3]);
    let b = f32s(&g, "b", &[3, 4]);
    expect_err!(
        Tensor::einsum("ij,jk->ik", &[&a]),
        "einsum",
        "2 operands, 1 were given"
    );
    expect_err!(
        Tensor::einsum("ij,jk->iz", &[&a, &b]),
        "einsum",
        "'z' is in no operand"
    );
    expect_err!(
        Tensor::einsum("ij,jk->ii", &[&a, &b]),
        "einsum",
        "'i' repeats"
    );
    expect_err!(
        Tensor::einsum("ij,kk->ik", &[&a, &b]),
        "einsum",
        "repeats within operand 1"
    );
    expect_err!(
        Tensor::einsum("ij,ik->jk", &[&a, &b]),
        "einsum",
        "'i' has sizes 2 and 3"
    );
    expect_err!(
        Tensor::einsum("ijk,jk->ik", &[&a, &b]),
        "einsum",
        "rank 2",
        "3 indices"
    );
    expect_err!(
        Tensor::einsum("i1,jk->ik", &[&a, &b]),
        "einsum",
        "not an index letter"
    );
    expect_err!(
        Tensor::einsum("...j,jk->k", &[&a, &b]),
        "einsum",
        "ellipsis"
    );
    expect_err!(Tensor::einsum("ij->i", &[]), "einsum", "no operands");
}

#[test]
fn gather_conv_sort_random_rules() {
    let g = Graph::new();
    let table = f32s(&g, "t", &[5, 3]);
    let fidx = f32s(&g, "f", &[2]);
    expect_err!(table.take(&fidx), "take", "f32[2]");
    expect_err!(fidx.one_hot(4, DType::F32), "one_hot", "f32[2]");
    let x = f32s(&g, "x", &[1, 6, 4]);
    let w = f32s(&g, "w", &[3, 2]);
    expect_err!(
        x.causal_conv1d(&w, None),
        "causal_conv1d",
        "f32[1, 6, 4]",
        "f32[3, 2]"
    );
    let p = g.parameter("p", DType::Pred, &[3]).unwrap();
    expect_err!(p.sort(0, SortOrder::Ascending), "sort", "pred[3]");
    expect_err!(table.top_k(4), "top_k", "k = 4");
    let bad_key = g.parameter("k", DType::U32, &[3]).unwrap();
    expect_err!(
        g.random_uniform(&bad_key, DType::F32, &[2]),
        "random_uniform",
        "u32[2]",
        "u32[3]"
    );
    let key = g.parameter("key", DType::U32, &[2]).unwrap();
    expect_err!(
        g.random_normal(&key, DType::I32, &[2]),
        "random_normal",
        "i32"
    );
    expect_err!(x.tril(0).and_then(|_| fidx.tril(0)), "tril", "f32[2]");
}

#[test]
fn inferred_shapes_of_composites() {
    let g = Graph::new();
    let x = f32s(&g, "x", &[2, 5, 3]);
    assert_eq!(x.sum_keepdims(&[1]).unwrap().dims(), &[2, 1, 3]);
    assert_eq!(x.sum(&[-1, 0]).unwrap().dims(), &[5]);
    assert_eq!(x.argmax(-1).unwrap().ty().to_string(), "i64[2, 5]");
    assert_eq!(x.logsumexp(&[1]).unwrap().dims(), &[2, 3]);
    assert_eq!(
        x.cumsum_with(
            1,
            CumsumOptions {
                exclusive: true,
                reverse: true
            }
        )
        .unwrap()
        .dims(),
        &[2, 5, 3]
    );
    assert_eq!(x.slice(1, -3, 100, 2).unwrap().dims(), &[2, 2, 3]);
    assert_eq!(x.reshape(&[-1, 3]).unwrap().dims(), &[10, 3]);
    assert_eq!(x.transpose(&[2, 0, 1]).unwrap().dims(), &[3, 2, 5]);
    assert_eq!(x.expand_dims(-1).unwrap().dims(), &[2, 5, 3, 1]);
    assert_eq!(
        x.pad(&[1, 0, -1], &[0, 2, 0], &[0, 1, 0], 0.0)
            .unwrap()
            .dims(),
        &[3, 11, 2]
    );
    let y = f32s(&g, "y", &[2, 3, 4]);
    assert_eq!(x.matmul(&y).unwrap().dims(), &[2, 5, 4]);
    assert_eq!(
        Tensor::einsum("bij,bjk->bik", &[&x, &y]).unwrap().dims(),
        &[2, 5, 4]
    );
    assert_eq!(
        Tensor::einsum("bij,bjk->kb", &[&x, &y]).unwrap().dims(),
        &[4, 2]
    );
    assert_eq!(Tensor::einsum("bij", &[&x]).unwrap().dims(), &[2, 5, 3]);
    let idx = g.parameter("idx", DType::I32, &[4, 2]).unwrap();
    let table = f32s(&g, "table", &[7, 3]);
    assert_eq!(table.take(&idx).unwrap().dims(), &[4, 2, 3]);
    assert_eq!(idx.one_hot(7, DType::F32).unwrap().dims(), &[4, 2, 7]);
    let (v, i) = x.top_k(2).unwrap();
    assert_eq!(
        (v.dims(), i.ty().to_string()),
        (&[2usize, 5, 2][..], "i64[2, 5, 2]".into())
    );
    assert_eq!(g.tril_mask(3, 4, 0).unwrap().ty().to_string(), "pred[3, 4]");
    let key = g.parameter("key", DType::U32, &[2]).unwrap();
    assert_eq!(
        g.random_normal(&key, DType::BF16, &[3, 2])
            .unwrap()
            .ty()
            .to_string(),
        "bf16[3, 2]"
    );
}

#[test]
fn loop_rules() {
    let g = Graph::new();
    let x = f32s(&g, "x", &[3]);
    let i = g.parameter("i", DType::I64, &[]).unwrap();
    // The body changes the dtype of carry component 1.
    expect_err!(
        g.while_loop(
            &(x.clone(), i.clone()),
            |(_, i)| i.lt(10.0),
            |(x, i)| Ok((x.clone(), i.astype(DType::I32)?))
        ),
        "while_loop",
        "carry component 1",
        "i64[]",
        "i32[]"
    );
    // ... or the shape of component 0.
    expect_err!(
        g.while_loop(&x, |x| x.sum_all()?.gt(0.0), |x| Tensor::concat(&[x, x], 0)),
        "while_loop",
        "carry component 0",
        "f32[3]",
        "f32[6]"
    );
    expect_err!(
        g.while_loop(&x, |x| Ok(x.clone()), |x| Ok(x.clone())),
        "while_loop",
        "rank-0 pred",
        "f32[3]"
    );
    expect_err!(
        g.while_loop(
            &x,
            |x| x.sum_all()?.gt(0.0),
            |_| g.parameter("p", DType::F32, &[3])
        ),
        "parameter",
        "inside a loop"
    );
    // A value made inside a loop cannot be used outside it.
    let mut leaked = None;
    let _ = g.while_loop(
        &x,
        |x| x.sum_all()?.gt(0.0),
        |x| {
            let y = x.mul(2.0)?;
            leaked = Some(y.clone());
            Ok(y)
        },
    );
    let leaked = leaked.unwrap();
    expect_err!(x.add(&leaked), "add", "inside a loop");
    expect_err!(g.set_outputs(&[&leaked]), "set_outputs", "inside a loop");
    // Bounds must be rank-0 integers of one dtype.
    let fbound = f32s(&g, "fb", &[]);
    expect_err!(
        g.fori_loop(0, &fbound, &x, |_, x| Ok(x.clone())),
        "fori_loop",
        "rank-0 integers",
        "f32[]"
    );
    // fori_loop names itself, and counts the carry's components from the user's first (not
    // from its hidden counter).
    expect_err!(
        g.fori_loop(0, 4, &(x.clone(), i.clone()), |_, (x, i)| Ok((
            x.clone(),
            i.astype(DType::I32)?
        ))),
        "fori_loop",
        "carry component 1 changes from i64[] to i32[]"
    );
    expect_err!(
        g.fori_loop(0, 4, &x, |_, x| Tensor::concat(&[x, x], 0)),
        "fori_loop",
        "carry component 0 changes from f32[3] to f32[6]"
    );
    // ... and counts only the user's tensors when the number changes.
    expect_err!(
        g.fori_loop(0, 4, &vec![x.clone()], |_, v| Ok(vec![
            v[0].clone(),
            v[0].clone()
        ])),
        "fori_loop",
        "the body returns 2 tensors, the state has 1"
    );
    // After errors the graph is usable: new nodes land in the program again.
    let y = x.exp().unwrap();
    g.set_outputs(&[&y]).unwrap();
}

#[test]
fn select_family_names_the_op_called() {
    let g = Graph::new();
    let a = f32s(&g, "a", &[2, 3]);
    let m = g.parameter("m", DType::Pred, &[2, 3]).unwrap();
    let i = g.parameter("i", DType::I32, &[2, 3]).unwrap();
    // masked_fill's errors say masked_fill (they said select).
    expect_err!(
        a.masked_fill(&a, 0.0),
        "masked_fill",
        "condition must be pred",
        "f32[2, 3]"
    );
    expect_err!(i.masked_fill(&m, 1.5), "masked_fill", "1.5", "i32");
    let wide = g.parameter("w", DType::Pred, &[4, 3]).unwrap();
    expect_err!(
        a.masked_fill(&wide, 0.0),
        "masked_fill",
        "pred[4, 3]",
        "broadcast"
    );
    expect_err!(a.where_(&a, 0.0), "where_", "condition must be pred");
    let s = g.scalar(0.0, DType::F32).unwrap();
    expect_err!(s.tril(0), "tril", "rank >= 2", "f32[]");
    // select with numbers for both branches has no dtype to give them.
    expect_err!(
        m.select(1.0, 0.0),
        "select",
        "at least one branch must be a tensor"
    );
    expect_err!(
        m.select(&a, &i),
        "select",
        "operands need one dtype",
        "f32[2, 3]",
        "i32[2, 3]",
        "convert on_false with `.astype(DType::F32)`"
    );
    // Numbers take the tensor branch's dtype, on either side.
    assert_eq!(m.select(1, &i).unwrap().ty().to_string(), "i32[2, 3]");
    assert_eq!(m.select(&a, -1.0).unwrap().ty().to_string(), "f32[2, 3]");
    expect_err!(m.select(&i, 2.5), "select", "2.5", "i32");
}

#[test]
fn reduction_options_and_index_dtypes() {
    let g = Graph::new();
    let x = f32s(&g, "x", &[2, 300]);
    let p = g.parameter("p", DType::Pred, &[2]).unwrap();
    assert_eq!(x.max_keepdims(&[1]).unwrap().dims(), &[2, 1]);
    assert_eq!(x.mean_keepdims(&[0, 1]).unwrap().dims(), &[1, 1]);
    assert_eq!(x.logsumexp_keepdims(&[-1]).unwrap().dims(), &[2, 1]);
    assert_eq!(x.argmin_keepdims(1).unwrap().ty().to_string(), "i64[2, 1]");
    assert_eq!(
        x.argmax_as(0, DType::U8).unwrap().ty().to_string(),
        "u8[300]"
    );
    assert_eq!(
        x.argmin_as(-1, DType::I32).unwrap().ty().to_string(),
        "i32[2]"
    );
    // 299 does not fit a u8; floats and pred are not index dtypes.
    expect_err!(x.argmax_as(1, DType::U8), "argmax_as", "299", "u8");
    expect_err!(x.argmin_as(0, DType::F32), "argmin_as", "integer", "f32");
    expect_err!(x.argmax_as(0, DType::Pred), "argmax_as", "integer", "pred");
    expect_err!(x.sum_keepdims(&[2]), "sum_keepdims", "axis 2");
    expect_err!(
        p.cumsum_with(0, CumsumOptions::default()),
        "cumsum_with",
        "pred[2]"
    );
    expect_err!(p.sort(0, SortOrder::Descending), "sort", "pred[2]");
}

#[test]
fn operators_with_numbers() {
    let g = Graph::new();
    let u = g.parameter("u", DType::U8, &[3]).unwrap();
    let i = g.parameter("i", DType::I64, &[3]).unwrap();
    let h = g.parameter("h", DType::F16, &[3]).unwrap();
    // An integer must be a value of the tensor's dtype, on either side of the operator.
    expect_err!(&u + 300, "add", "300", "u8");
    expect_err!(&u * -1i64, "mul", "-1", "u8");
    expect_err!(2.5 * &u, "mul", "2.5", "u8");
    expect_err!(&h * 100_000i64, "mul", "100000", "f16");
    expect_err!(u.clone() - u64::MAX, "sub", "18446744073709551615", "u8");
    assert_eq!((&u * 10).unwrap().ty().to_string(), "u8[3]");
    assert_eq!((2 * &i).unwrap().ty().to_string(), "i64[3]");
    assert_eq!((1.0 - &h).unwrap().ty().to_string(), "f16[3]");
    // A Result<Tensor> on either side keeps the first error.
    expect_err!(&u + (&u + 300), "add", "300");
    expect_err!((&u + 300) + &u, "add", "300");
    // Different dtypes are still an error through the operators.
    expect_err!(
        &u + &i,
        "add",
        "operands need one dtype; convert lhs with `.astype(DType::I64)`"
    );
    expect_err!(u.clone() % i.clone(), "rem", "u8[3]", "i64[3]");
}

// ---- composites ---------------------------------------------------------------------------------

#[test]
fn bad_arguments_are_errors_that_say_what_was_wrong() {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[4, 8]).unwrap();
    let n = g.parameter("n", I32, &[4, 8]).unwrap();
    let w5 = g.parameter("w5", F32, &[5]).unwrap();
    let w64 = g.parameter("w64", F64, &[8]).unwrap();
    let idx = g.parameter("idx", I32, &[4, 2]).unwrap();
    let idx3 = g.parameter("idx3", I32, &[3, 2]).unwrap();
    let empty = g.parameter("empty", F32, &[4, 0]).unwrap();
    let xs = g.parameter("xs", F32, &[5, 8]).unwrap();
    let ys = g.parameter("ys", F32, &[6, 8]).unwrap();
    let s = g.parameter("s", F32, &[]).unwrap();
    let other = Graph::new().parameter("o", F32, &[4, 8]).unwrap();
    let zero_len = g.parameter("zero_len", F32, &[0]).unwrap();
    assert_err(x.softmax(2), &["axis 2 is out of range"]);
    assert_err(n.softmax(-1), &["softmax needs a float"]);
    assert_err(x.log_softmax(-3), &["axis -3 is out of range"]);
    assert_err(x.layer_norm(&[], None, None, 1e-5), &["at least one axis"]);
    assert_err(x.layer_norm(&[1, -1], None, None, 1e-5), &["given twice"]);
    assert_err(
        x.layer_norm(&[-1], Some(&w5), None, 1e-5),
        &["weight f32[5]"],
    );
    assert_err(
        x.layer_norm(&[-1], None, Some(&w64), 1e-5),
        &["bias f64[8]"],
    );
    assert_err(x.layer_norm(&[-1], None, None, -1.0), &["eps"]);
    assert_err(
        x.layer_norm(&[-1], Some(&other), None, 1e-5),
        &["belongs to graph"],
    );
    assert_err(n.rms_norm(&[-1], None, 1e-6), &["rms_norm needs a float"]);
    assert_err(x.rms_norm(&[-1], None, f64::NAN), &["eps"]);
    assert_err(n.erf(), &["erf needs a float"]);
    assert_err(n.gelu_exact(), &["gelu_exact needs a float"]);
    assert_err(n.var(&[0]), &["var needs a float"]);
    assert_err(x.std(&[5]), &["axis 5 is out of range"]);
    assert_err(n.mean_all(), &["mean_all needs a float"]);
    assert_err(x.split(1, &[3, 4]), &["add up to 7"]);
    assert_err(x.split(1, &[usize::MAX, 9]), &["add up to"]);
    assert_err(x.split(2, &[8]), &["axis 2 is out of range"]);
    assert_err(x.chunk(1, 3), &["3 equal chunks"]);
    assert_err(x.chunk(0, 0), &["0 equal chunks"]);
    assert_err(zero_len.chunk(0, usize::MAX), &["more than the 65536"]);
    assert_err(x.take_along_axis(&x, 1), &["integers"]);
    assert_err(x.take_along_axis(&n.sum(&[0]).unwrap(), 1), &["rank"]);
    assert_err(
        x.take_along_axis(&idx3, 1),
        &["dimension 0 does not broadcast"],
    );
    assert_err(empty.take_along_axis(&idx, 1), &["axis 1 is empty"]);
    assert_err(x.take_along_axis(&idx, 2), &["axis 2 is out of range"]);
    assert_err(x.take_axis(&x, 0), &["integers"]);
    assert_err(empty.take_axis(&idx, 1), &["axis 1 of f32[4, 0] is empty"]);
    assert_err(x.take_axis(&other, 0), &["belongs to graph"]);
    // scan: no inputs, unequal lengths, a rank-0 input, a carry that changes type.
    let step = |h: &Tensor, x: &Tensor| -> Result<(Tensor, Tensor)> { Ok((h.add(x)?, h.clone())) };
    let h0 = g.zeros(F32, &[8]).unwrap();
    let none: Vec<Tensor> = Vec::new();
    let r = g.scan(&h0, &none, |h, _| Ok((h.clone(), h.clone())));
    assert_err(r, &["at least one input"]);
    let r = g.scan(&h0, &(xs.clone(), ys.clone()), |h, (x, _)| step(h, x));
    assert_err(r, &["f32[5, 8], f32[6, 8]"]);
    assert_err(g.scan(&h0, &s, |h, x| step(h, x)), &["leading axis"]);
    let r = g.scan(&(h0.clone(), h0.clone()), &xs, |(h, k), x| {
        Ok(((h.add(x)?, k.sum_all()?), x.clone()))
    });
    assert_err(
        r,
        &["scan", "carry component 1 changes from f32[8] to f32[]"],
    );
    assert_err(
        g.scan(&h0, &other, |h, x| step(h, x)),
        &["belongs to graph"],
    );
    // The graph is still usable after the failed builds.
    let (_, ys) = g.scan(&h0, &xs, |h, x| step(h, x)).unwrap();
    g.set_outputs(&[&ys]).unwrap();
    g.to_stablehlo().unwrap();
}

// ---- gradients and the optimizer ---------------------------------------------------------------

#[test]
fn what_is_not_differentiable_is_an_error() {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[3]).unwrap();
    let i = g.parameter("i", I32, &[3]).unwrap();
    let loss = x.sum_all().unwrap();
    assert_err(loss.grad(&[&i]), &["only float values have gradients"]);
    assert_err(x.grad(&[&x]), &["rank-0 float"]);
    // A data-dependent exit.
    let h = g
        .while_loop(&x, |h| h.sum_all()?.lt(10.0), |h| h.mul(2.0))
        .unwrap();
    let r = h.sum_all().unwrap().grad(&[&x]);
    assert_err(r, &["fori_loop with constant bounds"]);
    // Reinterpreted float bits.
    let y = x.bitcast(I32).unwrap().bitcast(F32).unwrap();
    let ok = y.sum_all().unwrap().grad(&[&x]);
    assert!(ok.is_ok(), "through an integer the flow stops, no error");
    let through_bits = || {
        x.astype(DType::F16)?
            .bitcast(DType::BF16)?
            .astype(F32)?
            .sum_all()
    };
    assert_err(through_bits().unwrap().grad(&[&x]), &["not differentiable"]);
    // A cotangent of the wrong type.
    let c = g.zeros(F32, &[2]).unwrap();
    assert_err(g.vjp(&[&x], &[&c], &[&x]), &["cotangent"]);
    // A value of another graph.
    let other = Graph::new().parameter("z", F32, &[]).unwrap();
    assert!(other.grad(&[&x]).is_err());
}

#[test]
fn adamw_refuses_mismatched_arguments_by_name() {
    let g = Graph::new();
    let p = g.parameter("p", F32, &[2, 3]).unwrap();
    let q = g.parameter("q", F32, &[4]).unwrap();
    let opt = AdamW::default();
    let state = AdamWState::new(vec![ParamState::new(p.clone(), true).unwrap()]).unwrap();
    let one = [p.clone()];
    assert_err(
        opt.update(&state, &[], None),
        &["AdamW::update: grads has 0 entries but the state has 1 parameters"],
    );
    assert_err(
        opt.update(&state, std::slice::from_ref(&q), None),
        &["grads[0] is f32[4], expected the type of params[0], f32[2, 3]"],
    );
    let mut wrong = state.clone();
    wrong.params[0].v = q.clone();
    assert_err(opt.update(&wrong, &one, None), &["v[0] is f32[4]"]);
    let mut wrong = state.clone();
    wrong.step = p.clone();
    assert_err(opt.update(&wrong, &one, None), &["step is"]);
    assert_err(opt.update(&state, &one, Some(&state.step)), &["lr is"]);
    let ids = g.parameter("ids", I32, &[3]).unwrap();
    let int_state = AdamWState {
        params: vec![ParamState {
            param: ids.clone(),
            m: ids.clone(),
            v: ids.clone(),
            decay: false,
        }],
        step: state.step.clone(),
    };
    assert_err(
        opt.update(&int_state, std::slice::from_ref(&ids), None),
        &["params[0] is", "float"],
    );
    let bad = AdamW {
        beta2: 1.0,
        ..AdamW::default()
    };
    assert_err(
        bad.update(&state, &one, None),
        &["beta2 = 1 must be in [0, 1)"],
    );
    assert_err(
        bad.update_with_norm(&state, &one, None),
        &["AdamW::update_with_norm", "beta2"],
    );
    let bad = AdamW {
        clip_norm: Some(0.0),
        ..AdamW::default()
    };
    assert_err(bad.validate(), &["clip_norm"]);
    assert!(global_norm(&[]).is_err());
    assert_err(AdamWState::new(Vec::new()), &["AdamWState::new", "empty"]);
    let empty = AdamWState {
        params: Vec::new(),
        step: state.step.clone(),
    };
    assert_err(opt.update_with_norm(&empty, &[], None), &["global_norm"]);
}
