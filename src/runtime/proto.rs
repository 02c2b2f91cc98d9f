//! A minimal protobuf wire-format reader and writer (no protoc, no prost), for the few XLA
//! messages the runtime writes (`CompileOptionsProto`) and reads (an optimized
//! `HloModuleProto`'s instructions).

const WIRE_VARINT: u32 = 0;
const WIRE_LEN: u32 = 2;

/// Writes field `field` as a length-delimited value (bytes or a nested message).
pub(crate) fn put_bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Writes `v` as a base-128 varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, u64::from(field << 3 | wire));
}

/// Writes field `field` as a varint.
pub(crate) fn put_varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    put_key(out, field, WIRE_VARINT);
    put_varint(out, v);
}

/// A field's value: a varint, length-delimited bytes, or a fixed-width value (not read).
pub(crate) enum FieldValue<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// Iterates over the top-level fields of a protobuf message.
pub(crate) struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Fields { rest: bytes }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.rest.split_first()?;
            self.rest = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(head)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Option<(u32, FieldValue<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = (|| {
            let key = self.varint()?;
            let number = u32::try_from(key >> 3).ok()?;
            let value = match key & 7 {
                0 => FieldValue::Varint(self.varint()?),
                1 => self.take(8).map(|_| FieldValue::Fixed)?,
                2 => {
                    let n = usize::try_from(self.varint()?).ok()?;
                    FieldValue::Bytes(self.take(n)?)
                }
                5 => self.take(4).map(|_| FieldValue::Fixed)?,
                _ => return None,
            };
            Some((number, value))
        })();
        if parsed.is_none() {
            self.rest = &[];
        }
        Some(parsed)
    }
}

/// The varints of a packed repeated field's bytes; `None` for a malformed one.
pub(crate) fn packed_varints(bytes: &[u8]) -> Option<Vec<u64>> {
    let mut reader = Fields::new(bytes);
    let mut out = Vec::new();
    while !reader.rest.is_empty() {
        out.push(reader.varint()?);
    }
    Some(out)
}
