//! Reading the JSON configs of checkpoints: Python's non-JSON floats (`Infinity`, `NaN`) and
//! transformers 5's `{"__float__": ...}`, and fields every SSM family shares.

use serde_json::Value;

use crate::error::{Error, Result};

/// Rewrites the non-JSON float tokens Python writes (`Infinity`, `-Infinity`, `NaN`) outside
/// strings into strings that `number` below understands.
pub(crate) fn strict_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let c = bytes[i] as char;
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        let rest = &text[i..];
        if c == '"' {
            in_string = true;
            out.push(c);
            i += 1;
        } else if let Some(tok) = ["-Infinity", "Infinity", "NaN"]
            .iter()
            .find(|t| rest.starts_with(**t))
        {
            out.push('"');
            out.push_str(tok);
            out.push('"');
            i += tok.len();
        } else {
            let ch = rest.chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// A JSON number, or one of the spellings of infinity Python writes.
pub(crate) fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "Infinity" | "inf" => Some(f64::INFINITY),
            "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
            "NaN" | "nan" => Some(f64::NAN),
            _ => s.parse().ok(),
        },
        Value::Object(o) => o.get("__float__").and_then(number),
        _ => None,
    }
}

/// A `time_step_limit` pair (`[lo, hi]`, either may be infinite); absent or null is
/// `(0, inf)`.
pub(crate) fn time_step_limit(v: Option<&Value>) -> Result<(f64, f64)> {
    match v {
        None | Some(Value::Null) => Ok((0.0, f64::INFINITY)),
        Some(Value::Array(a)) if a.len() == 2 => match (number(&a[0]), number(&a[1])) {
            (Some(lo), Some(hi)) => Ok((lo, hi)),
            _ => Err(Error::InvalidArgument(format!(
                "time_step_limit {a:?} is not two numbers"
            ))),
        },
        Some(other) => Err(Error::InvalidArgument(format!(
            "time_step_limit {other} is not a pair"
        ))),
    }
}
