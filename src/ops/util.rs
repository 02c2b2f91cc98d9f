//! Small helpers shared by the builders: axis normalisation, operand checks, scalar encoding.

use std::panic::Location;

use half::{bf16, f16};

use super::graph::{graph_error, Graph};
use super::op::Op;
use super::rules;
use super::tensor::Tensor;
use crate::dtype::{DType, TensorType};
use crate::error::Result;

/// Where a builder was called from.
pub(crate) type Loc = &'static Location<'static>;

/// Normalises a possibly negative axis for a tensor of rank `rank`.
pub(crate) fn axis(op: &'static str, t: &Tensor, axis: isize, loc: Loc) -> Result<usize> {
    axis_of(op, t.ty(), axis, loc)
}

/// Normalises a possibly negative axis for a type of rank `ty.rank()`.
pub(crate) fn axis_of(op: &'static str, ty: &TensorType, axis: isize, loc: Loc) -> Result<usize> {
    let rank = ty.rank() as isize;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank {
        return Err(graph_error(
            op,
            format!("axis {axis} is out of range for {ty} (rank {rank})"),
            loc,
        ));
    }
    Ok(a as usize)
}

/// Normalises a list of axes, rejecting duplicates; returns them sorted.
pub(crate) fn axes(op: &'static str, t: &Tensor, list: &[isize], loc: Loc) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(list.len());
    for &a in list {
        let a = axis(op, t, a, loc)?;
        if out.contains(&a) {
            return Err(graph_error(
                op,
                format!("axis {a} is given twice in {list:?} for {}", t.ty()),
                loc,
            ));
        }
        out.push(a);
    }
    out.sort_unstable();
    Ok(out)
}

/// Checks that every operand belongs to `g`.
pub(crate) fn same_graph(
    g: &Graph,
    operands: &[&Tensor],
    op: &'static str,
    loc: Loc,
) -> Result<()> {
    for t in operands {
        g.check_same(t, op, loc)?;
    }
    Ok(())
}

/// Appends a node of `op` on `operands` (which must belong to `g`) whose result types its rule
/// gives ([`super::rules::infer`]); returns its results. `target` is the requested result type
/// of the ops that take one ([`super::rules::takes_target`]). A rule's message becomes a graph
/// error naming `name` (what the user called) and `loc`.
pub(crate) fn nodes(
    g: &Graph,
    op: Op,
    operands: &[&Tensor],
    target: Option<TensorType>,
    name: &'static str,
    loc: Loc,
) -> Result<Vec<Tensor>> {
    let call = Call::new(name, loc);
    build(g, op, operands, target, &call)
}

/// [`nodes`] for `call`, whose [`Call::rule_error`] words a rule's message.
fn build(
    g: &Graph,
    op: Op,
    operands: &[&Tensor],
    target: Option<TensorType>,
    call: &Call,
) -> Result<Vec<Tensor>> {
    let (name, loc) = (call.name, call.loc);
    same_graph(g, operands, name, loc)?;
    let types: Vec<&TensorType> = operands.iter().map(|t| t.ty()).collect();
    let outputs = rules::infer(&op, &types, target.as_ref())
        .map_err(|m| call.rule_error(rules::operand_words(&op), &m))?;
    let inputs = operands
        .iter()
        .map(|t| g.resolve(t.id(), name, loc))
        .collect::<Result<Vec<_>>>()?;
    g.push(op, inputs, outputs)
}

/// Runs `op`'s rule on `operands` without adding a node, for a builder whose result is an
/// operand itself but must fit the rule all the same.
pub(crate) fn check(op: &Op, operands: &[&Tensor], name: &'static str, loc: Loc) -> Result<()> {
    let types: Vec<&TensorType> = operands.iter().map(|t| t.ty()).collect();
    rules::infer(op, &types, None).map_err(|m| graph_error(name, m, loc))?;
    Ok(())
}

/// [`nodes`] for an op with one result, computed by its rule.
pub(crate) fn node(
    g: &Graph,
    op: Op,
    operands: &[&Tensor],
    name: &'static str,
    loc: Loc,
) -> Result<Tensor> {
    one(nodes(g, op, operands, None, name, loc)?, name, loc)
}

/// [`nodes`] for an op whose one result has the requested type `ty` (checked by its rule).
pub(crate) fn typed_node(
    g: &Graph,
    op: Op,
    operands: &[&Tensor],
    ty: TensorType,
    name: &'static str,
    loc: Loc,
) -> Result<Tensor> {
    one(nodes(g, op, operands, Some(ty), name, loc)?, name, loc)
}

fn one(mut outputs: Vec<Tensor>, name: &'static str, loc: Loc) -> Result<Tensor> {
    match outputs.len() {
        1 => Ok(outputs.remove(0)),
        n => Err(graph_error(
            name,
            format!("internal: {n} results, expected 1"),
            loc,
        )),
    }
}

/// A call as the user wrote it, for the errors of a builder that lowers to primitives of other
/// names (`matmul` and `einsum` to `dot_general`, `conv2d` to `convolution`): the name it was
/// called by, what else the message should repeat (an einsum's spec), and the user's operands
/// with their roles in the builder's words (`lhs`, `kernel`, `operand 0`). Its errors read
/// `name: [detail where] role is type and role is type: why`, the rule's operand words
/// ([`rules::operand_words`]) replaced by the roles, and a dtype mismatch
/// ([`rules::ONE_DTYPE`]) says which operand to convert to what.
pub(crate) struct Call<'a> {
    /// What the user called; its errors carry this name.
    pub(crate) name: &'static str,
    /// Repeated before the operands (an einsum's spec, a convolution's layouts).
    pub(crate) detail: Option<String>,
    /// The user's operands, each with its role.
    pub(crate) operands: Vec<(&'a str, &'a Tensor)>,
    /// Where the user called it.
    pub(crate) loc: Loc,
}

impl<'a> Call<'a> {
    /// A call of `name` at `loc` whose messages name no operands (a rule's message as it is).
    pub(crate) fn new(name: &'static str, loc: Loc) -> Call<'a> {
        Call {
            name,
            detail: None,
            operands: Vec::new(),
            loc,
        }
    }

    /// A call of `name` at `loc` on `operands`, each with its role.
    pub(crate) fn on(name: &'static str, operands: &[(&'a str, &'a Tensor)], loc: Loc) -> Self {
        Call {
            operands: operands.to_vec(),
            ..Call::new(name, loc)
        }
    }

    /// This call with `detail` repeated before the operands.
    pub(crate) fn detail(self, detail: impl Into<String>) -> Self {
        Call {
            detail: Some(detail.into()),
            ..self
        }
    }

    /// [`node`] of `op` on `operands` (the user's or derived from them), its rule's message in
    /// this call's words.
    pub(crate) fn node(&self, op: Op, operands: &[&Tensor]) -> Result<Tensor> {
        self.one_node(op, operands, None)
    }

    /// [`typed_node`] in this call's words.
    pub(crate) fn typed_node(
        &self,
        op: Op,
        operands: &[&Tensor],
        ty: TensorType,
    ) -> Result<Tensor> {
        self.one_node(op, operands, Some(ty))
    }

    fn one_node(&self, op: Op, operands: &[&Tensor], ty: Option<TensorType>) -> Result<Tensor> {
        let g = operands
            .first()
            .ok_or_else(|| self.error("internal: a node without operands"))?
            .graph();
        one(build(g, op, operands, ty, self)?, self.name, self.loc)
    }

    /// The error `why`, after the call's detail and its operands; a dtype mismatch
    /// ([`rules::ONE_DTYPE`]) gets the conversion that fixes it.
    pub(crate) fn error(&self, why: &str) -> crate::error::Error {
        let mut m = self.detail.clone().unwrap_or_default();
        if !self.operands.is_empty() {
            if !m.is_empty() {
                m.push_str(" where ");
            }
            let each: Vec<String> = self
                .operands
                .iter()
                .map(|(role, t)| format!("{role} is {}", t.ty()))
                .collect();
            m.push_str(&and_list(&each));
        }
        if !m.is_empty() {
            m.push_str(": ");
        }
        m.push_str(why);
        if why.starts_with(rules::ONE_DTYPE) {
            if let Some(fix) = self.dtype_fix() {
                m.push_str("; ");
                m.push_str(&fix);
            }
        }
        graph_error(self.name, m, self.loc)
    }

    /// A rule's message `why`, whose operands it names by `words` (the primitive's), in this
    /// call's words: when the call names as many operands, each word becomes its role.
    pub(crate) fn rule_error(&self, words: &[&str], why: &str) -> crate::error::Error {
        if words.len() != self.operands.len() {
            return self.error(why);
        }
        let roles: Vec<&str> = self.operands.iter().map(|(r, _)| *r).collect();
        self.error(&reword(why, words, &roles))
    }

    /// "convert lhs with `.astype(DType::F64)`": the operands whose dtype is not the one all
    /// can be converted to without loss (as near as the dtypes allow), when they differ.
    fn dtype_fix(&self) -> Option<String> {
        let to = self
            .operands
            .iter()
            .map(|(_, t)| t.dtype())
            .reduce(join_dtypes)?;
        let off: Vec<String> = self
            .operands
            .iter()
            .filter(|(_, t)| t.dtype() != to)
            .map(|(role, _)| role.to_string())
            .collect();
        let which = match off.len() {
            0 => return None,
            2 if self.operands.len() == 2 => "both".to_string(),
            n if n == self.operands.len() => "each".to_string(),
            _ => and_list(&off),
        };
        Some(format!("convert {which} with `.astype(DType::{to:?})`"))
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// `text` with every whole word of `words` replaced by the `roles` at its index.
fn reword(text: &str, words: &[&str], roles: &[&str]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        match words.iter().position(|w| w == word) {
            Some(i) => out.push_str(roles[i]),
            None => out.push_str(word),
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// The dtype that both `a` and `b` convert to with the least loss: a float over an integer or
/// pred, the wider of two of one kind (`f32` for `f16` and `bf16`), a signed integer wide
/// enough for both a signed and an unsigned one (`i64` at most).
pub(crate) fn join_dtypes(a: DType, b: DType) -> DType {
    let wider = |a: DType, b: DType| match a.size_in_bytes().cmp(&b.size_in_bytes()) {
        std::cmp::Ordering::Less => b,
        _ => a,
    };
    match (a, b) {
        _ if a == b => a,
        (DType::Pred, _) => b,
        (_, DType::Pred) => a,
        _ if a.is_float() != b.is_float() => match a.is_float() {
            true => a,
            false => b,
        },
        _ if a.is_float() && a.size_in_bytes() == b.size_in_bytes() => DType::F32,
        _ if a.is_float() || a.is_unsigned() == b.is_unsigned() => wider(a, b),
        _ => {
            let (s, u) = if a.is_unsigned() { (b, a) } else { (a, b) };
            match u {
                DType::U8 => wider(s, DType::I32),
                _ => DType::I64,
            }
        }
    }
}

/// Formats operand types for messages: `f32[2, 3], f32[3]`.
pub(crate) fn types(operands: &[&Tensor]) -> String {
    operands
        .iter()
        .map(|t| t.ty().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The little-endian bytes of `value` as one element of `dtype`. Integer types need an integral
/// value in range; `Pred` is `value != 0`.
pub(crate) fn scalar_bytes(value: f64, dtype: DType) -> std::result::Result<Vec<u8>, String> {
    // `hi` is exclusive: 2^63 and 2^64 are exactly representable and must be rejected.
    let int = |lo: f64, hi: f64| -> std::result::Result<f64, String> {
        if value.fract() != 0.0 || !(lo <= value && value < hi) {
            Err(format!("{value} is not a {dtype} value"))
        } else {
            Ok(value)
        }
    };
    Ok(match dtype {
        DType::Pred => vec![u8::from(value != 0.0)],
        DType::U8 => vec![int(0.0, 256.0)? as u8],
        DType::U32 => (int(0.0, 2f64.powi(32))? as u32).to_le_bytes().to_vec(),
        DType::U64 => (int(0.0, 2f64.powi(64))? as u64).to_le_bytes().to_vec(),
        DType::I8 => vec![int(-128.0, 128.0)? as i8 as u8],
        DType::I32 => (int(-(2f64.powi(31)), 2f64.powi(31))? as i32)
            .to_le_bytes()
            .to_vec(),
        DType::I64 => (int(-(2f64.powi(63)), 2f64.powi(63))? as i64)
            .to_le_bytes()
            .to_vec(),
        DType::F16 => f16::from_f64(value).to_le_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(value).to_le_bytes().to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
    })
}

/// The little-endian bytes of the integer `value` as one element of `dtype`: exactly for integer
/// types (out of range is an error), rounded to the nearest value for floats (an error where that
/// is infinite), `value != 0` for `Pred`.
pub(crate) fn int_scalar_bytes(value: i128, dtype: DType) -> std::result::Result<Vec<u8>, String> {
    let bytes = match dtype {
        DType::U8 => u8::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::U32 => u32::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::U64 => u64::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::I8 => i8::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::I32 => i32::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::I64 => i64::try_from(value).ok().map(|v| v.to_le_bytes().to_vec()),
        DType::F16 => Some(f16::from_f64(value as f64))
            .filter(|h| h.is_finite())
            .map(|h| h.to_le_bytes().to_vec()),
        // Every i128 is finite in these (bf16 and f32 reach 3.4e38; i128 ends at 1.7e38).
        DType::Pred | DType::BF16 | DType::F32 | DType::F64 => {
            return scalar_bytes(value as f64, dtype)
        }
    };
    bytes.ok_or_else(|| format!("{value} is not a {dtype} value"))
}

#[cfg(test)]
mod tests {
    use super::{join_dtypes, reword};
    use crate::dtype::DType::*;

    #[test]
    fn dtypes_join_without_loss_where_one_exists() {
        for (a, b, want) in [
            (F32, F64, F64),
            (I32, F16, F16),
            (F16, BF16, F32),
            (Pred, U8, U8),
            (I8, I64, I64),
            (U8, I8, I32),
            (U32, I8, I64),
            (U8, I64, I64),
            (U64, I32, I64),
        ] {
            assert_eq!(join_dtypes(a, b), want, "{a} and {b}");
            assert_eq!(join_dtypes(b, a), want, "{b} and {a}");
        }
    }

    #[test]
    fn reword_replaces_whole_words_only() {
        let m = "the contracted lhs axis 1 and rhs axis 0 differ; lhs_dilation, rhs";
        assert_eq!(
            reword(m, &["lhs", "rhs"], &["x", "weight"]),
            "the contracted x axis 1 and weight axis 0 differ; lhs_dilation, weight"
        );
        // Simultaneous: a role that is the other word is not replaced again.
        assert_eq!(
            reword("lhs rhs", &["lhs", "rhs"], &["rhs", "lhs"]),
            "rhs lhs"
        );
    }
}
