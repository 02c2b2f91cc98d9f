//! [`Text`]: how a checkpoint's tokens relate to text: its `tokenizer.json` (with the
//! `tokenizers` feature, on by default), or the byte vocabulary of a 256-token model without
//! one (token `b` is the byte `b`).

use std::path::Path;

use crate::error::{Error, Result};

/// The size of the byte vocabulary: one token per byte value.
pub const BYTE_VOCAB: usize = 256;

/// Text to tokens and back for one checkpoint.
pub enum Text {
    /// The checkpoint's `tokenizer.json`.
    #[cfg(feature = "tokenizers")]
    Tokenizer(Box<tokenizers::Tokenizer>),
    /// Token `b` is the byte `b` (a 256-token vocabulary without a tokenizer).
    Bytes,
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            #[cfg(feature = "tokenizers")]
            Text::Tokenizer(_) => f.write_str("Text::Tokenizer"),
            Text::Bytes => f.write_str("Text::Bytes"),
        }
    }
}

impl Text {
    /// The text of the checkpoint in `dir` with a vocabulary of `vocab` tokens: its
    /// `tokenizer.json` when present, else bytes when `vocab` is 256, else `None`. An
    /// unreadable tokenizer is an error naming the file.
    pub fn for_checkpoint(dir: &Path, vocab: usize) -> Result<Option<Text>> {
        let path = dir.join("tokenizer.json");
        if path.is_file() {
            return read_tokenizer(&path).map(Some);
        }
        Ok((vocab == BYTE_VOCAB).then_some(Text::Bytes))
    }

    /// The token ids of `text` (not empty), with the special tokens the tokenizer adds (a
    /// beginning-of-sequence token, say).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// The token ids of `text` as it is, no special tokens added (not empty): for text that
    /// holds its own, such as a rendered chat template.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, false)
    }

    fn encode_with(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let _ = special; // bytes have no special tokens
        let ids: Vec<u32> = match self {
            #[cfg(feature = "tokenizers")]
            Text::Tokenizer(tok) => tok
                .encode(text, special)
                .map_err(|e| Error::InvalidArgument(format!("encoding the text: {e}")))?
                .get_ids()
                .to_vec(),
            Text::Bytes => text.bytes().map(u32::from).collect(),
        };
        if ids.is_empty() {
            return Err(Error::InvalidArgument(
                "the text encodes to no tokens".into(),
            ));
        }
        Ok(ids)
    }

    /// The text of `ids`; bytes that are not UTF-8 show as U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            #[cfg(feature = "tokenizers")]
            Text::Tokenizer(tok) => tok
                .decode(ids, false)
                .map_err(|e| Error::InvalidArgument(format!("decoding tokens: {e}"))),
            Text::Bytes => Ok(String::from_utf8_lossy(&ids_to_bytes(ids)).into_owned()),
        }
    }

    /// The text of `ids` that later tokens cannot change, for streaming: with bytes, all but
    /// a trailing incomplete UTF-8 sequence (which the next bytes may complete); with a
    /// tokenizer, all but trailing U+FFFD characters (a byte-level tokenizer shows the first
    /// bytes of a character split over tokens so, until the rest arrives).
    pub fn decode_settled(&self, ids: &[u32]) -> Result<String> {
        match self {
            Text::Bytes => {
                let bytes = ids_to_bytes(ids);
                Ok(String::from_utf8_lossy(&bytes[..settled_len(&bytes)]).into_owned())
            }
            #[cfg(feature = "tokenizers")]
            _ => {
                let text = self.decode(ids)?;
                Ok(text.trim_end_matches('\u{FFFD}').to_string())
            }
        }
    }
}

/// The tokenizer in `path`.
#[cfg(feature = "tokenizers")]
fn read_tokenizer(path: &Path) -> Result<Text> {
    let tok = tokenizers::Tokenizer::from_file(path)
        .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))?;
    Ok(Text::Tokenizer(Box::new(tok)))
}

/// Without the `tokenizers` feature, a tokenizer is an error naming the feature.
#[cfg(not(feature = "tokenizers"))]
fn read_tokenizer(path: &Path) -> Result<Text> {
    Err(Error::InvalidArgument(format!(
        "{}: reading a tokenizer needs stablegraph's `tokenizers` feature",
        path.display()
    )))
}

/// Token ids of the byte vocabulary as bytes (an id above 255, which a 256-token model never
/// produces, becomes `?`).
fn ids_to_bytes(ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .map(|&t| u8::try_from(t).unwrap_or(b'?'))
        .collect()
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
        let ids = Text::Bytes.encode(text).unwrap();
        assert_eq!(ids.len(), text.len());
        assert_eq!(ids[0], u32::from(b'f'));
        assert_eq!(Text::Bytes.decode(&ids).unwrap(), text);
        // "é" is two bytes: after its first, the settled text stops before it.
        let cut = "fn ".len() + 1;
        assert_eq!(Text::Bytes.decode_settled(&ids[..cut]).unwrap(), "fn ");
        assert_eq!(Text::Bytes.decode(&ids[..cut]).unwrap(), "fn \u{fffd}");
        // An invalid byte in the middle settles as U+FFFD.
        assert_eq!(settled_len(&[b'a', 0xff, b'b']), 3);
        assert_eq!(settled_len(&[b'a', 0xe2, 0x86]), 1);
        assert_eq!(Text::Bytes.decode(&[104, 105, 0xff]).unwrap(), "hi\u{fffd}");
    }

    /// A byte-level BPE tokenizer whose tokens are single bytes: `a` (0), and the two bytes of
    /// "é" (0xC3 as `Ã`, 0xA9 as `©` in byte-level's alphabet).
    #[cfg(feature = "tokenizers")]
    fn byte_level() -> Text {
        let level = serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
        });
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "post_processor": null,
            "pre_tokenizer": level, "decoder": level,
            "model": {"type": "BPE", "vocab": {"a": 0, "\u{c3}": 1, "\u{a9}": 2}, "merges": []},
        });
        let tok = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap();
        Text::Tokenizer(Box::new(tok))
    }

    #[cfg(feature = "tokenizers")]
    #[test]
    fn a_character_split_over_tokens_settles_once_whole() {
        let t = byte_level();
        assert_eq!(t.decode(&[0, 1, 2]).unwrap(), "a\u{e9}");
        // After the first byte of "é" the tokenizer shows U+FFFD, which is not settled yet.
        assert_eq!(t.decode(&[0, 1]).unwrap(), "a\u{fffd}");
        assert_eq!(t.decode_settled(&[0, 1]).unwrap(), "a");
        assert_eq!(t.decode_settled(&[0, 1, 2, 0]).unwrap(), "a\u{e9}a");
    }
}
