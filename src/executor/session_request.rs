//! A request to open a session, and its validation: its files and limits are checked as an
//! execution's would be, with the session's upload cap.

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::checks::{limit, reject, resolve_language};
use super::request::{
    FileInput, LimitsInput, RequestError, RunRequest, SessionTerms, ValidRequest,
};
use crate::config::Config;
use crate::registry::{Language, Registry};
use crate::report::RunLimits;

/// What a client asks for to open a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Language id or alias (see `list_supported_languages`).
    pub language: String,
    /// Memory and CPU for the session's whole life; `timeout_seconds` is each execution's
    /// default timeout.
    #[serde(default)]
    pub limits: Option<LimitsInput>,
    /// Files placed in the session's working directory; they stay.
    #[serde(default)]
    pub files: Option<Vec<FileInput>>,
    /// End the session after this many seconds without a call naming it.
    #[serde(default)]
    pub idle_timeout_seconds: Option<f64>,
}

/// A session request that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidSession {
    pub language: Language,
    pub limits: RunLimits,
    pub files: Vec<(String, Bytes)>,
    pub idle_timeout: std::time::Duration,
}

impl ValidSession {
    pub fn new(
        req: SessionRequest,
        registry: &Registry,
        config: &Config,
    ) -> Result<ValidSession, RequestError> {
        let max_idle = config.sessions.max_idle_timeout_seconds as f64;
        let idle = limit(
            "idle_timeout_seconds",
            req.idle_timeout_seconds,
            config.sessions.idle_timeout_seconds as f64,
            max_idle,
            "idle time",
            "s",
        )?;
        if idle < 1.0 {
            return reject(
                "idle_timeout_seconds",
                format!("requested {idle} s; the minimum is 1 s"),
            );
        }
        // The files and limits are checked as an execution's would be, with the session's
        // upload cap.
        let probe = RunRequest {
            language: req.language,
            code: "-".into(),
            files: req.files,
            limits: req.limits,
            ..Default::default()
        };
        let language = resolve_language(registry, &probe.language)?;
        let terms = SessionTerms {
            language,
            limits: config.limits.defaults(),
            max_upload_bytes: config.sessions.max_upload_bytes,
        };
        let valid = ValidRequest::checked(probe, language, config, Some(terms))?;
        Ok(ValidSession {
            language: valid.language,
            limits: valid.limits,
            files: valid.files,
            idle_timeout: std::time::Duration::from_secs_f64(idle),
        })
    }
}
