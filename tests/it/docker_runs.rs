//! Real Docker: the posture proven from inside a run, every outcome for Python and C++,
//! files, stdin, args, output caps, and cleanup.

use codebox::config::Config;
use codebox::contract::{Encoding, FileInput, ValidRequest};
use codebox::engine::docker::DockerEngine;
use codebox::executor::Executor;
use codebox::report::{Stage, Status};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use crate::common::{self, cpp, limits, py, request, run, run_with};

// ---- posture, one test per guarantee ------------------------------------------------------

#[tokio::test]
async fn programs_run_as_a_non_root_user() {
    let r = run(py(
        "import os; print(os.getuid(), os.getgid(), os.geteuid())",
    ))
    .await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let ids: Vec<u32> = r
        .stdout
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(
        ids.iter().all(|id| *id == ids[0]),
        "uid, gid, euid differ: {ids:?}"
    );
    assert!(
        (10001..=10064).contains(&ids[0]),
        "not a sandbox user: {ids:?}"
    );
}

#[tokio::test]
async fn the_daemon_holds_the_full_posture_for_a_live_run_container() {
    // Read back from the daemon what the posture check cannot see in a spec, because the
    // Docker adapter fixes it: no mounts, binds or devices, no added capabilities, a private
    // IPC namespace, no log on the daemon's disk, not privileged.
    let exec = common::docker_executor();
    let valid = ValidRequest::new(
        py("import time; time.sleep(60)"),
        &common::registry(),
        exec.config(),
    )
    .unwrap();
    let id = codebox::executor::new_run_id();
    let cancel = CancellationToken::new();
    let run = {
        let (id, cancel) = (id.clone(), cancel.clone());
        tokio::spawn(async move { exec.execute(&id, &valid, 0, cancel).await })
    };
    let container = loop {
        if let Some(c) = common::leftovers(&id).into_iter().next() {
            break c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let out = std::process::Command::new("docker")
        .args(["inspect", &container])
        .output()
        .expect("docker CLI");
    cancel.cancel();
    let r = run.await.unwrap();
    assert_eq!(r.status, Status::Stopped, "{r:?}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (c, h) = (&v[0]["Config"], &v[0]["HostConfig"]);
    let empty = |x: &serde_json::Value| x.is_null() || x.as_array().is_some_and(|a| a.is_empty());
    assert_eq!(h["Runtime"], common::test_runtime().as_str());
    assert_eq!(h["NetworkMode"], "none");
    assert_eq!(c["NetworkDisabled"], true);
    assert_eq!(h["ReadonlyRootfs"], true);
    assert_eq!(h["Privileged"], false);
    assert_eq!(h["CapDrop"], serde_json::json!(["ALL"]));
    assert!(empty(&h["CapAdd"]), "{}", h["CapAdd"]);
    assert!(
        empty(&h["Binds"]) && empty(&h["Mounts"]) && empty(&v[0]["Mounts"]),
        "{v}"
    );
    assert!(empty(&h["Devices"]), "{}", h["Devices"]);
    assert_eq!(h["IpcMode"], "private");
    assert_eq!(h["LogConfig"]["Type"], "none");
    assert_eq!(h["PidsLimit"], 256);
    assert_eq!(h["Memory"], h["MemorySwap"]);
    assert!(h["CpuQuota"].as_i64().unwrap() > 0, "{}", h["CpuQuota"]);
    assert!(h["Init"].is_null() || h["Init"] == false, "{}", h["Init"]);
    assert_eq!(c["Hostname"], "sandbox");
    assert_eq!(c["Cmd"], serde_json::json!(["/usr/local/bin/codebox-init"]));
    let opts: Vec<&str> = h["SecurityOpt"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.as_str())
        .collect();
    assert!(opts.contains(&"no-new-privileges"), "{opts:?}");
    assert!(opts.iter().any(|o| o.starts_with("seccomp=")), "{opts:?}");
    let tmpfs = h["Tmpfs"].as_object().unwrap();
    assert_eq!(
        tmpfs.keys().collect::<Vec<_>>(),
        ["/tmp", "/workspace"],
        "{tmpfs:?}"
    );
    assert!(tmpfs["/tmp"].as_str().unwrap().contains("noexec"));
    common::assert_no_leftovers(&id).await;
}

#[tokio::test]
async fn concurrent_runs_get_different_uids() {
    // Per-user kernel limits (inotify instances, message queues, pipe buffers) are then
    // never shared between runs that execute at the same time.
    let code = "import os, time; print(os.getuid(), flush=True); time.sleep(2)";
    // One executor, as in a server: its runs lease from one pool of uids.
    let exec = std::sync::Arc::new(common::docker_executor());
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let exec = exec.clone();
            tokio::spawn(async move { run_with(&exec, py(code)).await })
        })
        .collect();
    let mut uids = Vec::new();
    for r in runs {
        let r = r.await.unwrap();
        assert_eq!(r.status, Status::Succeeded, "{r:?}");
        uids.push(r.stdout.trim().parse::<u32>().unwrap());
    }
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), 4, "runs shared a uid: {uids:?}");
}

#[tokio::test]
async fn programs_have_no_capabilities() {
    let r = run(py(
        "for l in open('/proc/self/status'):\n    if l.startswith(('CapEff','CapPrm','CapBnd','CapAmb')): print(l.split()[1])",
    ))
    .await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let caps: Vec<&str> = r.stdout.lines().collect();
    // gVisor's /proc/self/status has no CapAmb line.
    assert_eq!(
        caps.len(),
        if common::gvisor() { 3 } else { 4 },
        "{}",
        r.stdout
    );
    assert!(
        caps.iter().all(|c| c.chars().all(|d| d == '0')),
        "capabilities: {caps:?}"
    );
}

#[tokio::test]
async fn programs_cannot_gain_privileges() {
    // PR_GET_NO_NEW_PRIVS (gVisor's /proc/self/status has no NoNewPrivs line).
    let r = run(py(
        "import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))",
    ))
    .await;
    assert_eq!(r.stdout, "1\n", "{r:?}");
}

#[tokio::test]
async fn only_loopback_exists_and_connecting_fails_at_once() {
    // Only loopback is ever addressed here.
    let code = r#"
import os, socket
print(sorted(os.listdir('/sys/class/net')))
routes = [l for l in open('/proc/net/route').read().splitlines()[1:] if l.strip()]
print('routes', len(routes))
s = socket.socket()
s.settimeout(5)
try:
    s.connect(('127.0.0.1', 9))
    print('connected')
except ConnectionRefusedError:
    print('refused')
"#;
    let r = run(py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout, "['lo']\nroutes 0\nrefused\n");
}

#[tokio::test]
async fn root_filesystem_is_read_only() {
    let code = r#"
import errno
for path in ['/probe', '/usr/probe', '/etc/probe']:
    try:
        open(path, 'w').close()
        print(path, 'writable')
    except OSError as e:
        print(path, errno.errorcode[e.errno])
"#;
    let r = run(py(code)).await;
    // gVisor checks permissions before the read-only mount: the write is refused either way.
    let e = if common::gvisor() { "EACCES" } else { "EROFS" };
    assert_eq!(
        r.stdout,
        format!("/probe {e}\n/usr/probe {e}\n/etc/probe {e}\n"),
        "{r:?}"
    );
}

#[tokio::test]
async fn files_in_tmp_cannot_be_executed() {
    let code = r#"
import os, subprocess
open('/tmp/x.sh', 'w').write('#!/bin/sh\necho ran\n')
os.chmod('/tmp/x.sh', 0o755)
try:
    subprocess.run(['/tmp/x.sh'])
    print('executed')
except PermissionError:
    print('denied')
"#;
    let r = run(py(code)).await;
    assert_eq!(r.stdout, "denied\n", "{r:?}");
}

#[tokio::test]
async fn tmp_is_writable_but_size_capped() {
    let code = r#"
import errno
f = open('/tmp/big', 'wb')
try:
    for _ in range(200):
        f.write(b'x' * 1024 * 1024)
        f.flush()
    print('wrote 200 MB')
except OSError as e:
    print(errno.errorcode[e.errno])
"#;
    let r = run(py(code)).await;
    assert_eq!(r.stdout, "ENOSPC\n", "{r:?}");
}

#[tokio::test]
async fn fork_bomb_is_stopped_by_the_pids_limit() {
    let code = r#"
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError:
    pass
print('forked', n)
"#;
    if common::gvisor() {
        // gVisor's kernel runs inside the container's cgroup: at the pids limit it cannot make
        // the host threads it needs, and ends with the program.
        let r = run(py(code)).await;
        assert_eq!(r.status, Status::SandboxError, "{r:?}");
        return;
    }
    let n = common::count_until_the_pids_limit(code, "forked").await;
    assert!(
        n > 0 && n < 256,
        "forked {n} processes; the pids limit is 256"
    );
}

#[tokio::test]
async fn a_shell_fork_bomb_dies_with_the_shell_that_started_it() {
    // The script returns at once, leaving the bomb running in the background: when the
    // program ends, codebox-init kills every process left, so the run ends with the shell's
    // status and nothing outlives it.
    let mut req = request("bash", ":(){ :|:& };:");
    req.limits = limits(None, Some(10.0));
    let r = run(req).await; // run() also checks that nothing is left behind
    if common::gvisor() && r.status == Status::SandboxError {
        // Under gVisor each process of the bomb is a host process too, counted by the pids
        // limit: when the bomb reaches it before codebox-init has ended it, gVisor's kernel
        // cannot make the host threads it needs and ends with the program (1 run in 12 on a
        // quiet machine). The run is still contained and nothing outlives it.
        assert_eq!(r.stage, Some(Stage::Run), "{r:?}");
        assert!(
            r.message.contains("before codebox-init reported"),
            "{}",
            r.message
        );
        return;
    }
    assert_eq!(
        (r.status, r.exit_code),
        (Status::Succeeded, Some(0)),
        "{r:?}"
    );
    assert!(r.usage.cpu_time_ms.is_some(), "{r:?}");
}

// ---- outcomes ------------------------------------------------------------------------------

#[tokio::test]
async fn python_hello_succeeds() {
    let r = run(py("print('hello')")).await;
    assert_eq!(
        (r.status, r.stage, r.exit_code),
        (Status::Succeeded, Some(Stage::Run), Some(0))
    );
    assert_eq!(r.stdout, "hello\n");
    assert_eq!(r.compile.as_ref().unwrap().status, Status::Succeeded);
    assert!(r.image_id.as_deref().unwrap().starts_with("sha256:"));
    assert_eq!(r.limits.memory_mb, 512);
}

#[tokio::test]
async fn cpp_hello_succeeds() {
    let r = run(cpp(
        "#include <iostream>\nint main() { std::cout << \"hello\\n\"; }",
    ))
    .await;
    assert_eq!(
        (r.status, r.exit_code),
        (Status::Succeeded, Some(0)),
        "{r:?}"
    );
    assert_eq!(r.stdout, "hello\n");
}

#[tokio::test]
async fn python_exit_code_is_reported() {
    let r = run(py("import sys; sys.exit(3)")).await;
    assert_eq!(
        (r.status, r.exit_code, r.signal.as_deref()),
        (Status::Failed, Some(3), None)
    );
}

#[tokio::test]
async fn cpp_exit_code_is_reported() {
    let r = run(cpp("int main() { return 3; }")).await;
    assert_eq!((r.status, r.exit_code), (Status::Failed, Some(3)), "{r:?}");
}

#[tokio::test]
async fn cpp_segfault_is_failed_with_sigsegv() {
    let r = run(cpp(
        "int main() { volatile int *p = nullptr; *p = 42; return 0; }",
    ))
    .await;
    assert_eq!(r.status, Status::Failed, "{r:?}");
    assert_eq!(r.signal.as_deref(), Some("SIGSEGV"));
    assert_eq!(r.exit_code, Some(139));
}

#[tokio::test]
async fn python_segfault_is_failed_with_sigsegv() {
    let r = run(py("import ctypes; ctypes.string_at(0)")).await;
    assert_eq!(
        (r.status, r.signal.as_deref()),
        (Status::Failed, Some("SIGSEGV")),
        "{r:?}"
    );
}

#[tokio::test]
async fn python_syntax_error_is_a_compile_error() {
    let r = run(py("print('unclosed'")).await;
    assert_eq!(
        (r.status, r.stage),
        (Status::CompileError, Some(Stage::Compile)),
        "{r:?}"
    );
    let c = r.compile.unwrap();
    assert_eq!(c.status, Status::CompileError);
    assert!(c.stderr.contains("SyntaxError"), "{}", c.stderr);
    assert_ne!(c.exit_code, Some(0));
}

#[tokio::test]
async fn cpp_compile_error_carries_the_compiler_message() {
    let r = run(cpp("int main() { return undeclared_name; }")).await;
    assert_eq!(
        (r.status, r.stage),
        (Status::CompileError, Some(Stage::Compile)),
        "{r:?}"
    );
    let c = r.compile.unwrap();
    assert!(c.stderr.contains("undeclared_name"), "{}", c.stderr);
    assert!(
        c.stderr.contains("was not declared in this scope"),
        "{}",
        c.stderr
    );
}

#[tokio::test]
async fn python_infinite_loop_times_out_and_keeps_earlier_output() {
    let mut req = py("print('before', flush=True)\nwhile True: pass");
    req.limits = limits(None, Some(2.0));
    let r = run(req).await;
    assert_eq!(
        (r.status, r.stage),
        (Status::TimedOut, Some(Stage::Run)),
        "{r:?}"
    );
    assert_eq!(r.stdout, "before\n");
    assert_eq!(r.signal.as_deref(), Some("SIGKILL"));
    // A correctness bound, not a speed check: the program was killed at its deadline,
    // not left to run (it never ends by itself).
    assert!(r.duration_ms < 2_000 + 15_000, "took {} ms", r.duration_ms);
}

#[tokio::test]
async fn cpp_infinite_loop_times_out() {
    let mut req = cpp("#include <cstdio>\nint main() { std::puts(\"before\"); std::fflush(stdout); volatile unsigned long i = 0; for (;;) i++; }");
    req.limits = limits(None, Some(2.0));
    let r = run(req).await;
    assert_eq!(r.status, Status::TimedOut, "{r:?}");
    assert_eq!(r.stdout, "before\n");
}

#[tokio::test]
async fn python_memory_bomb_is_out_of_memory() {
    let mut req = py("print('start', flush=True)\na = []\nwhile True: a.append(bytearray(10**7))");
    req.limits = limits(Some(128.0), Some(20.0));
    let r = run(req).await;
    assert_eq!(
        (r.status, r.stage),
        (Status::OutOfMemory, Some(Stage::Run)),
        "{r:?}"
    );
    assert_eq!(r.stdout, "start\n");
    assert_eq!(r.exit_code, Some(137));
}

/// A container started with the docker CLI, labelled like codebox's so a leftover is seen.
fn docker_run_detached(memory: &str, code: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["run", "-d", "--label", "codebox.managed=true", "--runtime"])
        .arg(common::test_runtime())
        .args(["--network", "none", "-m", memory, "--memory-swap", memory])
        .args(["--entrypoint", "python3", "codebox/python:3.11", "-c", code])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let waited = std::process::Command::new("docker")
        .args(["wait", &id])
        .output()
        .unwrap();
    assert!(waited.status.success());
    id
}

#[tokio::test]
async fn the_engine_finds_an_oom_kill_among_a_containers_events_and_none_where_there_was_none() {
    use codebox::engine::ContainerEngine;
    let engine = common::docker_engine().unwrap();
    // Bytes written, not just reserved: the pages count against the limit.
    let hog = docker_run_detached("64m", "b = []\nwhile True: b.append(b'x' * 10**7)");
    let seen =
        tokio::time::timeout(std::time::Duration::from_secs(30), engine.oom_event(&hog)).await;
    let quiet = docker_run_detached("64m", "print(1)");
    let none =
        tokio::time::timeout(std::time::Duration::from_secs(2), engine.oom_event(&quiet)).await;
    for id in [&hog, &quiet] {
        engine.remove_container(id).await.unwrap();
    }
    assert!(matches!(seen, Ok(Ok(true))), "{seen:?}");
    assert!(
        none.is_err(),
        "no OOM event for a program that printed 1: {none:?}"
    );
}

#[tokio::test]
async fn cpp_memory_bomb_is_out_of_memory() {
    let code = r#"
#include <cstring>
#include <vector>
int main() {
    std::vector<char*> keep;
    for (;;) { char* p = new char[1 << 24]; std::memset(p, 1, 1 << 24); keep.push_back(p); }
}
"#;
    let mut req = cpp(code);
    req.limits = limits(Some(128.0), Some(20.0));
    let r = run(req).await;
    assert_eq!(r.status, Status::OutOfMemory, "{r:?}");
}

#[tokio::test]
async fn python_stdin_is_echoed() {
    let mut req = py("import sys; sys.stdout.write(sys.stdin.read())");
    req.stdin = Some("line one\nline two\n".into());
    let r = run(req).await;
    assert_eq!(r.stdout, "line one\nline two\n", "{r:?}");
}

#[tokio::test]
async fn cpp_stdin_is_echoed() {
    let mut req = cpp("#include <iostream>\n#include <string>\nint main() { std::string l; while (std::getline(std::cin, l)) std::cout << l << '\\n'; }");
    req.stdin = Some("a\nb\n".into());
    let r = run(req).await;
    assert_eq!(r.stdout, "a\nb\n", "{r:?}");
}

#[tokio::test]
async fn program_without_stdin_sees_end_of_file() {
    let r = run(py("import sys; print(repr(sys.stdin.read()))")).await;
    assert_eq!(r.stdout, "''\n", "{r:?}");
}

#[tokio::test]
async fn extra_files_are_readable_by_the_program() {
    let mut req = py("print(open('data/in.txt').read(), open('blob.bin','rb').read())");
    req.files = Some(vec![
        FileInput {
            path: "data/in.txt".into(),
            content: "from a file".into(),
            encoding: None,
        },
        FileInput {
            path: "blob.bin".into(),
            content: "AAEC".into(),
            encoding: Some(Encoding::Base64),
        },
    ]);
    let r = run(req).await;
    assert_eq!(r.stdout, "from a file b'\\x00\\x01\\x02'\n", "{r:?}");
}

#[tokio::test]
async fn cpp_reads_extra_files() {
    let mut req = cpp("#include <fstream>\n#include <iostream>\nint main() { std::ifstream f(\"in.txt\"); std::string s; f >> s; std::cout << s << '\\n'; }");
    req.files = Some(vec![FileInput {
        path: "in.txt".into(),
        content: "payload".into(),
        encoding: None,
    }]);
    let r = run(req).await;
    assert_eq!(r.stdout, "payload\n", "{r:?}");
}

#[tokio::test]
async fn args_are_passed_to_the_program() {
    let mut req = py("import sys; print(sys.argv[1:])");
    req.args = Some(vec!["one".into(), "two words".into(), "--flag".into()]);
    let r = run(req).await;
    assert_eq!(r.stdout, "['one', 'two words', '--flag']\n", "{r:?}");
    let mut req = cpp("#include <cstdio>\nint main(int c, char** v) { for (int i = 1; i < c; i++) std::printf(\"%s;\", v[i]); }");
    req.args = Some(vec!["a".into(), "b c".into()]);
    assert_eq!(run(req).await.stdout, "a;b c;");
}

#[tokio::test]
async fn output_beyond_the_cap_is_counted_and_cut() {
    let mut config = Config::default();
    config.sandbox.output_limit_bytes = 1000;
    let exec = common::docker_executor_with(config);
    let r = run_with(
        &exec,
        py("import sys\nsys.stdout.write('x' * 50_000_000)\nsys.stderr.write('e' * 10)"),
    )
    .await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout_bytes, 50_000_000);
    assert_eq!(
        (r.stderr.as_str(), r.stderr_truncated, r.stderr_bytes),
        ("eeeeeeeeee", false, 10)
    );
}

#[tokio::test]
async fn invalid_utf8_output_is_replaced_and_counted_raw() {
    let r = run(py("import sys; sys.stdout.buffer.write(b'ok\\xff\\n')")).await;
    assert_eq!(r.stdout, "ok\u{fffd}\n");
    assert_eq!(r.stdout_bytes, 4);
}

#[tokio::test]
async fn cancelling_a_run_stops_it_and_removes_its_containers() {
    let exec = common::docker_executor();
    let valid = ValidRequest::new(
        py("import time; print('up', flush=True); time.sleep(60)"),
        &common::registry(),
        exec.config(),
    )
    .unwrap();
    let id = codebox::executor::new_run_id();
    let cancel = CancellationToken::new();
    let stopper = cancel.clone();
    let watched = id.clone();
    // Stop once the program's container is up (not after a fixed time).
    tokio::spawn(async move {
        while common::leftovers(&watched).is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2000)).await;
        stopper.cancel();
    });
    let r = exec.execute(&id, &valid, 0, cancel).await;
    assert_eq!(r.status, Status::Stopped, "{r:?}");
    assert_eq!(r.stdout, "up\n", "output before the stop is kept");
    assert!(
        r.usage.cpu_time_ms.is_some(),
        "a stopped run reports usage: {r:?}"
    );
    common::assert_no_leftovers(&id).await;
}

#[tokio::test]
async fn unreachable_docker_is_a_sandbox_error_that_says_where() {
    let engine = DockerEngine::connect_to("unix:///nonexistent/codebox-test.sock").unwrap();
    let exec = Executor::new(Arc::new(engine), Arc::new(Config::default()), "t".into());
    let valid = ValidRequest::new(py("print(1)"), &common::registry(), exec.config()).unwrap();
    let r = exec
        .execute("unreachable", &valid, 0, CancellationToken::new())
        .await;
    assert_eq!(r.status, Status::SandboxError);
    assert!(
        r.message
            .contains("Docker is not reachable at unix:///nonexistent/codebox-test.sock"),
        "{}",
        r.message
    );
    assert!(
        r.message.contains("start the daemon or set DOCKER_HOST"),
        "{}",
        r.message
    );
}
