//! The server's counters and latency histograms, as Prometheus text (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use stablegraph::serving::SchedulerStats;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A Prometheus histogram.
#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if seconds <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

#[derive(Debug, Default)]
struct Values {
    requests: BTreeMap<&'static str, u64>,
    prompt_tokens: u64,
    generated_tokens: u64,
    queue_depth: usize,
    active_slots: usize,
    slots: usize,
    compiles: usize,
    segments: u64,
    ttft: Histogram,
    itl: Histogram,
}

/// What the server counts; shared between the HTTP handlers and the engine thread.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    values: Mutex<Values>,
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Values)) {
        let mut v = self.values.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut v);
    }

    /// A request ended with `outcome` (`completed`, `stopped`, `invalid`, `queue_full`,
    /// `disconnected`, `failed`, `unauthorized`, `shutting_down`).
    pub(crate) fn request(&self, outcome: &'static str) {
        self.with(|v| *v.requests.entry(outcome).or_default() += 1);
    }

    /// Where the scheduler stands, from its own counts.
    pub(crate) fn engine(&self, stats: &SchedulerStats, slots: usize, compiles: usize) {
        self.with(|v| {
            (v.queue_depth, v.active_slots, v.slots) = (stats.queued, stats.active, slots);
            (v.compiles, v.segments) = (compiles, stats.segments);
            (v.prompt_tokens, v.generated_tokens) = (stats.prompt_tokens, stats.generated_tokens);
        });
    }

    /// Time to first token.
    pub(crate) fn ttft(&self, seconds: f64) {
        self.with(|v| v.ttft.observe(seconds));
    }

    /// `tokens` tokens arrived `seconds` after the previous ones: each counts `seconds /
    /// tokens` as its inter-token latency.
    pub(crate) fn itl(&self, seconds: f64, tokens: usize) {
        self.with(|v| {
            for _ in 0..tokens {
                v.itl.observe(seconds / tokens.max(1) as f64);
            }
        });
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let v = self.values.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP stablegraph_requests_total Requests by outcome.\n\
             # TYPE stablegraph_requests_total counter"
        );
        for (outcome, n) in &v.requests {
            let _ = writeln!(
                out,
                "stablegraph_requests_total{{outcome=\"{outcome}\"}} {n}"
            );
        }
        let counters = [
            (
                "prompt_tokens_total",
                "Prompt tokens prefilled.",
                v.prompt_tokens,
            ),
            (
                "generated_tokens_total",
                "Tokens generated.",
                v.generated_tokens,
            ),
            ("segments_total", "Segment program calls.", v.segments),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP stablegraph_{name} {help}\n# TYPE stablegraph_{name} counter\n\
                 stablegraph_{name} {value}"
            );
        }
        let gauges = [
            ("queue_depth", "Requests waiting for a slot.", v.queue_depth),
            ("slots_active", "Slots decoding a request.", v.active_slots),
            ("slots", "Slots of the segment program.", v.slots),
            (
                "programs_compiled",
                "Programs compiled since start.",
                v.compiles,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP stablegraph_{name} {help}\n# TYPE stablegraph_{name} gauge\n\
                 stablegraph_{name} {value}"
            );
        }
        v.ttft.write(
            &mut out,
            "stablegraph_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
        );
        v.itl.write(
            &mut out,
            "stablegraph_inter_token_latency_seconds",
            "Time between a request's tokens (a segment's tokens share its time).",
        );
        out
    }
}
