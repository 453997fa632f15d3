//! The figures every bench mode prints: a sample's spread, durations in ms.

use std::time::Duration;

/// min, median, p95 of a sample, in ms.
pub fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (v[0], p(0.5), p(0.95))
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
