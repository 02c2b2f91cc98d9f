//! Linear algebra: `dot_general`, `matmul`, and `einsum` over any number of operands.
//!
//! An einsum desugars to primitives: indices that occur in only one operand and not in the output
//! are summed out of that operand first; then operands are contracted left to right, each pair by
//! exactly one `dot_general` (indices still needed later or in the output are batch dimensions,
//! the others are contracted); a final transpose puts the output in the requested order.

use std::panic::Location;

use super::graph::graph_error;
use super::op::Op;
use super::tensor::Tensor;
use super::util::{axes, same_graph, Call};
use crate::dtype::{DType, TensorType};
use crate::error::Result;

impl Tensor {
    /// General dot product: `batch` pairs (lhs axis, rhs axis) of equal size are kept, `contract`
    /// pairs are summed over. Output dimensions: the batch dimensions, then the lhs's free
    /// dimensions, then the rhs's free dimensions, each in operand order.
    #[track_caller]
    pub fn dot_general(
        &self,
        rhs: &Tensor,
        batch: &[(isize, isize)],
        contract: &[(isize, isize)],
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let lb: Vec<isize> = batch.iter().map(|p| p.0).collect();
        let rb: Vec<isize> = batch.iter().map(|p| p.1).collect();
        let lc: Vec<isize> = contract.iter().map(|p| p.0).collect();
        let rc: Vec<isize> = contract.iter().map(|p| p.1).collect();
        let norm = |t: &Tensor, list: &[isize]| -> Result<Vec<usize>> {
            axes("dot_general", t, list, loc)?;
            list.iter()
                .map(|&a| super::util::axis("dot_general", t, a, loc))
                .collect()
        };
        let (lb, rb, lc, rc) = (
            norm(self, &lb)?,
            norm(rhs, &rb)?,
            norm(self, &lc)?,
            norm(rhs, &rc)?,
        );
        let call = Call::on("dot_general", &[("lhs", self), ("rhs", rhs)], loc);
        self.dot_general_at(rhs, [&lb, &rb, &lc, &rc], &call)
    }

    /// [`Tensor::dot_general`] with a result dtype of its own: a widening product, `i8 x i8`
    /// or `u8 x i8` summed into `i32`, `bf16 x bf16` into `f32` (StableHLO's `dot_general`
    /// with a result type wider than its operands; XLA's CPU backend runs these forms through
    /// YNNPACK from two rows on). `out` equal to the operands' dtype is `dot_general`. Not
    /// differentiable between floats; nothing flows through integer products.
    #[track_caller]
    pub fn dot_general_as(
        &self,
        rhs: &Tensor,
        batch: &[(isize, isize)],
        contract: &[(isize, isize)],
        out: DType,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let axis = |t: &Tensor, a: isize| super::util::axis("dot_general_as", t, a, loc);
        let lb = batch
            .iter()
            .map(|p| axis(self, p.0))
            .collect::<Result<Vec<_>>>()?;
        let rb = batch
            .iter()
            .map(|p| axis(rhs, p.1))
            .collect::<Result<Vec<_>>>()?;
        let lc = contract
            .iter()
            .map(|p| axis(self, p.0))
            .collect::<Result<Vec<_>>>()?;
        let rc = contract
            .iter()
            .map(|p| axis(rhs, p.1))
            .collect::<Result<Vec<_>>>()?;
        let free = |t: &Tensor, b: &[usize], c: &[usize]| -> Vec<usize> {
            (0..t.rank())
                .filter(|a| !b.contains(a) && !c.contains(a))
                .map(|a| t.dims()[a])
                .collect()
        };
        let mut dims: Vec<usize> = lb.iter().map(|&a| self.dims()[a]).collect();
        dims.extend(free(self, &lb, &lc));
        dims.extend(free(rhs, &rb, &rc));
        let op = Op::DotGeneral {
            lhs_batch: lb,
            rhs_batch: rb,
            lhs_contract: lc,
            rhs_contract: rc,
        };
        let ty = TensorType::new(out, &dims);
        let call = Call::on("dot_general_as", &[("lhs", self), ("rhs", rhs)], loc);
        call.typed_node(op, &[self, rhs], ty)
    }

    /// The `dot_general` of `self` and `rhs` over normalised axes `[lhs batch, rhs batch, lhs
    /// contracting, rhs contracting]`, its errors in the words of `call` (what the user called).
    pub(crate) fn dot_general_at(
        &self,
        rhs: &Tensor,
        [lb, rb, lc, rc]: [&[usize]; 4],
        call: &Call,
    ) -> Result<Tensor> {
        let op = Op::DotGeneral {
            lhs_batch: lb.to_vec(),
            rhs_batch: rb.to_vec(),
            lhs_contract: lc.to_vec(),
            rhs_contract: rc.to_vec(),
        };
        call.node(op, &[self, rhs])
    }

    /// Matrix product over the last two dimensions: `[..., m, k] @ [..., k, n]` with equal
    /// leading (batch) dimensions, or `[..., m, k] @ [k, n]`, or vector forms `[k] @ [k, n]`
    /// and `[..., m, k] @ [k]`.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.matmul_as(
            rhs,
            Call::on("matmul", &[("lhs", self), ("rhs", rhs)], Location::caller()),
        )
    }

    /// [`Tensor::matmul`], its errors in the words of `call`.
    fn matmul_as(&self, rhs: &Tensor, call: Call) -> Result<Tensor> {
        let (lr, rr) = (self.rank(), rhs.rank());
        match (lr, rr) {
            (0, _) | (_, 0) => Err(call.error("a scalar has no matrix product (use `mul`)")),
            (_, 1) | (_, 2) => self.dot_general_at(rhs, [&[], &[], &[lr - 1], &[0]], &call),
            (1, _) => Err(call.error(&format!(
                "a vector lhs takes a rhs of rank 1 or 2, not {rr}"
            ))),
            _ if lr == rr => {
                let batch: Vec<usize> = (0..lr - 2).collect();
                self.dot_general_at(rhs, [&batch, &batch, &[lr - 1], &[rr - 2]], &call)
            }
            _ => Err(call.error(&format!(
                "a rhs of rank {rr} needs a lhs of its rank ({lr} given): leading (batch) \
                 dimensions are not broadcast"
            ))),
        }
    }

    /// `self` (`[..., in]`) times `weight` (`[out, in]`) transposed, `[..., out]`: a linear
    /// layer's product, its errors naming `name` and the operands `x` and `weight`.
    pub(crate) fn linear_at(
        &self,
        weight: &Tensor,
        name: &'static str,
        loc: &'static Location<'static>,
    ) -> Result<Tensor> {
        let call = Call::on(name, &[("x", self), ("weight", weight)], loc);
        if self.rank() == 0 || weight.rank() != 2 {
            return Err(
                call.error("takes x [..., in_features] and weight [out_features, in_features]")
            );
        }
        self.dot_general_at(weight, [&[], &[], &[self.rank() - 1], &[1]], &call)
    }
}

/// The parsed einsum spec: one index list per operand and the output's.
pub(crate) struct Spec {
    pub(crate) inputs: Vec<Vec<char>>,
    pub(crate) output: Vec<char>,
}

pub(crate) fn parse_spec(spec: &str, n: usize) -> std::result::Result<Spec, String> {
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    if spec.contains("...") {
        return Err("ellipsis ('...') is not supported; name every index".into());
    }
    let (lhs, out) = match spec.split_once("->") {
        Some((l, o)) => (l.to_string(), Some(o.to_string())),
        None => (spec.clone(), None),
    };
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    if inputs.len() != n {
        return Err(format!(
            "the spec has {} operands, {n} were given",
            inputs.len()
        ));
    }
    for t in inputs.iter().flatten() {
        if !t.is_ascii_alphabetic() {
            return Err(format!("'{t}' is not an index letter"));
        }
    }
    for (i, t) in inputs.iter().enumerate() {
        for (j, c) in t.iter().enumerate() {
            if t[..j].contains(c) {
                return Err(format!(
                    "index '{c}' repeats within operand {i} (diagonals are not supported)"
                ));
            }
        }
    }
    let output: Vec<char> = match out {
        Some(o) => o.chars().collect(),
        None => {
            // Implicit mode: indices that occur exactly once, in alphabetical order.
            let mut once: Vec<char> = inputs
                .iter()
                .flatten()
                .copied()
                .filter(|c| inputs.iter().flatten().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    for (j, c) in output.iter().enumerate() {
        if !c.is_ascii_alphabetic() {
            return Err(format!("'{c}' is not an index letter"));
        }
        if output[..j].contains(c) {
            return Err(format!("output index '{c}' repeats"));
        }
        if !inputs.iter().flatten().any(|d| d == c) {
            return Err(format!("output index '{c}' is in no operand"));
        }
    }
    Ok(Spec { inputs, output })
}

/// An operand during einsum evaluation: a tensor and the index of each of its dimensions.
struct Term {
    t: Tensor,
    idx: Vec<char>,
}

/// Each operand has one index per dimension and the first operand's dtype, and an index has
/// one size wherever it occurs.
fn check_terms(operands: &[&Tensor], s: &Spec) -> std::result::Result<(), String> {
    let mut sizes: Vec<(char, usize)> = Vec::new();
    for (i, (t, idx)) in operands.iter().zip(&s.inputs).enumerate() {
        if idx.len() != t.rank() {
            return Err(format!(
                "operand {i} has rank {} but its term '{}' has {} indices",
                t.rank(),
                idx.iter().collect::<String>(),
                idx.len()
            ));
        }
        if t.dtype() != operands[0].dtype() {
            return Err("operands need one dtype".into());
        }
        for (c, &d) in idx.iter().zip(t.dims()) {
            match sizes.iter().find(|(k, _)| k == c) {
                Some((_, e)) if *e != d => {
                    return Err(format!("index '{c}' has sizes {e} and {d}"))
                }
                Some(_) => {}
                None => sizes.push((*c, d)),
            }
        }
    }
    Ok(())
}

/// The operands as terms, each summed over the indices private to it and absent from the
/// output.
fn sum_private(operands: &[&Tensor], s: &Spec) -> Result<Vec<Term>> {
    let mut terms: Vec<Term> = Vec::new();
    for (i, (t, idx)) in operands.iter().zip(&s.inputs).enumerate() {
        let private: Vec<isize> = idx
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                !s.output.contains(c)
                    && !s
                        .inputs
                        .iter()
                        .enumerate()
                        .any(|(j, o)| j != i && o.contains(c))
            })
            .map(|(k, _)| k as isize)
            .collect();
        let (t, idx) = if private.is_empty() {
            ((*t).clone(), idx.clone())
        } else {
            let kept = idx
                .iter()
                .enumerate()
                .filter(|(k, _)| !private.contains(&(*k as isize)))
                .map(|(_, c)| *c)
                .collect();
            (t.sum(&private)?, kept)
        };
        terms.push(Term { t, idx });
    }
    Ok(terms)
}

impl Term {
    /// This term times `next` (one `dot_general`): the indices both share are batch dimensions
    /// where `later` (the indices of the terms still to come and of the output) needs them and
    /// contracted where it does not; then the indices of the product that `later` does not name
    /// are summed out.
    fn contract(self, next: &Term, later: &[char], call: &Call) -> Result<Term> {
        let shared: Vec<char> = self
            .idx
            .iter()
            .copied()
            .filter(|c| next.idx.contains(c))
            .collect();
        let batch: Vec<char> = shared
            .iter()
            .copied()
            .filter(|c| later.contains(c))
            .collect();
        let contract: Vec<char> = shared
            .iter()
            .copied()
            .filter(|c| !later.contains(c))
            .collect();
        let pos = |idx: &[char], c: char| idx.iter().position(|d| *d == c).unwrap_or(0);
        let lb: Vec<usize> = batch.iter().map(|&c| pos(&self.idx, c)).collect();
        let rb: Vec<usize> = batch.iter().map(|&c| pos(&next.idx, c)).collect();
        let lc: Vec<usize> = contract.iter().map(|&c| pos(&self.idx, c)).collect();
        let rc: Vec<usize> = contract.iter().map(|&c| pos(&next.idx, c)).collect();
        let t = self.t.dot_general_at(&next.t, [&lb, &rb, &lc, &rc], call)?;
        let mut idx = batch.clone();
        idx.extend(self.idx.iter().filter(|c| !shared.contains(c)));
        idx.extend(next.idx.iter().filter(|c| !shared.contains(c)));
        // An index in both operands but needed nowhere later was contracted; one private to
        // the new product and absent later is summed out here.
        let dead: Vec<isize> = idx
            .iter()
            .enumerate()
            .filter(|(_, c)| !later.contains(c))
            .map(|(k, _)| k as isize)
            .collect();
        if dead.is_empty() {
            return Ok(Term { t, idx });
        }
        let kept = idx
            .iter()
            .enumerate()
            .filter(|(k, _)| !dead.contains(&(*k as isize)))
            .map(|(_, c)| *c)
            .collect();
        Ok(Term {
            t: t.sum(&dead)?,
            idx: kept,
        })
    }
}

impl Tensor {
    /// Einstein summation over `operands`, e.g. `"bclhn,bcshn->bclhs"`. Indices are ASCII
    /// letters; the output part may be omitted (then it is the indices that occur once, sorted).
    /// Errors name the problem: wrong operand count, unknown output index, repeated output index,
    /// a term whose length differs from its operand's rank, or sizes that disagree.
    #[track_caller]
    pub fn einsum(spec: &str, operands: &[&Tensor]) -> Result<Tensor> {
        let loc = Location::caller();
        let first = operands
            .first()
            .ok_or_else(|| graph_error("einsum", format!("'{spec}' got no operands"), loc))?;
        same_graph(first.graph(), operands, "einsum", loc)?;
        let roles: Vec<String> = (0..operands.len())
            .map(|i| format!("operand {i}"))
            .collect();
        let named: Vec<(&str, &Tensor)> = roles
            .iter()
            .map(String::as_str)
            .zip(operands.iter().copied())
            .collect();
        let call = Call::on("einsum", &named, loc).detail(format!("'{spec}'"));
        let bad = |why: String| call.error(&why);
        let s = parse_spec(spec, operands.len()).map_err(&bad)?;
        check_terms(operands, &s).map_err(&bad)?;
        let mut terms = sum_private(operands, &s)?;
        // Contract left to right; a product's error names the spec (its operands are partial).
        let inner = Call::new("einsum", loc).detail(format!("'{spec}'"));
        let mut acc = terms.remove(0);
        for (k, next) in terms.iter().enumerate() {
            let later: Vec<char> = terms[k + 1..]
                .iter()
                .flat_map(|t| t.idx.iter().copied())
                .chain(s.output.iter().copied())
                .collect();
            acc = acc.contract(next, &later, &inner)?;
        }

        // Indices left that the output does not name (single-operand sum-outs were done above).
        let perm: Vec<usize> = s
            .output
            .iter()
            .map(|c| acc.idx.iter().position(|d| d == c))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("internal: an output index was lost".into()))?;
        if perm.len() != acc.idx.len() {
            return Err(bad("internal: indices left over after contraction".into()));
        }
        acc.t.transpose_at(&perm, loc)
    }
}
