//! Reading the parameter types of `@main` from StableHLO text.
//!
//! The PJRT C API (as of 0.81) cannot tell the caller what parameters a program takes, and the CPU
//! plugin runs a program on arguments of the wrong shape without complaint, reading past the end
//! of a short buffer. So the runtime reads the parameter types from the module text it compiles
//! and checks every execution's arguments against them.

use crate::dtype::{DType, TensorType};

/// The parameter types of `func.func @main`, or `None` when the signature is not in the plain
/// textual form with static `tensor<...>` types of supported element types.
pub(crate) fn main_parameters(mlir: &str) -> Option<Vec<TensorType>> {
    let start = mlir.find("@main(")? + "@main(".len();
    let params = balanced(&mlir[start..])?;
    split_top_level(params)
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (_, ty) = p.split_once(':')?;
            parse_tensor_type(ty.trim_start())
        })
        .collect()
}

/// The text up to the `)` that closes an already opened `(`.
fn balanced(s: &str) -> Option<&str> {
    let mut depth = 0i32;
    let mut in_string = false;
    for (i, c) in s.char_indices() {
        match c {
            '"' => in_string = !in_string,
            _ if in_string => {}
            '(' | '<' | '{' | '[' => depth += 1,
            ')' if depth == 0 => return Some(&s[..i]),
            ')' | '>' | '}' | ']' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut in_string = false;
    let mut from = 0;
    for (i, c) in s.char_indices() {
        match c {
            '"' => in_string = !in_string,
            _ if in_string => {}
            '(' | '<' | '{' | '[' => depth += 1,
            ')' | '>' | '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[from..]);
    parts
}

/// Parses `tensor<2x3xf32>` (anything after the closing `>` is ignored).
fn parse_tensor_type(s: &str) -> Option<TensorType> {
    let inner = balanced_angle(s.strip_prefix("tensor<")?)?;
    // An encoding such as `tensor<4xf32, #enc>` follows a top-level comma.
    let shape = split_top_level(inner).first()?.trim();
    let mut pieces: Vec<&str> = shape.split('x').collect();
    let element = pieces.pop()?;
    let dtype = DType::ALL.into_iter().find(|d| d.mlir_name() == element)?;
    let dims = pieces
        .iter()
        .map(|d| d.parse::<usize>().ok())
        .collect::<Option<Vec<_>>>()?;
    Some(TensorType { dtype, dims })
}

fn balanced_angle(s: &str) -> Option<&str> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' if depth == 0 => return Some(&s[..i]),
            '>' => depth -= 1,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: DType, dims: &[usize]) -> TensorType {
        TensorType {
            dtype,
            dims: dims.to_vec(),
        }
    }

    #[test]
    fn reads_plain_signatures() {
        let m = "module {\n func.func public @main(%a: tensor<2x3xf32>, %b: tensor<i64> {jax.buffer_donor = true}, %c: tensor<0x4xbf16> loc(\"x\")) -> tensor<2xf32> {\n";
        assert_eq!(
            main_parameters(m),
            Some(vec![
                t(DType::F32, &[2, 3]),
                t(DType::I64, &[]),
                t(DType::BF16, &[0, 4])
            ])
        );
        assert_eq!(
            main_parameters("func.func @main() -> tensor<f32> {"),
            Some(vec![])
        );
        assert_eq!(
            main_parameters("func.func @main(%p: tensor<5xi1>, %u: tensor<1x1xui8>) -> () {"),
            Some(vec![t(DType::Pred, &[5]), t(DType::U8, &[1, 1])])
        );
    }

    #[test]
    fn gives_up_on_what_it_cannot_check() {
        // dynamic dimension, unsupported element type, tuple, no @main
        assert_eq!(
            main_parameters("func.func @main(%a: tensor<?xf32>) {"),
            None
        );
        assert_eq!(main_parameters("func.func @main(%a: tensor<4xi8>) {"), None);
        assert_eq!(
            main_parameters("func.func @main(%a: tuple<tensor<f32>>) {"),
            None
        );
        assert_eq!(main_parameters("func.func @other(%a: tensor<f32>) {"), None);
        assert_eq!(main_parameters("func.func @main(%a: tensor<f32>"), None);
    }
}
