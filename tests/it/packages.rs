//! Packages on request (SPEC 13) against real Docker and a PEP 503 index the test builds and
//! serves itself on loopback (`python3 -m http.server` over `tests/fixtures/packages`):
//! installs import, a cached second request works with the index stopped, the program stays
//! offline with the prefix read-only, an sdist's setup.py reaches nothing but the proxy,
//! failures end as `stage: "install"` naming the requirement, concurrent identical requests
//! install once, and closing removes every volume. The install container has no network
//! (only `lo`): its way out is the proxy's Unix socket, through codebox-init's relay.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use codebox::config::Config;
use codebox::contract::{RunRequest, ValidRequest};
use codebox::executor::{new_run_id, Executor};
use codebox::live::Event;
use codebox::report::{RunReport, Stage, Status};
use tokio_util::sync::CancellationToken;

use crate::common::{self, py, registry};

/// A PEP 503 index on 127.0.0.1, stopped when dropped.
struct Index {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Index {
    /// A PEP 503 index (`make_index.py`).
    fn start() -> Index {
        Index::probing("{\"addrs\": [], \"port\": 9}")
    }

    /// A PEP 503 index whose probe sdist tries `probe` (JSON: the host's addresses and a port
    /// listening on 0.0.0.0).
    fn probing(probe: &str) -> Index {
        let index = Index::serve();
        index.make("make_index.py", &[probe]);
        index
    }

    /// A static npm registry (`make_registry.py`), its tarball URLs pointing at itself.
    fn npm() -> Index {
        let index = Index::serve();
        let base = format!("http://127.0.0.1:{}", index.port);
        index.make("make_registry.py", &[&base]);
        index
    }

    fn make(&self, script: &str, args: &[&str]) {
        let made = Command::new("python3")
            .arg(common::root().join("tests/fixtures/packages").join(script))
            .arg(self._dir.path())
            .args(args)
            .status()
            .expect("python3");
        assert!(made.success(), "{script} failed");
    }

    /// `python3 -m http.server` over a fresh folder.
    fn serve() -> Index {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new("python3")
            .args([
                "-u",
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                "0",
                "--directory",
            ])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        let port = line
            .split(" port ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Index {
            child,
            port,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/simple/", self.port)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Removes what a failing test's cache made (its volumes): a test that panics never reaches
/// `close()`, and the reaper keeps what a live instance owns.
struct RemovedIfFailed(Arc<codebox::executor::packages::Packages>);

impl Drop for RemovedIfFailed {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for v in self.0.volumes() {
            // Containers that mount it first (a pool's, a session's the test left).
            let users = Command::new("docker")
                .args(["ps", "-aq", "--filter", &format!("volume={v}")])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for c in users.lines() {
                let _ = Command::new("docker").args(["rm", "-f", c]).output();
            }
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f", &v])
                .output();
        }
    }
}

fn executor(index: &Index, tune: impl FnOnce(&mut Config)) -> Executor {
    let mut c = Config::default();
    c.packages.python.index_url = Some(index.url());
    c.packages.install_timeout_seconds = 60.0;
    tune(&mut c);
    common::docker_executor_with(c)
}

fn with_packages(code: &str, packages: &[&str]) -> RunRequest {
    RunRequest {
        packages: Some(packages.iter().map(|p| p.to_string()).collect()),
        ..py(code)
    }
}

async fn run(exec: &Executor, req: RunRequest) -> RunReport {
    let valid = ValidRequest::new(req, &registry(), exec.config()).expect("valid request");
    let id = new_run_id();
    let r = exec.execute(&id, &valid, 0, CancellationToken::new()).await;
    common::assert_no_leftovers(&id).await;
    r
}

/// Which of these volumes exist now.
fn existing(volumes: &[String]) -> Vec<String> {
    let all = common::labelled_objects(&format!("label=codebox.instance={}", common::instance()));
    volumes
        .iter()
        .filter(|v| all.contains(v))
        .cloned()
        .collect()
}

/// The proxy directories of these runs still in the data directory (which the tests running
/// beside this one share).
fn egress_left(exec: &Executor, runs: &[&RunReport]) -> Vec<String> {
    std::fs::read_dir(exec.config().data_dir.join("egress"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| runs.iter().any(|r| name.starts_with(&r.run_id)))
                .collect()
        })
        .unwrap_or_default()
}

/// The host's IPv4 addresses other than loopback (docker0's among them).
fn host_addresses() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .expect("ip");
    let addrs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|a| a.split('/').next())
        .filter(|a| !a.starts_with("127."))
        .map(str::to_string)
        .collect();
    assert!(!addrs.is_empty(), "no host address to try");
    addrs
}

const OFFLINE_PROGRAM: &str = r#"
import os, socket, tinypkg
print(tinypkg.VALUE)
print(sorted(os.listdir("/sys/class/net")))
try:
    socket.create_connection(("1.1.1.1", 80), timeout=2)
    print("connected")
except OSError as e:
    print("no network:", type(e).__name__)
try:
    open("/opt/codebox/packages/tinypkg/x", "w")
    print("prefix writable")
except OSError as e:
    print("prefix read-only:", e.errno)
"#;

#[tokio::test]
async fn an_installed_package_imports_and_a_cached_one_needs_no_index() {
    let mut index = Index::start();
    let exec = executor(&index, |_| {});
    let _cleanup = RemovedIfFailed(exec.packages().clone());
    let r = run(&exec, with_packages(OFFLINE_PROGRAM, &["tinypkg==1.0"])).await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "tiny one");
    assert_eq!(lines[1], "['lo']", "the program's container has only lo");
    assert!(lines[2].starts_with("no network"), "{}", r.stdout);
    assert!(lines[3].starts_with("prefix read-only"), "{}", r.stdout);
    let p = r.packages.clone().expect("packages report");
    assert_eq!(p.requested, ["tinypkg==1.0"]);
    assert!(!p.cached);
    assert!(p.install_ms > 0);
    assert!(
        p.installed
            .iter()
            .any(|i| i.name == "tinypkg" && i.version == "1.0"),
        "{p:?}"
    );

    index.stop();
    let again = run(
        &exec,
        with_packages("import tinypkg; print(tinypkg.VALUE)", &["tinypkg==1.0"]),
    )
    .await;
    assert_eq!(
        again.status,
        Status::Succeeded,
        "{}\n{}",
        again.message,
        again.stderr
    );
    assert_eq!(again.stdout, "tiny one\n");
    let p = again.packages.clone().expect("packages report");
    assert!(p.cached, "the second request was not served from the cache");
    assert_eq!(p.install_ms, 0);
    let c = exec.packages().counters();
    assert_eq!(c.hits.load(Ordering::Relaxed), 1);
    assert_eq!(c.misses.load(Ordering::Relaxed), 1);

    // A different list never shares a prefix: with the index stopped, it must install, and fails.
    let other = run(&exec, with_packages("import tinypkg", &["tinypkg==2.0"])).await;
    assert_eq!(other.status, Status::Failed, "{}", other.message);
    assert_eq!(other.stage, Some(Stage::Install));

    let volumes = exec.packages().volumes();
    assert_eq!(existing(&volumes).len(), 1, "{volumes:?}");
    assert_eq!(
        egress_left(&exec, &[&r, &again, &other]),
        Vec::<String>::new(),
        "a proxy's directory was left"
    );
    exec.packages().close().await;
    assert!(existing(&volumes).is_empty(), "volumes left after close");
}

#[tokio::test]
async fn an_sdist_setup_py_reaches_nothing_but_the_proxy() {
    // A service of the host's listening on every address: the install container must not
    // reach it on any of them (docker0's included).
    let host_service = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    host_service.set_nonblocking(true).unwrap();
    let addrs = host_addresses();
    let probe = serde_json::json!({
        "addrs": addrs,
        "port": host_service.local_addr().unwrap().port(),
    });
    let index = Index::probing(&probe.to_string());
    let exec = executor(&index, |_| {});
    let _cleanup = RemovedIfFailed(exec.packages().clone());
    let r = run(
        &exec,
        with_packages("import probe; print(probe.RESULTS)", &["probe==1.0"]),
    )
    .await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    let none_of = format!("'host_addresses': 'reached: none of {}'", addrs.len());
    for (what, expect) in [
        ("'interfaces': 'reached: lo'", "only the loopback interface"),
        ("'dns': 'failed", "DNS of an outside name"),
        ("'outside': 'failed", "a direct connection out"),
        (none_of.as_str(), "a connection to the host's own addresses"),
        (
            "'proxied_other': 'failed: HTTPError",
            "another host through the proxy",
        ),
        (
            "'proxied_metadata': 'failed: HTTPError",
            "the metadata address through the proxy",
        ),
        (
            "'proxied_loopback': 'failed: HTTPError",
            "the index's address on another port through the proxy",
        ),
        (
            "'proxied_connect_other_port': 'failed: URLError",
            "CONNECT to another port",
        ),
    ] {
        assert!(
            r.stdout.contains(what),
            "{expect} was not refused: {}",
            r.stdout
        );
    }
    assert!(
        host_service.accept().is_err(),
        "the host's service was reached"
    );
    exec.packages().close().await;
}

#[tokio::test]
async fn failed_installs_end_at_the_install_stage_naming_the_requirement() {
    let index = Index::start();
    let exec = executor(&index, |c| {
        c.packages.max_download_mb = 1;
        c.packages.prefix_mb = 2;
        c.packages.install_timeout_seconds = 8.0;
    });
    let _cleanup = RemovedIfFailed(exec.packages().clone());
    let cases = [
        (
            vec!["tinypkg==1.0", "nosuch==1.0"],
            Status::Failed,
            "`nosuch==1.0`",
        ),
        (
            vec!["big==1.0"],
            Status::Failed,
            "packages.max_download_mb (1 MB)",
        ),
        (
            vec!["fat==1.0"],
            Status::Failed,
            "2 MB prefix (packages.prefix_mb)",
        ),
        (
            vec!["slow==1.0"],
            Status::TimedOut,
            "packages.install_timeout_seconds",
        ),
    ];
    for (packages, status, says) in cases {
        let r = run(&exec, with_packages("print('never')", &packages)).await;
        assert_eq!(
            r.status, status,
            "{packages:?}: {}\n{}",
            r.message, r.stderr
        );
        assert_eq!(r.stage, Some(Stage::Install), "{packages:?}");
        assert!(r.message.contains(says), "{packages:?}: {}", r.message);
        assert!(!r.stdout.contains("never"), "the program ran");
    }
    assert_eq!(
        exec.packages().counters().failures.load(Ordering::Relaxed),
        4
    );
    exec.packages().close().await;
}

#[tokio::test]
async fn concurrent_identical_requests_install_once_and_close_removes_the_prefixes() {
    let index = Index::start();
    let exec = Arc::new(executor(&index, |_| {}));
    let _cleanup = RemovedIfFailed(exec.packages().clone());
    let runs = (0..3).map(|_| {
        let exec = exec.clone();
        async move {
            run(
                &exec,
                with_packages("import other; print(other.VALUE)", &["other==1.0"]),
            )
            .await
        }
    });
    let reports = futures_util::future::join_all(runs).await;
    for r in &reports {
        assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
        assert_eq!(r.stdout, "other one\n");
    }
    let cached = reports
        .iter()
        .filter(|r| r.packages.as_ref().unwrap().cached)
        .count();
    assert_eq!(
        cached, 2,
        "three identical requests installed more than once"
    );
    assert_eq!(exec.packages().counters().misses.load(Ordering::Relaxed), 1);
    let before = exec.packages().volumes();
    assert_eq!(existing(&before).len(), 1);
    exec.packages().close().await;
    let after = existing(&before);
    assert!(after.is_empty(), "volumes left after close: {after:?}");
}

#[tokio::test]
async fn javascript_installs_with_npm_and_its_dependencies_resolve() {
    let mut registry = Index::npm();
    let url = format!("http://127.0.0.1:{}/", registry.port);
    let exec = common::docker_executor_with({
        let mut c = Config::default();
        c.packages.javascript.registry_url = Some(url);
        c
    });
    let _cleanup = RemovedIfFailed(exec.packages().clone());
    let code = r#"
const pad = require("leftpadx");
console.log(pad("x", 3));
const fs = require("fs");
try { fs.writeFileSync("/opt/codebox/packages/node_modules/leftpadx/x", "1"); console.log("writable"); }
catch (e) { console.log("read-only:", e.code); }
console.log(fs.readdirSync("/sys/class/net").join(","));
"#;
    let req = |code: &str| RunRequest {
        packages: Some(vec!["leftpadx@^1".into()]),
        ..common::request("javascript", code)
    };
    let r = run(&exec, req(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    // EROFS under runc; gVisor checks permissions first (EACCES): either way, refused.
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "  x:dep");
    assert!(
        ["read-only: EROFS", "read-only: EACCES"].contains(&lines[1]),
        "{}",
        r.stdout
    );
    assert_eq!(lines[2], "lo", "the program's container has only lo");
    let p = r.packages.expect("packages report");
    let names: Vec<(&str, &str)> = p
        .installed
        .iter()
        .map(|i| (i.name.as_str(), i.version.as_str()))
        .collect();
    assert_eq!(names, [("leftpadx", "1.0.0"), ("tinydep", "1.2.0")]);
    registry.stop();
    let again = run(&exec, req("console.log(require('leftpadx')('y', 2))")).await;
    assert_eq!(
        again.status,
        Status::Succeeded,
        "{}
{}",
        again.message,
        again.stderr
    );
    assert_eq!(
        again.stdout,
        " y:dep
"
    );
    assert!(again.packages.is_some_and(|p| p.cached));
    exec.packages().close().await;
}

#[test]
fn packages_are_refused_naming_the_field_when_not_enabled() {
    let err = ValidRequest::new(
        with_packages("print(1)", &["tinypkg"]),
        &registry(),
        &Config::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("packages"), "{text}");
    assert!(text.contains("not enabled on this server"), "{text}");
    assert!(text.contains("packages.python.index_url"), "{text}");
    let mut c = Config::default();
    c.packages.python.index_url = Some("http://127.0.0.1:1/simple/".into());
    for bad in ["--index-url=http://evil/", "a b", "git+https://x/y"] {
        let e = ValidRequest::new(with_packages("print(1)", &[bad]), &registry(), &c).unwrap_err();
        assert!(e.to_string().contains("packages[0]"), "{bad}: {e}");
    }
    let e = ValidRequest::new(
        RunRequest {
            packages: Some(vec!["x".into()]),
            ..common::request("bash", "echo")
        },
        &registry(),
        &c,
    )
    .unwrap_err();
    assert!(e.to_string().contains("takes no packages"), "{e}");
    let many: Vec<String> = (0..33).map(|i| format!("p{i}")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let e = ValidRequest::new(with_packages("print(1)", &refs), &registry(), &c).unwrap_err();
    assert!(e.to_string().contains("the maximum is 32"), "{e}");
}

#[tokio::test]
async fn a_session_keeps_its_packages_and_shutdown_removes_everything() {
    let index = Index::start();
    let url = index.url();
    let m = crate::mcp_support::docker_sessions(
        |c| {
            c.packages.python.index_url = Some(url);
            c.sessions.ready.clear();
        },
        None,
    );
    let _cleanup = RemovedIfFailed(m.runs().executor().packages().clone());
    // Through the run manager, as run_code and POST /v1/runs submit.
    let id = m
        .submit(with_packages(
            "import tinypkg; print(tinypkg.VALUE)",
            &["tinypkg==2.0"],
        ))
        .expect("accepted")
        .run_id;
    let feed = m.runs().feed(&id).expect("the run's live events");
    let r = m
        .runs()
        .wait(&id, std::time::Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    assert_eq!(r.stdout, "tiny two\n");
    assert_eq!(r.packages.as_ref().map(|p| p.cached), Some(false));
    // The live events show the install stage, its output, then the program's.
    let (events, _) = feed.after(0);
    let mut seen = Vec::new();
    for (_, e) in &events {
        match e {
            Event::Started { stage } => seen.push(format!("started {}", stage.as_str())),
            Event::Output { data, .. } if data.contains("tinypkg") => {
                seen.push(format!("output {}", data.trim()))
            }
            _ => {}
        }
    }
    let install = seen.iter().position(|e| e == "started install");
    let pip = seen
        .iter()
        .position(|e| e.starts_with("output") && !e.contains("tiny two"));
    let run = seen.iter().position(|e| e == "started run");
    assert!(
        install.is_some() && install < pip && pip < run,
        "no install stage with its output before the run: {seen:?}"
    );

    let s = m
        .create(codebox::contract::SessionRequest {
            language: "python".into(),
            packages: Some(vec!["other==1.0".into()]),
            ..Default::default()
        })
        .await
        .expect("session with packages");
    let container = format!("codebox-session-{}", &s.session_id[4..16]);
    for code in ["import other\nx = other.VALUE", "print(x, other.VALUE)"] {
        let id = m
            .submit(RunRequest {
                code: code.into(),
                session_id: Some(s.session_id.clone()),
                ..Default::default()
            })
            .expect("accepted")
            .run_id;
        let r = m
            .runs()
            .wait(&id, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            r.status,
            Status::Succeeded,
            "{code}: {}\n{}",
            r.message,
            r.stderr
        );
        if code.starts_with("print") {
            assert_eq!(r.stdout, "other one other one\n");
        }
    }
    let volumes = m.runs().executor().packages().volumes();
    assert_eq!(existing(&volumes).len(), 2, "{volumes:?}");
    m.close(&s.session_id).unwrap();
    m.shutdown(std::time::Duration::from_secs(20)).await;
    let left = existing(&volumes);
    assert!(left.is_empty(), "left: {left:?}");
    let ps = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("name={container}")])
        .output()
        .unwrap();
    assert!(ps.stdout.is_empty(), "the session's container is left");
}

/// One execution in session `session`, with `packages` installed first when given.
async fn in_session(
    m: &std::sync::Arc<codebox::sessions::Sessions>,
    session: &str,
    code: &str,
    packages: &[&str],
) -> RunReport {
    let id = m
        .submit(RunRequest {
            code: code.into(),
            session_id: Some(session.to_string()),
            packages: (!packages.is_empty())
                .then(|| packages.iter().map(|p| p.to_string()).collect()),
            ..Default::default()
        })
        .expect("accepted")
        .run_id;
    m.runs()
        .wait(&id, std::time::Duration::from_secs(120))
        .await
        .unwrap()
}

/// The packages volumes of the session whose id is `session_id`.
fn session_volumes(session_id: &str) -> Vec<String> {
    let filter = format!("name=codebox-pkg-session-{}", &session_id[4..16]);
    let out = Command::new("docker")
        .args(["volume", "ls", "-q", "--filter", &filter])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

async fn gone_within(what: impl Fn() -> Vec<String>, seconds: u64) -> Vec<String> {
    for _ in 0..seconds * 10 {
        let left = what();
        if left.is_empty() {
            return left;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    what()
}

#[tokio::test]
async fn packages_installed_in_a_running_session_keep_its_state_and_go_at_close() {
    let index = Index::start();
    let url = index.url();
    let m = crate::mcp_support::docker_sessions(
        |c| {
            c.packages.python.index_url = Some(url);
            c.packages.install_runtime = Some("runc".into());
            c.packages.prefix_mb = 2;
            c.sessions.ready.clear();
        },
        None,
    );
    let _cleanup = RemovedIfFailed(m.runs().executor().packages().clone());
    let s = m
        .create(codebox::contract::SessionRequest {
            language: "python".into(),
            ..Default::default()
        })
        .await
        .expect("session");
    let sid = s.session_id.clone();
    assert_eq!(session_volumes(&sid).len(), 1, "no packages volume");
    let r = in_session(&m, &sid, "x = 41", &[]).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.stderr);
    // A failed import first: the import system's caches must not hide what comes later.
    let r = in_session(&m, &sid, "import tinypkg", &[]).await;
    assert_eq!(r.status, Status::Failed);
    assert!(r.stderr.contains("ModuleNotFoundError"), "{}", r.stderr);

    let r = in_session(
        &m,
        &sid,
        "import tinypkg\nprint(tinypkg.VALUE, x + 1)",
        &["tinypkg==1.0"],
    )
    .await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    assert_eq!(
        r.stdout, "tiny one 42\n",
        "the interpreter's state was lost"
    );
    let p = r.packages.clone().expect("packages report");
    assert_eq!(p.requested, ["tinypkg==1.0"]);
    assert!(!p.cached);
    assert!(p
        .installed
        .iter()
        .any(|i| i.name == "tinypkg" && i.version == "1.0"));
    assert_eq!(
        r.session.as_ref().map(|s| s.state),
        Some(codebox::report::InterpreterState::Kept)
    );

    // Failures end at the install stage and leave the session and its packages as they were.
    for (packages, says) in [
        (vec!["nosuch==1.0"], "`nosuch==1.0`"),
        (vec!["tinypkg==2.0"], "a session's packages only grow"),
    ] {
        let r = in_session(&m, &sid, "print('never')", &packages).await;
        assert_eq!(r.status, Status::Failed, "{packages:?}: {}", r.message);
        assert_eq!(r.stage, Some(Stage::Install), "{packages:?}");
        assert!(r.message.contains(says), "{packages:?}: {}", r.message);
        assert!(!r.stdout.contains("never"), "the program ran");
    }
    // The prefix cap holds for what the session holds in all: 1.5 MB fits 2 MB, 3 MB not.
    let r = in_session(&m, &sid, "import half1\nprint(x)", &["half1==1.0"]).await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    let r = in_session(&m, &sid, "print('never')", &["half2==1.0"]).await;
    assert_eq!(r.stage, Some(Stage::Install), "{}", r.message);
    assert!(
        r.message.contains("2 MB prefix (packages.prefix_mb)"),
        "{}",
        r.message
    );

    let check = r#"
print(tinypkg.VALUE, x)
try:
    open("/opt/codebox/packages/x", "w")
    print("writable")
except OSError:
    print("read-only")
"#;
    let r = in_session(&m, &sid, check, &["tinypkg==1.0"]).await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    assert_eq!(r.stdout, "tiny one 41\nread-only\n");
    let p = r.packages.expect("packages report");
    assert!(p.cached, "a package the session holds was installed again");
    assert_eq!(p.install_ms, 0);
    let names: Vec<&str> = p.installed.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["half1", "tinypkg"]);

    let volumes = session_volumes(&sid);
    m.close(&sid).unwrap();
    let left = gone_within(|| session_volumes(&sid), 30).await;
    assert!(
        left.is_empty(),
        "the session's packages volume is left: {volumes:?}"
    );
    m.shutdown(std::time::Duration::from_secs(20)).await;
}

#[tokio::test]
async fn a_javascript_session_resolves_packages_installed_after_it_started() {
    let registry = Index::npm();
    let url = format!("http://127.0.0.1:{}/", registry.port);
    let m = crate::mcp_support::docker_sessions(
        |c| {
            c.packages.javascript.registry_url = Some(url);
            c.packages.install_runtime = Some("runc".into());
            c.sessions.ready.clear();
        },
        None,
    );
    let _cleanup = RemovedIfFailed(m.runs().executor().packages().clone());
    let s = m
        .create(codebox::contract::SessionRequest {
            language: "javascript".into(),
            ..Default::default()
        })
        .await
        .expect("session");
    let sid = s.session_id.clone();
    let r = in_session(
        &m,
        &sid,
        "let n = 2; try { require('leftpadx') } catch (e) { console.log(e.code) }",
        &[],
    )
    .await;
    assert_eq!(r.stdout, "MODULE_NOT_FOUND\n", "{}", r.stderr);
    let r = in_session(
        &m,
        &sid,
        "console.log(require('leftpadx')('x', 3), n)",
        &["leftpadx@^1"],
    )
    .await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    assert_eq!(r.stdout, "  x:dep 2\n");
    let p = r.packages.expect("packages report");
    let names: Vec<(&str, &str)> = p
        .installed
        .iter()
        .map(|i| (i.name.as_str(), i.version.as_str()))
        .collect();
    assert_eq!(names, [("leftpadx", "1.0.0"), ("tinydep", "1.2.0")]);
    m.close(&sid).unwrap();
    let left = gone_within(|| session_volumes(&sid), 30).await;
    assert!(
        left.is_empty(),
        "the session's packages volume is left: {left:?}"
    );
    m.shutdown(std::time::Duration::from_secs(20)).await;
}

#[tokio::test]
async fn a_session_takes_packages_another_session_installed_from_the_cache() {
    let mut index = Index::start();
    let url = index.url();
    let m = crate::mcp_support::docker_sessions(
        |c| {
            c.packages.python.index_url = Some(url);
            c.packages.install_runtime = Some("runc".into());
            c.sessions.ready.clear();
        },
        None,
    );
    let _cleanup = RemovedIfFailed(m.runs().executor().packages().clone());
    let mut sids = Vec::new();
    for _ in 0..2 {
        let request = codebox::contract::SessionRequest {
            language: "python".into(),
            ..Default::default()
        };
        sids.push(m.create(request).await.expect("session").session_id);
    }
    let code = "import tinypkg\nprint(tinypkg.VALUE)";
    let r = in_session(&m, &sids[0], code, &["tinypkg==1.0"]).await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    // The second copies the cached prefix: no install, no index.
    index.stop();
    let r = in_session(&m, &sids[1], code, &["tinypkg==1.0"]).await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    assert_eq!(r.stdout, "tiny one\n");
    assert_eq!(r.packages.map(|p| p.cached), Some(true));
    for sid in &sids {
        m.close(sid).unwrap();
        let left = gone_within(|| session_volumes(sid), 30).await;
        assert!(
            left.is_empty(),
            "a session's packages volume is left: {left:?}"
        );
    }
    m.shutdown(std::time::Duration::from_secs(20)).await;
}

/// Containers of the pool that mount `volume`.
fn pooled_with(volume: &str) -> usize {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("volume={volume}"),
            "--filter",
            "label=codebox.run=pool",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[tokio::test]
async fn cache_hits_take_ready_containers_that_mount_their_prefix_and_nothing_else_does() {
    let index = Index::start();
    let url = index.url();
    let m = crate::mcp_support::docker_sessions(
        |c| {
            c.packages.python.index_url = Some(url);
            c.packages.install_runtime = Some("runc".into());
            c.pool.sizes = [("python".to_string(), 1)].into_iter().collect();
            c.sessions.ready.clear();
        },
        None,
    );
    let _cleanup = RemovedIfFailed(m.runs().executor().packages().clone());
    m.runs().start_pool();
    let submit = |code: &str, packages: &[&str]| {
        let req = if packages.is_empty() {
            py(code)
        } else {
            with_packages(code, packages)
        };
        m.submit(req).expect("accepted").run_id
    };
    let wait = |id: String| {
        let m = &m;
        async move {
            m.runs()
                .wait(&id, std::time::Duration::from_secs(120))
                .await
                .unwrap()
        }
    };
    // Installed, then hit twice: runs that mount this prefix are now a demand of their own.
    for _ in 0..2 {
        let r = wait(submit("import tinypkg", &["tinypkg==1.0"])).await;
        assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    }
    let volume = m
        .runs()
        .executor()
        .packages()
        .volumes()
        .pop()
        .expect("a cached prefix");
    // Ready: the pool follows this demand as any other (how many, by its own rules).
    crate::mcp_support::eventually(60, "a container mounting the prefix is ready", || {
        let s = m.stats().pool.stats;
        pooled_with(&volume) >= 1 && s.filling == 0 && s.idle.values().sum::<usize>() >= 2
    })
    .await;
    let ready = pooled_with(&volume);
    // A run without packages never takes one.
    let r = wait(submit("print('plain')", &[])).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    assert_eq!(
        pooled_with(&volume),
        ready,
        "a run without packages took one"
    );
    let hits = m.stats().pool.hits;
    let r = wait(submit(OFFLINE_PROGRAM, &["tinypkg==1.0"])).await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    assert!(r.packages.as_ref().is_some_and(|p| p.cached));
    assert_eq!(m.stats().pool.hits, hits + 1, "the hit did not take it");
    // The same posture as a fresh container: only lo, the prefix read-only.
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[..2], ["tiny one", "['lo']"], "{}", r.stdout);
    assert!(lines[2].starts_with("no network"), "{}", r.stdout);
    assert!(lines[3].starts_with("prefix read-only"), "{}", r.stdout);
    m.shutdown(std::time::Duration::from_secs(20)).await;
    assert_eq!(pooled_with(&volume), 0, "a ready container is left");
    assert!(
        existing(&[volume]).is_empty(),
        "the prefix's volume is left"
    );
}

#[tokio::test]
async fn post_v1_runs_in_a_session_installs_and_its_events_show_the_install_stage() {
    use crate::http_api::{start_sessions, TOKEN};
    use crate::live::{start_run, Events};
    let index = Index::start();
    let url = index.url();
    let m = crate::mcp_support::docker_sessions(
        |c| {
            c.packages.python.index_url = Some(url);
            c.packages.install_runtime = Some("runc".into());
            c.sessions.ready.clear();
        },
        None,
    );
    let _cleanup = RemovedIfFailed(m.runs().executor().packages().clone());
    let server = start_sessions(m.clone(), Some(TOKEN)).await;
    let (status, session) = server
        .send("POST", "/v1/sessions", Some(r#"{"language": "python"}"#))
        .await;
    assert_eq!(status, 200, "{session}");
    let sid = session["session_id"].as_str().unwrap().to_string();
    let id = start_run(
        &server,
        serde_json::json!({"session_id": sid, "packages": ["other==1.0"],
            "code": "import other\nprint(other.VALUE)", "wait": false}),
    )
    .await;
    let mut stream = Events::open(&server, &id, None).await;
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        events.push(e);
    }
    let names: Vec<String> = events
        .iter()
        .map(|e| match e.event.as_str() {
            "started" => format!("started {}", e.data["stage"].as_str().unwrap()),
            other => other.to_string(),
        })
        .collect();
    let install = names.iter().position(|n| n == "started install");
    let run = names.iter().position(|n| n == "started run");
    assert!(install.is_some() && install < run, "{names:?}");
    let install_output: String = events[install.unwrap()..run.unwrap()]
        .iter()
        .filter_map(|e| e.data["data"].as_str())
        .collect();
    assert!(
        install_output.contains("other"),
        "the install's output was not shown: {install_output:?}"
    );
    let report = &events.last().unwrap().data;
    assert_eq!(report["status"], "succeeded", "{report}");
    assert_eq!(report["stdout"], "other one\n");
    assert_eq!(report["packages"]["requested"][0], "other==1.0");
    assert_eq!(report["session"]["session_id"], sid.as_str());
    server
        .send("DELETE", &format!("/v1/sessions/{sid}"), None)
        .await;
    let left = gone_within(|| session_volumes(&sid), 30).await;
    assert!(
        left.is_empty(),
        "the session's packages volume is left: {left:?}"
    );
    m.shutdown(std::time::Duration::from_secs(20)).await;
}
