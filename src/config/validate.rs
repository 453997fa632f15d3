//! [`validate`]: every setting checked once, at start, each error naming the setting,
//! the value and what is allowed.

use super::*;

/// Check every setting once, at start.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    fn invalid(setting: &str, value: impl ToString, reason: &str) -> ConfigError {
        ConfigError::Invalid {
            setting: setting.to_string(),
            value: value.to_string(),
            reason: reason.to_string(),
        }
    }
    let l = &config.limits;
    if l.max_memory_mb == 0 || l.max_memory_mb > 1 << 20 {
        return Err(invalid(
            "limits.max_memory_mb",
            l.max_memory_mb,
            "must be between 1 and 1048576",
        ));
    }
    if l.default_memory_mb < 6 || l.default_memory_mb > l.max_memory_mb {
        return Err(invalid(
            "limits.default_memory_mb",
            l.default_memory_mb,
            &format!(
                "must be between 6 and limits.max_memory_mb ({})",
                l.max_memory_mb
            ),
        ));
    }
    for (name, v) in [
        ("limits.max_timeout_seconds", l.max_timeout_seconds),
        ("limits.max_cpus", l.max_cpus),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(invalid(name, v, "must be a positive number"));
        }
    }
    for (name, v, max, max_name) in [
        (
            "limits.default_timeout_seconds",
            l.default_timeout_seconds,
            l.max_timeout_seconds,
            "limits.max_timeout_seconds",
        ),
        (
            "limits.default_cpus",
            l.default_cpus,
            l.max_cpus,
            "limits.max_cpus",
        ),
    ] {
        if !(v.is_finite() && v > 0.0 && v <= max) {
            return Err(invalid(
                name,
                v,
                &format!("must be positive and at most {max_name} ({max})"),
            ));
        }
    }
    let s = &config.sandbox;
    if s.pids_limit < 8 {
        return Err(invalid(
            "sandbox.pids_limit",
            s.pids_limit,
            "must be at least 8",
        ));
    }
    if s.runtime.trim().is_empty() || s.runtime.contains(char::is_whitespace) {
        return Err(invalid(
            "sandbox.runtime",
            format!("{:?}", s.runtime),
            "must name an OCI runtime registered with the daemon, e.g. runc or runsc",
        ));
    }
    for h in &s.egress_hosts {
        if super::Allowed::from_host(h).is_none() {
            return Err(invalid(
                "sandbox.egress_hosts",
                format!("{h:?}"),
                "must be `host` or `host:port` (no scheme, path or credentials)",
            ));
        }
    }
    // No check against the memory: each run's working directory is this, at most half
    // the run's memory, so lowering `limits.default_memory_mb` needs no second setting.
    if s.workspace_mb < 1 || s.workspace_mb > l.max_memory_mb {
        return Err(invalid(
            "sandbox.workspace_mb",
            s.workspace_mb,
            &format!(
                "must be between 1 and limits.max_memory_mb ({} MB); each run gets at most half its memory",
                l.max_memory_mb
            ),
        ));
    }
    for (name, v) in [
        ("sandbox.output_limit_bytes", s.output_limit_bytes),
        ("sandbox.max_output_bytes", s.max_output_bytes),
        ("sandbox.max_output_file_bytes", s.max_output_file_bytes),
        ("sandbox.tmpfs_mb", s.tmpfs_mb),
        ("sandbox.max_file_size_mb", s.max_file_size_mb),
        ("sandbox.max_code_bytes", s.max_code_bytes as u64),
        ("sandbox.max_arg_bytes", s.max_arg_bytes as u64),
    ] {
        if v == 0 {
            return Err(invalid(name, 0, "must be positive"));
        }
    }
    let r = &config.runs;
    if r.max_concurrent_runs == 0 || r.max_concurrent_runs > 1024 {
        return Err(invalid(
            "runs.max_concurrent_runs",
            r.max_concurrent_runs,
            "must be between 1 and 1024",
        ));
    }
    if r.max_queued_runs > 100_000 {
        return Err(invalid(
            "runs.max_queued_runs",
            r.max_queued_runs,
            "must be at most 100000",
        ));
    }
    if r.memory_budget_mb < l.default_memory_mb {
        return Err(invalid(
            "runs.memory_budget_mb",
            r.memory_budget_mb,
            &format!(
                "must be at least limits.default_memory_mb ({})",
                l.default_memory_mb
            ),
        ));
    }
    if r.result_retention_seconds < MIN_RESULT_RETENTION_SECONDS {
        return Err(invalid(
            "runs.result_retention_seconds",
            r.result_retention_seconds,
            &format!("must be at least {MIN_RESULT_RETENTION_SECONDS} (reports are kept for at least an hour)"),
        ));
    }
    if r.retained_reports_mb == 0 {
        return Err(invalid(
            "runs.retained_reports_mb",
            0,
            "must be positive (it bounds the memory of finished reports)",
        ));
    }
    let p = &config.pool;
    let pooled: usize = p.sizes.values().sum();
    if pooled > MAX_POOLED {
        return Err(invalid(
            "pool.sizes",
            pooled,
            &format!("must keep at most {MAX_POOLED} containers in all (each holds one of the 64 sandbox users)"),
        ));
    }
    let at_most = |setting: String, n: usize| {
        if n > MAX_POOLED {
            return Err(invalid(
                &setting,
                n,
                &format!("must be at most {MAX_POOLED} (the pool holds at most {MAX_POOLED} containers: each holds one of the 64 sandbox users)"),
            ));
        }
        Ok(())
    };
    at_most("pool.default_max_ready".into(), p.default_max_ready)?;
    for (lang, &n) in &p.max_ready {
        at_most(format!("pool.max_ready.{lang}"), n)?;
    }
    if p.idle_seconds < 10 {
        return Err(invalid(
            "pool.idle_seconds",
            p.idle_seconds,
            "must be at least 10",
        ));
    }
    let hist = &config.history;
    if let Some(url) = &hist.url {
        check_postgres_url(url).map_err(|reason| {
            invalid(
                "history.url",
                format!("{:?}", redact_password(url)),
                &reason,
            )
        })?;
        if let Some(path) = &hist.path {
            return Err(invalid(
                "history.path",
                path.display(),
                "is the SQLite file, but history.url is set too: set one of them",
            ));
        }
    } else if let Some(file) = &hist.password_file {
        return Err(invalid(
            "history.password_file",
            file.display(),
            "is only used with history.url (PostgreSQL)",
        ));
    }
    let d = &config.docker;
    if let Some(host) = &d.host {
        let ok = match host.split_once("://") {
            Some(("unix", path)) => path.starts_with('/'),
            Some(("tcp", rest)) => rest
                .trim_end_matches('/')
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()),
            _ => false,
        };
        if !ok {
            return Err(invalid(
                "docker.host",
                format!("{host:?}"),
                "must be unix:///path/to/docker.sock or tcp://HOST:PORT (the setting, else DOCKER_HOST)",
            ));
        }
    }
    if let Some(network) = &d.build_network {
        if network.trim().is_empty() || network.contains(char::is_whitespace) {
            return Err(invalid(
                "docker.build_network",
                format!("{network:?}"),
                "must name a network mode, e.g. host",
            ));
        }
    }
    let h = &config.http;
    if h.listen.parse::<std::net::SocketAddr>().is_err() {
        return Err(invalid(
            "http.listen",
            format!("{:?}", h.listen),
            "must be an IP address and port, e.g. 127.0.0.1:8765",
        ));
    }
    if h.allowed_hosts.is_empty() {
        return Err(invalid(
            "http.allowed_hosts",
            "[]",
            "must list at least one host name; the Host check is the defence against DNS rebinding",
        ));
    }
    if h.max_body_bytes < 1024 {
        return Err(invalid(
            "http.max_body_bytes",
            h.max_body_bytes,
            "must be at least 1024",
        ));
    }
    config.cluster.validate(config)?;
    config.sessions.validate(config)?;
    config.packages.validate(config)
}
