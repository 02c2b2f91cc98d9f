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
    stats: SchedulerStats,
    slots: usize,
    compiles: usize,
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
            (v.stats, v.slots, v.compiles) = (stats.clone(), slots, compiles);
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
        let s = &v.stats;
        let counters = [
            (
                "prompt_tokens_total",
                "Prompt tokens prefilled.",
                s.prompt_tokens,
            ),
            (
                "cached_tokens_total",
                "Prompt tokens taken from the prefix cache instead of prefilled.",
                s.cached_tokens,
            ),
            (
                "generated_tokens_total",
                "Tokens generated.",
                s.generated_tokens,
            ),
            ("segments_total", "Segment program calls.", s.segments),
            (
                "mixed_calls_total",
                "Calls in which prefill rode with decode (--mixed).",
                s.mixed,
            ),
            (
                "prefix_cache_hits_total",
                "Requests whose prompt started with a cached prefix.",
                s.prefix_hits,
            ),
            (
                "prefix_cache_misses_total",
                "Requests with a whole block of prompt and no cached prefix.",
                s.prefix_misses,
            ),
            (
                "prefix_cache_evictions_total",
                "Cached prefix states dropped to make room.",
                s.prefix_evictions,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP stablegraph_{name} {help}\n# TYPE stablegraph_{name} counter\n\
                 stablegraph_{name} {value}"
            );
        }
        let gauges = [
            ("queue_depth", "Requests waiting for a slot.", s.queued),
            ("slots_active", "Slots decoding a request.", s.active),
            ("slots", "Slots of the segment program.", v.slots),
            (
                "programs_compiled",
                "Programs compiled since start.",
                v.compiles,
            ),
            (
                "prefix_cache_bytes",
                "Device memory the cached prefix states hold.",
                s.prefix_bytes,
            ),
            (
                "prefix_cache_entries",
                "Cached prefix states.",
                s.prefix_entries,
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
