//! The argument extractor that names the offending field when arguments do not deserialize
//! (the parameters themselves are the contract's: [`crate::contract::params`]).

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

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
