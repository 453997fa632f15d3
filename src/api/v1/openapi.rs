//! The OpenAPI 3.1 document of `/v1` (`GET /v1/openapi.json`), generated from the Rust types
//! the MCP tools use (their JSON schemas come from the same `schemars` derives), so the
//! document cannot drift from what the server accepts and answers.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use super::error::{ErrorBody, RETRY_AFTER_SECONDS};
use crate::catalog::Catalog;
use crate::contract::answers::SessionFileResult;
use crate::contract::params::{
    GetResultParams, HistoryParams, ReadSessionFileParams, MAX_WAIT_SECONDS,
};
use crate::contract::schema::standard_schema;
use crate::contract::session_ceilings;
use crate::contract::{RunRequest, SessionRequest};
use crate::history::HistoryResult;
use crate::report::{fmt_num, RunReport};
use crate::runs::{Accepted, RunManager};
use crate::sessions::{Closed, SessionInfo, SessionList};

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
    let session_request = add_schema::<SessionRequest>(&mut generator, &mut schemas);
    let session = add_schema::<SessionInfo>(&mut generator, &mut schemas);
    let sessions = add_schema::<SessionList>(&mut generator, &mut schemas);
    let closed = add_schema::<Closed>(&mut generator, &mut schemas);
    let file = add_schema::<SessionFileResult>(&mut generator, &mut schemas);
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
    // A session's limits hold for its whole life: its ceilings, with this server's numbers.
    let sc = session_ceilings(manager.config());
    if let Some(limits) = schemas
        .get_mut(&session_request)
        .and_then(|s| s.pointer_mut("/properties/limits"))
    {
        let said = limits["description"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        limits["description"] = json!(format!(
            "{said} On this server: memory_mb at most {} MB (sessions.memory_budget_mb bounds it too), timeout_seconds at most {}, cpus at most {}.",
            sc.memory_mb,
            fmt_num(sc.timeout_seconds),
            fmt_num(sc.cpus)
        ));
    }
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
    let session_parameter = json!({
        "name": "id", "in": "path", "required": true,
        "description": "The session id that POST /v1/sessions returned.",
        "schema": { "type": "string" },
    });
    let mut listing_parameters = vec![session_parameter.clone()];
    listing_parameters.extend(query_parameters::<ReadSessionFileParams>(&[
        "offset",
        "max_bytes",
    ]));
    let mut file_parameters = vec![
        session_parameter.clone(),
        json!({
            "name": "path", "in": "path", "required": true,
            "description": "A path relative to the session's working directory (`.` for the directory itself).",
            "schema": { "type": "string" },
        }),
    ];
    file_parameters.extend(query_parameters::<ReadSessionFileParams>(&[
        "offset",
        "max_bytes",
    ]));
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
                 list_supported_languages, get_execution_history) and sessions (create_session, \
                 list_sessions, close_session, read_session_file). At most {} runs execute at \
                 once; a queue holds {} more. At most {} sessions are open at once.",
                c.runs.max_concurrent_runs, c.runs.max_queued_runs, c.sessions.max_sessions
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
                        "404": refusal("session_id names no session this server ever opened."),
                        "409": refusal("session_id names a session that has ended (session_ended: the message says why), or that another server holds (conflict)."),
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
            "/v1/runs/{id}/events": {
                "get": {
                    "operationId": "runEvents",
                    "summary": "A run's live events (also a session's execution), as Server-Sent Events: `queued`, `started` {stage}, `stdout` and `stderr` {data} in order as produced (with `case`, the 1-based test case, when a run has several; within the output caps and 4096 events; `truncated` {stream, reason} when a cap is reached), `file` {path, size_bytes}, and one final `report` (the run report), after which the stream ends. Every event has an id; reconnecting with `Last-Event-ID` resumes after it. A run that has ended answers its `report` at once.",
                    "parameters": [
                        id_parameter.clone(),
                        {
                            "name": "Last-Event-ID", "in": "header", "required": false,
                            "description": "The id of the last event received: the events after it are sent.",
                            "schema": { "type": "string" },
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "The event stream (each event's `data` is JSON; `report`'s is the run report).",
                            "content": { "text/event-stream": { "schema": { "type": "string" } } },
                        },
                        "400": refusal("A query parameter was given (none is taken)."),
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
            "/v1/sessions": {
                "post": {
                    "operationId": "createSession",
                    "summary": "Open a session (create_session): files, and for stateful languages the interpreter's state, kept between executions (POST /v1/runs with session_id).",
                    "requestBody": {
                        "required": true,
                        "content": { "application/json": { "schema": schema_ref(&session_request) } },
                    },
                    "responses": {
                        "200": response("The session.", schema_ref(&session)),
                        "400": refusal("An argument is wrong; `field` names it."),
                        "401": unauthorized.clone(),
                        "413": refusal("The body is over http.max_body_bytes."),
                        "429": retryable("sessions.max_sessions or a memory budget is full (sessions_full); retry later."),
                        "503": retryable("The session's container could not be opened, or the server is shutting down."),
                    },
                },
                "get": {
                    "operationId": "listSessions",
                    "summary": "The open sessions (list_sessions).",
                    "responses": {
                        "200": response("The open sessions.", schema_ref(&sessions)),
                        "401": unauthorized.clone(),
                    },
                },
            },
            "/v1/sessions/{id}": {
                "delete": {
                    "operationId": "closeSession",
                    "summary": "Close a session (close_session): its container and files are removed.",
                    "parameters": [session_parameter],
                    "responses": {
                        "200": response("Closed.", schema_ref(&closed)),
                        "401": unauthorized.clone(),
                        "404": refusal("No such session was ever opened here."),
                        "409": refusal("The session has ended (session_ended: the message says why), or another server holds it (conflict)."),
                    },
                },
            },
            "/v1/sessions/{id}/files": {
                "get": {
                    "operationId": "listSessionFiles",
                    "summary": "The entries of the session's working directory (read_session_file of `.`); also at /v1/sessions/{id}/files/ and /v1/sessions/{id}/files/.",
                    "parameters": listing_parameters,
                    "responses": {
                        "200": response("The working directory (entries).", schema_ref(&file)),
                        "400": refusal("A number is wrong."),
                        "401": unauthorized.clone(),
                        "404": refusal("No such session was ever opened here."),
                        "409": refusal("The session has ended, or another server holds it."),
                    },
                },
            },
            "/v1/sessions/{id}/files/{path}": {
                "get": {
                    "operationId": "readSessionFile",
                    "summary": "A file of the session's working directory, or a folder's entries (read_session_file); symbolic links are not followed.",
                    "parameters": file_parameters,
                    "responses": {
                        "200": response("The file (content_base64) or the folder (entries).", schema_ref(&file)),
                        "400": refusal("The path or a number is wrong."),
                        "401": unauthorized.clone(),
                        "404": refusal("No such session was ever opened here (not_found), or the session has no such file or folder (not_found, `field`: path)."),
                        "409": refusal("The session has ended, or another server holds it."),
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
