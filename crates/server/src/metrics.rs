//! `/metrics`: the engine's counters (`EngineStats`) and the server's response counts in the
//! Prometheus text exposition format (version 0.0.4).
//!
//! Invariants: every sample has a `# HELP` and `# TYPE` line before it; counters end in
//! `_total` and only grow; gauges are snapshots; step time is a summary without quantiles
//! (`_sum` seconds, `_count` steps), so rate(sum)/rate(count) is the mean step time.
//! Rejected: the `prometheus` crate (a registry, globals and protobuf for a dozen numbers
//! the engine already keeps).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use tf_engine::serve::api::EngineStats;

/// HTTP responses sent, by status code.
#[derive(Debug)]
pub struct HttpCounters {
    /// Index: status code (100..=599 fit; others are not produced by the server).
    by_status: Box<[AtomicU64; 600]>,
}

impl Default for HttpCounters {
    fn default() -> Self {
        HttpCounters { by_status: Box::new(std::array::from_fn(|_| AtomicU64::new(0))) }
    }
}

impl HttpCounters {
    pub fn record(&self, status: u16) {
        if let Some(c) = self.by_status.get(usize::from(status)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn nonzero(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.by_status
            .iter()
            .enumerate()
            .map(|(code, c)| (code, c.load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
    }
}

/// The `/metrics` body.
pub fn render(stats: &EngineStats, http: &HttpCounters) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(out, "# HELP tensorfold_{name} {help}");
        let _ = writeln!(out, "# TYPE tensorfold_{name} {kind}");
        let _ = writeln!(out, "tensorfold_{name} {}", number(value));
    };
    let s = stats;
    metric("requests_total", "counter", "Requests the engine accepted.", s.requests_total as f64);
    metric("requests_running", "gauge", "Requests holding a lane.", s.requests_running as f64);
    metric(
        "requests_waiting",
        "gauge",
        "Requests queued for a lane (queue depth).",
        s.requests_waiting as f64,
    );
    metric(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens of accepted requests.",
        s.prompt_tokens_total as f64,
    );
    metric(
        "cached_tokens_total",
        "counter",
        "Prompt tokens whose KV came from the prompt cache (cache hits).",
        s.cached_tokens_total as f64,
    );
    metric(
        "completion_tokens_total",
        "counter",
        "Tokens generated.",
        s.completion_tokens_total as f64,
    );
    metric("kv_blocks", "gauge", "KV cache blocks in the pool.", s.kv_blocks_total as f64);
    metric("kv_blocks_free", "gauge", "KV cache blocks free.", s.kv_blocks_free as f64);
    metric(
        "prompt_cache_blocks",
        "gauge",
        "KV blocks held by the prompt cache.",
        s.prompt_cache_blocks as f64,
    );
    let _ = writeln!(out, "# HELP tensorfold_step_seconds Engine step wall time.");
    let _ = writeln!(out, "# TYPE tensorfold_step_seconds summary");
    let _ = writeln!(out, "tensorfold_step_seconds_sum {}", number(s.step_seconds_total));
    let _ = writeln!(out, "tensorfold_step_seconds_count {}", s.steps_total);
    let _ = writeln!(out, "# HELP tensorfold_http_responses_total HTTP responses sent, by status.");
    let _ = writeln!(out, "# TYPE tensorfold_http_responses_total counter");
    for (code, n) in http.nonzero() {
        let _ = writeln!(out, "tensorfold_http_responses_total{{code=\"{code}\"}} {n}");
    }
    out
}

/// A sample value as the format spells it (`NaN`, `+Inf`, `-Inf`, else the shortest decimal
/// that round-trips).
fn number(v: f64) -> String {
    match v {
        v if v.is_nan() => "NaN".into(),
        f64::INFINITY => "+Inf".into(),
        f64::NEG_INFINITY => "-Inf".into(),
        v => format!("{v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_carry_the_stats_and_every_family_is_typed() {
        let stats = EngineStats {
            requests_total: 7,
            requests_waiting: 3,
            cached_tokens_total: 96,
            steps_total: 4,
            step_seconds_total: 0.25,
            ..Default::default()
        };
        let http = HttpCounters::default();
        http.record(200);
        http.record(200);
        http.record(429);
        let text = render(&stats, &http);
        let lines: Vec<&str> = text.lines().collect();
        for want in [
            "tensorfold_requests_total 7",
            "tensorfold_requests_waiting 3",
            "tensorfold_cached_tokens_total 96",
            "tensorfold_step_seconds_sum 0.25",
            "tensorfold_step_seconds_count 4",
            "tensorfold_http_responses_total{code=\"200\"} 2",
            "tensorfold_http_responses_total{code=\"429\"} 1",
        ] {
            assert!(lines.contains(&want), "missing {want:?} in\n{text}");
        }
        let mut typed = Vec::new();
        for line in &lines {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.push(rest.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = name.trim_end_matches("_sum").trim_end_matches("_count");
                assert!(typed.iter().any(|t| t == family || t == name), "untyped sample {line}");
            }
        }
    }

    #[test]
    fn special_values_use_the_format_spelling() {
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(3.0), "3");
    }
}
