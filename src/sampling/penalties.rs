//! Penalties on tokens the context already holds, applied to the logits on the device before
//! the token is picked (greedy or sampled; before the temperature, as in transformers).
//!
//! The context is the prompt and the tokens generated so far (left padding is no token). In
//! this order, for each row:
//!
//! 1. **`repetition_penalty`** (transformers' `repetition_penalty`, llama.cpp's
//!    `repeat_penalty`, after CTRL): the logit `x` of a token that occurs in the window becomes
//!    `x / p` when `x >= 0` and `x * p` when `x < 0`.
//! 2. **`frequency_penalty` and `presence_penalty`** (OpenAI's and llama.cpp's): `x -= c * f +
//!    (c > 0) * q`, where `c` is how often the token occurs in the window.
//! 3. **`no_repeat_ngram_size`** `n` (transformers'): a token that would complete an n-gram the
//!    context already holds gets `-inf`: with `s` the context's last `n - 1` tokens, every token
//!    that follows an occurrence of `s` in the context is banned (for `n = 1`, every token of the
//!    context). A row whose every token would be banned keeps its logits unbanned.
//!
//! The window of 1 and 2 is llama.cpp's `repeat_last_n`: the last `N` tokens of the context, or
//! all of it (`None`); a window of 0 tokens holds none, so those penalties do nothing. The
//! n-gram ban always looks at the whole context.
//!
//! Every setting is a `[batch]` runtime input of the program, and the context is carried on the
//! device as a [`TokenHistory`]: the tokens by position, and for each position the length of
//! the longest common suffix of the context before it and the whole context, which one step
//! updates in O(width) (shifted by one, plus one where the new token follows, else 0). The
//! counts come from one scatter-add over the history per step, the bans from another: each step
//! costs O(width + vocab), independent of `n`.

use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{Carry, Graph, Tensor};

/// The penalties of one generation (every row alike). [`Penalties::default`] is off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// Divides a positive logit, multiplies a negative one, of each token in the window (> 0,
    /// finite; 1: off; above 1 discourages repeats).
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of each token in the window (finite; 0: off).
    pub presence_penalty: f32,
    /// Subtracted from the logit of each token in the window once per occurrence (finite; 0:
    /// off).
    pub frequency_penalty: f32,
    /// The window of the three penalties above: the last `n` tokens of the context (`Some(0)`:
    /// none, so they do nothing), or the whole context (`None`).
    pub repeat_last_n: Option<usize>,
    /// Bans every token that would complete an n-gram of this size that the context already
    /// holds (0: off; at most [`MAX_NO_REPEAT_NGRAM_SIZE`]).
    pub no_repeat_ngram_size: usize,
}

/// The largest [`Penalties::no_repeat_ngram_size`] (2^24, as many tokens as one `generate`
/// call makes; a longer n-gram than the context bans nothing).
pub const MAX_NO_REPEAT_NGRAM_SIZE: usize = 1 << 24;

impl Default for Penalties {
    fn default() -> Penalties {
        Penalties::NONE
    }
}

impl Penalties {
    /// No penalty.
    pub const NONE: Penalties = Penalties {
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        repeat_last_n: None,
        no_repeat_ngram_size: 0,
    };

    /// Whether no penalty changes any logit (the window alone changes nothing): programs then
    /// carry no penalty work at all.
    pub fn is_off(&self) -> bool {
        self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && self.no_repeat_ngram_size == 0
    }

    /// Checks the settings: `repetition_penalty` finite and > 0, the other two finite,
    /// `no_repeat_ngram_size` at most [`MAX_NO_REPEAT_NGRAM_SIZE`]. The error names the setting
    /// (as `penalties.<name>`).
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("penalties.{what}")));
        let r = self.repetition_penalty;
        if !(r > 0.0 && r.is_finite()) {
            return bad(format!(
                "repetition_penalty ({r}) is not a finite number > 0"
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() {
                return bad(format!("{name} ({v}) is not a finite number"));
            }
        }
        let n = self.no_repeat_ngram_size;
        if n > MAX_NO_REPEAT_NGRAM_SIZE {
            return bad(format!(
                "no_repeat_ngram_size ({n}) is more than {MAX_NO_REPEAT_NGRAM_SIZE}"
            ));
        }
        Ok(())
    }
}

/// Per-row penalty settings as tensors of a program, each of shape `[batch]`.
#[derive(Debug, Clone)]
pub struct PenaltySettings {
    /// [`Penalties::repetition_penalty`], f32.
    pub repetition_penalty: Tensor,
    /// [`Penalties::presence_penalty`], f32.
    pub presence_penalty: Tensor,
    /// [`Penalties::frequency_penalty`], f32.
    pub frequency_penalty: Tensor,
    /// [`Penalties::repeat_last_n`], i32 (the whole context: `i32::MAX`).
    pub repeat_last_n: Tensor,
    /// [`Penalties::no_repeat_ngram_size`], i32 (0: off).
    pub no_repeat_ngram_size: Tensor,
}

/// The parameter names and dtypes of [`PenaltySettings`], in order.
const SETTINGS: [(&str, DType); 5] = [
    ("repetition_penalty", DType::F32),
    ("presence_penalty", DType::F32),
    ("frequency_penalty", DType::F32),
    ("repeat_last_n", DType::I32),
    ("no_repeat_ngram_size", DType::I32),
];

impl PenaltySettings {
    /// Declares the settings as parameters of `g`, each `[batch]`, in the order of the fields
    /// (the names are the fields').
    pub fn parameters(g: &Graph, batch: usize) -> Result<PenaltySettings> {
        let p = |i: usize| g.parameter(SETTINGS[i].0, SETTINGS[i].1, &[batch]);
        Ok(PenaltySettings {
            repetition_penalty: p(0)?,
            presence_penalty: p(1)?,
            frequency_penalty: p(2)?,
            repeat_last_n: p(3)?,
            no_repeat_ngram_size: p(4)?,
        })
    }

    /// The values for [`PenaltySettings::parameters`]: `penalties` (checked) for each of
    /// `batch` rows, paired with the parameter names. A window longer than `i32::MAX` is the
    /// whole context.
    pub fn host_values(
        penalties: &Penalties,
        batch: usize,
    ) -> Result<[(&'static str, HostArray); 5]> {
        penalties.check()?;
        let f = |v: f32| HostArray::from_vec(&[batch], vec![v; batch]);
        let i =
            |v: usize| HostArray::from_vec(&[batch], vec![v.min(i32::MAX as usize) as i32; batch]);
        let window = penalties.repeat_last_n.unwrap_or(usize::MAX);
        Ok([
            (SETTINGS[0].0, f(penalties.repetition_penalty)?),
            (SETTINGS[1].0, f(penalties.presence_penalty)?),
            (SETTINGS[2].0, f(penalties.frequency_penalty)?),
            (SETTINGS[3].0, i(window)?),
            (SETTINGS[4].0, i(penalties.no_repeat_ngram_size)?),
        ])
    }

    /// [`PenaltySettings::host_values`] with each row's own `penalties` (checked).
    pub fn row_host_values(penalties: &[Penalties]) -> Result<[(&'static str, HostArray); 5]> {
        for p in penalties {
            p.check()?;
        }
        let b = penalties.len();
        let f = |get: fn(&Penalties) -> f32| {
            HostArray::from_vec(&[b], penalties.iter().map(get).collect::<Vec<f32>>())
        };
        let i = |get: fn(&Penalties) -> usize| {
            let v = penalties
                .iter()
                .map(|p| get(p).min(i32::MAX as usize) as i32);
            HostArray::from_vec(&[b], v.collect::<Vec<i32>>())
        };
        Ok([
            (SETTINGS[0].0, f(|p| p.repetition_penalty)?),
            (SETTINGS[1].0, f(|p| p.presence_penalty)?),
            (SETTINGS[2].0, f(|p| p.frequency_penalty)?),
            (SETTINGS[3].0, i(|p| p.repeat_last_n.unwrap_or(usize::MAX))?),
            (SETTINGS[4].0, i(|p| p.no_repeat_ngram_size)?),
        ])
    }

    fn check(&self, batch: usize) -> Result<()> {
        let all = [
            &self.repetition_penalty,
            &self.presence_penalty,
            &self.frequency_penalty,
            &self.repeat_last_n,
            &self.no_repeat_ngram_size,
        ];
        for ((name, dtype), t) in SETTINGS.iter().zip(all) {
            if t.dtype() != *dtype || t.dims() != [batch] {
                return Err(Error::InvalidArgument(format!(
                    "penalize: settings.{name} is {}, expected {dtype}[{batch}]",
                    t.ty()
                )));
            }
        }
        Ok(())
    }
}

/// The context of each row on the device, as the penalties read it. Positions are shared by
/// the rows (prompts are left-padded to a common width).
#[derive(Debug, Clone)]
pub struct TokenHistory {
    /// The tokens by position, i32 `[batch, width]`; -1 where a position holds none (left
    /// padding, positions not reached yet).
    pub tokens: Tensor,
    /// i32 `[batch, width]`: at each position `j` below `len`, how many tokens before `j` equal
    /// the context's last tokens (the length of the common suffix of `context[..j]` and
    /// `context[..len]`, 0 across left padding).
    pub matched: Tensor,
    /// i32 rank-0: the positions filled; the next token goes to this one.
    pub len: Tensor,
}

impl Carry for TokenHistory {
    fn flatten(&self, out: &mut Vec<Tensor>) {
        out.extend([self.tokens.clone(), self.matched.clone(), self.len.clone()]);
    }
    fn unflatten(_: &Self, values: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        Some(TokenHistory {
            tokens: values.next()?,
            matched: values.next()?,
            len: values.next()?,
        })
    }
}

impl TokenHistory {
    /// Declares a history of `batch` rows and `width` positions as parameters of `g`: `history`
    /// and `matched` (i32 `[batch, width]`) and `history_len` (i32 rank 0), in that order.
    pub fn parameters(g: &Graph, batch: usize, width: usize) -> Result<TokenHistory> {
        Ok(TokenHistory {
            tokens: g.parameter("history", DType::I32, &[batch, width])?,
            matched: g.parameter("matched", DType::I32, &[batch, width])?,
            len: g.parameter("history_len", DType::I32, &[])?,
        })
    }

    /// The values for [`TokenHistory::parameters`] after `prompts`, each left-padded to
    /// `prompt_width` positions, in a history of `width` positions, paired with the parameter
    /// names. An error when a prompt is longer than `prompt_width`, `prompt_width` is more than
    /// `width`, or a token id or width does not fit an i32.
    pub fn host_values(
        prompts: &[Vec<u32>],
        prompt_width: usize,
        width: usize,
    ) -> Result<[(&'static str, HostArray); 3]> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("TokenHistory: {what}")));
        if prompt_width > width || i32::try_from(width).is_err() {
            return bad(format!(
                "prompt width {prompt_width} and width {width}: expected prompt width <= width < 2^31"
            ));
        }
        let batch = prompts.len();
        let mut tokens = vec![-1i32; batch * width];
        let mut matched = vec![0i32; batch * width];
        for (r, p) in prompts.iter().enumerate() {
            let Some(start) = prompt_width.checked_sub(p.len()) else {
                return bad(format!(
                    "prompt {r} has {} tokens, more than the prompt width {prompt_width}",
                    p.len()
                ));
            };
            let row = r * width + start;
            for (k, &t) in p.iter().enumerate() {
                let Ok(t) = i32::try_from(t) else {
                    return bad(format!("token id {t} does not fit an i32"));
                };
                tokens[row + k] = t;
            }
            // The common suffix of p[..j] and p with j = p.len() - i is Z[i] of the reversed
            // prompt (the longest common prefix of it and its suffix from i).
            let reversed: Vec<u32> = p.iter().rev().copied().collect();
            let z = z_array(&reversed);
            for j in 1..p.len() {
                matched[row + j] = z[p.len() - j] as i32;
            }
        }
        let len = i32::try_from(prompt_width).unwrap_or(i32::MAX);
        Ok([
            ("history", HostArray::from_vec(&[batch, width], tokens)?),
            ("matched", HostArray::from_vec(&[batch, width], matched)?),
            ("history_len", HostArray::scalar(len)),
        ])
    }

    /// The history after `token` (i32 `[batch]`, each >= 0) is appended at `len`, which must
    /// be below the width (at the width, the last position is overwritten).
    pub fn push(&self, token: &Tensor) -> Result<TokenHistory> {
        let g = token.graph();
        let t = token.expand_dims(1)?;
        // The token before each position, and the common suffix ending there, before the push.
        let before = self.tokens.pad(&[0, 1], &[0, -1], &[0, 0], -1.0)?;
        let matched_before = self.matched.pad(&[0, 1], &[0, -1], &[0, 0], 0.0)?;
        let matched = before.eq(&t)?.select(&matched_before.add(1.0)?, 0.0)?;
        let zero = g.scalar(0.0, DType::I32)?;
        let tokens = self.tokens.dynamic_update_slice(&t, &[&zero, &self.len])?;
        Ok(TokenHistory {
            tokens,
            matched,
            len: self.len.add(1.0)?,
        })
    }

    fn check(&self, batch: usize) -> Result<usize> {
        let width = self.tokens.dims().get(1).copied().unwrap_or(0);
        let ok = |t: &Tensor| t.dtype() == DType::I32 && t.dims() == [batch, width];
        if !ok(&self.tokens)
            || !ok(&self.matched)
            || self.len.rank() != 0
            || self.len.dtype() != DType::I32
        {
            return Err(Error::InvalidArgument(format!(
                "penalize: the history is {}, {} and {}, expected i32[{batch}, width] twice and \
                 a rank-0 i32",
                self.tokens.ty(),
                self.matched.ty(),
                self.len.ty()
            )));
        }
        Ok(width)
    }
}

/// `z[i]`: the length of the longest common prefix of `s` and `s[i..]` (`z[0] = s.len()`),
/// by the Z-algorithm in O(len).
fn z_array(s: &[u32]) -> Vec<usize> {
    let n = s.len();
    let mut z = vec![0; n];
    if n == 0 {
        return z;
    }
    z[0] = n;
    let (mut left, mut right) = (0, 0);
    for i in 1..n {
        let mut k = if i < right {
            z[i - left].min(right - i)
        } else {
            0
        };
        while i + k < n && s[k] == s[i + k] {
            k += 1;
        }
        z[i] = k;
        if i + k > right {
            (left, right) = (i, i + k);
        }
    }
    z
}

/// Per row, how many positions of the history each token holds among those `take` (pred
/// `[batch, width]`) keeps, as f32 `[batch, vocab]`: one scatter-add.
fn token_counts(history: &Tensor, take: &Tensor, vocab: usize) -> Result<Tensor> {
    let g = history.graph();
    let (batch, width) = (history.dims()[0], history.dims()[1]);
    let row_start = g.iota(DType::I32, &[batch, width], 0)?.mul(vocab as f64)?;
    let flat = row_start
        .add(&history.maximum(0.0)?)?
        .reshape(&[(batch * width) as isize])?;
    let ones = take
        .astype(DType::F32)?
        .reshape(&[(batch * width) as isize])?;
    g.zeros(DType::F32, &[batch * vocab])?
        .index_add(&flat, &ones)?
        .reshape(&[batch as isize, vocab as isize])
}

/// `logits` `[batch, vocab]` with the penalties of `settings` for the context `history` (see
/// the module docs), as f32.
pub fn penalize(
    logits: &Tensor,
    settings: &PenaltySettings,
    history: &TokenHistory,
) -> Result<Tensor> {
    let (batch, vocab) = super::logits_dims(logits, "penalize")?;
    settings.check(batch)?;
    let width = history.check(batch)?;
    let g = logits.graph();
    let x = logits.astype(DType::F32)?;
    let column = |t: &Tensor| t.expand_dims(1);
    let position = g.iota(DType::I32, &[batch, width], 1)?;
    let filled = position.lt(&history.len)?.and(&history.tokens.ge(0.0)?)?;
    // The window starts at len - repeat_last_n (i32::MAX: before the first position).
    let window_start = history.len.sub(&settings.repeat_last_n)?;
    let in_window = filled.and(&position.ge(&column(&window_start)?)?)?;
    let counts = token_counts(&history.tokens, &in_window, vocab)?;
    let seen = counts.gt(0.0)?;
    let p = column(&settings.repetition_penalty)?;
    let scaled = x.lt(0.0)?.select(&x.mul(&p)?, &x.div(&p)?)?;
    let x = seen.select(&scaled, &x)?;
    let frequency = counts.mul(&column(&settings.frequency_penalty)?)?;
    let presence = seen
        .astype(DType::F32)?
        .mul(&column(&settings.presence_penalty)?)?;
    let x = x.sub(&frequency.add(&presence)?)?;
    // Tokens after an occurrence of the last n - 1 tokens, for rows with n > 0.
    let n = &settings.no_repeat_ngram_size;
    let follows = history.matched.ge(&column(&n.sub(1.0)?)?)?;
    let ngram_on = column(&n.gt(0.0)?)?;
    let hits = filled.and(&follows)?.and(&ngram_on)?;
    let banned = token_counts(&history.tokens, &hits, vocab)?.gt(0.0)?;
    let allowed_somewhere = banned
        .not()?
        .astype(DType::I32)?
        .max_keepdims(&[1])?
        .gt(0.0)?;
    banned
        .and(&allowed_somewhere)?
        .select(f64::NEG_INFINITY, &x)
}
