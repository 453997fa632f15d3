//! README.md's statements that the code can check: the report's fields, the limits'
//! defaults and ceilings, and the metrics it names (the language table has its own test in
//! `registry_file.rs`).

use codebox::config::Config;
use codebox::report::{RunLimits, RunReport, Status};

use crate::common::root;

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).unwrap()
}

#[test]
fn the_readme_names_every_field_of_the_report() {
    let report = RunReport::new(
        "r",
        "python",
        Status::Succeeded,
        RunLimits {
            memory_mb: 1,
            timeout_seconds: 1.0,
            cpus: 1.0,
        },
        "",
    );
    let json = serde_json::to_value(&report).unwrap();
    let text = readme();
    let start = text
        .find("The report is one JSON shape everywhere")
        .expect("README.md describes the report");
    let list = &text[start..start + 1200];
    for field in json.as_object().unwrap().keys() {
        assert!(
            list.contains(&format!("{field},"))
                || list.contains(&format!("{field} "))
                || list.contains(&format!("{field}`")),
            "README.md's report field list leaves out `{field}`"
        );
    }
}

#[test]
fn the_readme_states_the_limits_the_code_enforces() {
    let c = Config::default();
    let (d, m) = (c.limits.defaults(), c.ceilings());
    let expected = format!(
        "Per request: `memory_mb` (default {}, max {}), `timeout_seconds` (wall clock; default {},\nmax {}), `cpus` (default {}, max {}).",
        d.memory_mb, m.memory_mb, d.timeout_seconds, m.timeout_seconds, d.cpus, m.cpus
    );
    assert!(
        readme().contains(&expected),
        "README.md's Limits section should read: {expected}"
    );
    assert!(
        readme().contains(&format!("the maximum is {} MB`", m.memory_mb)),
        "README.md's example error should name the effective memory ceiling {} MB",
        m.memory_mb
    );
}

#[test]
fn every_metric_the_docs_name_is_exported() {
    let metrics = std::fs::read_to_string(root().join("src/runs/metrics.rs")).unwrap();
    for doc in ["README.md", "docs/mcp.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for (i, _) in text.match_indices("codebox_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.ends_with("_total") || name.ends_with("_seconds") || name.contains("_runs") {
                assert!(
                    metrics.contains(&name),
                    "{doc} names the metric {name}, which /metrics does not export"
                );
            }
        }
    }
    // The README says the compile cache's hits and misses are there.
    assert!(metrics.contains("codebox_compile_cache_lookups_total"));
    assert!(readme().contains("and the cache's hits and misses"));
}
