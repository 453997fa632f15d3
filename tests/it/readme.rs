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

/// The text of the first fenced block after `heading` in `doc`.
fn block_after(doc: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let at = text
        .find(heading)
        .unwrap_or_else(|| panic!("{doc} has no `{heading}`"));
    let rest = &text[at..];
    let open = rest.find("```").expect("a fenced block");
    let body = &rest[open..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("```").expect("the block ends")].to_string()
}

#[test]
fn the_defaults_block_of_mcp_md_is_what_codebox_config_defaults_prints() {
    let shown = block_after("docs/mcp.md", "Every setting, at its shipped default");
    let rendered = codebox::config::defaults_toml();
    assert!(
        shown == rendered,
        "docs/mcp.md's defaults block differs from `codebox config --defaults`; replace it with:\n{rendered}"
    );
}

#[tokio::test]
async fn the_annotation_table_of_mcp_md_lists_every_tool_as_the_server_announces_it() {
    let text = std::fs::read_to_string(root().join("docs/mcp.md")).unwrap();
    let start = text
        .find("| tool | read-only | destructive | idempotent | open world |")
        .expect("docs/mcp.md has the annotation table");
    let mut rows = std::collections::BTreeMap::new();
    for line in text[start..].lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<String> = line
            .split('|')
            .map(|c| c.trim().split(' ').next().unwrap_or("").to_string())
            .collect();
        let yes = |i: usize| cells[i] == "yes";
        rows.insert(
            cells[1].trim_matches('`').to_string(),
            (yes(2), yes(3), yes(4), yes(5)),
        );
    }
    let fake = std::sync::Arc::new(codebox::engine::fake::FakeEngine::new());
    let client = crate::mcp_support::connect(crate::mcp_support::fake_manager(&fake, |_| {})).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut announced = std::collections::BTreeMap::new();
    for t in &tools {
        let a = t.annotations.clone().expect("annotations");
        let hint = |h: Option<bool>| h.expect("every hint is given");
        announced.insert(
            t.name.to_string(),
            (
                hint(a.read_only_hint),
                hint(a.destructive_hint),
                hint(a.idempotent_hint),
                hint(a.open_world_hint),
            ),
        );
    }
    assert_eq!(
        rows, announced,
        "docs/mcp.md's table (read-only, destructive, idempotent, open world) against tools/list"
    );
}

#[test]
fn the_readme_command_list_names_every_command_and_history_session() {
    let list = block_after("README.md", "After the first run the binary is at");
    let cli = codebox::cli::command();
    for c in cli.get_subcommands().filter(|c| c.get_name() != "help") {
        let name = c.get_name();
        assert!(
            list.lines()
                .any(|l| l.starts_with(&format!("codebox {name}"))),
            "README.md's command list leaves out `codebox {name}`"
        );
    }
    let history = list
        .lines()
        .find(|l| l.starts_with("codebox history"))
        .unwrap();
    assert!(history.contains("--session"), "{history}");
}
