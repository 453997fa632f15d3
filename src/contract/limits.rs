//! The limits a request asks for (memory, wall-clock time, CPU), checked against a ceiling;
//! never clamped.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::checks::{limit, reject, RequestError, MIN_TIMEOUT_SECONDS};
use crate::report::RunLimits;

/// Limits a client may ask for; anything left out takes the operator's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsInput {
    /// Memory limit in MB (whole number).
    pub memory_mb: Option<f64>,
    /// Wall-clock limit of the run stage in seconds.
    pub timeout_seconds: Option<f64>,
    /// CPU quota in cores (may be fractional, e.g. 0.5).
    pub cpus: Option<f64>,
}

/// Check the limits a request asks for against `ceilings`; what it leaves out takes
/// `defaults`.
pub(super) fn check_limits(
    limits: Option<LimitsInput>,
    defaults: RunLimits,
    ceilings: RunLimits,
) -> Result<RunLimits, RequestError> {
    let (l, d, c) = (limits.unwrap_or_default(), defaults, ceilings);
    let memory = limit(
        "limits.memory_mb",
        l.memory_mb,
        d.memory_mb as f64,
        c.memory_mb as f64,
        "memory",
        "MB",
    )?;
    if memory.fract() != 0.0 {
        return reject(
            "limits.memory_mb",
            format!("must be a whole number of MB; requested {memory}"),
        );
    }
    if memory < 6.0 {
        return reject(
            "limits.memory_mb",
            format!("requested {memory} MB; the minimum is 6 MB"),
        );
    }
    let timeout = limit(
        "limits.timeout_seconds",
        l.timeout_seconds,
        d.timeout_seconds,
        c.timeout_seconds,
        "wall-clock time",
        "s",
    )?;
    if timeout < MIN_TIMEOUT_SECONDS {
        return reject(
            "limits.timeout_seconds",
            format!("requested {timeout} s; the minimum is {MIN_TIMEOUT_SECONDS} s"),
        );
    }
    let cpus = limit("limits.cpus", l.cpus, d.cpus, c.cpus, "CPU", "cpus")?;
    if cpus < 0.01 {
        return reject(
            "limits.cpus",
            format!("requested {cpus} cpus; the minimum is 0.01"),
        );
    }
    Ok(RunLimits {
        memory_mb: memory as u64,
        timeout_seconds: timeout,
        cpus,
    })
}
