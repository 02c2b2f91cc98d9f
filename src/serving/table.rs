//! What the scheduler keeps per request: a request in a slot ([`Running`]), queued choices
//! ([`Queued`]), and what an extras segment takes from the rows decoding.

use super::request::{Request, RequestId};
use crate::sampling::{Penalties, Sampling};

/// A request in a slot.
#[derive(Debug)]
pub(super) struct Running {
    pub(super) id: RequestId,
    /// Tokens still to make.
    pub(super) remaining: usize,
    /// It has made no token yet.
    pub(super) fresh: bool,
    /// What it asked for (`max_tokens` as asked).
    pub(super) request: Request,
    /// The prompt's tokens in its slot's state so far.
    pub(super) fed: usize,
    pub(super) key: [u32; 2],
    /// The tokens it made, when its penalties read them.
    pub(super) made: Vec<u32>,
    /// A later choice of a request for several: the slot of its first choice, whose state it
    /// takes once that prompt is in.
    pub(super) copy_of: Option<usize>,
}

impl Running {
    /// Its prompt is in: it decodes.
    pub(super) fn ready(&self) -> bool {
        self.fed == self.request.prompt.len()
    }

    /// It is fed pieces of its own prompt.
    pub(super) fn feeding(&self) -> bool {
        !self.ready() && self.copy_of.is_none()
    }

    /// Nothing of its prompt is in its slot yet: its first piece starts from an empty state.
    pub(super) fn unfed(&self) -> bool {
        self.fed == 0
    }

    /// Part of its prompt is in its slot: the slot's state must be kept until the rest is.
    pub(super) fn partly_fed(&self) -> bool {
        !self.ready() && !self.unfed()
    }
}

/// Queued requests: one prompt and the ids of its choices (one unless `n` was asked for), each
/// with its own sampling ([`Sampling::for_choice`]).
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) ids: Vec<RequestId>,
    pub(super) samplings: Vec<Sampling>,
    pub(super) request: Request,
}

/// A request in a slot, its prompt not fed yet (a later choice: waiting for slot `copy_of`).
pub(super) fn running(id: RequestId, r: Request, copy_of: Option<usize>) -> Running {
    Running {
        id,
        remaining: r.max_tokens,
        fresh: true,
        key: r.sampling.key(),
        request: r,
        fed: 0,
        made: Vec::new(),
        copy_of,
    }
}

/// Per slot, what an extras segment takes, when a decoding row asks for penalties, a bias or
/// log-probabilities: each row's penalties, bias and context (prompt and tokens made, for
/// rows with penalties).
#[allow(clippy::type_complexity)]
pub(super) fn extras_of(
    rows: &[Option<&Running>],
) -> Option<(Vec<Penalties>, Vec<Vec<(u32, f32)>>, Vec<Vec<u32>>)> {
    if !rows.iter().flatten().any(|r| r.request.needs_extras()) {
        return None;
    }
    let penalties = rows
        .iter()
        .map(|r| r.map_or(Penalties::NONE, |r| r.request.penalties))
        .collect();
    let bias = rows
        .iter()
        .map(|r| r.map_or(Vec::new(), |r| r.request.logit_bias.clone()))
        .collect();
    let context = rows
        .iter()
        .map(|r| match r {
            Some(r) if !r.request.penalties.is_off() => {
                let mut c = r.request.prompt.clone();
                c.extend(&r.made);
                c
            }
            _ => Vec::new(),
        })
        .collect();
    Some((penalties, bias, context))
}
