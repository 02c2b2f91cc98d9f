//! The VJP rule of every straight-line primitive: given the cotangents of a node's results,
//! the cotangents of its operands (`None` where zero or not asked for). Each rule builds its
//! result from primitives through the ordinary builders, so it is checked like any node.

use super::Step;
use crate::dtype::{DType, TensorType};
use crate::error::Result;
use crate::ops::op::{BinaryOp, Op, ReduceKind, UnaryOp};
use crate::ops::tensor::Tensor;
use crate::ops::util::{node, typed_node};

/// The operands' cotangents of the node of `s`.
pub(super) fn vjp(s: &Step) -> Result<Vec<Option<Tensor>>> {
    let x = |k: usize| &s.inputs[k];
    let y = &s.outputs[0];
    let n = s.inputs.len();
    let mut out: Vec<Option<Tensor>> = vec![None; n];
    match &s.node.op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::BlockArg => {}
        Op::Unary(op) => out[0] = unary(*op, x(0), y, &s.ct(0)?)?,
        Op::Binary(op) => {
            let (da, db) = binary(*op, x(0), x(1), y, &s.ct(0)?, s)?;
            out[0] = da;
            out[1] = db;
        }
        // Pred results: no cotangent ever reaches them.
        Op::Compare(_) | Op::ArgReduce { .. } => {}
        Op::Select => {
            let ct = s.ct(0)?;
            let zero = zeros_like(&ct)?;
            out[1] = Some(x(0).select(&ct, &zero)?);
            out[2] = Some(x(0).select(&zero, &ct)?);
        }
        Op::Clamp => {
            // y = min(max(x, lo), hi) as JAX differentiates it.
            let (lo, v, hi) = (x(0), x(1), x(2));
            let ct = s.ct(0)?;
            let zero = zeros_like(&ct)?;
            let inside = v.gt(lo)?.and(&v.lt(hi)?)?;
            out[1] = Some(inside.select(&ct, &zero)?);
            out[0] = Some(lo.gt(v)?.and(&lo.lt(hi)?)?.select(&ct, &zero)?);
            out[2] = Some(hi.lt(v)?.select(&ct, &zero)?);
        }
        Op::Convert => {
            if x(0).dtype().is_float() && y.dtype().is_float() {
                out[0] = Some(s.ct(0)?.convert_at(x(0).dtype(), s.loc)?);
            }
        }
        Op::BitcastConvert => {
            if x(0).dtype().is_float() && y.dtype().is_float() {
                return Err(s.not_differentiable("reinterpreting float bits"));
            }
        }
        Op::BroadcastInDim { dims } => out[0] = Some(unbroadcast(&s.ct(0)?, x(0).ty(), dims, s)?),
        Op::Reshape => out[0] = Some(s.ct(0)?.reshape_at(x(0).dims(), s.loc)?),
        Op::Transpose { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            out[0] = Some(s.ct(0)?.transpose_at(&inverse, s.loc)?);
        }
        Op::Slice {
            start,
            limit: _,
            stride,
        } => {
            let ct = s.ct(0)?;
            let dims = x(0).dims();
            let mut high = Vec::with_capacity(dims.len());
            for d in 0..dims.len() {
                let (st, n) = (start[d], ct.dims()[d]);
                let end = if n == 0 {
                    st
                } else {
                    st + (n - 1) * stride[d] + 1
                };
                high.push((dims[d] - end) as i64);
            }
            let low: Vec<i64> = start.iter().map(|&v| v as i64).collect();
            let interior: Vec<usize> = stride.iter().map(|&v| v - 1).collect();
            let zero = scalar(&ct, 0.0, s)?;
            out[0] = Some(ct.pad_with_at(&zero, &low, &high, &interior, s.loc)?);
        }
        Op::DynamicSlice { .. } => {
            let starts: Vec<&Tensor> = s.inputs[1..].iter().collect();
            let zero = zeros_like(x(0))?;
            out[0] = Some(zero.dynamic_update_slice(&s.ct(0)?, &starts)?);
        }
        Op::DynamicUpdateSlice => {
            let ct = s.ct(0)?;
            let starts: Vec<&Tensor> = s.inputs[2..].iter().collect();
            if s.want[0] {
                out[0] = Some(ct.dynamic_update_slice(&zeros_like(x(1))?, &starts)?);
            }
            if s.want[1] {
                out[1] = Some(ct.dynamic_slice(&starts, x(1).dims())?);
            }
        }
        Op::Concatenate { axis } => {
            let ct = s.ct(0)?;
            let mut at = 0;
            for (k, t) in s.inputs.iter().enumerate() {
                let len = t.dims()[*axis];
                if s.want[k] {
                    let mut start = vec![0; ct.rank()];
                    let mut limit = ct.dims().to_vec();
                    start[*axis] = at;
                    limit[*axis] = at + len;
                    out[k] = Some(ct.slice_all_at(&start, &limit, &vec![1; ct.rank()], s.loc)?);
                }
                at += len;
            }
        }
        Op::Pad {
            low,
            high,
            interior,
        } => {
            // Undo the edges (cropping what was added, zero-filling what was cropped), then
            // keep every (interior + 1)-th element.
            let ct = s.ct(0)?;
            let zero = scalar(&ct, 0.0, s)?;
            let neg = |v: &[i64]| v.iter().map(|&a| -a).collect::<Vec<i64>>();
            let unpadded =
                ct.pad_with_at(&zero, &neg(low), &neg(high), &vec![0; ct.rank()], s.loc)?;
            let stride: Vec<usize> = interior.iter().map(|&i| i + 1).collect();
            let operand =
                unpadded.slice_all_at(&vec![0; ct.rank()], unpadded.dims(), &stride, s.loc)?;
            if s.want[1] {
                out[1] = Some(ct.sum_all()?.sub(&operand.sum_all()?)?);
            }
            out[0] = Some(operand);
        }
        Op::Reverse { axes } => out[0] = Some(s.ct(0)?.reverse_at(axes, s.loc)?),
        Op::Reduce { kind, axes } => out[0] = Some(reduce(*kind, axes, x(0), y, &s.ct(0)?, s)?),
        Op::Cumsum { axis } => {
            let ct = s.ct(0)?;
            let a = *axis as isize;
            out[0] = Some(
                ct.reverse_at(&[*axis], s.loc)?
                    .cumsum(a)?
                    .reverse_at(&[*axis], s.loc)?,
            );
        }
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => {
            let ct = s.ct(0)?;
            let dn = Dims {
                lb: lhs_batch,
                rb: rhs_batch,
                lc: lhs_contract,
                rc: rhs_contract,
            };
            if s.want[0] {
                out[0] = Some(dot_operand(&ct, x(1), x(0).rank(), &dn, Side::Lhs, s)?);
            }
            if s.want[1] {
                let swapped = Dims {
                    lb: rhs_batch,
                    rb: lhs_batch,
                    lc: rhs_contract,
                    rc: lhs_contract,
                };
                out[1] = Some(dot_operand(&ct, x(0), x(1).rank(), &swapped, Side::Rhs, s)?);
            }
        }
        Op::Take => {
            // The transpose of a gather: the cotangent rows added where they were picked.
            let zero = zeros_like(x(0))?;
            out[0] = Some(zero.index_add(x(1), &s.ct(0)?)?);
        }
        Op::ScatterAdd => {
            let ct = s.ct(0)?;
            if s.want[2] {
                out[2] = Some(ct.take(x(1))?);
            }
            out[0] = Some(ct);
        }
        Op::Sort { axis, descending } => {
            // The permutation the sort applied, from sorting the keys with their positions;
            // sorting it back (with each cotangent alongside) undoes it.
            let keys = x(0);
            let positions = keys.graph().iota(DType::I32, keys.dims(), *axis as isize)?;
            let op = Op::Sort {
                axis: *axis,
                descending: *descending,
            };
            let perm = crate::ops::util::nodes(
                keys.graph(),
                op,
                &[keys, &positions],
                None,
                "grad",
                s.loc,
            )?
            .remove(1);
            let back = Op::Sort {
                axis: *axis,
                descending: false,
            };
            for (k, slot) in out.iter_mut().enumerate() {
                if s.want[k] && s.cts[k].is_some() {
                    let ct = s.ct(k)?;
                    let restored = crate::ops::util::nodes(
                        keys.graph(),
                        back.clone(),
                        &[&perm, &ct],
                        None,
                        "grad",
                        s.loc,
                    )?
                    .remove(1);
                    *slot = Some(restored);
                }
            }
        }
        // The identity, without constraining the cotangent too (as JAX does): XLA's partitioner
        // computed wrong values for a program with such a constraint on a constant cotangent
        // feeding a pad with interior padding (found by the sharded_graph fuzz target; see the
        // README's "Many devices").
        Op::ShardingConstraint { .. } => out[0] = Some(s.ct(0)?),
        // `backprop` hands loops to `loops::while_vjp`, which needs the regions; never here.
        Op::While { .. } => return Err(s.not_differentiable("this loop")),
        Op::ShardMap { .. }
        | Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::AxisIndex { .. } => return Err(s.not_differentiable("a shard_map or collective")),
    }
    Ok(out)
}

/// A rank-0 constant of `like`'s dtype.
fn scalar(like: &Tensor, value: f64, s: &Step) -> Result<Tensor> {
    like.graph().full_at(value, like.dtype(), &[], s.loc)
}

/// Zeros of `t`'s type.
fn zeros_like(t: &Tensor) -> Result<Tensor> {
    t.graph().zeros(t.dtype(), t.dims())
}

/// The cotangent of `x` for `y = op(x)`.
fn unary(op: UnaryOp, x: &Tensor, y: &Tensor, ct: &Tensor) -> Result<Option<Tensor>> {
    Ok(Some(match op {
        UnaryOp::Neg => ct.neg()?,
        UnaryOp::Abs => ct.mul(&x.sign()?)?,
        UnaryOp::Exp => ct.mul(y)?,
        UnaryOp::Expm1 => ct.mul(&y.add(1.0)?)?,
        UnaryOp::Log => ct.div(x)?,
        UnaryOp::Log1p => ct.div(&x.add(1.0)?)?,
        UnaryOp::Sqrt => ct.div(&y.mul(2.0)?)?,
        UnaryOp::Rsqrt => ct.mul(&y.div(x)?.mul(-0.5)?)?,
        UnaryOp::Tanh => ct.mul(&y.mul(y)?.neg()?.add(1.0)?)?,
        UnaryOp::Logistic => ct.mul(&y.mul(&y.neg()?.add(1.0)?)?)?,
        UnaryOp::Sin => ct.mul(&x.cos()?)?,
        UnaryOp::Cos => ct.mul(&x.sin()?)?.neg()?,
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Sign | UnaryOp::Not => return Ok(None),
    }))
}

/// The cotangents of `a` and `b` for `y = op(a, b)`.
fn binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    y: &Tensor,
    ct: &Tensor,
    s: &Step,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let want = |k: usize| s.want[k];
    Ok(match op {
        BinaryOp::Add => (Some(ct.clone()), Some(ct.clone())),
        BinaryOp::Sub => (Some(ct.clone()), Some(ct.neg()?)),
        BinaryOp::Mul => (
            want(0).then(|| ct.mul(b)).transpose()?,
            want(1).then(|| ct.mul(a)).transpose()?,
        ),
        BinaryOp::Div => (
            want(0).then(|| ct.div(b)).transpose()?,
            want(1).then(|| ct.mul(y)?.div(b)?.neg()).transpose()?,
        ),
        BinaryOp::Pow => {
            // d/da = b a^(b-1), 0 where b = 0; d/db = ln(a) a^b, 0 where a = 0 (JAX's).
            let da = if want(0) {
                let zero = zeros_like(a)?;
                let d = b.mul(&a.pow(&b.sub(1.0)?)?)?;
                Some(ct.mul(&b.eq(0.0)?.select(&zero, &d)?)?)
            } else {
                None
            };
            let db = if want(1) {
                let safe = a.eq(0.0)?.select(1.0, a)?;
                Some(ct.mul(&safe.log()?.mul(y)?)?)
            } else {
                None
            };
            (da, db)
        }
        BinaryOp::Max | BinaryOp::Min => {
            // The cotangent goes to the operand that was picked, half to each on a tie.
            let picked = |p: &Tensor, q: &Tensor| -> Result<Tensor> {
                let half = p.eq(q)?.select(&scalar(y, 0.5, s)?, &scalar(y, 1.0, s)?)?;
                let share = p.eq(y)?.select(&half, 0.0)?;
                ct.mul(&share)
            };
            (
                want(0).then(|| picked(a, b)).transpose()?,
                want(1).then(|| picked(b, a)).transpose()?,
            )
        }
        BinaryOp::Rem => {
            // a - b trunc(a / b): d/db = -trunc(a / b).
            let db = if want(1) {
                let q = a.div(b)?;
                let trunc = q.sign()?.mul(&q.abs()?.floor()?)?;
                Some(ct.mul(&trunc)?.neg()?)
            } else {
                None
            };
            (Some(ct.clone()), db)
        }
        BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical => (None, None),
    })
}

/// Sums the cotangent of a broadcast back to the operand's type: over the new dimensions and
/// over the stretched size-1 ones.
fn unbroadcast(ct: &Tensor, operand: &TensorType, dims: &[usize], s: &Step) -> Result<Tensor> {
    let mut summed: Vec<usize> = (0..ct.rank()).filter(|d| !dims.contains(d)).collect();
    for (i, &d) in dims.iter().enumerate() {
        if operand.dims[i] == 1 && ct.dims()[d] != 1 {
            summed.push(d);
        }
    }
    summed.sort_unstable();
    let reduced = if summed.is_empty() {
        ct.clone()
    } else {
        let op = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: summed,
        };
        node(ct.graph(), op, &[ct], "grad", s.loc)?
    };
    reduced.reshape_at(&operand.dims, s.loc)
}

/// `t` (reduced over `axes` of a tensor of `full`'s type) broadcast back to `full`'s shape.
fn rebroadcast(t: &Tensor, full: &Tensor, axes: &[usize], s: &Step) -> Result<Tensor> {
    let kept: Vec<usize> = (0..full.rank()).filter(|d| !axes.contains(d)).collect();
    typed_node(
        t.graph(),
        Op::BroadcastInDim { dims: kept },
        &[t],
        TensorType::new(t.dtype(), full.dims()),
        "grad",
        s.loc,
    )
}

/// The cotangent of `x` for `y = reduce(kind, x, axes)`.
fn reduce(
    kind: ReduceKind,
    axes: &[usize],
    x: &Tensor,
    y: &Tensor,
    ct: &Tensor,
    s: &Step,
) -> Result<Tensor> {
    let ct_b = rebroadcast(ct, x, axes, s)?;
    let sum = |t: &Tensor| -> Result<Tensor> {
        node(
            t.graph(),
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: axes.to_vec(),
            },
            &[t],
            "grad",
            s.loc,
        )
    };
    match kind {
        ReduceKind::Sum => Ok(ct_b),
        ReduceKind::Prod => {
            // The product of the others: y / x without zeros; with one zero, the product of the
            // non-zero elements at the zero and 0 elsewhere; with more, 0.
            let is_zero = x.eq(0.0)?;
            let zeros = sum(&is_zero.convert_at(x.dtype(), s.loc)?)?;
            let nonzero = is_zero.select(1.0, x)?;
            let prod_nonzero = node(
                x.graph(),
                Op::Reduce {
                    kind: ReduceKind::Prod,
                    axes: axes.to_vec(),
                },
                &[&nonzero],
                "grad",
                s.loc,
            )?;
            let zeros_b = rebroadcast(&zeros, x, axes, s)?;
            let y_b = rebroadcast(y, x, axes, s)?;
            let p_b = rebroadcast(&prod_nonzero, x, axes, s)?;
            let none = y_b.div(&nonzero)?;
            let one = is_zero.select(&p_b, 0.0)?;
            let others = zeros_b
                .eq(0.0)?
                .select(&none, &zeros_b.eq(1.0)?.select(&one, 0.0)?)?;
            ct_b.mul(&others)
        }
        ReduceKind::Max | ReduceKind::Min => {
            // Shared evenly among the elements equal to the extreme.
            let hit = x
                .eq(&rebroadcast(y, x, axes, s)?)?
                .convert_at(x.dtype(), s.loc)?;
            let count = rebroadcast(&sum(&hit)?, x, axes, s)?;
            ct_b.mul(&hit)?.div(&count)
        }
    }
}

/// Dimension numbers of a `dot_general`, as the lhs sees them (`lb`/`lc` its own).
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
