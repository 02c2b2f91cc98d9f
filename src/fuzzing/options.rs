//! The `compile_options` target: the `CompileOptionsProto` decoder and encoder.

use super::Bytes;
use crate::runtime::CompileOptions;

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
