//! The six tools over an in-process MCP session (rmcp client over `tokio::io::duplex`):
//! schemas, descriptions from the running config, every success and every error path.
//! Runs go to real Docker unless a test says otherwise.

use std::sync::Arc;
use std::time::Duration;

use codebox::contract::params::MAX_WAIT_SECONDS;
use codebox::engine::fake::FakeEngine;
use codebox::report::{RunReport, Status};
use rmcp::model::{CallToolRequestParams, ClientRequest, Request};
use rmcp::service::PeerRequestOptions;
use serde_json::{json, Value};

use crate::mcp_support::{
    call, connect, docker_manager, eventually, fake_manager, labelled, ok, params, settle,
    temp_history, tool_error,
};

fn report(v: Value) -> RunReport {
    serde_json::from_value(v).expect("a run report")
}

#[tokio::test]
async fn tools_have_schemas_truthful_annotations_and_descriptions_from_the_running_config() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| {
        c.limits.default_memory_mb = 384;
        c.limits.max_timeout_seconds = 120.0;
        c.runs.max_concurrent_runs = 3;
    });
    let client = connect(m).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "close_session",
            "create_session",
            "get_execution_history",
            "get_result",
            "list_sessions",
            "list_supported_languages",
            "read_session_file",
            "run_code",
            "start_run",
            "stop_run"
        ]
    );
    let n = crate::common::registry().languages.len();
    for t in &tools {
        assert!(t.output_schema.is_some(), "{} has no output schema", t.name);
        let d = t.description.as_deref().unwrap_or("");
        assert!(d.len() > 80, "{}: description too short: {d}", t.name);
        let a = t.annotations.clone().expect("annotations");
        assert_eq!(a.open_world_hint, Some(false), "{}", t.name);
        let read_only = matches!(
            t.name.as_ref(),
            "get_result"
                | "list_supported_languages"
                | "get_execution_history"
                | "read_session_file"
                | "list_sessions"
        );
        assert_eq!(a.read_only_hint, Some(read_only), "{}", t.name);
        assert_eq!(
            a.destructive_hint,
            Some(matches!(t.name.as_ref(), "stop_run" | "close_session")),
            "{}",
            t.name
        );
        if t.name == "run_code" {
            assert!(d.contains(&format!("{n} languages")), "{d}");
            assert!(d.contains("memory_mb default 384 (max 8192)"), "{d}");
            assert!(d.contains("timeout_seconds default 30 (max 120)"), "{d}");
            assert!(d.contains("At most 3 runs"), "{d}");
        }
        if t.name == "start_run" {
            assert!(d.contains("Arguments as run_code"), "{d}");
        }
        if t.name == "create_session" {
            assert!(d.contains("default 600, max 3600"), "{d}");
            assert!(d.contains("3600 s after creation"), "{d}");
            assert!(d.contains("state is lost"), "{d}");
            assert!(d.contains("At most 8 sessions holding 4096 MB"), "{d}");
        }
        // Only formats JSON Schema defines (no `uint64`, `double`...): strict validators
        // such as the official TypeScript SDK's accept them silently.
        let schemas = [
            Some(Value::Object((*t.input_schema).clone())),
            t.output_schema
                .as_ref()
                .map(|s| Value::Object((**s).clone())),
        ];
        for schema in schemas.iter().flatten() {
            let text = schema.to_string();
            for odd in [
                "\"uint64\"",
                "\"uint\"",
                "\"int64\"",
                "\"double\"",
                "\"float\"",
            ] {
                assert!(
                    !text.contains(&format!("\"format\":{odd}")),
                    "{}: {odd}",
                    t.name
                );
            }
        }
        // Every argument is documented.
        if let Some(props) = t.input_schema.get("properties").and_then(Value::as_object) {
            for (field, schema) in props {
                assert!(
                    schema.get("description").is_some(),
                    "{}.{field} is undocumented",
                    t.name
                );
            }
        }
    }
    let run_code = tools.iter().find(|t| t.name == "run_code").unwrap();
    let start_run = tools.iter().find(|t| t.name == "start_run").unwrap();
    assert_eq!(
        start_run
            .input_schema
            .get("properties")
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        run_code
            .input_schema
            .get("properties")
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        "start_run takes run_code's arguments"
    );
    let props = run_code.input_schema.get("properties").unwrap();
    assert!(props.get("limits").is_some());
    let language = props["language"]["description"].as_str().unwrap();
    assert!(
        language.contains("python") && language.contains("cpp"),
        "{language}"
    );
    let memory = run_code.input_schema["$defs"]["LimitsInput"]["properties"]["memory_mb"]
        ["description"]
        .as_str()
        .unwrap();
    assert!(memory.contains("default 384, at most 8192"), "{memory}");
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "codebox");
}

/// What the model reads of `tools/list` on every turn: names, descriptions, input schemas.
fn model_facing_chars(tools: &[rmcp::model::Tool]) -> usize {
    tools
        .iter()
        .map(|t| {
            t.name.len()
                + t.description.as_deref().map_or(0, str::len)
                + Value::Object((*t.input_schema).clone()).to_string().len()
        })
        .sum()
}

#[tokio::test]
async fn what_the_model_reads_of_the_tools_stays_within_its_budget() {
    let fake = Arc::new(FakeEngine::new());
    let client = connect(fake_manager(&fake, |_| {})).await;
    let tools = client.list_all_tools().await.unwrap();
    let chars = model_facing_chars(&tools);
    eprintln!(
        "model-facing tools/list: {chars} characters for {} tools",
        tools.len()
    );
    if std::env::var("DUMP_TOOLS").is_ok() {
        for t in &tools {
            eprintln!("{}: {}", t.name, Value::Object((*t.input_schema).clone()));
        }
    }
    for t in &tools {
        eprintln!(
            "  {}: description {}, input schema {}",
            t.name,
            t.description.as_deref().map_or(0, str::len),
            Value::Object((*t.input_schema).clone()).to_string().len()
        );
    }
    assert!(
        chars <= codebox::mcp::describe::MODEL_FACING_BUDGET,
        "{chars} characters, over the budget of {}",
        codebox::mcp::describe::MODEL_FACING_BUDGET
    );
}

#[tokio::test]
async fn run_code_returns_the_report_of_a_python_hello() {
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let r = report(
        ok(
            &client,
            "run_code",
            json!({"language": "python", "code": "print('hello')"}),
        )
        .await,
    );
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout, "hello\n");
    // Removal follows the report, off the critical path.
    eventually(20, "the run's container is removed", || {
        labelled(&r.run_id).is_empty()
    })
    .await;
    settle(&m).await;
}

#[tokio::test]
async fn a_java_program_is_saved_under_its_public_class_over_mcp_too() {
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let code = "import java.nio.file.*;\n\npublic final class Solution {\n    public static void main(String[] a) throws Exception {\n        System.out.println(Files.exists(Path.of(\"Solution.java\")) + \" \" + Files.exists(Path.of(\"Main.java\")));\n    }\n}\n";
    let r = report(
        ok(
            &client,
            "run_code",
            json!({"language": "java", "code": code}),
        )
        .await,
    );
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout, "true false\n");
    // Without a public class the file stays Main.java.
    let code =
        "class Main { public static void main(String[] a) { System.out.println(\"main\"); } }";
    let r = report(
        ok(
            &client,
            "run_code",
            json!({"language": "java", "code": code}),
        )
        .await,
    );
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (Status::Succeeded, "main\n"),
        "{r:?}"
    );
    settle(&m).await;
}

#[tokio::test]
async fn a_failed_program_is_a_normal_result_not_an_error() {
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let res = call(
        &client,
        "run_code",
        json!({"language": "py", "code": "import sys\nprint('x', file=sys.stderr)\nsys.exit(3)", "limits": {"timeout_seconds": 20}}),
    )
    .await;
    assert_eq!(res.is_error, Some(false));
    let r = report(res.structured_content.unwrap());
    assert_eq!((r.status, r.exit_code), (Status::Failed, Some(3)));
    assert_eq!(r.stderr, "x\n");
    let r = report(
        ok(
            &client,
            "run_code",
            json!({"language": "cpp", "code": "int main() { return }"}),
        )
        .await,
    );
    assert_eq!(r.status, Status::CompileError);
    settle(&m).await;
}

#[tokio::test]
async fn invalid_arguments_are_tool_errors_that_name_the_field() {
    let fake = Arc::new(FakeEngine::new());
    let client = connect(fake_manager(&fake, |_| {})).await;
    for (tool, args, field) in [
        (
            "run_code",
            json!({"language": "intercal", "code": "x"}),
            "language",
        ),
        (
            "start_run",
            json!({"language": "python", "code": "  "}),
            "code",
        ),
        ("run_code", json!({"language": "python"}), "code"),
        (
            "run_code",
            json!({"language": "python", "code": "1", "limits": {"memory_mb": 32768}}),
            "limits.memory_mb",
        ),
        (
            "start_run",
            json!({"language": "python", "code": "1", "limits": {"memory_mb": "lots"}}),
            "limits.memory_mb",
        ),
        (
            "start_run",
            json!({"language": "python", "code": "1", "limits": {"timeout_seconds": -1}}),
            "limits.timeout_seconds",
        ),
        (
            "start_run",
            json!({"language": "python", "code": "1", "limits": {"cpus": 64}}),
            "limits.cpus",
        ),
        (
            "start_run",
            json!({"language": "python", "code": "1", "bogus": true}),
            "bogus",
        ),
        (
            "start_run",
            json!({"language": "python", "code": "1", "files": [{"path": "../x", "content": ""}]}),
            "files[0].path",
        ),
        (
            "start_run",
            json!({"language": "python", "code": "1", "args": "not-a-list"}),
            "args",
        ),
        (
            "get_result",
            json!({"run_id": "x", "wait_seconds": MAX_WAIT_SECONDS + 1.0}),
            "wait_seconds",
        ),
        ("get_result", json!({}), "run_id"),
        ("stop_run", json!({"run": "x"}), "run"),
        (
            "get_execution_history",
            json!({"status": "exploded"}),
            "status",
        ),
        ("get_execution_history", json!({"limit": 0}), "limit"),
        ("get_execution_history", json!({"limit": "ten"}), "limit"),
    ] {
        let msg = tool_error(&client, tool, args.clone()).await;
        assert!(
            msg.contains(field),
            "{tool}({args}): `{msg}` does not name `{field}`"
        );
    }
    assert!(
        fake.specs().is_empty(),
        "a rejected request never reaches the engine"
    );
    // An unknown tool is a protocol error.
    assert!(client
        .call_tool(CallToolRequestParams::new("rm_rf"))
        .await
        .is_err());
}

#[tokio::test]
async fn an_unknown_run_id_is_a_clear_tool_error() {
    let fake = Arc::new(FakeEngine::new());
    let client = connect(fake_manager(&fake, |_| {})).await;
    for tool in ["get_result", "stop_run"] {
        let msg = tool_error(&client, tool, json!({"run_id": "0123456789abcdef"})).await;
        assert!(
            msg.contains("run_id") && msg.contains("0123456789abcdef") && msg.contains("no run"),
            "{msg}"
        );
    }
}

#[tokio::test]
async fn a_run_is_named_by_its_judge0_token_in_get_result_and_stop_run() {
    let fake = Arc::new(FakeEngine::new());
    let client = connect(fake_manager(&fake, |_| {})).await;
    let started = ok(
        &client,
        "start_run",
        json!({"language": "python", "code": "1"}),
    )
    .await;
    let id = started["run_id"].as_str().unwrap().to_string();
    let token = uuid::Uuid::parse_str(&id).unwrap().hyphenated().to_string();
    let polled = ok(
        &client,
        "get_result",
        json!({"run_id": token, "wait_seconds": 10}),
    )
    .await;
    assert_eq!(polled["run_id"], id.as_str(), "{polled}");
    let stopped = ok(&client, "stop_run", json!({"run_id": token.to_uppercase()})).await;
    assert_eq!(stopped["run_id"], id.as_str(), "{stopped}");
}

#[tokio::test]
async fn a_full_queue_is_a_retryable_tool_error() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let m = fake_manager(&fake, |c| {
        c.runs.max_concurrent_runs = 1;
        c.runs.max_queued_runs = 1;
    });
    let client = connect(m.clone()).await;
    ok(
        &client,
        "start_run",
        json!({"language": "python", "code": "1"}),
    )
    .await;
    ok(
        &client,
        "start_run",
        json!({"language": "python", "code": "1"}),
    )
    .await;
    let msg = tool_error(
        &client,
        "start_run",
        json!({"language": "python", "code": "1"}),
    )
    .await;
    assert!(msg.contains("busy") && msg.contains("retry"), "{msg}");
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn start_run_then_long_poll_get_result_then_stop_run_which_is_idempotent() {
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let started = ok(
        &client,
        "start_run",
        json!({"language": "python", "code": "import subprocess\nprint('begun', flush=True)\nsubprocess.run(['sleep', '120'])", "limits": {"timeout_seconds": 300}}),
    )
    .await;
    let id = started["run_id"].as_str().unwrap().to_string();
    assert!(
        matches!(started["status"].as_str(), Some("queued" | "running")),
        "{started}"
    );
    assert_eq!(started["limits"]["timeout_seconds"], json!(300.0));
    // Long-poll: the run is still going when the wait ends.
    let r = report(
        ok(
            &client,
            "get_result",
            json!({"run_id": id, "wait_seconds": 1}),
        )
        .await,
    );
    assert!(!r.status.is_terminal(), "{r:?}");
    // `sleep` runs once the program has printed.
    eventually(30, "the program printed and sleeps", || {
        labelled(&id).iter().any(|c| {
            let top = std::process::Command::new("docker")
                .args(["top", c])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            top.contains("sleep 120")
        })
    })
    .await;
    let stopped = report(ok(&client, "stop_run", json!({"run_id": id})).await);
    assert_eq!(stopped.status, Status::Stopped, "{stopped:?}");
    assert_eq!(stopped.stdout, "begun\n", "output before the stop is kept");
    eventually(20, "the stopped run's container is removed", || {
        labelled(&id).is_empty()
    })
    .await;
    let again = report(ok(&client, "stop_run", json!({"run_id": id})).await);
    assert_eq!(again, stopped);
    let polled = report(
        ok(
            &client,
            "get_result",
            json!({"run_id": id, "wait_seconds": 5}),
        )
        .await,
    );
    assert_eq!(polled, stopped);
    settle(&m).await;
}

#[tokio::test]
async fn get_result_long_poll_answers_as_soon_as_the_run_ends() {
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let started = ok(
        &client,
        "start_run",
        json!({"language": "python", "code": "print(6*7)"}),
    )
    .await;
    let id = started["run_id"].as_str().unwrap();
    let r = report(
        ok(
            &client,
            "get_result",
            json!({"run_id": id, "wait_seconds": 60}),
        )
        .await,
    );
    assert_eq!((r.status, r.stdout.as_str()), (Status::Succeeded, "42\n"));
    settle(&m).await;
}

#[tokio::test]
async fn run_code_sends_progress_notifications_while_it_runs() {
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let res = call(
        &client,
        "run_code",
        json!({"language": "python", "code": "import time\ntime.sleep(2.5)\nprint('done')"}),
    )
    .await;
    let r = report(res.structured_content.unwrap());
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let seen = client.service().progress.lock().unwrap().clone();
    assert!(
        seen.len() >= 2,
        "expected progress notifications, got {seen:?}"
    );
    for pair in seen.windows(2) {
        assert!(
            pair[1].progress > pair[0].progress,
            "progress must increase: {seen:?}"
        );
    }
    assert!(
        seen.iter()
            .any(|p| p.message.as_deref().unwrap_or("").contains("running")),
        "{seen:?}"
    );
    settle(&m).await;
}

#[tokio::test]
async fn cancelling_run_code_stops_the_run_and_removes_its_containers() {
    let (history, _dir) = temp_history();
    let m = docker_manager(|_| {}, Some(history.clone()));
    let client = connect(m.clone()).await;
    let request = ClientRequest::CallToolRequest(Request::new(params(
        "run_code",
        json!({"language": "python", "code": "import time\ntime.sleep(300)", "limits": {"timeout_seconds": 600}}),
    )));
    let handle = client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    eventually(30, "the run is running", || m.stats().active == 1).await;
    let rows = history.query(Default::default()).await.unwrap();
    let id = rows[0].run_id.clone();
    eventually(30, "the run's container exists", || {
        !labelled(&id).is_empty()
    })
    .await;
    handle
        .cancel(Some("user pressed stop".into()))
        .await
        .unwrap();
    let r = m.wait(&id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(r.status, Status::Stopped, "{r:?}");
    eventually(20, "the cancelled run's container is removed", || {
        labelled(&id).is_empty()
    })
    .await;
    assert_eq!(
        history.get(&id).await.unwrap().unwrap().status,
        Status::Stopped
    );
    settle(&m).await;
}

#[tokio::test]
async fn list_supported_languages_is_the_catalog() {
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let v = ok(&client, "list_supported_languages", json!({})).await;
    let expected =
        codebox::catalog::catalog(m.executor().engine().as_ref(), m.registry(), m.config())
            .await
            .unwrap();
    assert_eq!(v, serde_json::to_value(&expected).unwrap());
    let py = v["languages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["language"] == "python")
        .unwrap();
    assert_eq!(py["image"], "codebox/python:3.11");
    assert_eq!(py["image_present"], true);
    assert_eq!(v["limits"]["defaults"]["memory_mb"], 512);
    assert_eq!(
        v["limits"]["ceilings"]["memory_mb"], 8192,
        "the budget, below the setting"
    );
    settle(&m).await;
}

#[tokio::test]
async fn get_execution_history_lists_runs_newest_first_with_filters() {
    let fake = Arc::new(FakeEngine::new());
    let (history, _dir) = temp_history();
    let m = crate::mcp_support::manager_on(fake.clone(), |_| {}, Some(history));
    let client = connect(m).await;
    let mut ids = Vec::new();
    for (lang, code) in [
        ("python", "print(1)"),
        ("cpp", "int main(){}"),
        ("py", "print(3)"),
    ] {
        let r = report(ok(&client, "run_code", json!({"language": lang, "code": code})).await);
        ids.push(r.run_id);
    }
    let all = ok(&client, "get_execution_history", json!({})).await;
    let runs = all["runs"].as_array().unwrap();
    let got: Vec<&str> = runs.iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    assert_eq!(got, [ids[2].as_str(), ids[1].as_str(), ids[0].as_str()]);
    assert_eq!(runs[0]["status"], "succeeded");
    assert_eq!(runs[0]["code_preview"], "print(3)");
    let py = ok(
        &client,
        "get_execution_history",
        json!({"language": "python3", "limit": 1}),
    )
    .await;
    assert_eq!(py["runs"].as_array().unwrap().len(), 1);
    assert_eq!(py["runs"][0]["run_id"], ids[2].as_str());
    let none = ok(
        &client,
        "get_execution_history",
        json!({"status": "failed"}),
    )
    .await;
    assert!(none["runs"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn history_without_a_database_is_a_tool_error_that_says_so() {
    let fake = Arc::new(FakeEngine::new());
    let client = connect(fake_manager(&fake, |_| {})).await;
    let msg = tool_error(&client, "get_execution_history", json!({})).await;
    assert_eq!(msg, "history: this server keeps no history");
}

#[tokio::test]
async fn each_returned_file_travels_once_as_a_block_in_the_order_of_files() {
    use base64::Engine as _;
    use rmcp::model::{ContentBlock, ResourceContents};
    use sha2::{Digest, Sha256};
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let code = "import os\nimport matplotlib.pyplot as plt\nos.makedirs('outputs')\nplt.plot([1, 2, 3])\nplt.savefig('outputs/plot.png')\nopen('outputs/table.csv', 'w').write('a,b\\n1,2\\n')\nopen('outputs/z.bin', 'wb').write(bytes(range(256)))\n";
    let res = call(
        &client,
        "run_code",
        json!({"language": "python", "code": code, "limits": {"timeout_seconds": 60}}),
    )
    .await;
    let r = report(res.structured_content.clone().unwrap());
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let paths: Vec<&str> = r.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        ["outputs/plot.png", "outputs/table.csv", "outputs/z.bin"]
    );
    for f in &r.files {
        assert_eq!(f.content_base64, None, "{} is sent twice", f.path);
        assert_eq!(
            f.omitted_reason.as_deref(),
            Some(codebox::contract::answers::SENT_AS_BLOCK)
        );
    }
    // The text is the structured report, and the blocks follow it in the order of `files`.
    let text = crate::mcp_support::text(&res);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        res.structured_content.clone().unwrap()
    );
    let sha = |bytes: &[u8]| -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).unwrap();
    let blocks = &res.content[1..];
    assert_eq!(blocks.len(), 3, "{:?}", res.content);
    let ContentBlock::Image(image) = &blocks[0] else {
        panic!("{:?}", blocks[0])
    };
    assert_eq!(image.mime_type, "image/png");
    assert_eq!(sha(&b64(&image.data)), r.files[0].sha256);
    let resource = |i: usize| match &blocks[i] {
        ContentBlock::Resource(r) => r.resource.clone(),
        other => panic!("{other:?}"),
    };
    match resource(1) {
        ResourceContents::TextResourceContents { text, uri, .. } => {
            assert_eq!(text, "a,b\n1,2\n");
            assert!(
                uri.ends_with(&format!("{}/outputs/table.csv", r.run_id)),
                "{uri}"
            );
        }
        other => panic!("{other:?}"),
    }
    match resource(2) {
        ResourceContents::BlobResourceContents { blob, uri, .. } => {
            assert_eq!(b64(&blob), (0..=255u8).collect::<Vec<u8>>());
            assert!(uri.ends_with("/outputs/z.bin"), "{uri}");
        }
        other => panic!("{other:?}"),
    }
    // The whole result carries the plot's bytes once.
    let whole = serde_json::to_string(&res).unwrap();
    assert_eq!(whole.matches(&image.data[..64]).count(), 1);
    settle(&m).await;
}

#[tokio::test]
async fn outputs_not_listed_are_named_over_mcp_too() {
    use crate::workspace::{deep_folder, DEEP_AND_MANY, MANY_REASON};
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let res = call(
        &client,
        "run_code",
        json!({"language": "python", "code": DEEP_AND_MANY, "limits": {"timeout_seconds": 60}}),
    )
    .await;
    let r = report(res.structured_content.clone().unwrap());
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let reasons: Vec<(&str, Option<&str>)> = r
        .files
        .iter()
        .filter(|f| f.mime_type == "inode/directory")
        .map(|f| (f.path.as_str(), f.omitted_reason.as_deref()))
        .collect();
    assert_eq!(
        reasons,
        [
            (
                deep_folder().as_str(),
                Some("the folder's contents are not listed: deeper than 16 levels")
            ),
            ("outputs/many", Some(MANY_REASON))
        ]
    );
    assert!(r.message.contains(MANY_REASON), "{}", r.message);
    let summary = crate::mcp_support::text(&res);
    assert!(summary.contains(MANY_REASON), "{summary}");
    settle(&m).await;
}

#[tokio::test]
async fn a_session_over_the_sessions_memory_share_is_an_invalid_argument_naming_the_ceiling() {
    let fake = Arc::new(FakeEngine::new());
    let client = connect(fake_manager(&fake, |_| {})).await;
    let msg = tool_error(
        &client,
        "create_session",
        json!({"language": "python", "limits": {"memory_mb": 5000}}),
    )
    .await;
    assert!(
        msg.contains("invalid argument limits.memory_mb") && msg.contains("4096 MB"),
        "{msg}"
    );
    assert!(msg.contains("holds its memory for its whole life"), "{msg}");
    assert!(!msg.contains("retry"), "it is not worth retrying: {msg}");
    // Under the ceiling but not a whole number: refused without the ceiling's story.
    let msg = tool_error(
        &client,
        "create_session",
        json!({"language": "python", "limits": {"memory_mb": 100.5}}),
    )
    .await;
    assert!(msg.contains("invalid argument limits.memory_mb"), "{msg}");
    assert!(!msg.contains("whole life"), "{msg}");
    let tools = client.list_all_tools().await.unwrap();
    let d = tools
        .iter()
        .find(|t| t.name == "create_session")
        .and_then(|t| t.description.as_deref())
        .unwrap_or_default();
    assert!(d.contains("memory_mb at most 4096 MB"), "{d}");
}
