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

/// What is left in the executor's egress folder (a proxy's directory outlived its install).
fn egress_left(exec: &Executor) -> Vec<String> {
    std::fs::read_dir(exec.config().data_dir.join("egress"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
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
    let p = again.packages.expect("packages report");
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
        egress_left(&exec),
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
    let m = crate::mcp_support::docker_manager(
        |c| {
            c.packages.python.index_url = Some(url);
            c.sessions.ready.clear();
        },
        None,
    );
    let _cleanup = RemovedIfFailed(m.executor().packages().clone());
    // Through the run manager, as run_code and POST /v1/runs submit.
    let id = m
        .submit(with_packages(
            "import tinypkg; print(tinypkg.VALUE)",
            &["tinypkg==2.0"],
        ))
        .expect("accepted")
        .run_id;
    let r = m
        .wait(&id, std::time::Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    assert_eq!(r.stdout, "tiny two\n");
    assert_eq!(r.packages.as_ref().map(|p| p.cached), Some(false));

    let s = m
        .create_session(codebox::contract::SessionRequest {
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
    // In a session, packages go to create_session.
    let refused = m.submit(RunRequest {
        code: "print(1)".into(),
        session_id: Some(s.session_id.clone()),
        packages: Some(vec!["tinypkg".into()]),
        ..Default::default()
    });
    assert!(
        refused.is_err_and(|e| e.to_string().contains("create_session")),
        "packages in a session's run_code were not refused"
    );
    let volumes = m.executor().packages().volumes();
    assert_eq!(existing(&volumes).len(), 2, "{volumes:?}");
    m.close_session(&s.session_id).unwrap();
    m.shutdown(std::time::Duration::from_secs(20)).await;
    let left = existing(&volumes);
    assert!(left.is_empty(), "left: {left:?}");
    let ps = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("name={container}")])
        .output()
        .unwrap();
    assert!(ps.stdout.is_empty(), "the session's container is left");
}
