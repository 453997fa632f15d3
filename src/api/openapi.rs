//! The OpenAPI 3.1 document of `/v1` (`GET /v1/openapi.json`), generated from the Rust types
//! the MCP tools use (their JSON schemas come from the same `schemars` derives), so the
//! document cannot drift from what the server accepts and answers.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use super::v1::{ErrorBody, RETRY_AFTER_SECONDS};
use crate::catalog::Catalog;
use crate::executor::RunRequest;
use crate::history::HistoryResult;
use crate::mcp::{standard_schema, GetResultParams, HistoryParams, MAX_WAIT_SECONDS};
use crate::report::RunReport;
use crate::runs::{Accepted, RunManager};

/// Where the schemas live in the document.
const SCHEMAS: &str = "#/components/schemas/";

/// A `$ref` to a schema of the document.
fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("{SCHEMAS}{name}") })
}

/// The JSON schemas of `T` and of everything it uses, under their names.
fn add_schema<T: JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
    schemas: &mut Map<String, Value>,
) -> String {
    let name = T::schema_name().to_string();
    let _ = generator.subschema_for::<T>();
    for (k, v) in generator.take_definitions(true) {
        schemas.insert(k, v);
    }
    name
}

/// The properties of a parameters struct as OpenAPI query parameters.
fn query_parameters<T: JsonSchema>(only: &[&str]) -> Vec<Value> {
    let schema = schemars::schema_for!(T);
    let mut out = Vec::new();
    let properties = schema
        .as_object()
        .and_then(|o| o.get("properties"))
        .and_then(Value::as_object);
    for (name, property) in properties.into_iter().flatten() {
        if !only.is_empty() && !only.contains(&name.as_str()) {
            continue;
        }
        let mut property = property.clone();
        let description = property
            .as_object_mut()
            .and_then(|o| o.remove("description"))
            .unwrap_or(Value::Null);
        out.push(json!({
            "name": name,
            "in": "query",
            "required": false,
            "description": description,
            "schema": property,
        }));
    }
    out
}

/// One response of an operation: a JSON body of `schema`.
fn response(description: &str, schema: Value) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": schema } },
    })
}

fn refusal(description: &str) -> Value {
    response(description, schema_ref("ErrorBody"))
}

fn retryable(description: &str) -> Value {
    let mut r = refusal(description);
    r["headers"] = json!({
        "Retry-After": {
            "description": format!("Seconds to wait before retrying ({RETRY_AFTER_SECONDS})."),
            "schema": { "type": "integer" },
        }
    });
    r
}

/// The document, with the running server's numbers where the schemas state them.
pub fn document(manager: &RunManager) -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let mut schemas = Map::new();
    let request = add_schema::<RunRequest>(&mut generator, &mut schemas);
    let report = add_schema::<RunReport>(&mut generator, &mut schemas);
    let accepted = add_schema::<Accepted>(&mut generator, &mut schemas);
    let catalog = add_schema::<Catalog>(&mut generator, &mut schemas);
    let history = add_schema::<HistoryResult>(&mut generator, &mut schemas);
    add_schema::<ErrorBody>(&mut generator, &mut schemas);

    // POST /v1/runs takes run_code's arguments plus `wait`.
    let mut body = schemas.get(&request).cloned().unwrap_or_else(|| json!({}));
    if let Some(properties) = body.get_mut("properties").and_then(Value::as_object_mut) {
        properties.insert(
            "wait".into(),
            json!({
                "description": "Wait for the run's end and answer its report (true, the default), or answer 202 with the run id at once (false).",
                "type": ["boolean", "null"],
                "default": true,
            }),
        );
    }
    body["description"] = json!("run_code's arguments, and `wait`.");
    schemas.insert("RunBody".into(), body);
    for schema in schemas.values_mut() {
        if let Value::Object(o) = schema {
            *o = standard_schema(o);
        }
    }

    let c = manager.config();
    let id_parameter = json!({
        "name": "id", "in": "path", "required": true,
        "description": "The run id that POST /v1/runs returned.",
        "schema": { "type": "string" },
    });
    let mut get_run_parameters = vec![id_parameter.clone()];
    get_run_parameters.extend(query_parameters::<GetResultParams>(&["wait_seconds"]));
    let unauthorized = refusal("Missing or wrong bearer token.");
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "codebox",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "Run code in locked-down, throwaway Docker containers. The same runs, reports \
                 and limits as the MCP tools at /mcp (run_code, start_run, get_result, stop_run, \
                 list_supported_languages, get_execution_history). At most {} runs execute at \
                 once; a queue holds {} more.",
                c.runs.max_concurrent_runs, c.runs.max_queued_runs
            ),
        },
        "servers": [{ "url": "/" }],
        "security": [{ "bearer": [] }],
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The server's token (CODEBOX_TOKEN or --token-file); none when it was started with --no-auth on loopback.",
                },
            },
        },
        "paths": {
            "/v1/runs": {
                "post": {
                    "operationId": "createRun",
                    "summary": "Run a program (run_code, or start_run with wait: false).",
                    "requestBody": {
                        "required": true,
                        "content": { "application/json": { "schema": schema_ref("RunBody") } },
                    },
                    "responses": {
                        "200": response("The run ended; its report, whatever its status.", schema_ref(&report)),
                        "202": response("Accepted (wait: false); poll GET /v1/runs/{id}.", schema_ref(&accepted)),
                        "400": refusal("An argument is wrong; `field` names it."),
                        "401": unauthorized.clone(),
                        "413": refusal("The body is over http.max_body_bytes."),
                        "429": retryable("The queue is full; retry later."),
                        "503": retryable("The server cannot accept runs now (it is shutting down)."),
                    },
                },
            },
            "/v1/runs/{id}": {
                "get": {
                    "operationId": "getRun",
                    "summary": format!("A run's report (get_result); wait_seconds (0 to {MAX_WAIT_SECONDS:.0}) waits for its end."),
                    "parameters": get_run_parameters,
                    "responses": {
                        "200": response("The report: final, or status queued or running.", schema_ref(&report)),
                        "400": refusal("wait_seconds is wrong."),
                        "401": unauthorized.clone(),
                        "404": refusal("No such run is known (reports are kept for runs.result_retention_seconds)."),
                        "409": refusal("The run is held by another server sharing the history database."),
                    },
                },
                "delete": {
                    "operationId": "stopRun",
                    "summary": "Stop a run (stop_run); a finished run's report is returned unchanged.",
                    "parameters": [id_parameter],
                    "responses": {
                        "200": response("The final report.", schema_ref(&report)),
                        "401": unauthorized.clone(),
                        "404": refusal("No such run is known."),
                        "409": refusal("The run is held by another server sharing the history database."),
                    },
                },
            },
            "/v1/languages": {
                "get": {
                    "operationId": "listLanguages",
                    "summary": "The supported languages and limits (list_supported_languages).",
                    "responses": {
                        "200": response("Languages and limits.", schema_ref(&catalog)),
                        "401": unauthorized.clone(),
                        "503": retryable("Docker could not be asked about the images."),
                    },
                },
            },
            "/v1/history": {
                "get": {
                    "operationId": "listHistory",
                    "summary": "Past runs, newest first (get_execution_history).",
                    "parameters": query_parameters::<HistoryParams>(&[]),
                    "responses": {
                        "200": response("Past runs.", schema_ref(&history)),
                        "400": refusal("A filter is wrong; `field` names it."),
                        "401": unauthorized.clone(),
                        "503": retryable("This server keeps no history, or its database failed."),
                    },
                },
            },
            "/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document.",
                    "responses": {
                        "200": response("The OpenAPI 3.1 document of /v1.", json!({ "type": "object" })),
                        "401": unauthorized,
                    },
                },
            },
        },
    })
}
