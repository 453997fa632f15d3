//! Three servers behind nginx serve as one (SPEC section 15), each on a Docker host of its
//! own: health checks reach each in turn; a burst of mixed runs from many clients is answered
//! once each, right, recorded once, spread over the three servers, and made on the host of
//! the server that ran it; a session used round robin reaches the one server that holds it;
//! nothing is left on any host.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde_json::{json, Value};

use crate::cluster::{
    delete_json, history_through, instances, on_hosts, post_json, private_hosts, start_cluster_on,
    stop_all, watch, Nginx,
};
use crate::mcp_support::TOKEN;

/// One run of the mixed load, in the languages the private hosts have (Bash, AWK, Lua): its
/// request and what its report must say (status, stdout).
fn mixed(i: usize) -> (Value, &'static str, String) {
    match i % 6 {
        0 => (
            json!({"language": "bash", "code": format!("echo $(( {i} * 2 ))")}),
            "succeeded",
            format!("{}\n", i * 2),
        ),
        1 => (
            json!({"language": "bash", "code": format!("echo b{i}; exit 3")}),
            "failed",
            format!("b{i}\n"),
        ),
        2 => (
            json!({"language": "lua", "code": format!("print('l{i}')")}),
            "succeeded",
            format!("l{i}\n"),
        ),
        3 => (
            json!({"language": "awk", "code": "{ printf \"%s\", toupper($0) }", "stdin": format!("in{i}")}),
            "succeeded",
            format!("IN{i}"),
        ),
        4 => (
            json!({"language": "lua", "code": format!("print('unclosed {i}'")}),
            "compile_error",
            String::new(),
        ),
        _ => (
            json!({"language": "bash", "code": format!("echo e{i} >&2; echo o{i}")}),
            "succeeded",
            format!("o{i}\n"),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_behind_nginx_serve_runs_and_sessions_as_one() {
    let t0 = Instant::now();
    let (_hosts_alone, hosts) = private_hosts().await;
    let watch = watch(hosts);
    let slots: &[&str] = &["runs.max_concurrent_runs=2"];
    let mut cluster = start_cluster_on("nginx", &[slots, slots, slots], hosts).await;
    let mut nodes = std::mem::take(&mut cluster.nodes);
    let instances = instances(&nodes).await;
    let nginx = Nginx::in_front_of(&nodes);
    let http = reqwest::Client::new();
    eprintln!("set-up: {:.1} s", t0.elapsed().as_secs_f64());

    // Health checks through nginx reach each server in turn.
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let h: Value = http
            .get(nginx.url("/healthz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(h["status"], "ok", "{h}");
        seen.insert(h["instance"].as_str().unwrap().to_string());
    }
    assert_eq!(seen.len(), 3, "round robin over the three: {seen:?}");

    // Many runs from 16 clients at once through nginx: each answered once, right.
    const CLIENTS: usize = 16;
    const EACH: usize = 19;
    let t = Instant::now();
    let clients = (0..CLIENTS).map(|c| {
        let http = http.clone();
        let url = nginx.url("/v1/runs");
        async move {
            let mut ids = Vec::new();
            for k in 0..EACH {
                let i = c * EACH + k;
                let (request, status, stdout) = mixed(i);
                let r = post_json(&http, &url, request.clone()).await;
                assert_eq!(
                    (r["status"].as_str(), r["stdout"].as_str()),
                    (Some(status), Some(stdout.as_str())),
                    "run {i} ({request}): {r}"
                );
                ids.push(r["run_id"].as_str().unwrap().to_string());
            }
            ids
        }
    });
    let ids: Vec<String> = futures_util::future::join_all(clients)
        .await
        .into_iter()
        .flatten()
        .collect();
    let burst = t.elapsed();
    // One history row per run, spread over the three servers.
    let rows = history_through(&http, &nodes, &nginx).await;
    let rows = rows["runs"].as_array().unwrap();
    let mut per_instance = BTreeMap::<String, usize>::new();
    for id in &ids {
        let matching: Vec<&Value> = rows.iter().filter(|r| r["run_id"] == id.as_str()).collect();
        assert_eq!(matching.len(), 1, "run {id}: {matching:?}");
        assert!(matching[0]["status"] != "queued" && matching[0]["status"] != "running");
        *per_instance
            .entry(matching[0]["instance"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(
        per_instance.len(),
        3,
        "runs spread over the three: {per_instance:?}"
    );
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "each run one id");
    // And over the three hosts: each run's containers were made by the daemon of the server
    // its history row names, and by no other.
    let made_on = watch.hosts_of(&instances, &ids);
    let mut per_host = [0usize; 3];
    for id in &ids {
        let row = rows.iter().find(|r| r["run_id"] == id.as_str()).unwrap();
        let k = made_on[id];
        assert_eq!(
            row["instance"],
            instances[k].as_str(),
            "run {id} ran on host {k}"
        );
        per_host[k] += 1;
    }
    assert!(
        per_host.iter().all(|&n| n > 0),
        "runs on each host: {per_host:?}"
    );

    // A session through nginx, round robin: each call lands on the next server, and all
    // reach the one that holds it (one shell, its variables kept).
    let created = post_json(
        &http,
        &nginx.url("/v1/sessions"),
        json!({"language": "bash"}),
    )
    .await;
    let sid = created["session_id"]
        .as_str()
        .expect("a session")
        .to_string();
    let t = Instant::now();
    const STEPS: usize = 6;
    for k in 0..STEPS {
        let code = if k == 0 {
            "n=0; echo $n"
        } else {
            "n=$((n + 1)); echo $n"
        };
        let step = json!({"language": "bash", "session_id": sid, "code": code});
        let r = post_json(&http, &nginx.url("/v1/runs"), step).await;
        assert_eq!(r["stdout"], format!("{k}\n"), "step {k}: {r}");
    }
    let steps = t.elapsed();
    let listing = http
        .get(nginx.url(&format!("/v1/sessions/{sid}/files")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(listing.status(), 200);
    let closed = delete_json(&http, &nginx.url(&format!("/v1/sessions/{sid}"))).await;
    assert_eq!(
        (closed["closed"].as_bool(), closed["executions"].as_u64()),
        (Some(true), Some(STEPS as u64)),
        "{closed}"
    );

    eprintln!(
        "three servers behind nginx, a private Docker host each: {} mixed runs from {CLIENTS} \
         clients in {:.1} s ({:.1} runs/s), per host {per_host:?}; a session's {STEPS} steps \
         round robin (two in three forwarded) in {:.2} s; whole test {:.1} s",
        ids.len(),
        burst.as_secs_f64(),
        ids.len() as f64 / burst.as_secs_f64(),
        steps.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    drop(nginx);
    let t = Instant::now();
    stop_all(&mut nodes).await;
    eprintln!(
        "the three servers stopped in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Nothing of any run is left on any host.
    assert_eq!(
        on_hosts(hosts, "label=codebox.managed=true"),
        Vec::<String>::new()
    );
}
