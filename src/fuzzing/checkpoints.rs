//! The `checkpoint` target: the safetensors checkpoint reader (one file or an index over
//! shards), on raw bytes and on nearly valid checkpoints.

use super::Bytes;
use crate::tree::Tree;
use std::collections::BTreeMap;
use std::path::Path;

use crate::dtype::{DType, TensorType};
use crate::models::common::checkpoint::{read_index, sharded_files, LoadOptions};
use crate::models::mamba2::checkpoint::mamba2_loader;
use crate::models::mamba2::{Mamba2Config, Mamba2Weights};

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
    let mut loader = mamba2_loader(types, config, &LoadOptions::default());
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
