//! Text in and out: a checkpoint's `tokenizer.json`, or the byte vocabulary of a model with 256
//! tokens and no tokenizer (token `b` is the byte `b`), or none (token ids only).

use std::path::Path;

use anyhow::{anyhow, bail, ensure, Result};
use tokenizers::Tokenizer;

/// The size of the byte vocabulary: one token per byte value.
pub(crate) const BYTE_VOCAB: usize = 256;

/// How a model's tokens relate to text.
pub(crate) enum Codec {
    /// The checkpoint's `tokenizer.json`.
    Tokenizer(Box<Tokenizer>),
    /// Token `b` is the byte `b` (a 256-token vocabulary without a tokenizer).
    Bytes,
    /// No text: token ids only. `why` says what is missing, for errors.
    None { why: String },
}

impl Codec {
    /// The codec of a model with `vocab` tokens whose checkpoint directory is `dir` (none for a
    /// random shape): its `tokenizer.json` when present, else the byte vocabulary when `vocab`
    /// is 256, else none.
    pub(crate) fn for_model(dir: Option<&Path>, vocab: usize) -> Result<Codec> {
        let path = dir.map(|d| d.join("tokenizer.json"));
        if let Some(path) = path.as_ref().filter(|p| p.is_file()) {
            let tok = Tokenizer::from_file(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            return Ok(Codec::Tokenizer(Box::new(tok)));
        }
        if vocab == BYTE_VOCAB {
            return Ok(Codec::Bytes);
        }
        let why = match path {
            Some(path) => format!(
                "--prompt needs a tokenizer, and {} does not exist (a model with a 256-token \
                 byte vocabulary needs none; use --prompt-ids)",
                path.display()
            ),
            None => "--prompt needs a model with a tokenizer.json or a byte vocabulary; the \
                     random 130M shape has neither (use --prompt-ids)"
                .to_string(),
        };
        Ok(Codec::None { why })
    }

    /// Whether tokens can be shown as text.
    pub(crate) fn is_text(&self) -> bool {
        !matches!(self, Codec::None { .. })
    }

    /// The token ids of `text` (not empty).
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let ids = match self {
            Codec::Tokenizer(tok) => tok
                .encode(text, true)
                .map_err(|e| anyhow!("encoding --prompt: {e}"))?
                .get_ids()
                .to_vec(),
            Codec::Bytes => bytes_to_ids(text.as_bytes()),
            Codec::None { why } => bail!("{why}"),
        };
        ensure!(!ids.is_empty(), "--prompt encodes to no tokens");
        Ok(ids)
    }

    /// The text of `ids`, or `None` without a codec. Bytes that are not UTF-8 show as U+FFFD.
    pub(crate) fn decode(&self, ids: &[u32]) -> Result<Option<String>> {
        Ok(match self {
            Codec::Tokenizer(tok) => Some(tok.decode(ids, false).map_err(|e| anyhow!("{e}"))?),
            Codec::Bytes => Some(ids_to_text(ids)),
            Codec::None { .. } => None,
        })
    }

    /// The text of `ids` that later tokens cannot change, for streaming: with bytes, all but a
    /// trailing incomplete UTF-8 sequence (which the next bytes may complete).
    pub(crate) fn decode_settled(&self, ids: &[u32]) -> Result<Option<String>> {
        match self {
            Codec::Bytes => {
                let bytes = ids_to_bytes(ids);
                Ok(Some(
                    String::from_utf8_lossy(&bytes[..settled_len(&bytes)]).into_owned(),
                ))
            }
            _ => self.decode(ids),
        }
    }
}

/// Bytes as token ids of the byte vocabulary.
pub(crate) fn bytes_to_ids(bytes: &[u8]) -> Vec<u32> {
    bytes.iter().map(|&b| u32::from(b)).collect()
}

/// Token ids of the byte vocabulary as bytes (an id above 255, which a 256-token model never
/// produces, becomes `?`).
fn ids_to_bytes(ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .map(|&t| u8::try_from(t).unwrap_or(b'?'))
        .collect()
}

/// The bytes of `ids` as text, invalid UTF-8 replaced by U+FFFD.
pub(crate) fn ids_to_text(ids: &[u32]) -> String {
    String::from_utf8_lossy(&ids_to_bytes(ids)).into_owned()
}

/// The length of `bytes` without a trailing incomplete UTF-8 sequence: invalid sequences
/// before it are settled (they stay U+FFFD whatever follows), the incomplete tail is not.
fn settled_len(bytes: &[u8]) -> usize {
    let mut start = 0;
    loop {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(_) => return bytes.len(),
            Err(e) => match e.error_len() {
                None => return start + e.valid_up_to(),
                Some(n) => start += e.valid_up_to() + n,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_settle() {
        let text = "fn é → ok";
        let ids = Codec::Bytes.encode(text).unwrap();
        assert_eq!(ids.len(), text.len());
        assert_eq!(ids[0], u32::from(b'f'));
        assert_eq!(ids_to_text(&ids), text);
        // "é" is two bytes: after its first, the settled text stops before it.
        let cut = "fn ".len() + 1;
        assert_eq!(
            Codec::Bytes.decode_settled(&ids[..cut]).unwrap().unwrap(),
            "fn "
        );
        assert_eq!(ids_to_text(&ids[..cut]), "fn \u{fffd}");
        // An invalid byte in the middle settles as U+FFFD.
        assert_eq!(settled_len(&[b'a', 0xff, b'b']), 3);
        assert_eq!(settled_len(&[b'a', 0xe2, 0x86]), 1);
        assert_eq!(ids_to_text(&[104, 105, 0xff]), "hi\u{fffd}");
    }
}
