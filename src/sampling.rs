//! Choosing the next token from logits on the device, for any model: greedy (the argmax) and
//! sampling with a temperature, top-k and top-p whose values are runtime inputs of the program,
//! so that one compiled program serves every setting and every seed.
//!
//! The filters sort no logits. Each logit is mapped to a `u32` key in the order of the float
//! values ([`order_keys`]), and each cut is a threshold on the keys found bit by bit, from the
//! highest: 32 rounds, each one pass over the vocabulary (a compare and a sum).
//!
//! - **top-k** keeps the tokens whose key is at least the largest `T` with
//!   `count(key >= T) >= k`: that `T` is the key of the k-th largest logit, exactly; tokens tied
//!   with it are kept too.
//! - **top-p** then keeps the tokens whose key is at least the largest `T` with
//!   `sum(p[key >= T]) >= top_p` (`p` the softmax of what top-k kept): the smallest set of most
//!   likely tokens whose probability reaches `top_p`, ties at the cut kept. The sums are f32, so
//!   a set whose probability is within rounding of `top_p` may be cut one token differently
//!   from a sum in another order.
//!
//! A filter that is off for every row (`top_k` 0 or at least the vocabulary, `top_p >= 1`) runs
//! zero rounds. The draw is an inverse CDF with one uniform number per row from the Threefry
//! key: with weights `w = exp(x - max)` of the kept tokens, the token is the largest index `j`
//! with `sum(w[..j]) <= u * sum(w)`, found bit by bit too (17 rounds for a vocabulary below
//! 2^17). Each kept token is drawn with its softmax probability, up to the f32 rounding of the
//! sums.
//!
//! Over a large vocabulary (16,384 tokens and more) with top-k between 1 and 64 in every row,
//! the rounds and the draw run over 4,096 candidates per row instead of the vocabulary: the 64
//! blocks of 64 tokens with the best maxima (the block maxima are sorted, not the logits), once
//! a count over the vocabulary has checked that they hold every token the top-k cut keeps. When
//! they do not (ties at the cut spread wider), the whole vocabulary is used. Either way the
//! cuts and the draw are the ones defined above.
//!
//! Penalties on tokens the context already holds ([`Penalties`], [`penalize`]) change the
//! logits before either. A checkpoint's `generation_config.json` ([`GenerationConfig`]) says
//! which settings it is meant to be run with.

mod candidates;
mod generation_config;
mod penalties;

pub use generation_config::GenerationConfig;
pub use penalties::{penalize, Penalties, PenaltySettings, TokenHistory, MAX_NO_REPEAT_NGRAM_SIZE};

use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{Graph, Tensor};

/// How generation picks tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (the first one, on ties).
    Greedy,
    /// A random token from the logits scaled by `1 / temperature`, restricted to the `top_k`
    /// most likely (0: no limit) and to the smallest set whose probability reaches `top_p`
    /// (1: no limit). Reproducible for a given `seed`.
    Sample {
        /// Softmax temperature (> 0, finite).
        temperature: f32,
        /// Keep only the k most likely tokens (0 keeps all).
        top_k: usize,
        /// Nucleus threshold in (0, 1].
        top_p: f32,
        /// Random seed.
        seed: u64,
    },
}

impl Sampling {
    /// Checks the settings: a finite `temperature >= 0` (0 draws greedily, as a server
    /// reads it) and `top_p` in (0, 1]; a `top_k` of the vocabulary (`vocab`) or more is off,
    /// as 0 is. The error names the setting (as `sampling.<name>`).
    pub fn check(&self, _vocab: usize) -> Result<()> {
        let Sampling::Sample {
            temperature, top_p, ..
        } = *self
        else {
            return Ok(());
        };
        let bad = |what: String| Err(Error::InvalidArgument(format!("sampling.{what}")));
        if !(temperature >= 0.0 && temperature.is_finite()) {
            return bad(format!(
                "temperature ({temperature}) is not a finite number >= 0"
            ));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return bad(format!("top_p ({top_p}) is not in (0, 1]"));
        }
        Ok(())
    }

    /// The settings of choice `i` of a request for several (OpenAI's `n`): choice 0 is `self`;
    /// choice `i` samples with a seed mixed from this one and `i`, so that the choices differ
    /// and each repeats with the request's seed. Greedy stays greedy.
    pub fn for_choice(&self, i: usize) -> Sampling {
        match *self {
            Sampling::Sample {
                temperature,
                top_k,
                top_p,
                seed,
            } if i > 0 => Sampling::Sample {
                temperature,
                top_k,
                top_p,
                seed: seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            },
            other => other,
        }
    }

    /// The seed (0 for greedy), as the two-word Threefry key the programs take.
    pub fn key(&self) -> [u32; 2] {
        let seed = match *self {
            Sampling::Sample { seed, .. } => seed,
            Sampling::Greedy => 0,
        };
        [seed as u32, (seed >> 32) as u32]
    }
}

/// Per-row sampling settings as tensors of a program, each of shape `[batch]`.
#[derive(Debug, Clone)]
pub struct SampleSettings {
    /// Temperature, f32.
    pub temperature: Tensor,
    /// Top-k, i32 (0: off).
    pub top_k: Tensor,
    /// Top-p, f32 (1: off).
    pub top_p: Tensor,
}

impl SampleSettings {
    /// Declares the settings as parameters of `g`, in this order: `temperature` (f32),
    /// `top_k` (i32) and `top_p` (f32), each `[batch]`.
    pub fn parameters(g: &Graph, batch: usize) -> Result<SampleSettings> {
        Ok(SampleSettings {
            temperature: g.parameter("temperature", DType::F32, &[batch])?,
            top_k: g.parameter("top_k", DType::I32, &[batch])?,
            top_p: g.parameter("top_p", DType::F32, &[batch])?,
        })
    }

    /// The values for [`SampleSettings::parameters`]: `sampling`'s settings for each of `batch`
    /// rows (checked as [`Sampling::check`] does for `vocab`). Greedy is temperature 1, top-k 1.
    pub fn host_values(sampling: &Sampling, batch: usize, vocab: usize) -> Result<[HostArray; 3]> {
        SampleSettings::row_host_values(&vec![*sampling; batch], vocab)
    }

    /// [`SampleSettings::host_values`] with one setting per row (rows of a served batch). A
    /// temperature of 0 is a greedy row; a `top_k` beyond the vocabulary is the vocabulary
    /// (off).
    pub fn row_host_values(rows: &[Sampling], vocab: usize) -> Result<[HostArray; 3]> {
        let n = rows.len();
        let (mut temperature, mut top_k, mut top_p) = (Vec::new(), Vec::new(), Vec::new());
        for sampling in rows {
            sampling.check(vocab)?;
            let (t, k, p) = match *sampling {
                Sampling::Greedy => (1.0, 1, 1.0),
                Sampling::Sample {
                    temperature: 0.0, ..
                } => (1.0, 1, 1.0),
                Sampling::Sample {
                    temperature,
                    top_k,
                    top_p,
                    ..
                } => (temperature, top_k.min(vocab), top_p),
            };
            let k = i32::try_from(k).map_err(|_| {
                Error::InvalidArgument(format!("sampling: top_k ({k}) does not fit an i32"))
            })?;
            temperature.push(t);
            top_k.push(k);
            top_p.push(p);
        }
        Ok([
            HostArray::from_vec(&[n], temperature)?,
            HostArray::from_vec(&[n], top_k)?,
            HostArray::from_vec(&[n], top_p)?,
        ])
    }

    fn check(&self, batch: usize) -> Result<()> {
        let want = [
            ("temperature", &self.temperature, DType::F32),
            ("top_k", &self.top_k, DType::I32),
            ("top_p", &self.top_p, DType::F32),
        ];
        for (name, t, dtype) in want {
            if t.dtype() != dtype || t.dims() != [batch] {
                return Err(Error::InvalidArgument(format!(
                    "sampling: settings.{name} is {}, expected {dtype}[{batch}]",
                    t.ty()
                )));
            }
        }
        Ok(())
    }
}

/// Checks that `logits` is a float `[batch, vocab]` with a vocabulary of at least one token;
/// returns `(batch, vocab)`.
fn logits_dims(logits: &Tensor, what: &str) -> Result<(usize, usize)> {
    match *logits.dims() {
        [b, v] if logits.dtype().is_float() && v > 0 => Ok((b, v)),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: logits is {}, expected a float [batch, vocab] with vocab > 0",
            logits.ty()
        ))),
    }
}

/// The most likely token of each row of `logits` `[batch, vocab]` (the first on ties), as i32
/// `[batch]`.
pub fn greedy(logits: &Tensor) -> Result<Tensor> {
    logits_dims(logits, "greedy")?;
    logits.argmax(-1)?.astype(DType::I32)
}

/// Maps float values to `u32` keys with the same order: `a < b` exactly when
/// `key(a) < key(b)`, for every non-NaN pair of f32 values except `-0.0 < +0.0`. (The sign bit
/// is set for non-negative values; negative values have all their bits flipped.) Other float
/// types are converted to f32 first, so f64 values that round to one f32 share its key.
pub fn order_keys(x: &Tensor) -> Result<Tensor> {
    let bits = match x.dtype() {
        DType::F32 => x.bitcast(DType::U32)?,
        d if d.is_float() => x.astype(DType::F32)?.bitcast(DType::U32)?,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "order_keys: x is {}, expected a float tensor",
                x.ty()
            )))
        }
    };
    let sign = f64::from(1u32 << 31);
    let negative = bits.ge(sign)?;
    let flipped = bits.not()?;
    negative.select(&flipped, &bits.or(sign)?)
}

/// The largest `T < 2^bits` (a `[batch]` u32) with `holds(T)` true, found bit by bit for the
/// rows in `on` (`T` stays 0 for the others); `holds` maps candidates `[batch, 1]` to a pred
/// `[batch]` and must be true at 0 and monotone (true at `T` means true below it). Runs `bits`
/// rounds when some row is on, none otherwise.
fn largest_true(
    g: &Graph,
    on: &Tensor,
    bits: u32,
    holds: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let batch = on.dims()[0];
    let rounds = on.astype(DType::I32)?.max(&[0])?.mul(f64::from(bits))?;
    let zero = g.zeros(DType::U32, &[batch])?;
    let top_bit = g.scalar(f64::from(1u32 << (bits - 1)), DType::U32)?;
    g.fori_loop(0i32, &rounds, &zero, |i, t| {
        let candidate = t.or(&top_bit.shift_right_logical(&i.astype(DType::U32)?)?)?;
        let take = holds(&candidate.expand_dims(1)?)?.and(on)?;
        take.select(&candidate, t)
    })
}

/// The tokens that the cuts and the draw look at in each row: the whole vocabulary, or the
/// candidates of [`candidates::pool`].
struct Pool {
    /// The logits divided by the temperature, f32 `[batch, n]`.
    x: Tensor,
    /// [`order_keys`] of `x`, u32 `[batch, n]`.
    keys: Tensor,
    /// Where each entry sits in the vocabulary, i64 `[batch, n]`, ascending along each row;
    /// `None` for the whole vocabulary (entry `i` is token `i`).
    tokens: Option<Tensor>,
}

impl SampleSettings {
    /// `logits` `[batch, n]` (any part of a vocabulary) in f32 divided by each row's
    /// temperature: the one place this is computed, so that the vocabulary and the candidates
    /// of a row see equal values, and equal keys, for the same token.
    fn scaled(&self, logits: &Tensor) -> Result<Tensor> {
        logits
            .astype(DType::F32)?
            .div(&self.temperature.expand_dims(1)?)
    }
}

impl Pool {
    /// The whole vocabulary of `logits`, scaled by each row's temperature, and its top-k cut
    /// (for the rows with `0 < k < vocab`; see [`Pool::top_k_cut`]).
    fn vocabulary(logits: &Tensor, settings: &SampleSettings) -> Result<(Pool, Tensor)> {
        let x = settings.scaled(logits)?;
        let keys = order_keys(&x)?;
        let pool = Pool {
            x,
            keys,
            tokens: None,
        };
        let k = &settings.top_k;
        let vocab = i32::try_from(pool.len()).unwrap_or(i32::MAX);
        let on = k.gt(0.0)?.and(&k.lt(f64::from(vocab))?)?;
        let k_cut = pool.top_k_cut(k, &on)?;
        Ok((pool, k_cut))
    }

    /// The entries each row holds.
    fn len(&self) -> usize {
        self.x.dims()[1]
    }

    /// The tokens at `positions` (i32 `[batch]`) of each row, as i32 `[batch]`.
    fn token_at(&self, positions: &Tensor) -> Result<Tensor> {
        match &self.tokens {
            None => Ok(positions.clone()),
            Some(tokens) => {
                let batch = positions.dims()[0] as isize;
                tokens
                    .take_along_axis(&positions.expand_dims(1)?, 1)?
                    .reshape(&[batch])?
                    .astype(DType::I32)
            }
        }
    }

    /// The top-k threshold on the keys for the rows in `on` (0, keeping everything, for the
    /// others): the largest `T` with `count(key >= T) >= k`.
    fn top_k_cut(&self, k: &Tensor, on: &Tensor) -> Result<Tensor> {
        let keys = &self.keys;
        largest_true(keys.graph(), on, 32, |t| {
            let count = keys.ge(t)?.astype(DType::I32)?.sum(&[1])?;
            count.ge(k)
        })
    }
}

/// What the filters leave of a pool.
struct Filtered {
    /// Which tokens top-k and top-p keep, pred `[batch, n]`.
    keep: Tensor,
    /// `exp(x - max(x))` where kept, 0 elsewhere: the unnormalised probabilities.
    weights: Tensor,
}

/// Top-k at `k_cut` (from [`Pool::top_k_cut`]), then top-p over what it kept.
fn filter(pool: &Pool, settings: &SampleSettings, k_cut: &Tensor) -> Result<Filtered> {
    let (x, keys) = (&pool.x, &pool.keys);
    // The largest logit survives both cuts, so it is the maximum of the kept ones too.
    let e = x.sub(&x.max_keepdims(&[1])?)?.exp()?;
    let in_k = keys.ge(&k_cut.expand_dims(1)?)?.select(&e, 0.0)?;
    let top_p = &settings.top_p;
    let p_on = top_p.lt(1.0)?;
    let target = in_k.sum(&[1])?.mul(top_p)?;
    let p_cut = largest_true(x.graph(), &p_on, 32, |t| {
        keys.ge(t)?.select(&in_k, 0.0)?.sum(&[1])?.ge(&target)
    })?;
    let keep = keys.ge(&k_cut.maximum(&p_cut)?.expand_dims(1)?)?;
    let weights = keep.select(&e, 0.0)?;
    Ok(Filtered { keep, weights })
}

/// `logits` `[batch, vocab]` divided by each row's temperature, with the tokens that top-k and
/// then top-p remove set to `-inf` (f32). See the module docs for the exact cuts.
pub fn filtered_logits(logits: &Tensor, settings: &SampleSettings) -> Result<Tensor> {
    let (batch, _) = logits_dims(logits, "filtered_logits")?;
    settings.check(batch)?;
    let (pool, k_cut) = Pool::vocabulary(logits, settings)?;
    let f = filter(&pool, settings, &k_cut)?;
    f.keep.select(&pool.x, f64::NEG_INFINITY)
}

/// Samples one token per row of `logits` `[batch, vocab]` with `settings`, from the Threefry
/// `key`: u32 `[2]` for the whole batch, or u32 `[batch, 2]`, one key per row (a row's draws
/// then depend on its own key alone, whatever the other rows hold, and are those of a batch of
/// one with that key). Returns the tokens (i32
/// `[batch]`) and the key (or keys) for the next draw. A row with top-k 1 takes the most likely
/// token, as [`greedy`] does (the first on ties).
pub fn sample(
    logits: &Tensor,
    settings: &SampleSettings,
    key: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (batch, _) = logits_dims(logits, "sample")?;
    let per_row = key.dims() == [batch, 2];
    if key.dtype() != DType::U32 || !(key.dims() == [2] || per_row) {
        return Err(Error::InvalidArgument(format!(
            "sample: key is {}, expected u32[2] or u32[{batch}, 2]",
            key.ty()
        )));
    }
    settings.check(batch)?;
    let g = logits.graph();
    let (u, next) = if per_row {
        // Each row as a batch of one with its key draws: the first word of its key's stream
        // for the draw, and the next key from the tweaked stream ([`next_key`]). So a served
        // row samples what `generate` samples for its prompt alone with the same seed.
        let bits = g.random_bits_rows(key, 1)?;
        let u = crate::ops::random::unit_float(&bits.reshape(&[batch as isize])?)?;
        let tweak = g
            .constant(&HostArray::from_vec(&[1, 2], NEXT_KEY_TWEAK.to_vec())?)?
            .broadcast_to(&[batch, 2])?;
        (u, g.random_bits_rows(&key.xor(&tweak)?, 2)?)
    } else {
        (g.random_uniform(key, DType::F32, &[batch])?, next_key(key)?)
    };
    // The whole vocabulary is built where it is used, so that a branch of the conditional
    // below captures the logits, not copies of the vocabulary's size.
    let from_vocabulary = |u: &Tensor| {
        let (pool, k_cut) = Pool::vocabulary(logits, settings)?;
        draw(&pool, settings, &k_cut, u)
    };
    let token = match candidates::pool(logits, settings)? {
        None => from_vocabulary(&u)?,
        Some(few) => {
            let k = &settings.top_k;
            let k_on = k.ge(1.0)?.and(&k.le(candidates::TOP_K_MAX as f64)?)?;
            let k_cut = few.top_k_cut(k, &k_on)?;
            let covered = candidates::cover(logits, settings, &few, &k_cut, &k_on)?;
            g.cond(
                &covered,
                &u,
                |u| draw(&few, settings, &k_cut, u),
                from_vocabulary,
            )?
        }
    };
    Ok((token, next))
}

/// One token per row of `pool` after the cuts (top-k at `k_cut`), with the uniform numbers `u`
/// (f32 `[batch]`): an inverse CDF over the pool in vocabulary order, i32 `[batch]`.
fn draw(pool: &Pool, settings: &SampleSettings, k_cut: &Tensor, u: &Tensor) -> Result<Tensor> {
    let Filtered { weights: w, .. } = filter(pool, settings, k_cut)?;
    let g = w.graph();
    let (batch, n) = (w.dims()[0], pool.len());
    // With r = u * sum(w), the token is the largest j with sum(w[..j]) <= r, found bit by bit.
    let r = u.mul(&w.sum(&[1])?)?;
    let index = g.iota(DType::U32, &[batch, n], 1)?;
    let bits = usize::BITS - n.leading_zeros();
    let on = g.full(1.0, DType::Pred, &[batch])?;
    let position = largest_true(g, &on, bits, |j| {
        let before = index.lt(j)?.select(&w, 0.0)?.sum(&[1])?;
        before.le(&r)
    })?;
    // A token whose weight is 0 can only come from rounding in the sums (r within an ulp of
    // the total): take the most likely token instead (which every filter keeps).
    // Top-k 1 is the argmax too, so that ties go to the first token as in greedy decoding.
    let picked = index.eq(&position.expand_dims(1)?)?;
    let weight = picked.select(&w, 0.0)?.sum(&[1])?;
    let drawn = weight.gt(0.0)?.and(&settings.top_k.ne(1.0)?)?;
    let best = pool.x.argmax_as(-1, DType::I32)?;
    let position = drawn.select(&position.astype(DType::I32)?, &best)?;
    pool.token_at(&position)
}

/// The key for the next draw: bits from a separate stream (the key xor a constant), so that
/// it is independent of the draws made with `key`.
pub fn next_key(key: &Tensor) -> Result<Tensor> {
    let g = key.graph();
    let tweak = g.constant(&HostArray::from_vec(&[2], NEXT_KEY_TWEAK.to_vec())?)?;
    g.random_bits(&key.xor(&tweak)?, &[2])
}

/// What [`next_key`] xors a key with to start the next key's stream.
const NEXT_KEY_TWEAK: [u32; 2] = [0x9E37_79B9, 0x7F4A_7C15];
