//! Entry points for the fuzz targets in `fuzz/` and the property tests in `tests/fuzz_props.rs`.
//!
//! **Not a stable API**: hidden from the documentation, it may change or vanish in any release.
//!
//! Each function takes arbitrary bytes, drives one parser or builder the way untrusted input
//! would, and checks the properties that must hold for every input. It returns normally for any
//! input; a panic (or an abort) is a bug in the library. Most entry points read their first byte
//! as a mode: raw (the bytes are the parser's input as they are) or structured (the bytes drive
//! a generator that writes nearly valid input, to reach the checks behind the syntax).

use std::collections::BTreeMap;
use std::path::Path;

use crate::dtype::{DType, TensorType};
use crate::models::mamba2::checkpoint::{read_index, sharded_files, Loader};
use crate::models::mamba2::{LoadOptions, Mamba2Config, Mamba2Weights};
use crate::ops::linalg::{parse_spec, Spec};
use crate::ops::{Graph, Tensor};
use crate::runtime::signature::main_parameters;
use crate::runtime::CompileOptions;
use crate::HostArray;

mod graph_builder;
mod graphs;
mod sharded;

pub use graphs::random_graph;
pub use sharded::sharded_graph;

/// A reader of fuzzer bytes that never fails: past the end it yields zeros.
struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |v, _| v << 8 | u64::from(self.u8()))
    }

    /// True once in `n` (by the next byte).
    fn one_in(&mut self, n: u8) -> bool {
        self.u8().is_multiple_of(n)
    }

    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n.max(1)
    }

    /// One of `items` (not empty).
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Up to `max` raw bytes.
    fn take(&mut self, max: usize) -> &'a [u8] {
        let n = max.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// All that is left.
    fn rest(&mut self) -> &'a [u8] {
        self.take(self.data.len())
    }
}

// ---- config.json --------------------------------------------------------------------------------

/// The keys of both `config.json` forms (HF, then `mamba_ssm` and its `ssm_cfg`).
const CONFIG_KEYS: &[&str] = &[
    "hidden_size",
    "num_hidden_layers",
    "state_size",
    "head_dim",
    "num_heads",
    "vocab_size",
    "expand",
    "n_groups",
    "conv_kernel",
    "chunk_size",
    "pad_vocab_size_multiple",
    "layer_norm_epsilon",
    "rms_norm_eps",
    "residual_in_fp32",
    "tie_word_embeddings",
    "use_bias",
    "use_conv_bias",
    "norm_before_gate",
    "rms_norm",
    "time_step_min",
    "time_step_max",
    "time_step_floor",
    "time_step_limit",
    "d_model",
    "n_layer",
    "tie_embeddings",
    "ssm_cfg",
    "layer",
    "d_state",
    "headdim",
    "ngroups",
    "d_conv",
    "bias",
    "conv_bias",
    "dt_limit",
];

/// JSON values that configs hold or that parsers trip on.
const CONFIG_VALUES: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "4",
    "8",
    "16",
    "64",
    "-1",
    "0.5",
    "1e-5",
    "1e308",
    "-1e308",
    "4294967296",
    "4294967297",
    "18446744073709551615",
    "9223372036854775807",
    "3037000500",
    "true",
    "false",
    "null",
    "Infinity",
    "-Infinity",
    "NaN",
    "\"Infinity\"",
    "\"nan\"",
    "\"Mamba2\"",
    "\"Mamba1\"",
    "[0.0, Infinity]",
    "[0.0, {\"__float__\": \"Infinity\"}]",
    "[1, 0]",
    "[NaN, 1]",
    "[]",
    "{}",
    "{\"__float__\": \"-inf\"}",
    "\"\\u00e9Infinity\"",
];

/// `config.json` parsing ([`Mamba2Config::from_json`]), both forms. A config that parses must
/// validate, and its derived sizes and weight types must be computable.
pub fn config_json(data: &[u8]) {
    let mut b = Bytes::new(data);
    let text = if b.u8() & 1 == 0 {
        String::from_utf8_lossy(b.rest()).into_owned()
    } else {
        config_text(&mut b)
    };
    check_config(&text);
}

/// Writes a JSON object (HF or `mamba_ssm` form) whose keys and values `b` picks.
fn config_text(b: &mut Bytes<'_>) -> String {
    let mamba_ssm = b.bool();
    let mut fields: Vec<String> = Vec::new();
    let base: &[(&str, &str)] = if mamba_ssm {
        &[("d_model", "8"), ("n_layer", "1"), ("vocab_size", "10")]
    } else {
        &[
            ("hidden_size", "8"),
            ("num_hidden_layers", "1"),
            ("state_size", "4"),
            ("head_dim", "4"),
            ("vocab_size", "10"),
        ]
    };
    for (k, v) in base {
        if !b.one_in(8) {
            fields.push(format!("\"{k}\": {v}"));
        }
    }
    let mut ssm = Vec::new();
    while !b.is_empty() && fields.len() + ssm.len() < 40 {
        let key = b.pick(CONFIG_KEYS);
        let value = if b.one_in(4) {
            // A number of any size.
            format!("{}", b.u64() >> b.below(64))
        } else {
            b.pick(CONFIG_VALUES).to_string()
        };
        let entry = format!("\"{key}\": {value}");
        if mamba_ssm && b.bool() {
            ssm.push(entry);
        } else {
            fields.push(entry);
        }
    }
    if mamba_ssm {
        fields.push(format!("\"ssm_cfg\": {{{}}}", ssm.join(", ")));
    }
    format!("{{{}}}", fields.join(", "))
}

fn check_config(text: &str) {
    let Ok(config) = Mamba2Config::from_json(text) else {
        return;
    };
    assert!(
        config.validate().is_ok(),
        "from_json returned a config that does not validate: {config:?}"
    );
    let _ = (config.d_inner(), config.conv_dim(), config.in_proj_dim());
    for dtype in [DType::F32, DType::BF16] {
        let _ = Mamba2Weights::<TensorType>::types(&config, dtype);
    }
}

// ---- safetensors checkpoints --------------------------------------------------------------------

/// Shard names an index may give, good and bad.
const SHARD_NAMES: &[&str] = &[
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "missing.safetensors",
    "../model.safetensors",
    "/etc/model.safetensors",
    "sub/model.safetensors",
    "",
    ".",
    "..",
];

/// The dtypes a safetensors header may name (the loader takes the first four).
const SAFETENSORS_DTYPES: &[(&str, usize)] = &[
    ("F32", 4),
    ("BF16", 2),
    ("F16", 2),
    ("F64", 8),
    ("I32", 4),
    ("U8", 1),
    ("BOOL", 1),
    ("F8_E4M3", 1),
    ("I64", 8),
];

/// The Mamba-2 checkpoint loader from bytes: a sharded index's `weight_map` (its parsing and the
/// shard list derived from it) and one safetensors file (its header, and every tensor checked
/// against a tiny config and converted). Weights that load must have exactly the types
/// [`Mamba2Weights::types`] gives; every shard an index yields must be a plain file name.
///
/// Raw mode reads `[mode, index length (u16 LE), index text, file bytes]`; structured mode
/// writes a nearly valid index and file for the config.
pub fn checkpoint(data: &[u8]) {
    let mut b = Bytes::new(data);
    let mode = b.u8();
    let mut config = Mamba2Config {
        hidden_size: 4,
        num_layers: 1 + usize::from(mode >> 1 & 1),
        state_size: 2,
        head_dim: 2,
        num_heads: 4,
        n_groups: 1 + usize::from(mode >> 2 & 1),
        conv_kernel: 2,
        chunk_size: 4,
        vocab_size: 6,
        ..Mamba2Config::mamba2_130m()
    };
    config.tie_word_embeddings = mode & 8 == 0;
    config.use_bias = mode & 16 != 0;
    config.use_conv_bias = mode & 32 != 0;
    let matmul = if mode & 64 == 0 {
        DType::F32
    } else {
        DType::BF16
    };
    let Ok(types) = Mamba2Weights::<TensorType>::types(&config, matmul) else {
        return;
    };
    let (index, file) = if mode & 1 == 0 {
        let n = usize::from(b.u16());
        let index = String::from_utf8_lossy(b.take(n)).into_owned();
        (index, b.rest().to_vec())
    } else {
        checkpoint_bytes(&mut b, &config, &types)
    };
    check_checkpoint(
        &config,
        &types,
        (!index.is_empty()).then_some(index.as_str()),
        &file,
    );
}

/// Every tensor a checkpoint for `types` holds: (checkpoint name, shape on disk).
fn checkpoint_tensors(
    config: &Mamba2Config,
    types: &Mamba2Weights<TensorType>,
) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for (key, ty) in types.named() {
        let dims = if key.ends_with("mixer.conv1d") {
            vec![config.conv_dim(), 1, config.conv_kernel]
        } else {
            ty.dims.clone()
        };
        for name in crate::models::mamba2::checkpoint::checkpoint_names(&key) {
            out.push((name, dims.clone()));
        }
    }
    out.push((
        "lm_head.weight".into(),
        vec![config.vocab_size, config.hidden_size],
    ));
    out
}

/// A nearly valid index (or none) and safetensors file for `types`, as `b` picks.
fn checkpoint_bytes(
    b: &mut Bytes<'_>,
    config: &Mamba2Config,
    types: &Mamba2Weights<TensorType>,
) -> (String, Vec<u8>) {
    let expected = checkpoint_tensors(config, types);
    let count = b.below(expected.len() + 4);
    let mut header = Vec::new();
    let mut data = Vec::new();
    let mut names = Vec::new();
    // Mostly the expected tensors, in order; some skipped, some strangers.
    let mut next = 0;
    for _ in 0..count {
        let (name, dims) = match b.u8() % 16 {
            0 => (format!("junk.{}", b.u8()), vec![b.below(3)]),
            1 => {
                let (n, d) = &expected[b.below(expected.len())];
                (n.clone(), d.clone())
            }
            2 => {
                next += 1;
                continue;
            }
            _ => {
                let Some((n, d)) = expected.get(next) else {
                    break;
                };
                next += 1;
                (n.clone(), d.clone())
            }
        };
        header.push(tensor_entry(b, &name, dims, &mut data));
        names.push(name);
    }
    if b.bool() {
        header.push("\"__metadata__\": {\"format\": \"pt\"}".into());
    }
    let mut text = format!("{{{}}}", header.join(", "));
    while b.bool() && text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut file = (text.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(text.as_bytes());
    file.extend_from_slice(&data);
    let index = if b.bool() {
        index_text(b, &names)
    } else {
        String::new()
    };
    (index, file)
}

/// The safetensors header entry of tensor `name` with `dims` (sometimes made wrong), a dtype
/// and a byte count (sometimes off by one); its bytes are appended to `data`.
fn tensor_entry(b: &mut Bytes<'_>, name: &str, mut dims: Vec<usize>, data: &mut Vec<u8>) -> String {
    match b.u8() % 16 {
        0 if !dims.is_empty() => dims[0] += 1,
        1 => dims.push(1),
        2 => dims = vec![usize::from(b.u16()) << 40],
        3 => dims.clear(),
        _ => {}
    }
    let (dtype, size) = if b.one_in(8) {
        b.pick(SAFETENSORS_DTYPES)
    } else {
        SAFETENSORS_DTYPES[b.below(4)]
    };
    let elements = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let mut bytes = elements
        .and_then(|n| n.checked_mul(size))
        .filter(|&n| n <= 1 << 16)
        .unwrap_or(8);
    match b.u8() % 32 {
        0 => bytes += 1,
        1 => bytes = bytes.saturating_sub(1),
        _ => {}
    }
    let start = data.len();
    for i in 0..bytes {
        // Small floats mostly; a fuzzer byte now and then (NaN patterns included).
        data.push(if i % 4 == 3 && !b.one_in(4) {
            0x3f
        } else {
            b.u8()
        });
    }
    format!(
        "\"{name}\": {{\"dtype\": \"{dtype}\", \"shape\": {dims:?}, \"data_offsets\": [{start}, {}]}}",
        data.len()
    )
}

/// A sharded index whose `weight_map` sends `names` to the first shard, some to other (bad)
/// shard names, and sometimes holds a stranger.
fn index_text(b: &mut Bytes<'_>, names: &[String]) -> String {
    let mut map = Vec::new();
    for name in names {
        let shard = if b.one_in(8) {
            b.pick(SHARD_NAMES)
        } else {
            SHARD_NAMES[0]
        };
        map.push(format!("\"{name}\": \"{shard}\""));
    }
    if b.one_in(8) {
        map.push("\"extra.weight\": 3".into());
    }
    format!(
        "{{\"metadata\": {{\"total_size\": 1}}, \"weight_map\": {{{}}}}}",
        map.join(", ")
    )
}

fn check_checkpoint(
    config: &Mamba2Config,
    types: &Mamba2Weights<TensorType>,
    index: Option<&str>,
    file: &[u8],
) {
    let dir = Path::new("checkpoint");
    let mut shard = "model.safetensors".to_string();
    let mut weight_map: Option<BTreeMap<String, String>> = None;
    if let Some(text) = index {
        let index_path = dir.join("model.safetensors.index.json");
        let parsed = read_index(&index_path, text);
        let files = sharded_files(dir, &index_path, text, |s| s != "missing.safetensors");
        let Ok(files) = files else {
            return;
        };
        let map = files.index.unwrap_or_default();
        assert_eq!(
            parsed.ok().as_ref(),
            Some(&map),
            "sharded_files changed the weight map"
        );
        let mut from_map: Vec<&String> = map.values().collect();
        from_map.sort();
        from_map.dedup();
        assert!(
            from_map.into_iter().eq(files.shards.iter()),
            "the shards are not the index's files, sorted and once each"
        );
        for s in &files.shards {
            assert!(
                Path::new(s).file_name().and_then(|n| n.to_str()) == Some(s.as_str()),
                "the index names a shard {s:?} outside the checkpoint directory"
            );
        }
        match files.shards.first() {
            Some(first) => shard = first.clone(),
            None => return,
        }
        weight_map = Some(map);
    }
    let mut loader = Loader::new(types, config, &LoadOptions::default());
    if loader.read(&dir.join(&shard), &shard, file).is_err() {
        return;
    }
    if let Ok(weights) = loader.finish(dir, types, weight_map.as_ref()) {
        let got: Vec<(String, TensorType)> = weights
            .named()
            .into_iter()
            .map(|(k, a)| (k, a.ty()))
            .collect();
        let want: Vec<(String, TensorType)> = types
            .named()
            .into_iter()
            .map(|(k, t)| (k, t.clone()))
            .collect();
        assert_eq!(got, want, "loaded weights differ from their types");
    }
}

// ---- einsum -------------------------------------------------------------------------------------

/// The einsum spec parser and [`Tensor::einsum`]. A spec that parses has one term per operand,
/// and an output of distinct indices that occur in some operand. Given parameters whose ranks
/// and sizes agree with the spec, `einsum` must succeed, lower, and (through the interpreter)
/// equal a naive sum over every index.
///
/// Raw mode reads `[mode, operand count, spec text]`; structured mode writes a spec and sizes.
pub fn einsum_spec(data: &[u8]) {
    let mut b = Bytes::new(data);
    let mode = b.u8();
    let n = 1 + b.below(4);
    let (spec, sizes) = if mode & 1 == 0 {
        let spec = String::from_utf8_lossy(b.rest()).into_owned();
        // Sizes 1 to 3 by letter, so that agreeing shapes exist.
        let sizes = (0..128u8).map(|c| 1 + usize::from(c % 3)).collect();
        (spec, sizes)
    } else {
        einsum_text(&mut b, n)
    };
    let Ok(parsed) = parse_spec(&spec, n) else {
        return;
    };
    assert_eq!(parsed.inputs.len(), n, "{spec}: wrong operand count");
    for (j, c) in parsed.output.iter().enumerate() {
        assert!(
            !parsed.output[..j].contains(c),
            "{spec}: output repeats {c}"
        );
        assert!(
            parsed.inputs.iter().flatten().any(|d| d == c),
            "{spec}: output index {c} in no operand"
        );
    }
    let size = |c: char| sizes.get(c as usize).copied().unwrap_or(1);
    let g = Graph::new();
    let mut params = Vec::new();
    let mut inputs = Vec::new();
    for (i, term) in parsed.inputs.iter().enumerate() {
        let dims: Vec<usize> = term.iter().map(|&c| size(c)).collect();
        let count: usize = dims.iter().product();
        let values: Vec<f64> = (0..count)
            .map(|k| ((k * 7 + i * 3) % 7) as f64 - 3.0)
            .collect();
        let Ok(p) = g.parameter(&format!("p{i}"), DType::F64, &dims) else {
            panic!("{spec}: parameter of dims {dims:?} refused");
        };
        params.push(p);
        inputs.push(HostArray::from_vec(&dims, values).expect("sizes agree"));
    }
    let operands: Vec<&Tensor> = params.iter().collect();
    let out = match Tensor::einsum(&spec, &operands) {
        Ok(out) => out,
        Err(e) => panic!("{spec} parsed, its shapes agree, and einsum failed: {e}"),
    };
    let out_dims: Vec<usize> = parsed.output.iter().map(|&c| size(c)).collect();
    assert_eq!(out.dims(), out_dims.as_slice(), "{spec}: output shape");
    g.set_outputs(&[&out]).expect("one output");
    if let Err(e) = g.to_stablehlo() {
        panic!("{spec}: lowering failed: {e}");
    }
    // The naive sum over every index, when small.
    let Some(want) = naive_einsum(&parsed, &inputs, &size) else {
        return;
    };
    let got = match g.evaluate(&inputs) {
        Ok(got) => got[0].to_f64_vec(),
        Err(e) => panic!("{spec}: the interpreter failed: {e}"),
    };
    assert_eq!(got, want, "{spec}: interpreter against the naive sum");
}

/// The einsum of `inputs` by `parsed`, summed naively over every index (letter `c` of size
/// `size(c)`), or `None` when that is more than 2^14 terms.
fn naive_einsum(
    parsed: &Spec,
    inputs: &[HostArray],
    size: &dyn Fn(char) -> usize,
) -> Option<Vec<f64>> {
    let mut letters: Vec<char> = parsed.inputs.iter().flatten().copied().collect();
    letters.sort_unstable();
    letters.dedup();
    let total: usize = letters.iter().map(|&c| size(c)).product();
    if total > 1 << 14 {
        return None;
    }
    let out_size: usize = parsed.output.iter().map(|&c| size(c)).product();
    let mut want = vec![0.0; out_size];
    let mut at = vec![0usize; letters.len()];
    for _ in 0..total {
        let value = |term: &[char]| {
            term.iter().fold(0usize, |flat, c| {
                let k = letters.iter().position(|d| d == c).unwrap_or(0);
                flat * size(*c) + at[k]
            })
        };
        let mut product = 1.0;
        for (term, input) in parsed.inputs.iter().zip(inputs) {
            product *= input.to_f64_vec()[value(term)];
        }
        want[value(&parsed.output)] += product;
        for k in (0..letters.len()).rev() {
            at[k] += 1;
            if at[k] < size(letters[k]) {
                break;
            }
            at[k] = 0;
        }
    }
    Some(want)
}

/// A spec for `n` operands and the size of each letter.
fn einsum_text(b: &mut Bytes<'_>, n: usize) -> (String, Vec<usize>) {
    let letters = 1 + b.below(6);
    let pool = |b: &mut Bytes<'_>| -> char {
        match b.u8() % 64 {
            0 => b.pick(&['A', 'z', '.', ' ', '1', 'é', '-', '>', ',']),
            k => (b'a' + (k % letters as u8)) as char,
        }
    };
    let mut terms = Vec::new();
    for _ in 0..n {
        let rank = b.below(5);
        let mut t = String::new();
        for _ in 0..rank {
            let c = pool(b);
            if !t.contains(c) || b.one_in(16) {
                t.push(c);
            }
        }
        terms.push(t);
    }
    if b.one_in(16) {
        terms.pop();
    }
    let mut spec = terms.join(",");
    if !b.one_in(4) {
        let used: Vec<char> = spec.chars().filter(|c| c.is_ascii_lowercase()).collect();
        let mut out = String::new();
        for _ in 0..b.below(5) {
            let c = if used.is_empty() || b.one_in(16) {
                pool(b)
            } else {
                used[b.below(used.len())]
            };
            if !out.contains(c) || b.one_in(16) {
                out.push(c);
            }
        }
        spec = format!("{spec}->{out}");
    }
    let sizes = (0..128).map(|_| 1 + b.below(3)).collect();
    (spec, sizes)
}

// ---- @main signatures ---------------------------------------------------------------------------

/// Parameter types, each with whether the signature reader can check it.
const SIGNATURE_TYPES: &[(&str, bool)] = &[
    ("tensor<2x3xf32>", true),
    ("tensor<i64>", true),
    ("tensor<0x4xbf16>", true),
    ("tensor<5xi1>", true),
    ("tensor<1x1xui8>", true),
    ("tensor<4xf32, #enc>", true),
    ("tensor<?xf32>", false),
    ("tensor<4xi8>", false),
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

// ---- compile options ----------------------------------------------------------------------------

/// The `CompileOptionsProto` decoder ([`CompileOptions::decode`]). Whatever decodes re-encodes
/// to bytes that decode to the same options; options from bytes survive an encode/decode round
/// trip, and every proper, non-empty prefix of an encoding is refused.
pub fn compile_options(data: &[u8]) {
    let mut b = Bytes::new(data);
    if b.u8() & 1 == 0 {
        if let Some(options) = CompileOptions::decode(b.rest()) {
            assert_eq!(
                CompileOptions::decode(&options.encode()),
                Some(options.clone()),
                "re-encoding {options:?}"
            );
        }
        return;
    }
    let options = CompileOptions {
        num_replicas: b.u64() as i64,
        num_partitions: b.u64() as i64,
        device_ordinal: b.bool().then(|| b.u64() as i64),
        spmd: b.bool(),
        device_assignment: b.bool().then(|| {
            let replicas = usize::from(b.u8() % 3);
            (0..b.u8() % 5)
                .map(|_| (0..replicas).map(|_| b.u64() as i64).collect())
                .collect()
        }),
    };
    let bytes = options.encode();
    assert_eq!(
        CompileOptions::decode(&bytes),
        Some(options.clone()),
        "round trip of {options:?}"
    );
    for cut in 1..bytes.len() {
        assert_eq!(
            CompileOptions::decode(&bytes[..cut]),
            None,
            "{options:?} cut at {cut} of {}",
            bytes.len()
        );
    }
}
