//! `xla.CompileOptionsProto`, serialized by a small protobuf encoder (no protoc, no prost).
//!
//! Field numbers follow `xla/pjrt/proto/compile_options.proto`:
//! `CompileOptionsProto.executable_build_options = 3`, and in `ExecutableBuildOptionsProto`
//! `device_ordinal = 1`, `num_replicas = 4`, `num_partitions = 5`, `use_spmd_partitioning = 6`,
//! `device_assignment = 9` (a `DeviceAssignmentProto`: `replica_count = 1`, `computation_count =
//! 2`, repeated `computation_devices = 3`, each with repeated `replica_device_ids = 1`) and
//! `use_shardy_partitioner = 19`. Empty options make the CPU plugin abort (it reads
//! `num_replicas = 0`), so the replica and partition counts are always sent.

use super::proto::{put_bytes_field, put_varint_field, FieldValue, Fields};

/// Options for compiling a program.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Number of replicas (data-parallel copies). Must be at least 1.
    pub num_replicas: i64,
    /// Number of partitions (SPMD shards). Must be at least 1.
    pub num_partitions: i64,
    /// The device to build for, or `None` to let the plugin choose (device 0).
    pub device_ordinal: Option<i64>,
    /// Partition the program with XLA's SPMD partitioner, Shardy (`sdy`) annotations in the
    /// text saying how (sets `use_spmd_partitioning` and `use_shardy_partitioner`).
    pub spmd: bool,
    /// The device id (see [`crate::runtime::Device::id`]) of each partition and replica:
    /// `device_assignment[partition][replica]`; `None` lets the plugin choose.
    pub device_assignment: Option<Vec<Vec<i64>>>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            device_ordinal: None,
            spmd: false,
            device_assignment: None,
        }
    }
}

const COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS: u32 = 3;
const BUILD_OPTIONS_DEVICE_ORDINAL: u32 = 1;
const BUILD_OPTIONS_NUM_REPLICAS: u32 = 4;
const BUILD_OPTIONS_NUM_PARTITIONS: u32 = 5;
const BUILD_OPTIONS_USE_SPMD_PARTITIONING: u32 = 6;
const BUILD_OPTIONS_DEVICE_ASSIGNMENT: u32 = 9;
const BUILD_OPTIONS_USE_SHARDY_PARTITIONER: u32 = 19;
const ASSIGNMENT_REPLICA_COUNT: u32 = 1;
const ASSIGNMENT_COMPUTATION_COUNT: u32 = 2;
const ASSIGNMENT_COMPUTATION_DEVICES: u32 = 3;
const COMPUTATION_REPLICA_DEVICE_IDS: u32 = 1;

impl CompileOptions {
    /// The serialized `CompileOptionsProto`.
    pub fn encode(&self) -> Vec<u8> {
        let mut build = Vec::new();
        if let Some(ordinal) = self.device_ordinal {
            put_varint_field(&mut build, BUILD_OPTIONS_DEVICE_ORDINAL, ordinal as u64);
        }
        put_varint_field(
            &mut build,
            BUILD_OPTIONS_NUM_REPLICAS,
            self.num_replicas as u64,
        );
        put_varint_field(
            &mut build,
            BUILD_OPTIONS_NUM_PARTITIONS,
            self.num_partitions as u64,
        );
        if self.spmd {
            put_varint_field(&mut build, BUILD_OPTIONS_USE_SPMD_PARTITIONING, 1);
        }
        if let Some(assignment) = &self.device_assignment {
            let mut proto = Vec::new();
            let replicas = assignment.first().map_or(0, Vec::len);
            put_varint_field(&mut proto, ASSIGNMENT_REPLICA_COUNT, replicas as u64);
            put_varint_field(
                &mut proto,
                ASSIGNMENT_COMPUTATION_COUNT,
                assignment.len() as u64,
            );
            for computation in assignment {
                let mut ids = Vec::new();
                for &id in computation {
                    put_varint_field(&mut ids, COMPUTATION_REPLICA_DEVICE_IDS, id as u64);
                }
                put_bytes_field(&mut proto, ASSIGNMENT_COMPUTATION_DEVICES, &ids);
            }
            put_bytes_field(&mut build, BUILD_OPTIONS_DEVICE_ASSIGNMENT, &proto);
        }
        if self.spmd {
            put_varint_field(&mut build, BUILD_OPTIONS_USE_SHARDY_PARTITIONER, 1);
        }
        let mut out = Vec::new();
        put_bytes_field(&mut out, COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS, &build);
        out
    }

    /// Parses a serialized `CompileOptionsProto`, reading the fields [`CompileOptions`] holds and
    /// skipping any others. Returns `None` for malformed input.
    pub fn decode(bytes: &[u8]) -> Option<CompileOptions> {
        let mut options = CompileOptions {
            num_replicas: 0,
            num_partitions: 0,
            device_ordinal: None,
            spmd: false,
            device_assignment: None,
        };
        for field in Fields::new(bytes) {
            let (number, value) = field?;
            if let (COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS, FieldValue::Bytes(build)) =
                (number, value)
            {
                for inner in Fields::new(build) {
                    match inner? {
                        (BUILD_OPTIONS_DEVICE_ORDINAL, FieldValue::Varint(v)) => {
                            options.device_ordinal = Some(v as i64)
                        }
                        (BUILD_OPTIONS_NUM_REPLICAS, FieldValue::Varint(v)) => {
                            options.num_replicas = v as i64
                        }
                        (BUILD_OPTIONS_NUM_PARTITIONS, FieldValue::Varint(v)) => {
                            options.num_partitions = v as i64
                        }
                        (BUILD_OPTIONS_USE_SPMD_PARTITIONING, FieldValue::Varint(v)) => {
                            options.spmd = v != 0
                        }
                        (BUILD_OPTIONS_DEVICE_ASSIGNMENT, FieldValue::Bytes(proto)) => {
                            options.device_assignment = Some(decode_assignment(proto)?)
                        }
                        _ => {}
                    }
                }
            }
        }
        Some(options)
    }
}

/// The computations of a `DeviceAssignmentProto`, each a list of device ids (one per replica);
/// the counts are implied by the lists and not read.
fn decode_assignment(proto: &[u8]) -> Option<Vec<Vec<i64>>> {
    let mut assignment = Vec::new();
    for field in Fields::new(proto) {
        if let (ASSIGNMENT_COMPUTATION_DEVICES, FieldValue::Bytes(ids)) = field? {
            let mut replicas = Vec::new();
            for id in Fields::new(ids) {
                if let (COMPUTATION_REPLICA_DEVICE_IDS, FieldValue::Varint(v)) = id? {
                    replicas.push(v as i64);
                }
            }
            assignment.push(replicas);
        }
    }
    Some(assignment)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_encode_to_the_known_bytes() {
        // field 3, length 4: { field 4 = 1, field 5 = 1 } -- worked out by hand from the wire format.
        assert_eq!(
            CompileOptions::default().encode(),
            vec![0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]
        );
    }

    #[test]
    fn decode_reads_back_what_encode_wrote() {
        for options in [
            CompileOptions::default(),
            CompileOptions {
                num_replicas: 2,
                num_partitions: 300,
                device_ordinal: Some(3),
                ..CompileOptions::default()
            },
            CompileOptions {
                num_replicas: 1,
                num_partitions: 1,
                device_ordinal: Some(-1),
                ..CompileOptions::default()
            },
            CompileOptions {
                num_partitions: 4,
                spmd: true,
                device_assignment: Some(vec![vec![3], vec![2], vec![0], vec![1]]),
                ..CompileOptions::default()
            },
            CompileOptions {
                device_assignment: Some(vec![]),
                ..CompileOptions::default()
            },
        ] {
            assert_eq!(CompileOptions::decode(&options.encode()), Some(options));
        }
    }

    #[test]
    fn decode_skips_unknown_fields_and_rejects_truncation() {
        let mut bytes = vec![0x08, 0x01]; // field 1 (argument_layouts slot) as a varint: unknown here
        bytes.extend(CompileOptions::default().encode());
        assert_eq!(
            CompileOptions::decode(&bytes),
            Some(CompileOptions::default())
        );
        let full = CompileOptions::default().encode();
        assert_eq!(CompileOptions::decode(&full[..full.len() - 1]), None);
    }
}
