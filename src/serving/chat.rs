//! Chat templates: a checkpoint's own Jinja template (`chat_template` in its
//! `tokenizer_config.json`, or its `chat_template.jinja`) rendered as transformers'
//! `apply_chat_template` renders it: blocks trimmed, Python's string and dict methods (which
//! published templates call), `raise_exception`, `strftime_now`, and the checkpoint's special
//! tokens (`bos_token`, `eos_token`, ...) as variables.

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::{Environment, ErrorKind, Value};
use serde_json::Value as Json;

use crate::error::{Error, Result};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Its text (text parts joined by newlines).
    pub content: String,
}

/// A compiled chat template and the special tokens it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    special: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("special", &self.special)
            .finish()
    }
}

/// The special tokens a template sees as variables, from `tokenizer_config.json`.
const SPECIAL: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

impl ChatTemplate {
    /// Compiles `source` with `special` tokens (name, text) as variables. A template that
    /// does not parse is an error quoting the parser.
    pub fn new(source: &str, special: &[(&str, &str)]) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        // transformers' Jinja environment trims blocks.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| {
                Error::InvalidArgument(format!("the chat template does not parse: {e}"))
            })?;
        let special = special
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(ChatTemplate { env, special })
    }

    /// The template of the checkpoint in `dir`: `chat_template` in its `tokenizer_config.json`
    /// (a string, or a list of named templates: the one named `default`), else its
    /// `chat_template.jinja`; `None` when it has neither. Its special tokens come from
    /// `tokenizer_config.json`. An unreadable file or a template that does not parse is an
    /// error naming the file.
    pub fn for_checkpoint(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                Error::InvalidArgument(format!("{}: not JSON: {e}", config_path.display()))
            })?,
            Err(_) => Json::Null,
        };
        let named = |v: &Json| match v {
            Json::String(s) => Some(s.clone()),
            Json::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .or(list.first())
                .and_then(|t| t["template"].as_str())
                .map(str::to_string),
            _ => None,
        };
        let file = dir.join("chat_template.jinja");
        let (source, origin) = match named(&config["chat_template"]) {
            Some(s) => (s, config_path),
            None if file.is_file() => {
                let s = std::fs::read_to_string(&file)
                    .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
                (s, file)
            }
            None => return Ok(None),
        };
        let special: Vec<(&str, String)> = SPECIAL
            .iter()
            .filter_map(|&k| {
                let v = &config[k];
                let text = v.as_str().or_else(|| v["content"].as_str())?;
                Some((k, text.to_string()))
            })
            .collect();
        let special: Vec<(&str, &str)> = special.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ChatTemplate::new(&source, &special)
            .map(Some)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", origin.display())))
    }

    /// The conversation as the template renders it, with the assistant's turn opened when
    /// `add_generation_prompt`. A template error (`raise_exception` included) is an error
    /// quoting it.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<BTreeMap<&str, &str>> = messages
            .iter()
            .map(|m| BTreeMap::from([("role", m.role.as_str()), ("content", m.content.as_str())]))
            .collect();
        let mut ctx: BTreeMap<&str, Value> = self
            .special
            .iter()
            .map(|(k, v)| (k.as_str(), Value::from(v.as_str())))
            .collect();
        ctx.insert("messages", Value::from_serialize(&messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| Error::InvalidArgument(format!("the chat template: {e}")))?;
        template.render(ctx).map_err(|e| {
            Error::InvalidArgument(format!("the chat template failed: {}", detail(&e)))
        })
    }
}

/// An error's message with its causes (a `raise_exception` message is the detail).
fn detail(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(d) if e.kind() == ErrorKind::InvalidOperation => d.to_string(),
        _ => e.to_string(),
    }
}

/// Today's date (UTC) in `format`'s `%d %m %Y %y %b %B %H %M %S %%` (the ones templates use);
/// other directives are kept as written.
fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_date((secs / 86_400) as i64);
    let (hh, mm, ss) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The (year, month, day) of a day counted from 1970-01-01 (the proleptic Gregorian
/// calendar's civil-from-days formula).
fn civil_date(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<Message> {
        pairs
            .iter()
            .map(|(r, c)| Message {
                role: r.to_string(),
                content: c.to_string(),
            })
            .collect()
    }

    #[test]
    fn a_template_renders_with_python_methods_and_special_tokens() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content.strip() }}\n\
             {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
            &[("bos_token", "<s>")],
        )
        .unwrap();
        let m = msgs(&[("system", " be brief "), ("user", "hi")]);
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<s><|system|>be brief\n<|user|>hi\n<|assistant|>"
        );
        assert_eq!(
            t.render(&m, false).unwrap(),
            "<s><|system|>be brief\n<|user|>hi\n"
        );
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
            &[],
        )
        .unwrap();
        let e = t.render(&msgs(&[("assistant", "x")]), true).unwrap_err();
        assert!(e.to_string().contains("first must be user"), "{e}");
        let e = ChatTemplate::new("{% for %}", &[]).unwrap_err();
        assert!(e.to_string().contains("does not parse"), "{e}");
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(19_782), (2024, 2, 29));
        assert_eq!(civil_date(20_793), (2026, 12, 6));
    }
}
