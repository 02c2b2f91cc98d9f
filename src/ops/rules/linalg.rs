//! The rules of `DotGeneral`: its type rule, then its VJP rule, then its batching rule.

use super::batching::{move_axis, BatchStep, Batched};
use super::{arity, Rule, ONE_DTYPE};
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::autodiff::{Cotangents, Step};
use crate::ops::util::node;
use crate::ops::{Op, Tensor};

/// `DotGeneral`: two operands of one numeric dtype; `batch` and `contract` are `[lhs, rhs]`
/// axis lists that pair up, every listed axis in range and used once per operand, paired axes
/// of equal size. The result: batch dimensions, then the lhs's free ones, then the rhs's, in
/// the operands' dtype, or in the `target`'s when given (a mixed-precision product: see
/// [`mixed_dot_dtype`]). Messages name the operands `lhs` and `rhs`.
pub(super) fn dot_general(
    operands: &[&TensorType],
    batch: [&Vec<usize>; 2],
    contract: [&Vec<usize>; 2],
    target: Option<&TensorType>,
) -> Rule<TensorType> {
    let [lhs, rhs] = arity(operands)?;
    let out_dtype = match target {
        Some(t) => mixed_dot_dtype(lhs.dtype, rhs.dtype, t.dtype).ok_or_else(|| {
            format!(
                "no {} product of {} and {} operands; products may widen i8 x i8 and u8 x i8 \
                 to i32 and bf16 x bf16 to f32",
                t.dtype, lhs.dtype, rhs.dtype
            )
        })?,
        None if lhs.dtype != rhs.dtype => return Err(ONE_DTYPE.to_string()),
        None if lhs.dtype == DType::Pred => {
            return Err("pred operands have no product; convert them to a number type".into())
        }
        None => lhs.dtype,
    };
    check_dot_axes([lhs, rhs], batch, contract)?;
    let free = |x: &TensorType, side: usize| -> Vec<usize> {
        (0..x.rank())
            .filter(|a| !batch[side].contains(a) && !contract[side].contains(a))
            .map(|a| x.dims[a])
            .collect()
    };
    let mut dims: Vec<usize> = batch[0].iter().map(|&a| lhs.dims[a]).collect();
    dims.extend(free(lhs, 0));
    dims.extend(free(rhs, 1));
    let ty = TensorType::new(out_dtype, &dims);
    match target {
        Some(t) if t.dims != ty.dims => Err(format!("the result is {ty}, not {t}")),
        _ => Ok(ty),
    }
}

/// The batch and contracting axes of `lhs` and `rhs` pair up, each is in range and used once
/// per operand, and paired axes have one size.
fn check_dot_axes(
    [lhs, rhs]: [&TensorType; 2],
    batch: [&Vec<usize>; 2],
    contract: [&Vec<usize>; 2],
) -> Rule<()> {
    if batch[0].len() != batch[1].len() || contract[0].len() != contract[1].len() {
        return Err(format!(
            "batch axes {:?} x {:?} and contracting axes {:?} x {:?} must pair up",
            batch[0], batch[1], contract[0], contract[1]
        ));
    }
    for (side, x) in [(0, lhs), (1, rhs)] {
        let word = ["lhs", "rhs"][side];
        let (b, c) = (batch[side], contract[side]);
        if let Some(a) = b.iter().find(|a| c.contains(a)) {
            return Err(format!("{word} axis {a} is both batch and contracting"));
        }
        let used: Vec<usize> = b.iter().chain(c).copied().collect();
        let distinct = used.iter().enumerate().all(|(i, a)| !used[..i].contains(a));
        if !distinct || used.iter().any(|&a| a >= x.rank()) {
            return Err(format!(
                "{word} axes {used:?} (batch, then contracting) are out of range or repeat for {x}"
            ));
        }
    }
    for (what, pairs) in [("batch", batch), ("contracted", contract)] {
        for (&l, &r) in pairs[0].iter().zip(pairs[1]) {
            if lhs.dims[l] != rhs.dims[r] {
                return Err(format!(
                    "the {what} lhs axis {l} (size {}) and rhs axis {r} (size {}) differ",
                    lhs.dims[l], rhs.dims[r]
                ));
            }
        }
    }
    Ok(())
}

/// The result dtype `out` of a product of `lhs` and `rhs` operands, when it is one XLA takes:
/// the operands' own dtype, or a widening product (`i8 x i8` and `u8 x i8` into `i32`,
/// `bf16 x bf16` into `f32`, the forms XLA's CPU backend hands to YNNPACK).
pub(crate) fn mixed_dot_dtype(lhs: DType, rhs: DType, out: DType) -> Option<DType> {
    use DType::*;
    let ok = matches!(
        (lhs, rhs, out),
        (I8, I8, I32) | (U8, I8, I32) | (BF16, BF16, F32)
    ) || (lhs == rhs && lhs == out && lhs != Pred);
    ok.then_some(out)
}

/// Dimension numbers of a `dot_general`, as one operand sees them (`lb`/`lc` its own).
struct Dims<'a> {
    lb: &'a [usize],
    rb: &'a [usize],
    lc: &'a [usize],
    rc: &'a [usize],
}

/// Which operand a cotangent is for.
#[derive(PartialEq)]
enum Side {
    Lhs,
    Rhs,
}

/// `DotGeneral`: each operand's cotangent is a `dot_general` of the cotangent with the other
/// operand, transposed into the operand's dimension order. `batch` and `contract` are
/// `[lhs, rhs]` as in the type rule.
pub(super) fn dot_general_vjp(
    s: &Step,
    batch: [&Vec<usize>; 2],
    contract: [&Vec<usize>; 2],
) -> Result<Cotangents> {
    let (lhs, rhs) = (&s.inputs[0], &s.inputs[1]);
    if lhs.dtype() != s.outputs[0].dtype() || rhs.dtype() != s.outputs[0].dtype() {
        if lhs.dtype().is_int() {
            return Ok(s.none());
        }
        return Err(s.not_differentiable("a widening (mixed-precision) product"));
    }
    let ct = s.ct(0)?;
    let mut out = s.none();
    if s.want[0] {
        let dn = Dims {
            lb: batch[0],
            rb: batch[1],
            lc: contract[0],
            rc: contract[1],
        };
        out[0] = Some(dot_operand(&ct, rhs, lhs.rank(), &dn, Side::Lhs, s)?);
    }
    if s.want[1] {
        let swapped = Dims {
            lb: batch[1],
            rb: batch[0],
            lc: contract[1],
            rc: contract[0],
        };
        out[1] = Some(dot_operand(&ct, lhs, rhs.rank(), &swapped, Side::Rhs, s)?);
    }
    Ok(out)
}

/// The cotangent of one operand (`side`, of rank `rank`; `dn` written from its point of view,
/// `other` the other operand) of `out = dot_general(lhs, rhs)`, whose dimensions are
/// `[batch, lhs free, rhs free]`.
fn dot_operand(
    ct: &Tensor,
    other: &Tensor,
    rank: usize,
    dn: &Dims,
    side: Side,
    s: &Step,
) -> Result<Tensor> {
    let nb = dn.lb.len();
    let free = |r: usize, b: &[usize], c: &[usize]| -> Vec<usize> {
        (0..r)
            .filter(|d| !b.contains(d) && !c.contains(d))
            .collect()
    };
    let mine_free = free(rank, dn.lb, dn.lc);
    let other_free = free(other.rank(), dn.rb, dn.rc);
    // Where the other operand's free dimensions sit in `ct`.
    let other_at: Vec<usize> = match side {
        Side::Lhs => (nb + mine_free.len()..nb + mine_free.len() + other_free.len()).collect(),
        Side::Rhs => (nb..nb + other_free.len()).collect(),
    };
    let mine_at: Vec<usize> = match side {
        Side::Lhs => (nb..nb + mine_free.len()).collect(),
        Side::Rhs => (nb + other_free.len()..nb + other_free.len() + mine_free.len()).collect(),
    };
    // g = dot_general(ct, other): batch with batch, ct's other-free with other's free dims.
    // Its dimensions: [batch, my free (from ct, in order), other's contracting dims in the
    // other's order].
    let op = Op::DotGeneral {
        lhs_batch: (0..nb).collect(),
        rhs_batch: dn.rb.to_vec(),
        lhs_contract: other_at,
        rhs_contract: other_free,
    };
    let g = node(ct.graph(), op, &[ct, other], "grad", s.loc)?;
    // ct's remaining dims after removing batch and contracted: exactly `mine_at`, in order.
    debug_assert_eq!(mine_at.len(), mine_free.len());
    let mut other_contract_sorted: Vec<usize> = dn.rc.to_vec();
    other_contract_sorted.sort_unstable();
    let mut perm = vec![0; rank];
    for (k, &d) in dn.lb.iter().enumerate() {
        perm[d] = k;
    }
    for (j, &d) in mine_free.iter().enumerate() {
        perm[d] = nb + j;
    }
    for (k, &d) in dn.lc.iter().enumerate() {
        let pos = other_contract_sorted
            .iter()
            .position(|&r| r == dn.rc[k])
            .unwrap_or(0);
        perm[d] = nb + mine_free.len() + pos;
    }
    g.transpose_at(&perm, s.loc)
}

/// `DotGeneral` with a batched operand: a batch dimension of both when both are batched, else
/// a free dimension of the batched one, moved to the front of the result. `batch` and
/// `contract` are `[lhs, rhs]` as in the type rule.
pub(super) fn dot_general_batch(
    s: &BatchStep,
    batch: [&Vec<usize>; 2],
    contract: [&Vec<usize>; 2],
) -> Result<Vec<Batched>> {
    let ((lhs, lb), (rhs, rb)) = (&s.ins[0], &s.ins[1]);
    let shifted = |axes: &[usize], batched: bool| -> Vec<isize> {
        axes.iter()
            .map(|&a| (a + usize::from(batched)) as isize)
            .collect()
    };
    let pair = |[l, r]: [&Vec<usize>; 2]| -> Vec<(isize, isize)> {
        shifted(l, *lb).into_iter().zip(shifted(r, *rb)).collect()
    };
    let mut batch_pairs = pair(batch);
    let contract_pairs = pair(contract);
    if *lb && *rb {
        batch_pairs.insert(0, (0, 0));
    }
    let dtype = s.node.outputs[0].dtype;
    let out = lhs.dot_general_as(rhs, &batch_pairs, &contract_pairs, dtype)?;
    // Where the batch landed: first when shared; after the batch dimensions (lhs free axis 0),
    // or after the lhs's free dimensions (rhs free axis 0).
    let at = match (*lb, *rb) {
        (true, true) => 0,
        (true, false) => batch[0].len(),
        _ => lhs.rank() - contract[0].len(),
    };
    Ok(vec![(move_axis(&out, at, 0)?, true)])
}
