//! Real Docker: hostile programs probing the sandbox from inside a run. One test per guarantee
//! not already covered by `docker_runs.rs`. Only loopback is ever addressed.

use codebox::config::Config;
use codebox::contract::{FileInput, RunRequest, ValidRequest};
use codebox::report::{Stage, Status};
use std::process::Command;

use crate::common::{self, limits, py, request, run, run_with};

#[tokio::test]
async fn no_directory_outside_the_scratch_space_is_writable() {
    let code = r#"
import errno
for d in ['/var/tmp', '/run', '/run/lock', '/home', '/dev', '/sys', '/sys/fs/cgroup', '/proc/sys/kernel']:
    try:
        open(d + '/probe', 'w').close()
        print(d, 'writable')
    except OSError as e:
        print(d, errno.errorcode[e.errno])
"#;
    // /dev/mqueue is left out: creating a file there creates a POSIX message queue in the
    // run's private IPC namespace (bounded by RLIMIT_MSGQUEUE), which is not a file store.
    let r = run(py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout.lines().count(), 8, "{}", r.stdout);
    assert!(!r.stdout.contains("writable"), "{}", r.stdout);
}

#[tokio::test]
async fn nothing_written_to_shared_memory_can_be_executed() {
    let code = r#"
import os, shutil, subprocess
for d in ['/dev/shm', '/tmp']:
    p = d + '/true'
    shutil.copy('/bin/true', p)
    os.chmod(p, 0o755)
    try:
        subprocess.run([p])
        print(d, 'executed')
    except PermissionError:
        print(d, 'denied')
"#;
    let r = run(py(code)).await;
    assert_eq!(r.stdout, "/dev/shm denied\n/tmp denied\n", "{r:?}");
}

#[tokio::test]
async fn shared_memory_is_size_capped_and_counts_against_the_memory_limit() {
    // /dev/shm and /tmp are both 64 MB tmpfs; filling both exceeds a 100 MB memory limit.
    let code = r#"
import errno
def fill(path):
    f = open(path, 'wb')
    try:
        for _ in range(100):
            f.write(b'x' * (1 << 20))
            f.flush()
        print(path, 'took 100 MB', flush=True)
    except OSError as e:
        print(path, errno.errorcode[e.errno], flush=True)
fill('/dev/shm/a')
fill('/tmp/a')
"#;
    let mut req = py(code);
    req.limits = limits(Some(100.0), Some(20.0));
    let r = run(req).await;
    assert_eq!(r.status, Status::OutOfMemory, "{r:?}");
    assert!(r.stdout.starts_with("/dev/shm/a ENOSPC\n"), "{r:?}");
}

#[tokio::test]
async fn namespace_mount_and_kernel_interface_syscalls_are_refused() {
    // x86_64 syscall numbers; every call must fail with EPERM (seccomp or missing capability).
    let code = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
calls = {
    'unshare(NEWUSER)': (272, 0x10000000), 'unshare(NEWNS)': (272, 0x00020000),
    'setns': (308, os.open('/proc/self/ns/net', os.O_RDONLY), 0),
    'mount': (165, 0, 0, 0, 0, 0), 'umount2': (166, 0, 0), 'pivot_root': (155, 0, 0),
    'keyctl': (250, 0, -3, 0), 'bpf': (321, 0, 0, 0), 'perf_event_open': (298, 0, 0, -1, -1, 0),
    'userfaultfd': (323, 0), 'init_module': (175, 0, 0, 0), 'kexec_load': (246, 0, 0, 0, 0),
    'open_by_handle_at': (304, 0, 0, 0), 'setuid(0)': (105, 0), 'fsopen': (430, 0, 0),
}
for name, (nr, *args) in calls.items():
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    print(name, errno.errorcode.get(ctypes.get_errno()) if r < 0 else 'allowed')
"#;
    let r = run(py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout.lines().count(), 15, "{}", r.stdout);
    for line in r.stdout.lines() {
        if common::gvisor() {
            // Under gVisor the program meets gVisor's own kernel, not codebox's seccomp profile:
            // it emulates user and mount namespaces for the program; everything else fails.
            if line.starts_with("unshare(") {
                assert!(line.ends_with(" allowed"), "{line}");
            } else {
                assert!(!line.ends_with(" allowed"), "{line}");
            }
        } else {
            assert!(line.ends_with(" EPERM"), "{line}");
        }
    }
}

#[tokio::test]
async fn raw_and_packet_sockets_are_refused() {
    let code = r#"
import errno, socket
for name, fam, typ, proto in [('raw', socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                              ('packet', socket.AF_PACKET, socket.SOCK_RAW, 0)]:
    try:
        socket.socket(fam, typ, proto)
        print(name, 'created')
    except OSError as e:
        print(name, errno.errorcode[e.errno])
"#;
    let r = run(py(code)).await;
    assert_eq!(r.stdout, "raw EPERM\npacket EPERM\n", "{r:?}");
}

#[tokio::test]
async fn loopback_servers_work_inside_the_run() {
    let code = r#"
import socket
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)
c = socket.create_connection(srv.getsockname(), timeout=5)
a, _ = srv.accept(); c.sendall(b'ping'); print(a.recv(4).decode())
"#;
    let r = run(py(code)).await;
    assert_eq!(r.stdout, "ping\n", "{r:?}");
}

#[tokio::test]
async fn setuid_binaries_do_not_raise_privileges() {
    // `su` is setuid root; with no-new-privileges it runs with the caller's ids. It blocks at
    // its password prompt, where its ids are read.
    let code = r#"
import subprocess, time
p = subprocess.Popen(['su', 'root', '-c', 'id'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
ids = None
for _ in range(100):
    try:
        ids = [l.split()[1:] for l in open('/proc/%d/status' % p.pid) if l.startswith(('Uid', 'Gid'))]
    except FileNotFoundError:
        break
    if open('/proc/%d/comm' % p.pid).read().strip() == 'su':
        break
    time.sleep(0.05)
p.kill()
print(ids)
"#;
    let r = run(py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    // su ran with the run's own uid and gid in all four slots (real, effective, saved, fs).
    let uid = r.stdout.split('\'').nth(1).unwrap().to_string();
    let q = format!("'{uid}'");
    let four = [q.as_str(); 4].join(", ");
    assert_eq!(r.stdout, format!("[[{four}], [{four}]]\n"), "{r:?}");
    assert!(uid.starts_with("100") && uid != "0", "{uid}");
}

#[tokio::test]
async fn no_docker_socket_or_other_unix_socket_is_reachable() {
    let code = r#"
import os
found = []
for top in ['/run', '/var/run', '/tmp', '/workspace', '/var', '/dev', '/home', '/root']:
    for root, dirs, files in os.walk(top, onerror=lambda e: None):
        for f in files + dirs:
            p = os.path.join(root, f)
            try:
                if os.path.exists(p) and (f.endswith('.sock') or os.stat(p).st_mode & 0o170000 == 0o140000):
                    found.append(p)
            except OSError:
                pass
print(found)
"#;
    let r = run(py(code)).await;
    assert_eq!(r.stdout, "[]\n", "{r:?}");
}

#[tokio::test]
async fn environment_holds_only_the_minimal_variables() {
    let r = run(request("bash", "env -0 | sort -z | tr '\\0' '\\n'")).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let names: Vec<&str> = r
        .stdout
        .lines()
        .map(|l| l.split('=').next().unwrap())
        .collect();
    // HOSTNAME is set by the Docker daemon to the container's own hostname; PWD, SHLVL and _
    // by bash itself.
    assert_eq!(
        names,
        ["HOME", "HOSTNAME", "LANG", "PATH", "PWD", "SHLVL", "TMPDIR", "_"],
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("HOME=/tmp\n"), "{}", r.stdout);
    assert!(r.stdout.contains("TMPDIR=/tmp\n"), "{}", r.stdout);
}

#[tokio::test]
async fn rlimits_cap_open_files_file_size_and_core_dumps_and_cannot_be_raised() {
    let code = r#"
import resource
for n in ['RLIMIT_NOFILE', 'RLIMIT_FSIZE', 'RLIMIT_CORE']:
    r = getattr(resource, n)
    soft, hard = resource.getrlimit(r)
    try:
        resource.setrlimit(r, (hard * 2 + 1, hard * 2 + 1))
        raised = 'raised'
    except (ValueError, OSError):
        raised = 'fixed'
    print(n, soft, hard, raised)
"#;
    let r = run(py(code)).await;
    let fsize = Config::default().sandbox.max_file_size_mb * 1024 * 1024;
    assert_eq!(
        r.stdout,
        format!("RLIMIT_NOFILE 1024 1024 fixed\nRLIMIT_FSIZE {fsize} {fsize} fixed\nRLIMIT_CORE 0 0 fixed\n"),
        "{r:?}"
    );
}

#[tokio::test]
async fn file_descriptor_exhaustion_stops_at_the_limit() {
    let code = r#"
import errno, os
fds = []
try:
    while True:
        fds.append(os.open('/dev/null', os.O_RDONLY))
except OSError as e:
    print(errno.errorcode[e.errno], len(fds) < 1024)
"#;
    let r = run(py(code)).await;
    assert_eq!(r.stdout, "EMFILE True\n", "{r:?}");
}

#[tokio::test]
async fn thread_bomb_is_stopped_by_the_pids_limit() {
    let code = r#"
import threading
ev = threading.Event(); n = 0
try:
    while True:
        threading.Thread(target=ev.wait, daemon=True).start(); n += 1
except RuntimeError:
    pass
ev.set()
print('threads', n)
"#;
    if common::gvisor() {
        // gVisor's threads live in its own kernel, bounded by the memory limit.
        let r = run(py(code)).await;
        assert_eq!(r.status, Status::OutOfMemory, "{r:?}");
        return;
    }
    let n = common::count_until_the_pids_limit(code, "threads").await;
    assert!(
        n > 0 && n < 256,
        "started {n} threads; the pids limit is 256"
    );
}

#[tokio::test]
async fn a_compiler_writing_a_huge_object_file_is_stopped_by_the_file_size_limit() {
    let r = run(request(
        "c",
        "char big[1 << 30] = {1};\nint main(void) { return big[5]; }",
    ))
    .await;
    assert_eq!(
        (r.status, r.stage),
        (Status::CompileError, Some(Stage::Compile)),
        "{r:?}"
    );
    let c = r.compile.unwrap();
    assert!(
        c.stderr.contains("File size limit exceeded"),
        "{}",
        c.stderr
    );
}

#[tokio::test]
async fn a_detached_signal_ignoring_grandchild_dies_with_the_run() {
    let marker = format!("codebox-escapee-{}", codebox::executor::new_run_id());
    // `[c]odebox-...` finds the escapee without matching grep's own command line.
    let (first, rest) = marker.split_at(1);
    let code = format!(
        "setsid bash -c 'trap \"\" TERM HUP INT QUIT; exec -a {marker} sleep 1000' </dev/null >/dev/null 2>&1 &\n\
         trap '' TERM HUP INT QUIT\n\
         for _ in $(seq 100); do grep -qa '[{first}]{rest}' /proc/[0-9]*/cmdline && break; sleep 0.1; done\n\
         grep -qa '[{first}]{rest}' /proc/[0-9]*/cmdline && echo detached\nsleep 1000\n"
    );
    let mut req = request("bash", &code);
    req.limits = limits(None, Some(10.0));
    let r = run(req).await;
    assert_eq!(r.status, Status::TimedOut, "{r:?}");
    assert_eq!(r.stdout, "detached\n");
    let ps = Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .expect("ps");
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(!ps.contains(&marker), "a process outlived its run:\n{ps}");
}

#[tokio::test]
async fn simultaneous_floods_on_stdout_and_stderr_are_both_capped() {
    let mut config = Config::default();
    config.sandbox.output_limit_bytes = 4096;
    let exec = common::docker_executor_with(config);
    let code = r#"
import os, threading
def flood(fd, c):
    b = c * 65536
    for _ in range(500):
        os.write(fd, b)
t = threading.Thread(target=flood, args=(1, b'o')); t.start()
flood(2, b'e'); t.join()
"#;
    let r = run_with(&exec, py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    assert_eq!((r.stdout.len(), r.stderr.len()), (4096, 4096));
    assert!(r.stdout_truncated && r.stderr_truncated);
    assert_eq!((r.stdout_bytes, r.stderr_bytes), (32_768_000, 32_768_000));
}

#[tokio::test]
async fn a_huge_line_without_newline_is_capped() {
    let mut config = Config::default();
    config.sandbox.output_limit_bytes = 1000;
    let exec = common::docker_executor_with(config);
    let r = run_with(
        &exec,
        request(
            "c",
            "#include <stdio.h>\nint main(void) { for (long i = 0; i < 100L << 20; i++) putchar('A'); return 0; }",
        ),
    )
    .await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout, "A".repeat(1000));
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout_bytes, 100 << 20);
}

#[tokio::test]
async fn stdin_at_the_size_cap_arrives_intact_with_nul_bytes() {
    let cap = Config::default().sandbox.max_stdin_bytes;
    let mut stdin = "a\0".repeat(cap / 2);
    stdin.truncate(cap);
    let mut req = py("import sys; d = sys.stdin.buffer.read(); print(len(d), d.count(b'\\0'))");
    req.stdin = Some(stdin);
    let r = run(req).await;
    assert_eq!(r.stdout, format!("{cap} {}\n", cap / 2), "{r:?}");
}

#[test]
fn a_file_cannot_turn_the_source_file_into_a_directory() {
    let req = RunRequest {
        files: Some(vec![FileInput {
            path: "main.py/x".into(),
            content: "x".into(),
            encoding: None,
        }]),
        ..py("print('ran')")
    };
    let valid = ValidRequest::new(req, &common::registry(), &Config::default());
    assert!(valid.is_err(), "accepted: {valid:?}");
}

#[tokio::test]
async fn odd_but_valid_file_paths_land_where_they_say() {
    let req = RunRequest {
        files: Some(vec![
            FileInput {
                path: "./d//é ü/./f.txt".into(),
                content: "unicode".into(),
                encoding: None,
            },
            FileInput {
                path: format!("{}/g", "n".repeat(200)),
                content: "long".into(),
                encoding: None,
            },
        ]),
        ..py("import os\nprint(open('d/é ü/f.txt').read(), open('n' * 200 + '/g').read())")
    };
    let r = run(req).await;
    assert_eq!(r.stdout, "unicode long\n", "{r:?}");
}

#[test]
fn file_paths_with_forbidden_characters_or_too_long_are_rejected() {
    for path in ["a\0b", "a\\b", &"x".repeat(256)] {
        let req = RunRequest {
            files: Some(vec![FileInput {
                path: path.to_string(),
                content: "x".into(),
                encoding: None,
            }]),
            ..py("print(1)")
        };
        let err = ValidRequest::new(req, &common::registry(), &Config::default()).unwrap_err();
        assert_eq!(err.field, "files[0].path", "{path:?}: {err}");
    }
    let req = RunRequest {
        args: Some(vec!["a\0b".into()]),
        ..py("print(1)")
    };
    let err = ValidRequest::new(req, &common::registry(), &Config::default()).unwrap_err();
    assert_eq!(err.field, "args[0]");
}

#[tokio::test]
async fn vsock_sockets_and_io_uring_are_refused_by_the_seccomp_profile() {
    // Only creates a socket; never connects anywhere.
    let code = r#"
import ctypes, errno, socket
try:
    socket.socket(40, socket.SOCK_STREAM)
    print('vsock created')
except OSError as e:
    print('vsock', errno.errorcode[e.errno])
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(425, 1, None)
print('io_uring_setup', r, errno.errorcode.get(ctypes.get_errno()))
"#;
    let r = run(py(code)).await;
    let expected = if common::gvisor() {
        // gVisor has no vsock at all, and its io_uring lives in its own kernel (here it only
        // complains about the null parameters): neither reaches the host's.
        "vsock EAFNOSUPPORT\nio_uring_setup -1 EFAULT\n"
    } else {
        "vsock EPERM\nio_uring_setup -1 EPERM\n"
    };
    assert_eq!(r.stdout, expected, "{r:?}");
}

#[tokio::test]
async fn the_hostname_does_not_reveal_the_container_id() {
    let r = run(py(
        "import os, socket; print(socket.gethostname(), os.environ.get('HOSTNAME'))",
    ))
    .await;
    assert_eq!(r.stdout, "sandbox sandbox\n", "{r:?}");
}

/// A language whose "compiler" runs the submitted script, as GHC runs Template Haskell.
const BUILD_SCRIPT_REGISTRY: &str = r#"
[images.bash]
tag = "codebox/bash:5.2"
context = "images/bash"

[languages.buildscript]
display_name = "A compile step that runs user code"
image = "bash"
source_file = "build.sh"
compile = ["bash", "build.sh"]
run = ["cat", "out.txt"]
compile_limits = { workspace_mb = 16 }
"#;

async fn run_build_script(code: &str) -> codebox::report::RunReport {
    let registry = codebox::registry::Registry::parse(
        std::path::Path::new("buildscript.toml"),
        BUILD_SCRIPT_REGISTRY,
    )
    .unwrap();
    let exec = common::docker_executor();
    let valid = ValidRequest::new(
        common::request("buildscript", code),
        &registry,
        exec.config(),
    )
    .unwrap();
    let id = codebox::executor::new_run_id();
    let report = exec
        .execute(&id, &valid, 0, tokio_util::sync::CancellationToken::new())
        .await;
    common::assert_no_leftovers(&id).await;
    report
}

#[tokio::test]
async fn a_tmpfs_workspace_carries_compile_output_to_the_run_stage() {
    let r = run_build_script("echo built > out.txt").await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout, "built\n");
}

#[tokio::test]
async fn compile_time_code_cannot_write_more_than_the_tmpfs_workspace() {
    let code =
        "set -e\nfor i in 1 2 3; do head -c 10000000 /dev/zero > f$i; done\necho done > out.txt";
    let r = run_build_script(code).await;
    assert_eq!(r.status, Status::CompileError, "{r:?}");
    let c = r.compile.unwrap();
    assert!(c.stderr.contains("No space left on device"), "{}", c.stderr);
}
