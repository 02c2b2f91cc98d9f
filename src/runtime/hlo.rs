//! What the runtime reads from an optimized program (a serialized `HloModuleProto`, see
//! [`super::Executable::optimized_hlo`]): its collectives.
//!
//! Field numbers follow `xla/service/hlo.proto` and `xla/xla_data.proto`:
//! `HloModuleProto.computations = 3`; `HloComputationProto.name = 1`, `instructions = 2`;
//! `HloInstructionProto.opcode = 2`, `shape = 3`; `ShapeProto.dimensions = 3` (packed),
//! `tuple_shapes = 4`.

use super::proto::{packed_varints, FieldValue, Fields};
use crate::error::{Error, Result};

const MODULE_COMPUTATIONS: u32 = 3;
const COMPUTATION_NAME: u32 = 1;
const COMPUTATION_INSTRUCTIONS: u32 = 2;
const INSTRUCTION_OPCODE: u32 = 2;
const INSTRUCTION_SHAPE: u32 = 3;
const SHAPE_DIMENSIONS: u32 = 3;
const SHAPE_TUPLE_SHAPES: u32 = 4;

/// The opcodes counted as collectives (an async pair is counted at its `-start`).
const COLLECTIVES: [&str; 5] = [
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
];

/// One collective of an optimized program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collective {
    /// `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all` or `collective-permute`.
    pub opcode: String,
    /// The computation it is in (the entry computation, a loop's body, ...).
    pub computation: String,
    /// The elements of its result on each device (summed over the parts of a tuple; for an
    /// async `-start`, its last part, the result).
    pub elements: u64,
}

fn malformed(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "the optimized program is not a valid HloModuleProto: {what}"
    ))
}

/// The `HloModuleProto` of a serialized `HloModuleProtoWithConfig` (`hlo_module = 1`).
pub(crate) fn module_of_config(bytes: &[u8]) -> Result<Vec<u8>> {
    for field in Fields::new(bytes) {
        if let (1, FieldValue::Bytes(module)) =
            field.ok_or_else(|| malformed("a HloModuleProtoWithConfig field"))?
        {
            return Ok(module.to_vec());
        }
    }
    Err(malformed("a HloModuleProtoWithConfig without its module"))
}

/// The collectives of a serialized `HloModuleProto`.
pub(crate) fn collectives(module: &[u8]) -> Result<Vec<Collective>> {
    let mut found = Vec::new();
    for field in Fields::new(module) {
        let (number, value) = field.ok_or_else(|| malformed("a module field"))?;
        let (MODULE_COMPUTATIONS, FieldValue::Bytes(computation)) = (number, value) else {
            continue;
        };
        let mut name = String::new();
        let mut instructions = Vec::new();
        for field in Fields::new(computation) {
            match field.ok_or_else(|| malformed("a computation field"))? {
                (COMPUTATION_NAME, FieldValue::Bytes(b)) => {
                    name = String::from_utf8_lossy(b).into_owned()
                }
                (COMPUTATION_INSTRUCTIONS, FieldValue::Bytes(b)) => instructions.push(b),
                _ => {}
            }
        }
        for instruction in instructions {
            let mut opcode = String::new();
            let mut shape: &[u8] = &[];
            for field in Fields::new(instruction) {
                match field.ok_or_else(|| malformed("an instruction field"))? {
                    (INSTRUCTION_OPCODE, FieldValue::Bytes(b)) => {
                        opcode = String::from_utf8_lossy(b).into_owned()
                    }
                    (INSTRUCTION_SHAPE, FieldValue::Bytes(b)) => shape = b,
                    _ => {}
                }
            }
            let start = opcode.strip_suffix("-start");
            let base = start.unwrap_or(&opcode);
            if COLLECTIVES.contains(&base) {
                found.push(Collective {
                    opcode: base.to_string(),
                    computation: name.clone(),
                    elements: elements(shape, start.is_some())?,
                });
            }
        }
    }
    Ok(found)
}

/// The elements of a `ShapeProto`: the product of its dimensions, or the sum over a tuple's
/// parts (only the last one with `last_part`).
fn elements(shape: &[u8], last_part: bool) -> Result<u64> {
    let mut dims: Vec<u64> = Vec::new();
    let mut parts = Vec::new();
    for field in Fields::new(shape) {
        match field.ok_or_else(|| malformed("a shape field"))? {
            (SHAPE_DIMENSIONS, FieldValue::Bytes(b)) => {
                dims.extend(packed_varints(b).ok_or_else(|| malformed("dimensions"))?)
            }
            (SHAPE_DIMENSIONS, FieldValue::Varint(d)) => dims.push(d),
            (SHAPE_TUPLE_SHAPES, FieldValue::Bytes(b)) => parts.push(b),
            _ => {}
        }
    }
    if parts.is_empty() {
        return Ok(dims.iter().product());
    }
    if last_part {
        return elements(parts[parts.len() - 1], false);
    }
    parts.iter().map(|p| elements(p, false)).sum()
}

#[cfg(test)]
mod tests {
    use super::super::proto::{put_bytes_field, put_varint, put_varint_field};
    use super::*;

    fn shape(dims: &[u64]) -> Vec<u8> {
        let mut packed = Vec::new();
        for &d in dims {
            put_varint(&mut packed, d);
        }
        let mut s = Vec::new();
        put_varint_field(&mut s, 2, 11); // element_type F32
        put_bytes_field(&mut s, SHAPE_DIMENSIONS, &packed);
        s
    }

    fn instruction(opcode: &str, shape: &[u8]) -> Vec<u8> {
        let mut i = Vec::new();
        put_bytes_field(&mut i, 1, b"name.1");
        put_bytes_field(&mut i, INSTRUCTION_OPCODE, opcode.as_bytes());
        put_bytes_field(&mut i, INSTRUCTION_SHAPE, shape);
        i
    }

    #[test]
    fn collectives_are_read_with_their_computation_and_size() {
        let mut tuple = Vec::new();
        put_bytes_field(&mut tuple, SHAPE_TUPLE_SHAPES, &shape(&[2, 3]));
        put_bytes_field(&mut tuple, SHAPE_TUPLE_SHAPES, &shape(&[4]));
        let mut body = Vec::new();
        put_bytes_field(&mut body, COMPUTATION_NAME, b"body");
        for i in [
            instruction("add", &shape(&[8])),
            instruction("all-reduce", &shape(&[1, 3352])),
            instruction("all-reduce", &tuple),
            instruction("collective-permute-start", &tuple),
            instruction("collective-permute-done", &shape(&[4])),
        ] {
            put_bytes_field(&mut body, COMPUTATION_INSTRUCTIONS, &i);
        }
        let mut module = Vec::new();
        put_bytes_field(&mut module, 1, b"m");
        put_bytes_field(&mut module, MODULE_COMPUTATIONS, &body);
        let found = collectives(&module).unwrap();
        let got: Vec<(&str, &str, u64)> = found
            .iter()
            .map(|c| (c.opcode.as_str(), c.computation.as_str(), c.elements))
            .collect();
        assert_eq!(
            got,
            vec![
                ("all-reduce", "body", 3352),
                ("all-reduce", "body", 10),
                ("collective-permute", "body", 4)
            ]
        );
        assert!(collectives(&module[..module.len() - 1]).is_err());
    }
}
