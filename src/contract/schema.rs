//! The JSON schemas codebox publishes (tool schemas, the OpenAPI document) are derived from
//! the contract's types; this keeps them to what JSON Schema itself defines.

use serde_json::{Map, Value};

/// Formats JSON Schema defines; schemars also writes its own (`uint64`, `double`...), which
/// strict validators (the official TypeScript SDK's) warn about on every call.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// A schema with only standard keywords' values: non-standard `format`s removed.
pub(crate) fn standard_schema(schema: &Map<String, Value>) -> Map<String, Value> {
    fn clean(v: &mut Value) {
        match v {
            Value::Object(o) => {
                let odd = matches!(o.get("format"), Some(Value::String(f)) if !STANDARD_FORMATS.contains(&f.as_str()));
                if odd {
                    o.remove("format");
                }
                o.values_mut().for_each(clean);
            }
            Value::Array(a) => a.iter_mut().for_each(clean),
            _ => {}
        }
    }
    let mut v = Value::Object(schema.clone());
    clean(&mut v);
    match v {
        Value::Object(o) => o,
        _ => schema.clone(),
    }
}
