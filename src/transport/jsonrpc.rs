//! What a client sent, read the same way on both transports: a valid MCP message, JSON that
//! is no valid message (answered with JSON-RPC errors carrying the ids that can be read), or
//! bytes that are not JSON.
//!
//! The rule both transports keep, and the protocol fuzzer (`tests/it/mcp_fuzz.rs`) checks:
//! a request (an object with a `method`) whose id is a string or an integer gets exactly one
//! answer with that id, a result or an error; so does each request of a batch, which MCP does
//! not support.

use rmcp::model::ServerJsonRpcMessage;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ErrorData, JsonRpcRequest, RequestId};
use serde::Deserialize;
use serde_json::Value;

/// One message as read.
pub enum Incoming {
    Message(Box<ClientJsonRpcMessage>),
    /// JSON that is no valid message: the errors to answer it with (never empty), and
    /// whether it was a batch (an array; answered with an array over HTTP).
    Invalid {
        answers: Vec<ServerJsonRpcMessage>,
        batch: bool,
    },
    /// Blank, not UTF-8, not JSON, or nested deeper than the parser allows.
    NotJson(String),
}

const BATCH: &str =
    "JSON-RPC batches are not supported by MCP; send each request as a message of its own";

/// Read one message (a UTF-8 byte order mark is allowed).
pub fn parse(bytes: &[u8]) -> Incoming {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    if bytes.trim_ascii().is_empty() {
        return Incoming::NotJson("the message is empty".into());
    }
    let error = match serde_json::from_slice::<ClientJsonRpcMessage>(bytes) {
        Ok(message) => return Incoming::Message(Box::new(message)),
        Err(e) => e,
    };
    let value = match error.classify() {
        serde_json::error::Category::Data => serde_json::from_slice::<Value>(bytes).ok(),
        _ => None,
    };
    let Some(value) = value else {
        return Incoming::NotJson(error.to_string());
    };
    let mut answers: Vec<ServerJsonRpcMessage> = match &value {
        Value::Array(items) => items
            .iter()
            .filter_map(request_id)
            .map(|id| invalid(BATCH.to_string(), Some(id)))
            .collect(),
        _ => request_id(&value)
            .map(|id| invalid(why_invalid(&value), Some(id)))
            .into_iter()
            .collect(),
    };
    if answers.is_empty() {
        // No request whose id can be read: one error without an id, as JSON-RPC says.
        answers.push(invalid(
            "not a valid JSON-RPC 2.0 message with a usable id".into(),
            None,
        ));
    }
    Incoming::Invalid {
        answers,
        batch: value.is_array(),
    }
}

/// The id of a request (an object with a `method`), when a JSON-RPC id can be read from it:
/// a string or an integer.
fn request_id(v: &Value) -> Option<RequestId> {
    let o = v.as_object()?;
    o.get("method")?;
    RequestId::deserialize(o.get("id")?).ok()
}

/// Why a request with a readable id is not valid, in the parser's words.
fn why_invalid(v: &Value) -> String {
    let method = match v.get("method").and_then(Value::as_str) {
        Some(m) => format!(" `{}`", m.chars().take(100).collect::<String>()),
        None => String::new(),
    };
    match serde_json::from_value::<JsonRpcRequest<ClientRequest>>(v.clone()) {
        Err(e) => format!("invalid request{method}: {e}"),
        Ok(_) => format!("invalid request{method}"),
    }
}

/// An Invalid Request error (-32600).
pub fn invalid(message: String, id: Option<RequestId>) -> ServerJsonRpcMessage {
    ServerJsonRpcMessage::error(ErrorData::invalid_request(message, None), id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answers(text: &str) -> Vec<Value> {
        match parse(text.as_bytes()) {
            Incoming::Invalid { answers, .. } => answers
                .into_iter()
                .map(|m| serde_json::to_value(m).unwrap())
                .collect(),
            Incoming::Message(_) => panic!("{text} read as a message"),
            Incoming::NotJson(_) => Vec::new(),
        }
    }

    #[test]
    fn an_invalid_request_is_answered_with_its_own_id() {
        for (text, id) in [
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":"x"}"#,
                json!(3),
            ),
            (r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#, json!("a")),
            (r#"{"id":4,"method":"ping"}"#, json!(4)),
            (r#"{"jsonrpc":"2.0","id":2.0,"method":7}"#, json!(2)),
        ] {
            let a = answers(text);
            assert_eq!(a.len(), 1, "{text}");
            assert_eq!(a[0]["id"], id, "{text}: {}", a[0]);
            assert_eq!(a[0]["error"]["code"], -32600);
        }
    }

    #[test]
    fn each_request_of_a_batch_gets_an_error_with_its_id() {
        let a = answers(
            r#"[{"jsonrpc":"2.0","id":6,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":"x","method":"tools/list"},42]"#,
        );
        let ids: Vec<&Value> = a.iter().map(|m| &m["id"]).collect();
        assert_eq!(ids, [&json!(6), &json!("x")]);
        assert!(a[0]["error"]["message"].as_str().unwrap().contains("batch"));
    }

    #[test]
    fn messages_without_a_readable_id_get_one_anonymous_error_and_garbage_none() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            "42",
            "[]",
        ] {
            let a = answers(text);
            assert_eq!(a.len(), 1, "{text}");
            assert!(a[0].get("id").is_none(), "{text}: {}", a[0]);
        }
        for text in ["{", "\u{feff}", "   ", r#"{"a":"\ud800"}"#, "NaN"] {
            assert!(answers(text).is_empty(), "{text}");
        }
        assert!(matches!(
            parse(b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}"),
            Incoming::Message(_)
        ));
        assert!(matches!(
            parse(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}"),
            Incoming::NotJson(_)
        ));
    }
}
