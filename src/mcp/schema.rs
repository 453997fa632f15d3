//! The tools' JSON schemas: derived from the Rust types, with the running configuration's
//! numbers and language ids written into the descriptions, and only standard formats.

use crate::report::fmt_num;
use crate::runs::RunManager;

/// The ids of the languages the server runs, sorted.
pub(super) fn language_ids(manager: &RunManager) -> Vec<&str> {
    manager
        .registry()
        .languages
        .keys()
        .map(String::as_str)
        .collect()
}

/// Set the description of the node at `path` (object keys) in `schema`, if it exists.
fn describe(schema: &mut rmcp::model::JsonObject, path: &[&str], text: String) {
    let mut node = schema.get_mut(path[0]);
    for key in &path[1..] {
        node = node.and_then(|n| n.get_mut(*key));
    }
    if let Some(obj) = node.and_then(serde_json::Value::as_object_mut) {
        obj.insert("description".into(), serde_json::Value::String(text));
    }
}

/// The smaller of the memory ceiling and the budget: what a request can really get.
pub(super) fn effective_max_memory_mb(manager: &RunManager) -> u64 {
    manager.config().ceilings().memory_mb
}

/// `run_code`'s argument schema with the running config's numbers and language ids.
pub(super) fn run_schema(
    schema: &rmcp::model::JsonObject,
    manager: &RunManager,
) -> rmcp::model::JsonObject {
    let c = manager.config();
    let (d, m) = (c.limits.defaults(), c.ceilings());
    let mut schema = schema.clone();
    describe(
        &mut schema,
        &["properties", "language"],
        format!(
            "Language id or alias: {}. May be left out with session_id.",
            language_ids(manager).join(", ")
        ),
    );
    let limits = ["$defs", "LimitsInput", "properties"];
    describe(
        &mut schema,
        &[limits[0], limits[1], limits[2], "memory_mb"],
        format!(
            "MB, whole; default {}, at most {} (no swap).",
            d.memory_mb,
            effective_max_memory_mb(manager)
        ),
    );
    describe(
        &mut schema,
        &[limits[0], limits[1], limits[2], "timeout_seconds"],
        format!(
            "Wall clock; default {}, at least {}, at most {}.",
            fmt_num(d.timeout_seconds),
            fmt_num(crate::contract::MIN_TIMEOUT_SECONDS),
            fmt_num(m.timeout_seconds)
        ),
    );
    describe(
        &mut schema,
        &[limits[0], limits[1], limits[2], "cpus"],
        format!(
            "Cores, may be fractional; default {}, at most {}.",
            fmt_num(d.cpus),
            fmt_num(m.cpus)
        ),
    );
    schema
}

/// `start_run`'s schema: `run_code`'s, whose descriptions it does not repeat.
pub(super) fn start_run_schema(run_schema: &rmcp::model::JsonObject) -> rmcp::model::JsonObject {
    fn strip(v: &mut serde_json::Value, top: bool) {
        match v {
            serde_json::Value::Object(o) => {
                if !top {
                    o.remove("description");
                }
                o.values_mut().for_each(|c| strip(c, false));
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|c| strip(c, false)),
            _ => {}
        }
    }
    let mut v = serde_json::Value::Object(run_schema.clone());
    strip(&mut v, true);
    let mut schema = match v {
        serde_json::Value::Object(o) => o,
        _ => run_schema.clone(),
    };
    if let Some(props) = schema
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        for (_, p) in props.iter_mut() {
            if let Some(o) = p.as_object_mut() {
                o.insert("description".into(), "As in run_code.".into());
            }
        }
    }
    schema
}

/// An input schema as the model reads it, without what says nothing to it: `$schema`,
/// `default: null`, the `null` alternative of optional arguments (leaving one out is the
/// way to say nothing; the server still accepts an explicit null), the descriptions of the
/// `$defs` types themselves (their properties say it), and documented string variants as a
/// plain `enum`.
pub(super) fn compact(schema: &rmcp::model::JsonObject) -> rmcp::model::JsonObject {
    use serde_json::Value;
    fn not_null(v: &Value) -> bool {
        v.get("type").and_then(Value::as_str) != Some("null")
    }
    fn clean(v: &mut Value) {
        let Value::Object(o) = v else {
            if let Value::Array(a) = v {
                a.iter_mut().for_each(clean);
            }
            return;
        };
        if o.get("default") == Some(&Value::Null) {
            o.remove("default");
        }
        if let Some(Value::Array(types)) = o.get("type") {
            let kept: Vec<Value> = types
                .iter()
                .filter(|t| t.as_str() != Some("null"))
                .cloned()
                .collect();
            if kept.len() == 1 {
                o.insert("type".into(), kept[0].clone());
            }
        }
        if let Some(Value::Array(any)) = o.get("anyOf") {
            let kept: Vec<&Value> = any.iter().filter(|a| not_null(a)).collect();
            if kept.len() == 1 && any.len() == 2 {
                if let Some(Value::Object(one)) = kept.first().cloned() {
                    let one = one.clone();
                    o.remove("anyOf");
                    for (k, v) in one {
                        o.entry(k).or_insert(v);
                    }
                }
            }
        }
        if let Some(Value::Array(variants)) = o.get("oneOf") {
            let consts: Option<Vec<Value>> = variants
                .iter()
                .map(|v| match v.get("const") {
                    Some(c @ Value::String(_)) => Some(c.clone()),
                    _ => None,
                })
                .collect();
            if let Some(consts) = consts {
                o.remove("oneOf");
                o.insert("enum".into(), Value::Array(consts));
                o.insert("type".into(), "string".into());
            }
        }
        o.values_mut().for_each(clean);
    }
    let mut v = Value::Object(schema.clone());
    if let Value::Object(o) = &mut v {
        o.remove("$schema");
        if let Some(Value::Object(defs)) = o.get_mut("$defs") {
            for def in defs.values_mut() {
                if let Value::Object(d) = def {
                    d.remove("description");
                }
            }
        }
    }
    clean(&mut v);
    match v {
        Value::Object(o) => o,
        _ => schema.clone(),
    }
}
