//! Tool parameters and results that are not the run report itself, and the argument
//! extractor that names the offending field when arguments do not deserialize.

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// Typed tool arguments, like rmcp's `Parameters`, except that a deserialization error says
/// where it happened (`limits.memory_mb: invalid type: string "a lot", expected f64`).
///
/// The message keeps rmcp's `failed to deserialize parameters:` prefix, which is what makes
/// the router answer with a tool error (`isError: true`) instead of a protocol error.
#[derive(Debug, Clone)]
pub struct Parameters<P>(pub P);

impl<P: JsonSchema> JsonSchema for Parameters<P> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        P::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        P::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        P::json_schema(generator)
    }
}

impl<S, P: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Parameters<P> {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let arguments = context.arguments.take().unwrap_or_default();
        serde_path_to_error::deserialize(serde_json::Value::Object(arguments))
            .map(Parameters)
            .map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                let message = if path.is_empty() || path == "." {
                    format!("failed to deserialize parameters: {inner}")
                } else {
                    format!("failed to deserialize parameters: {path}: {inner}")
                };
                ErrorData::invalid_params(message, None)
            })
    }
}

/// Arguments of `get_result`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetResultParams {
    /// The id `start_run` returned.
    pub run_id: String,
    /// Wait up to this many seconds (0 to 60, default 0) for the run to finish before
    /// answering; the answer comes as soon as it finishes.
    #[serde(default)]
    pub wait_seconds: Option<f64>,
}

/// Arguments of `stop_run`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopRunParams {
    /// The id `start_run` returned.
    pub run_id: String,
}

/// Arguments of `get_execution_history`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// Most runs to return, newest first (1 to 1000, default 20).
    #[serde(default)]
    pub limit: Option<i64>,
    /// Only runs with this status: queued, running, succeeded, failed, compile_error,
    /// timed_out, out_of_memory, stopped or sandbox_error.
    #[serde(default)]
    pub status: Option<String>,
    /// Only runs of this language (id or alias).
    #[serde(default)]
    pub language: Option<String>,
    /// Only the executions of this session.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// Arguments naming a session.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionIdParams {
    /// The id `create_session` returned.
    pub session_id: String,
}

/// Arguments of `read_session_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadSessionFileParams {
    /// The id `create_session` returned.
    pub session_id: String,
    /// Relative to the session's working directory (`.` for itself, `outputs/plot.png`).
    pub path: String,
    /// Where to start reading, in bytes (default 0).
    #[serde(default)]
    pub offset: Option<i64>,
    /// Most bytes to return (default and maximum: the output cap).
    #[serde(default)]
    pub max_bytes: Option<i64>,
}
