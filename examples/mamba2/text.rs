//! Text in and out: the library's [`Text`] (a checkpoint's `tokenizer.json`, or the byte
//! vocabulary of a model with 256 tokens and no tokenizer), or none (token ids only), with the
//! flag to use instead in the message.

use std::path::Path;

use anyhow::{bail, Result};
pub(crate) use stablegraph::models::text::BYTE_VOCAB;
use stablegraph::models::Text;

/// How a model's tokens relate to text.
pub(crate) enum Codec {
    /// The checkpoint's tokenizer or byte vocabulary.
    Text(Text),
    /// No text: token ids only. `why` says what is missing, for errors.
    None { why: String },
}

impl Codec {
    /// The codec of a model with `vocab` tokens whose checkpoint directory is `dir` (none for a
    /// random shape): its `tokenizer.json` when present, else the byte vocabulary when `vocab`
    /// is 256, else none.
    pub(crate) fn for_model(dir: Option<&Path>, vocab: usize) -> Result<Codec> {
        let text = match dir {
            Some(dir) => Text::for_checkpoint(dir, vocab)?,
            None => (vocab == BYTE_VOCAB).then_some(Text::Bytes),
        };
        if let Some(text) = text {
            return Ok(Codec::Text(text));
        }
        let why = match dir {
            Some(dir) => format!(
                "--prompt needs a tokenizer, and {} does not exist (a model with a 256-token \
                 byte vocabulary needs none; use --prompt-ids)",
                dir.join("tokenizer.json").display()
            ),
            None => "--prompt needs a model with a tokenizer.json or a byte vocabulary; the \
                     random 130M shape has neither (use --prompt-ids)"
                .to_string(),
        };
        Ok(Codec::None { why })
    }

    /// Whether tokens can be shown as text.
    pub(crate) fn is_text(&self) -> bool {
        matches!(self, Codec::Text(_))
    }

    /// Whether tokens are bytes.
    pub(crate) fn is_bytes(&self) -> bool {
        matches!(self, Codec::Text(Text::Bytes))
    }

    /// The token ids of `text` (not empty).
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Codec::Text(t) => Ok(t.encode(text)?),
            Codec::None { why } => bail!("{why}"),
        }
    }

    /// The token ids of `text` as it is, no special tokens added (a rendered chat template).
    pub(crate) fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Codec::Text(t) => Ok(t.encode_plain(text)?),
            Codec::None { why } => bail!("{why}"),
        }
    }

    /// The text of `ids`, or `None` without a codec. Bytes that are not UTF-8 show as U+FFFD.
    pub(crate) fn decode(&self, ids: &[u32]) -> Result<Option<String>> {
        match self {
            Codec::Text(t) => Ok(Some(t.decode(ids)?)),
            Codec::None { .. } => Ok(None),
        }
    }

    /// The text of `ids` that later tokens cannot change, for streaming (see
    /// [`Text::decode_settled`]).
    pub(crate) fn decode_settled(&self, ids: &[u32]) -> Result<Option<String>> {
        match self {
            Codec::Text(t) => Ok(Some(t.decode_settled(ids)?)),
            Codec::None { .. } => Ok(None),
        }
    }
}

/// Bytes as token ids of the byte vocabulary.
pub(crate) fn bytes_to_ids(bytes: &[u8]) -> Vec<u32> {
    bytes.iter().map(|&b| u32::from(b)).collect()
}
