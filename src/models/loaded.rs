//! [`Model`]: a checkpoint of any family as a service holds it: the model on the device, its
//! text (tokenizer or bytes) and its end-of-sequence token; text in and out, state continued
//! in memory, and the log-probabilities of chosen tokens.

use std::path::Path;

use serde_json::Value;

use super::common::json::strict_json;
use super::common::{GenerateOptions, ModelState};
use super::family::{self, CausalLm};
use super::text::Text;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::Client;

/// A loaded checkpoint of any family: [`CausalLm`] with the checkpoint's text and `eos`.
/// `Send + Sync`: share it between threads behind an `Arc`.
///
/// ```
/// use std::sync::Arc;
/// use stablegraph::models::{GenerateOptions, Model};
/// use stablegraph::runtime::Client;
/// use stablegraph::DType;
///
/// fn main() -> stablegraph::Result<()> {
///     // Any family's checkpoint directory (here the shipped byte-level Mamba-2).
///     let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/models/mamba2-bytes");
///     let model = Arc::new(Model::load(&Client::cpu()?, dir.as_ref(), DType::F32)?);
///     // Two threads share it, each sampling with its own seed.
///     let threads: Vec<_> = ["fn main() {", "let x = "]
///         .into_iter()
///         .map(|prompt| {
///             let model = Arc::clone(&model);
///             let options = GenerateOptions::sampled(16, 0.8, 40, 0.95, 7);
///             std::thread::spawn(move || model.complete(prompt, &options, None))
///         })
///         .collect();
///     for t in threads {
///         let reply = t.join().expect("a thread panicked")?;
///         assert_eq!(reply.tokens.len(), 16);
///     }
///     // A conversation turn by turn, the state kept in memory between calls.
///     let greedy = model.options(8);
///     let first = model.complete("fn add(a: i32, b: i32)", &greedy, None)?;
///     let second = model.complete(" -> i32 {", &greedy, Some(first.state))?;
///     println!("{}", second.text);
///     // The chosen tokens' log-probabilities, and the 3 likeliest tokens at each step.
///     let prompt = model.encode("fn add(a: i32, b: i32)")?;
///     let scored = model.logprobs(&prompt, &first.tokens, 3)?;
///     assert_eq!(scored.len(), first.tokens.len());
///     assert!(scored.iter().all(|t| t.logprob <= 0.0 && t.top.len() == 3));
///     // Greedy tokens are the likeliest.
///     assert!(scored.iter().all(|t| t.top[0].0 == t.token));
///     Ok(())
/// }
/// ```
pub struct Model {
    lm: Box<dyn CausalLm>,
    text: Option<Text>,
    eos: Option<u32>,
}

/// What [`Model::complete`] returns.
#[derive(Debug)]
pub struct Completion {
    /// The new tokens, up to and including `eos` when the row stopped there.
    pub tokens: Vec<u32>,
    /// Their text (without `eos`).
    pub text: String,
    /// Whether the row stopped at `eos`.
    pub stopped: bool,
    /// The state after the prompt and every token, to continue from.
    pub state: ModelState,
}

/// A chosen token's log-probability under the model (its logits' log-softmax).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its natural log-probability.
    pub logprob: f64,
    /// The likeliest tokens at its position and theirs, most likely first.
    pub top: Vec<(u32, f64)>,
}

impl Model {
    /// Loads the checkpoint in `dir` (of any family `family::load` reads) with matrices in
    /// `matmul_dtype` (f32, bf16, or u8 for 8 bits), its `tokenizer.json` (or bytes for a
    /// 256-token vocabulary) and its `eos_token_id` (generation_config.json's, else
    /// config.json's; the first of a list).
    pub fn load(client: &Client, dir: &Path, matmul_dtype: DType) -> Result<Model> {
        let lm = family::load(client, dir, matmul_dtype)?;
        let text = Text::for_checkpoint(dir, lm.vocab_size())?;
        let eos = eos_token(dir)?.filter(|&e| (e as usize) < lm.vocab_size());
        Ok(Model { lm, text, eos })
    }

    /// The model, for everything [`CausalLm`] offers.
    pub fn lm(&self) -> &dyn CausalLm {
        self.lm.as_ref()
    }

    /// The checkpoint's end-of-sequence token, if it names one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Greedy options of `max_new_tokens` stopping at the checkpoint's `eos`.
    pub fn options(&self, max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions::greedy(max_new_tokens).with_eos(self.eos)
    }

    /// The checkpoint's text, if it has one (a tokenizer, or bytes).
    pub fn text(&self) -> Option<&Text> {
        self.text.as_ref()
    }

    /// The tokens of `text`; an error when the checkpoint has no tokenizer and its vocabulary
    /// is not bytes.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.need_text()?.encode(text)
    }

    /// The text of `tokens`.
    pub fn decode(&self, tokens: &[u32]) -> Result<String> {
        self.need_text()?.decode(tokens)
    }

    fn need_text(&self) -> Result<&Text> {
        self.text.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "this {} checkpoint has no tokenizer.json and its vocabulary ({} tokens) is not \
                 bytes: use token ids",
                self.lm.family(),
                self.lm.vocab_size()
            ))
        })
    }

    /// Continues `prompt` (after `state`, when given) as `options` say, in one program: the
    /// new tokens cut at `eos`, their text, and the state after them.
    pub fn complete(
        &self,
        prompt: &str,
        options: &GenerateOptions,
        state: Option<ModelState>,
    ) -> Result<Completion> {
        let ids = self.encode(prompt)?;
        let (rows, state) = self.lm.generate_from(&[ids], state, options)?;
        // The face has cut the row at its end.
        let tokens = rows.into_iter().next().unwrap_or_default();
        let end = options
            .eos
            .and_then(|e| tokens.iter().position(|&t| t == e));
        let shown = &tokens[..end.unwrap_or(tokens.len())];
        Ok(Completion {
            text: self.decode(shown)?,
            stopped: end.is_some(),
            tokens,
            state,
        })
    }

    /// The log-probability of each of `tokens` after `prompt` and the tokens before it (the
    /// model's logits, teacher-forced in one prefill), with the `top` likeliest tokens at each
    /// position.
    pub fn logprobs(
        &self,
        prompt: &[u32],
        tokens: &[u32],
        top: usize,
    ) -> Result<Vec<TokenLogprob>> {
        if prompt.is_empty() {
            return Err(Error::InvalidArgument(
                "logprobs: the prompt is empty".into(),
            ));
        }
        let all: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
        let logits = self.lm.prefill_logits(&[all])?.to_f64_vec();
        let vocab = self.lm.vocab_size();
        Ok(tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| {
                let at = prompt.len() - 1 + i;
                let row = &logits[at * vocab..(at + 1) * vocab];
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                let mut order: Vec<usize> = (0..vocab).collect();
                order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                TokenLogprob {
                    token,
                    logprob: row
                        .get(token as usize)
                        .map_or(f64::NEG_INFINITY, |x| x - lse),
                    top: order
                        .into_iter()
                        .take(top)
                        .map(|t| (t as u32, row[t] - lse))
                        .collect(),
                }
            })
            .collect())
    }
}

/// The checkpoint's `eos_token_id`: generation_config.json's, else config.json's (one id, or
/// the first of a list); `None` when neither names one.
fn eos_token(dir: &Path) -> Result<Option<u32>> {
    for file in ["generation_config.json", "config.json"] {
        let path = dir.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let v: Value = serde_json::from_str(&strict_json(&text))
            .map_err(|e| Error::InvalidArgument(format!("{}: not JSON: {e}", path.display())))?;
        let id = match v.get("eos_token_id") {
            Some(Value::Array(ids)) => ids.first().and_then(Value::as_u64),
            Some(id) => id.as_u64(),
            None => None,
        };
        if let Some(id) = id {
            return Ok(u32::try_from(id).ok());
        }
    }
    Ok(None)
}
