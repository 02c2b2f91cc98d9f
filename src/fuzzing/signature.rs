//! The `main_signature` target: the runtime's reader of the `@main` signature (parameter types
//! and donations) in StableHLO text.

use super::Bytes;
use crate::dtype::{DType, TensorType};
use crate::runtime::signature::main_parameters;

/// Parameter types, each with whether the signature reader can check it.
const SIGNATURE_TYPES: &[(&str, bool)] = &[
    ("tensor<2x3xf32>", true),
    ("tensor<i64>", true),
    ("tensor<0x4xbf16>", true),
    ("tensor<5xi1>", true),
    ("tensor<1x1xui8>", true),
    ("tensor<4xf32, #enc>", true),
    ("tensor<?xf32>", false),
    ("tensor<4xi8>", true),
    ("tensor<4xi16>", false),
    ("tuple<tensor<f32>>", false),
    ("tensor<4x>", false),
    ("tensor<18446744073709551616xf32>", false),
    ("!stablehlo.token", false),
];

/// Parameter attributes: the text, and the donation it means (`Some(None)`: a donor).
const SIGNATURE_ATTRIBUTES: &[(&str, Option<Option<usize>>)] = &[
    ("", None),
    (" {tf.aliasing_output = 0 : i32}", Some(Some(0))),
    (" {tf.aliasing_output = 2}", Some(Some(2))),
    (" {jax.buffer_donor = true}", Some(None)),
    (" {jax.buffer_donor = false}", None),
    (" {mhlo.sharding = \"{replicated}\"}", None),
    (
        " {mhlo.sharding = \"{replicated}\", tf.aliasing_output = 1 : i32}",
        Some(Some(1)),
    ),
    (" {\"tf.aliasing_output\" = 3}", Some(Some(3))),
    (" {tf.aliasing_output = #weird}", Some(None)),
    (" {mhlo.layout_mode = \"default\"}", None),
    (" loc(\"{tf.aliasing_output = 0 : i32}\")", None),
    (" {jax.buffer_donor = true} loc(\"x(\")", Some(None)),
];

/// The `@main` signature reader of the runtime (parameter types and donations). Donated
/// parameters are ascending and unique, and every aliased one is donated. In structured mode the
/// reader must find exactly the types and donations the generator wrote.
pub fn main_signature(data: &[u8]) {
    let mut b = Bytes::new(data);
    if b.u8() & 1 == 0 {
        let text = String::from_utf8_lossy(b.rest()).into_owned();
        check_signature(&text);
        return;
    }
    let mut params = Vec::new();
    let mut types = Some(Vec::new());
    let mut donated = Vec::new();
    let mut aliases = Vec::new();
    for i in 0..b.below(6) {
        let (ty, plain) = b.pick(SIGNATURE_TYPES);
        let (attr, donation) = b.pick(SIGNATURE_ATTRIBUTES);
        params.push(format!("%arg{i}: {ty}{attr}"));
        match (plain, types.as_mut()) {
            (true, Some(list)) => {
                let parsed = ty
                    .strip_prefix("tensor<")
                    .map(|t| t.split([',', '>']).next().unwrap_or(""))
                    .unwrap_or("");
                let mut pieces: Vec<&str> = parsed.split('x').collect();
                let element = pieces.pop().unwrap_or("");
                let dtype = DType::ALL.into_iter().find(|d| d.mlir_name() == element);
                let dims: Vec<usize> = pieces.iter().filter_map(|d| d.parse().ok()).collect();
                list.push(TensorType::new(dtype.expect("a plain type"), &dims));
            }
            _ => types = None,
        }
        if let Some(output) = donation {
            donated.push(i);
            if let Some(o) = output {
                aliases.push((i, o));
            }
        }
    }
    let text = format!(
        "module @m {{\n  func.func public @main({}) -> (tensor<f32>) {{\n    return\n  }}\n}}",
        params.join(", ")
    );
    let inputs = main_parameters(&text);
    assert_eq!(inputs.types, types, "{text}");
    assert_eq!(inputs.donated, donated, "{text}");
    assert_eq!(inputs.aliases, aliases, "{text}");
    // Cut anywhere (at a character boundary), the text must still be read without a panic.
    let cut = b.below(text.len() + 1);
    if let Some(prefix) = text.get(..cut) {
        check_signature(prefix);
    }
}

fn check_signature(text: &str) {
    let inputs = main_parameters(text);
    assert!(
        inputs.donated.windows(2).all(|w| w[0] < w[1]),
        "donations not ascending: {:?}",
        inputs.donated
    );
    for (p, _) in &inputs.aliases {
        assert!(
            inputs.donated.contains(p),
            "aliased parameter {p} not donated"
        );
    }
}
