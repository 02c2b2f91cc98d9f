//! Reading the parameter types of `@main` from StableHLO text.
//!
//! The PJRT C API (as of 0.81) cannot tell the caller what parameters a program takes, and the CPU
//! plugin runs a program on arguments of the wrong shape without complaint, reading past the end
//! of a short buffer. So the runtime reads the parameter types from the module text it compiles
//! and checks every execution's arguments against them. It also reads which parameters are
//! donated (`tf.aliasing_output = N : i32` or `jax.buffer_donor = true` in a parameter's
//! attribute dictionary): PJRT takes over the argument buffers in those positions.

use crate::dtype::{DType, TensorType};

/// What the runtime knows of `@main`'s parameters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Inputs {
    /// Each parameter's type, or `None` when the signature is not in the plain textual form with
    /// static `tensor<...>` types of supported element types.
    pub(crate) types: Option<Vec<TensorType>>,
    /// The donated parameters, ascending (read even when `types` is `None`).
    pub(crate) donated: Vec<usize>,
    /// `(parameter, output)` for each parameter with `tf.aliasing_output = output`.
    pub(crate) aliases: Vec<(usize, usize)>,
}

/// Reads the parameters of `func.func @main`; no `@main` (or an unclosed list) gives the default:
/// unknown types, nothing donated.
pub(crate) fn main_parameters(mlir: &str) -> Inputs {
    let Some(params) = mlir
        .find("@main(")
        .and_then(|at| balanced(&mlir[at + "@main(".len()..]))
    else {
        return Inputs::default();
    };
    let params: Vec<&str> = split_top_level(params)
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .collect();
    let types = params
        .iter()
        .map(|p| {
            let (_, ty) = p.split_once(':')?;
            parse_tensor_type(ty.trim_start())
        })
        .collect();
    let mut inputs = Inputs {
        types,
        ..Inputs::default()
    };
    for (i, p) in params.iter().enumerate() {
        match donation(p) {
            Some(Donation::Aliased(output)) => {
                inputs.donated.push(i);
                inputs.aliases.push((i, output));
            }
            Some(Donation::Donor) => inputs.donated.push(i),
            None => {}
        }
    }
    inputs
}

/// How a parameter is donated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Donation {
    /// `tf.aliasing_output = N : i32`: the parameter's buffer becomes output `N`.
    Aliased(usize),
    /// `jax.buffer_donor = true`, or a `tf.aliasing_output` whose value is not a plain index:
    /// donated, the compiler may reuse the memory for any output.
    Donor,
}

/// Reads the donation attributes of one parameter (`%name: type {attributes} loc(...)`).
fn donation(param: &str) -> Option<Donation> {
    let (_, rest) = param.split_once(':')?;
    let attributes = attribute_dict(rest)?;
    let mut found = None;
    for entry in split_top_level(attributes) {
        let Some((key, value)) = entry.split_once('=') else {
            continue;
        };
        let value = value.trim();
        match key.trim().trim_matches('"') {
            "tf.aliasing_output" => {
                // `0 : i32`; the type suffix is optional.
                let index = value.split(':').next().unwrap_or("").trim();
                return Some(match index.parse() {
                    Ok(output) => Donation::Aliased(output),
                    Err(_) => Donation::Donor,
                });
            }
            "jax.buffer_donor" if value != "false" => found = Some(Donation::Donor),
            _ => {}
        }
    }
    found
}

/// The characters of `s`, with their byte index, that stand outside every bracket (`()`, `<>`,
/// `{}`, `[]`) opened in `s` and outside strings. A bracket is yielded (or not) by the depth
/// before it; the `>` of an arrow `->` (in an affine map) is no bracket.
fn top_level(s: &str) -> impl Iterator<Item = (usize, char)> + '_ {
    let mut depth = 0i32;
    let mut in_string = false;
    let mut previous = ' ';
    s.char_indices().filter(move |&(_, c)| {
        let top = depth == 0 && !in_string && c != '"';
        match c {
            '"' => in_string = !in_string,
            _ if in_string => {}
            '>' if previous == '-' => {}
            '(' | '<' | '{' | '[' => depth += 1,
            ')' | '>' | '}' | ']' => depth -= 1,
            _ => {}
        }
        previous = c;
        top
    })
}

/// The inside of the first `{...}` outside any `<...>`, `(...)`, `[...]` or string in `s`.
fn attribute_dict(s: &str) -> Option<&str> {
    let (i, _) = top_level(s).find(|&(_, c)| c == '{')?;
    balanced_to(&s[i + 1..], '}')
}

/// The text up to the `)` that closes an already opened `(`.
fn balanced(s: &str) -> Option<&str> {
    balanced_to(s, ')')
}

/// The text up to the `close` bracket that closes an already opened one.
fn balanced_to(s: &str, close: char) -> Option<&str> {
    let (i, _) = top_level(s).find(|&(_, c)| c == close)?;
    Some(&s[..i])
}

/// `s` split at the commas outside brackets and strings.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut from = 0;
    for (i, _) in top_level(s).filter(|&(_, c)| c == ',') {
        parts.push(&s[from..i]);
        from = i + 1;
    }
    parts.push(&s[from..]);
    parts
}

/// Parses `tensor<2x3xf32>` (anything after the closing `>` is ignored).
fn parse_tensor_type(s: &str) -> Option<TensorType> {
    let inner = balanced_to(s.strip_prefix("tensor<")?, '>')?;
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
            main_parameters(m).types,
            Some(vec![
                t(DType::F32, &[2, 3]),
                t(DType::I64, &[]),
                t(DType::BF16, &[0, 4])
            ])
        );
        assert_eq!(
            main_parameters("func.func @main() -> tensor<f32> {").types,
            Some(vec![])
        );
        assert_eq!(
            main_parameters("func.func @main(%p: tensor<5xi1>, %u: tensor<1x1xui8>) -> () {").types,
            Some(vec![t(DType::Pred, &[5]), t(DType::U8, &[1, 1])])
        );
    }

    #[test]
    fn brackets_in_strings_and_encodings_do_not_end_a_type() {
        // A tensor encoding holds commas, an affine map's `->` and a string with brackets; the
        // parameter after it is still found.
        let m = "func.func @main(%a: tensor<4x4xf32, #sparse_tensor.encoding<{ map = (d0, d1) \
                 -> (d0 : dense, d1 : compressed) }>>, %b: tensor<2xi32> {mhlo.sharding = \
                 \"{devices=[1,2]<=[2]}\"}, %c: tensor<3xf64>) -> tensor<2xi32> {";
        assert_eq!(
            main_parameters(m).types,
            Some(vec![
                t(DType::F32, &[4, 4]),
                t(DType::I32, &[2]),
                t(DType::F64, &[3])
            ])
        );
    }

    #[test]
    fn gives_up_on_what_it_cannot_check() {
        // dynamic dimension, unsupported element type, tuple, no @main
        assert_eq!(
            main_parameters("func.func @main(%a: tensor<?xf32>) {").types,
            None
        );
        assert_eq!(
            main_parameters("func.func @main(%a: tensor<4xi16>) {").types,
            None
        );
        assert_eq!(
            main_parameters("func.func @main(%a: tuple<tensor<f32>>) {").types,
            None
        );
        assert_eq!(
            main_parameters("func.func @other(%a: tensor<f32>) {").types,
            None
        );
        assert_eq!(
            main_parameters("func.func @main(%a: tensor<f32>").types,
            None
        );
    }

    #[test]
    fn reads_donated_parameters() {
        let m = r#"module @step {
  func.func public @main(%state: tensor<4096x4096xf32> {tf.aliasing_output = 0 : i32}, %row: tensor<i32>, %buf: tensor<8xf32> {jax.buffer_donor = true}, %kept: tensor<2xf32> {jax.buffer_donor = false}, %late: tensor<f32> {mhlo.sharding = "{replicated}", tf.aliasing_output = 2 : i32} loc("x")) -> (tensor<4096x4096xf32>, tensor<8xf32>, tensor<f32>) {"#;
        let inputs = main_parameters(m);
        assert_eq!(inputs.types.as_ref().map(Vec::len), Some(5));
        assert_eq!(inputs.donated, vec![0, 2, 4]);
        assert_eq!(inputs.aliases, vec![(0, 0), (4, 2)]);

        // No attributes, attributes that are not about donation, and strings that only look like
        // them, donate nothing.
        for m in [
            "func.func @main(%a: tensor<2xf32>, %b: tensor<f32>) -> tensor<2xf32> {",
            "func.func @main(%a: tensor<2xf32> {mhlo.layout_mode = \"default\"}) -> () {",
            "func.func @main(%a: tensor<2xf32> loc(\"{tf.aliasing_output = 0 : i32}\")) -> () {",
            "func.func @main(%a: tensor<2xf32> {mhlo.sharding = \"tf.aliasing_output = 0\"}) {",
        ] {
            let inputs = main_parameters(m);
            assert!(inputs.types.is_some(), "{m}");
            assert_eq!(inputs.donated, Vec::<usize>::new(), "{m}");
        }
    }

    #[test]
    fn donation_is_read_even_when_types_are_not() {
        // A dynamic dimension defeats the type check, not the donation bookkeeping.
        let inputs = main_parameters(
            "func.func @main(%a: tensor<?xf32>, %b: tensor<4xf32> {tf.aliasing_output = 0 : i32}) {",
        );
        assert_eq!(inputs.types, None);
        assert_eq!(inputs.donated, vec![1]);
        // An aliasing value that is not a plain index still donates.
        assert_eq!(
            donation("%a: tensor<f32> {tf.aliasing_output = #weird}"),
            Some(Donation::Donor)
        );
        assert_eq!(
            donation("%a: tensor<f32> {\"tf.aliasing_output\" = 3}"),
            Some(Donation::Aliased(3))
        );
        assert_eq!(main_parameters("no main here"), Inputs::default());
    }
}
