//! Serving: the continuous-batching [`Scheduler`](stablegraph::serving::Scheduler) against
//! offline `generate` of each prompt alone ([`scheduler`]).

#[path = "../common/mod.rs"]
mod common;

mod scheduler;
