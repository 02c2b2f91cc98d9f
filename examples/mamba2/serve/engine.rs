//! The engine thread: owns the [`Scheduler`], takes requests and cancellations from the HTTP
//! handlers over a channel, steps the scheduler while there is work, and hands each request's
//! tokens to its handler. A handler that went away (its client disconnected) is noticed before
//! every step and its request cancelled, so its slot is free within one segment.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stablegraph::serving::{
    Event, FinishReason, Request, RequestId, Scheduler, SlotModel, StepLogprobs, SubmitError,
};
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;

/// What the engine tells a handler about its request (`usize`: the choice, 0 to `n - 1`).
#[derive(Debug)]
pub(crate) enum Update {
    /// Queued: each choice's id.
    Accepted(Vec<RequestId>),
    /// Refused.
    Refused(SubmitError),
    /// A choice's prompt is in its slot, this many of its tokens from the prefix cache.
    Started(usize, usize),
    /// New tokens of a choice, with their log-probabilities when asked for.
    Tokens(usize, Vec<u32>, Vec<StepLogprobs>),
    /// A choice is done.
    Finished(usize, FinishReason),
    /// The model failed.
    Failed(String),
}

/// What a handler tells the engine.
pub(crate) enum Command {
    /// Queue `n` choices of a request; their updates go to `updates`.
    Submit {
        request: Request,
        n: usize,
        arrived: Instant,
        updates: UnboundedSender<Update>,
    },
    /// Drop a request (the handler has what it needs, e.g. after a stop sequence).
    Cancel(RequestId),
}

/// A request the engine serves.
struct Live {
    updates: UnboundedSender<Update>,
    /// Which of its request's choices it is.
    choice: usize,
    arrived: Instant,
    /// When its last tokens went out.
    last: Option<Instant>,
}

/// Runs the engine until the command channel closes and no request is left.
pub(crate) fn run<M: SlotModel>(
    mut s: Scheduler<M>,
    commands: Receiver<Command>,
    metrics: Arc<Metrics>,
) {
    let mut live: HashMap<RequestId, Live> = HashMap::new();
    let mut open = true;
    while open || s.has_work() {
        // Idle: wait for a command (waking now and then to notice departed clients).
        if !s.has_work() {
            match commands.recv_timeout(Duration::from_millis(200)) {
                Ok(c) => command(&mut s, &mut live, &metrics, c),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(c) => command(&mut s, &mut live, &metrics, c),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let gone: Vec<RequestId> = live
            .iter()
            .filter(|(_, l)| l.updates.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            drop_request(&mut s, &mut live, &metrics, id);
        }
        if s.has_work() {
            match s.step() {
                Ok(events) => {
                    // The counts first, so that a client reading /metrics after its reply
                    // sees its tokens.
                    let compiles = s.model().programs_compiled();
                    metrics.engine(&s.stats(), s.options().slots, compiles);
                    dispatch(&mut s, &mut live, &metrics, events);
                }
                Err(e) => {
                    eprintln!("serve: the engine failed: {e}");
                    for (_, l) in live.drain() {
                        let _ = l.updates.send(Update::Failed(e.to_string()));
                        if l.choice == 0 {
                            metrics.request("failed");
                        }
                    }
                }
            }
        }
        let compiles = s.model().programs_compiled();
        metrics.engine(&s.stats(), s.options().slots, compiles);
    }
}

fn command<M: SlotModel>(
    s: &mut Scheduler<M>,
    live: &mut HashMap<RequestId, Live>,
    metrics: &Metrics,
    c: Command,
) {
    match c {
        Command::Submit {
            request,
            n,
            arrived,
            updates,
        } => match s.submit_n(request, n) {
            Ok(ids) => {
                if updates.send(Update::Accepted(ids.clone())).is_ok() {
                    for (choice, id) in ids.into_iter().enumerate() {
                        let live_one = Live {
                            updates: updates.clone(),
                            choice,
                            arrived,
                            last: None,
                        };
                        live.insert(id, live_one);
                    }
                } else {
                    for id in ids {
                        s.cancel(id);
                    }
                    metrics.request("disconnected");
                }
            }
            Err(e) => {
                let _ = updates.send(Update::Refused(e));
            }
        },
        Command::Cancel(id) => {
            s.cancel(id);
            live.remove(&id);
        }
    }
}

/// Cancels a choice whose client went away (a request counts once, by its first choice).
fn drop_request<M: SlotModel>(
    s: &mut Scheduler<M>,
    live: &mut HashMap<RequestId, Live>,
    metrics: &Metrics,
    id: RequestId,
) {
    s.cancel(id);
    if live.remove(&id).is_some_and(|l| l.choice == 0) {
        metrics.request("disconnected");
    }
}

fn dispatch<M: SlotModel>(
    s: &mut Scheduler<M>,
    live: &mut HashMap<RequestId, Live>,
    metrics: &Metrics,
    events: Vec<Event>,
) {
    let now = Instant::now();
    for e in events {
        let (id, update) = match e {
            Event::Started { id, cached } => (id, Update::Started(choice(live, id), cached)),
            Event::Tokens {
                id,
                tokens,
                logprobs,
            } => {
                if let Some(l) = live.get_mut(&id) {
                    match l.last {
                        None => metrics.ttft((now - l.arrived).as_secs_f64()),
                        Some(t) => metrics.itl((now - t).as_secs_f64(), tokens.len()),
                    }
                    l.last = Some(now);
                }
                (id, Update::Tokens(choice(live, id), tokens, logprobs))
            }
            Event::Finished { id, reason } => (id, Update::Finished(choice(live, id), reason)),
            Event::Failed { id, error } => {
                if choice(live, id) == 0 {
                    metrics.request("failed");
                }
                (id, Update::Failed(error))
            }
        };
        let Some(l) = live.get(&id) else { continue };
        let last = matches!(update, Update::Finished(..) | Update::Failed(_));
        if l.updates.send(update).is_err() {
            drop_request(s, live, metrics, id);
        } else if last {
            live.remove(&id);
        }
    }
}

/// Which of its request's choices `id` is.
fn choice(live: &HashMap<RequestId, Live>, id: RequestId) -> usize {
    live.get(&id).map_or(0, |l| l.choice)
}
