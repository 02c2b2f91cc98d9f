//! The wire format of OpenAI's completions and chat completions APIs, for servers built on
//! the [`super::Scheduler`]: a request body read into a [`Completion`] or a [`ChatCompletion`]
//! (every field's type and range checked, with an error that names it and the HTTP status to
//! answer), and the JSON of replies, stream chunks and errors. No HTTP here: the `serve`
//! subcommand of the example CLI puts it on a socket.

mod parse;
mod reply;

pub use parse::{
    parse_chat, parse_completion, ChatCompletion, Completion, Generation, Prompt, MAX_TOP_LOGPROBS,
};
pub use reply::{Choice, ReplyHead, TokenLogprob, Usage};

use serde_json::{json, Value};

/// An API error: its HTTP status, OpenAI's `type`, and a message naming what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status to answer with (4xx for the request's faults).
    pub status: u16,
    /// OpenAI's error `type` (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// What was wrong, naming the field.
    pub message: String,
    /// The field at fault, when one is.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: String) -> ApiError {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            message,
            param: Some(param.to_string()),
        }
    }

    /// Another status, about no field.
    pub fn status(status: u16, kind: &'static str, message: String) -> ApiError {
        ApiError {
            status,
            kind,
            message,
            param: None,
        }
    }

    /// OpenAI's error body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": Value::Null,
        }})
    }
}
