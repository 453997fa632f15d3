//! Programs' own egress (`sandbox.egress_hosts`, SPEC 13) against real Docker and a real HTTP
//! server on the host's loopback: a program reaches the listed host through codebox's proxy
//! (its container still has only `lo`); another host, an IP literal, another port and a direct
//! connection all fail; a pooled container serves such a run the same way.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use codebox::config::Config;
use codebox::contract::ValidRequest;
use codebox::executor::new_run_id;
use codebox::report::Status;
use tokio_util::sync::CancellationToken;

use crate::common::{self, py, registry};
use crate::mcp_support::{docker_manager, eventually};

/// `python3 -m http.server` on 127.0.0.1 over a folder holding `hello.txt`.
struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hello.txt"), "hello from the host\n").unwrap();
        let mut child = Command::new("python3")
            .args(["-u", "-m", "http.server", "--bind", "127.0.0.1", "0"])
            .arg("--directory")
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split(" port ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each attempt prints `name: ok ...` or `name: failed <why>`.
fn program(port: u16) -> String {
    format!(
        r#"
import os, socket, urllib.request
def attempt(name, f):
    try:
        print(name + ": ok " + str(f()))
    except Exception as e:
        print(name + ": failed " + type(e).__name__ + " " + str(getattr(e, "code", "")))
def via_proxy(request):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(request)
    return s.makefile("rb").readline().decode().strip()
get = lambda url: urllib.request.urlopen(url, timeout=10).read().decode().strip()
attempt("allowed", lambda: get("http://localhost:{port}/hello.txt"))
attempt("other_host", lambda: get("http://example.invalid/"))
attempt("ip_literal", lambda: via_proxy(b"GET http://127.0.0.1:{port}/hello.txt HTTP/1.1\r\n\r\n"))
attempt("other_ip", lambda: get("http://10.1.2.3/"))
attempt("metadata", lambda: get("http://169.254.169.254/latest/meta-data/"))
attempt("other_port", lambda: via_proxy(b"CONNECT localhost:443 HTTP/1.1\r\n\r\n"))
attempt("direct", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3))
attempt("dns", lambda: socket.getaddrinfo("deb.debian.org", 80))
print("interfaces:", ",".join(sorted(os.listdir("/sys/class/net"))))
print("proxy:", os.environ.get("HTTP_PROXY"), os.environ.get("NO_PROXY"), "CODEBOX_EGRESS" in os.environ)
"#
    )
}

fn check_answers(stdout: &str) {
    for want in [
        "allowed: ok hello from the host",
        "other_host: failed HTTPError 403",
        "ip_literal: ok HTTP/1.1 403 Forbidden",
        "other_ip: failed HTTPError 403",
        "metadata: failed HTTPError 403",
        "other_port: ok HTTP/1.1 403 Forbidden",
        "direct: failed ConnectionRefusedError",
        "dns: failed gaierror",
        "interfaces: lo",
        "proxy: http://127.0.0.1:3128 127.0.0.1,::1 False",
    ] {
        assert!(
            stdout.lines().any(|l| l.trim_end() == want),
            "no line `{want}` in:\n{stdout}"
        );
    }
}

fn config(port: u16) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| c.sandbox.egress_hosts = vec![format!("localhost:{port}")]
}

#[tokio::test]
async fn a_program_reaches_only_its_egress_hosts_through_the_proxy() {
    let server = Server::start();
    let mut c = Config::default();
    config(server.port)(&mut c);
    let exec = common::docker_executor_with(c);
    let valid = ValidRequest::new(py(&program(server.port)), &registry(), exec.config()).unwrap();
    let id = new_run_id();
    let r = exec.execute(&id, &valid, 0, CancellationToken::new()).await;
    common::assert_no_leftovers(&id).await;
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    check_answers(&r.stdout);
}

#[tokio::test]
async fn without_egress_hosts_nothing_listens_and_a_pooled_container_gets_it_with_them() {
    // Off (the default): no relay, no proxy variables.
    let server = Server::start();
    let exec = common::docker_executor_with(Config::default());
    let off = r#"
import os, socket
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=3)
    print("relay listening")
except OSError as e:
    print("no relay:", type(e).__name__)
print(sorted(k for k in os.environ if "proxy" in k.lower() or k == "CODEBOX_EGRESS"))
print(os.path.exists("/run/codebox-egress/proxy.sock"))
"#;
    let valid = ValidRequest::new(py(off), &registry(), exec.config()).unwrap();
    let id = new_run_id();
    let r = exec.execute(&id, &valid, 0, CancellationToken::new()).await;
    common::assert_no_leftovers(&id).await;
    assert_eq!(
        r.stdout, "no relay: ConnectionRefusedError\n[]\nFalse\n",
        "{}",
        r.stderr
    );

    // On, through the run manager with a ready Python container: the run takes it.
    let m = docker_manager(
        |c| {
            config(server.port)(c);
            c.pool.sizes = [("python".to_string(), 1)].into_iter().collect();
            c.sessions.ready.clear();
        },
        None,
    );
    m.start_pool();
    eventually(60, "a ready container", || {
        m.stats().pool.stats.idle.values().sum::<usize>() == 1
    })
    .await;
    let run = m.submit(py(&program(server.port))).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}\n{}", r.message, r.stderr);
    assert_eq!(
        m.stats().pool.hits,
        1,
        "the run did not take the ready container"
    );
    check_answers(&r.stdout);
    m.shutdown(Duration::from_secs(20)).await;
}
