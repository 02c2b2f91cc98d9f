//! transformers' `generation_config.json`: the generation defaults a checkpoint ships with.

use std::path::Path;

use serde_json::{Map, Value};

use super::{Penalties, Sampling};
use crate::error::{Error, Result};

/// The settings of a `generation_config.json` that this crate uses, each `None` where the file
/// does not set it (or sets it to `null`). Other keys (beam search, lengths, ...) are ignored.
///
/// The transformers keys are `do_sample`, `temperature`, `top_k`, `top_p`,
/// `repetition_penalty` and `no_repeat_ngram_size`. Three more keys are this crate's (llama.cpp's
/// and OpenAI's settings; transformers keeps unknown keys and ignores them): `presence_penalty`,
/// `frequency_penalty` and `repeat_last_n` (-1: the whole context).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// Whether to sample (else greedy).
    pub do_sample: Option<bool>,
    /// Sampling temperature (finite, >= 0; 0 is greedy).
    pub temperature: Option<f32>,
    /// Top-k cut (0: none).
    pub top_k: Option<usize>,
    /// Nucleus threshold, in (0, 1].
    pub top_p: Option<f32>,
    /// [`Penalties::repetition_penalty`].
    pub repetition_penalty: Option<f32>,
    /// [`Penalties::no_repeat_ngram_size`].
    pub no_repeat_ngram_size: Option<usize>,
    /// [`Penalties::presence_penalty`].
    pub presence_penalty: Option<f32>,
    /// [`Penalties::frequency_penalty`].
    pub frequency_penalty: Option<f32>,
    /// [`Penalties::repeat_last_n`]: `Some(None)` for the whole context (-1 in the file).
    pub repeat_last_n: Option<Option<usize>>,
    /// `eos_token_id`: the tokens that end a reply (one id or a list; a chat model's end of
    /// turn among them).
    pub eos_token_id: Option<Vec<u32>>,
}

impl GenerationConfig {
    /// Reads a `generation_config.json`. A file that is not a JSON object, or a key this crate
    /// uses with a value of the wrong type or out of range, is an error naming the file and
    /// the key.
    pub fn from_file(path: impl AsRef<Path>) -> Result<GenerationConfig> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        GenerationConfig::from_json(&text)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))
    }

    /// Parses the text of a `generation_config.json` (see [`GenerationConfig::from_file`]).
    pub fn from_json(text: &str) -> Result<GenerationConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("generation config is not JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| {
            Error::InvalidArgument("generation config is not a JSON object".into())
        })?;
        let keys = Keys(obj);
        let config = GenerationConfig {
            do_sample: keys.bool("do_sample")?,
            temperature: keys.float("temperature", "a finite number >= 0", |t| t >= 0.0)?,
            top_k: keys.count("top_k")?,
            top_p: keys.float("top_p", "a number in (0, 1]", |p| p > 0.0 && p <= 1.0)?,
            repetition_penalty: keys
                .float("repetition_penalty", "a finite number > 0", |r| r > 0.0)?,
            no_repeat_ngram_size: keys.count("no_repeat_ngram_size")?,
            presence_penalty: keys.float("presence_penalty", "a finite number", |_| true)?,
            frequency_penalty: keys.float("frequency_penalty", "a finite number", |_| true)?,
            repeat_last_n: keys.window("repeat_last_n")?,
            eos_token_id: keys.ids("eos_token_id")?,
        };
        config.penalties().check()?;
        Ok(config)
    }

    /// How the file says to pick tokens: sampling when `do_sample` is true and the temperature
    /// is not 0 (temperature 1, no top-k and no top-p cut where the file does not say; unlike
    /// transformers, whose top-k defaults to 50), else greedy. A top-k above `vocab` is
    /// `vocab` (as in transformers). `seed` is the sampling seed.
    pub fn sampling(&self, seed: u64, vocab: usize) -> Sampling {
        let temperature = self.temperature.unwrap_or(1.0);
        if self.do_sample != Some(true) || temperature == 0.0 {
            return Sampling::Greedy;
        }
        Sampling::Sample {
            temperature,
            top_k: self.top_k.unwrap_or(0).min(vocab),
            top_p: self.top_p.unwrap_or(1.0),
            seed,
        }
    }

    /// The file's penalties, [`Penalties::NONE`]'s values where it sets none.
    pub fn penalties(&self) -> Penalties {
        let none = Penalties::NONE;
        Penalties {
            repetition_penalty: self.repetition_penalty.unwrap_or(none.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(none.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(none.frequency_penalty),
            repeat_last_n: self.repeat_last_n.unwrap_or(none.repeat_last_n),
            no_repeat_ngram_size: self
                .no_repeat_ngram_size
                .unwrap_or(none.no_repeat_ngram_size),
        }
    }
}

/// Typed reads of a config's keys: absent or `null` is `None`, a wrong type or range an error
/// naming the key.
struct Keys<'a>(&'a Map<String, Value>);

impl Keys<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn bad<T>(key: &str, want: &str, v: &Value) -> Result<T> {
        Err(Error::InvalidArgument(format!(
            "generation config key `{key}` is {v}, expected {want}"
        )))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Keys::bad(key, "true or false", v),
        }
    }

    fn float(&self, key: &str, want: &str, ok: impl Fn(f32) -> bool) -> Result<Option<f32>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v.as_f64().map(|x| x as f32) {
            Some(x) if x.is_finite() && ok(x) => Ok(Some(x)),
            _ => Keys::bad(key, want, v),
        }
    }

    fn count(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => Keys::bad(key, "an integer >= 0", v),
        }
    }

    fn ids(&self, key: &str) -> Result<Option<Vec<u32>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        let ids = match v {
            Value::Array(items) => items.iter().map(id).collect::<Option<Vec<u32>>>(),
            one => id(one).map(|i| vec![i]),
        };
        match ids {
            Some(ids) => Ok(Some(ids)),
            None => Keys::bad(key, "a token id or a list of token ids", v),
        }
    }

    fn window(&self, key: &str) -> Result<Option<Option<usize>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        if v.as_i64() == Some(-1) {
            return Ok(Some(None));
        }
        match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Ok(Some(Some(n))),
            None => Keys::bad(key, "an integer >= -1 (-1: the whole context)", v),
        }
    }
}
