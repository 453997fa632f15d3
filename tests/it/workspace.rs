//! Real Docker: the run's working directory is writable, size-capped scratch that only it
//! sees; files left under `outputs/` come back; usage is measured for every stage.

use std::sync::Arc;

use base64::Engine as _;
use codebox::report::{RunReport, Status};
use sha2::{Digest, Sha256};

use crate::common::{self, cpp, limits, py, run, run_with};

fn file<'a>(r: &'a RunReport, path: &str) -> &'a codebox::report::FileReport {
    r.files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} not returned: {:?}", r.files))
}

fn content(f: &codebox::report::FileReport) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(f.content_base64.as_deref().expect("content"))
        .unwrap()
}

#[tokio::test]
async fn the_working_directory_takes_creates_renames_deletes_and_nested_folders() {
    let code = r#"
import os
os.makedirs('a/b/c', exist_ok=True)
open('a/b/c/x.txt', 'w').write('x')
os.rename('a/b/c/x.txt', 'a/y.txt')
open('gone.txt', 'w').write('g')
os.remove('gone.txt')
os.rmdir('a/b/c')
print(os.getcwd(), sorted(os.listdir('.')), sorted(os.listdir('a')), open('a/y.txt').read())
"#;
    let r = run(py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout, "/workspace ['a', 'main.py'] ['b', 'y.txt'] x\n");
}

#[tokio::test]
async fn filling_the_working_directory_is_enospc_and_the_run_goes_on() {
    let code = r#"
import errno
n = 0
try:
    while True:
        with open('f%06d' % n, 'wb') as f:
            f.write(b'x' * 8192)
        n += 1
except OSError as e:
    print(errno.errorcode[e.errno], n > 1000)
"#;
    let r = run(py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout, "ENOSPC True\n");
}

#[tokio::test]
async fn concurrent_runs_never_see_each_others_files() {
    let exec = Arc::new(common::docker_executor());
    let runs = (0..3).map(|i| {
        let exec = exec.clone();
        async move {
            let code = format!(
                "import os, time\nopen('mine-{i}', 'w').write('{i}')\ntime.sleep(1)\nprint(sorted(os.listdir('.')))"
            );
            run_with(&exec, py(&code)).await
        }
    });
    for (i, r) in futures_util::future::join_all(runs)
        .await
        .iter()
        .enumerate()
    {
        assert_eq!(r.status, Status::Succeeded, "{r:?}");
        assert_eq!(r.stdout, format!("['main.py', 'mine-{i}']\n"));
    }
}

#[tokio::test]
async fn chroot_and_mount_are_still_refused_with_a_writable_directory() {
    let code = r#"
import ctypes, errno, os
try:
    os.chroot('.')
    print('chroot worked')
except OSError as e:
    print('chroot', errno.errorcode[e.errno])
libc = ctypes.CDLL(None, use_errno=True)
os.mkdir('m')
rc = libc.mount(b'none', b'm', b'tmpfs', 0, None)
print('mount', rc, errno.errorcode[ctypes.get_errno()])
"#;
    let r = run(py(code)).await;
    assert_eq!(r.stdout, "chroot EPERM\nmount -1 EPERM\n", "{r:?}");
}

#[tokio::test]
async fn a_compiled_binary_and_the_files_it_writes_share_the_working_directory() {
    let code = r#"
#include <stdio.h>
int main(void) {
    FILE *f = fopen("outputs/result.txt", "w");
    if (!f) { perror("outputs"); return 1; }
    fputs("from c++\n", f);
    return fclose(f);
}
"#;
    // outputs/ does not exist yet: the program creates it.
    let code = code.replace(
        "int main(void) {",
        "#include <sys/stat.h>\nint main(void) {\n    mkdir(\"outputs\", 0755);",
    );
    let r = run(cpp(&code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let f = file(&r, "outputs/result.txt");
    assert_eq!(content(f), b"from c++\n");
    assert_eq!(f.mime_type, "text/plain");
}

#[tokio::test]
async fn files_under_outputs_come_back_with_type_bytes_and_hash() {
    let code = r#"
import os, zlib, struct
os.makedirs('outputs/sub')
open('outputs/data.csv', 'w').write('a,b\n1,2\n')
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
png = b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 0, 0, 0, 0)) \
    + chunk(b'IDAT', zlib.compress(b'\x00\x00')) + chunk(b'IEND', b'')
open('outputs/sub/dot.png', 'wb').write(png)
open('not-returned.txt', 'w').write('outside outputs/')
"#;
    let r = run(py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.files.len(), 2, "{:?}", r.files);
    let csv = file(&r, "outputs/data.csv");
    assert_eq!((csv.mime_type.as_str(), csv.size_bytes), ("text/csv", 8));
    assert_eq!(content(csv), b"a,b\n1,2\n");
    assert_eq!(csv.sha256, format!("{:x}", Sha256::digest(b"a,b\n1,2\n")));
    let png = file(&r, "outputs/sub/dot.png");
    assert_eq!(png.mime_type, "image/png");
    assert!(content(png).starts_with(b"\x89PNG"));
    assert_eq!(png.omitted_reason, None);
}

#[tokio::test]
async fn files_over_the_caps_are_listed_with_the_reason() {
    let code = r#"
import os
os.makedirs('outputs')
for i in range(34):
    open('outputs/f%02d.txt' % i, 'w').write('x')
open('outputs/big.bin', 'wb').write(b'\0' * (5 * 1024 * 1024))
os.symlink('/etc/passwd', 'outputs/passwd')
"#;
    let r = run(py(code)).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.files.len(), 36, "every file is listed");
    let sent = r
        .files
        .iter()
        .filter(|f| f.content_base64.is_some())
        .count();
    assert_eq!(sent, 32);
    let big = file(&r, "outputs/big.bin");
    assert_eq!(
        big.omitted_reason.as_deref(),
        Some("over the 4194304-byte per-file cap")
    );
    assert_eq!(big.size_bytes, 5 * 1024 * 1024);
    assert_eq!(big.sha256.len(), 64, "hashed even when not sent");
    let link = file(&r, "outputs/passwd");
    assert_eq!(
        link.omitted_reason.as_deref(),
        Some("a symbolic link, not followed")
    );
    assert!(link.content_base64.is_none());
    let over = r
        .files
        .iter()
        .filter(|f| f.omitted_reason.as_deref() == Some("over the 32-file cap"))
        .count();
    assert_eq!(over, 2);
}

/// A program that leaves a file 20 folders below `outputs/` and 1,500 files in one folder.
pub const DEEP_AND_MANY: &str = r#"
import os
deep = 'outputs/' + '/'.join('d%02d' % i for i in range(1, 21))
os.makedirs(deep)
open(deep + '/lost.txt', 'w').write('x')
os.makedirs('outputs/many')
for i in range(1500):
    open('outputs/many/%04d' % i, 'w').close()
"#;

/// The folder entry of `DEEP_AND_MANY`'s too-deep folder.
pub fn deep_folder() -> String {
    let levels: Vec<String> = (1..=16).map(|i| format!("d{i:02}")).collect();
    format!("outputs/{}", levels.join("/"))
}

/// Entries past the cap: 15 folders d01..d15, the too-deep d16 and `many` count, and 983
/// files of `many` are listed, so 517 are not.
pub const MANY_REASON: &str =
    "the listing stopped in this folder at the 1000-entry cap: 517 more entries are not listed";

#[tokio::test]
async fn files_too_deep_or_past_the_entry_cap_are_named_in_files_and_message() {
    let r = run(py(DEEP_AND_MANY)).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let deep = file(&r, &deep_folder());
    assert_eq!(
        (deep.size_bytes, deep.sha256.as_str(), &deep.content_base64),
        (0, "", &None)
    );
    assert_eq!(
        deep.omitted_reason.as_deref(),
        Some("the folder's contents are not listed: deeper than 16 levels")
    );
    let many = file(&r, "outputs/many");
    assert_eq!(many.omitted_reason.as_deref(), Some(MANY_REASON));
    assert_eq!((many.size_bytes, many.content_base64.is_none()), (0, true));
    assert_eq!(
        r.files.len(),
        983 + 2,
        "983 files of outputs/many and the two folders"
    );
    assert!(
        r.message
            .starts_with("exited with code 0; not everything under outputs/ is listed: ")
            && r.message
                .contains(&format!("{} (the folder's contents", deep_folder()))
            && r.message.contains(&format!("outputs/many ({MANY_REASON})")),
        "{}",
        r.message
    );
}

#[tokio::test]
async fn a_symlinked_outputs_folder_is_not_followed() {
    let r = run(py("import os; os.symlink('/etc', 'outputs')")).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.files.len(), 1, "{:?}", r.files);
    assert!(r.files[0].content_base64.is_none());
}

// ---- usage ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_one_second_busy_loop_reports_a_second_of_cpu() {
    let r = run(py(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass",
    ))
    .await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let cpu = r.usage.cpu_time_ms.unwrap();
    assert!((900..=1200).contains(&cpu), "{cpu} ms");
}

#[tokio::test]
async fn touching_200_mb_reports_at_least_200_mb_peak() {
    let r = run(py(
        "b = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1",
    ))
    .await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let peak = r.usage.peak_memory_kb.unwrap();
    assert!(peak >= 200 * 1024, "{peak} KiB");
}

#[tokio::test]
async fn a_sleeping_program_reports_almost_no_cpu() {
    let r = run(crate::common::request("bash", "sleep 2")).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let cpu = r.usage.cpu_time_ms.unwrap();
    // gVisor counts CPU time in 10 ms ticks and charges the program for its own work on the
    // program's behalf (execve, loading libraries): 30 to 100 ms for this under load, against
    // 2 to 3 ms under runc. Either way the 2 s of sleep must not count.
    let ceiling = if common::gvisor() { 500 } else { 50 };
    assert!(cpu < ceiling, "{cpu} ms");
}

#[tokio::test]
async fn short_timed_out_and_oom_killed_stages_all_report_usage() {
    let short = run(py("print(1)")).await;
    let mut slow = py("while True: pass");
    slow.limits = limits(None, Some(1.0));
    let timed_out = run(slow).await;
    let mut hog = py("b = []\nwhile True: b.append(bytearray(16 * 1024 * 1024))");
    hog.limits = limits(Some(64.0), None);
    let oom = run(hog).await;
    let compiled = run(cpp("int main() { return 0; }")).await;
    assert_eq!(timed_out.status, Status::TimedOut, "{timed_out:?}");
    assert_eq!(oom.status, Status::OutOfMemory, "{oom:?}");
    for r in [&short, &timed_out, &compiled] {
        assert!(r.usage.cpu_time_ms.is_some(), "{r:?}");
        assert!(r.usage.peak_memory_kb.is_some(), "{r:?}");
    }
    let c = compiled.compile.unwrap();
    assert!(
        c.usage.cpu_time_ms.is_some() && c.usage.peak_memory_kb.is_some(),
        "{c:?}"
    );
    if common::gvisor() {
        // gVisor's kernel is in the container's memory cgroup: the OOM kill ends it (and
        // codebox-init) with the program, so nobody is left to measure.
        assert_eq!(oom.usage.cpu_time_ms, None, "{oom:?}");
    } else {
        assert!(oom.usage.cpu_time_ms.is_some(), "{oom:?}");
        assert!(oom.usage.peak_memory_kb.unwrap() >= 48 * 1024, "{oom:?}");
    }
}

// ---- the python image ----------------------------------------------------------------------

#[tokio::test]
async fn every_package_the_python_entry_lists_imports() {
    let python = &common::registry().languages["python"];
    assert!(python.packages.len() >= 7, "{:?}", python.packages);
    let code = python
        .packages
        .iter()
        .map(|p| format!("import {p}\n"))
        .collect::<String>()
        + "print('ok')";
    let mut req = py(&code);
    req.limits = limits(None, Some(60.0));
    let r = run(req).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (Status::Succeeded, "ok\n"),
        "{r:?}"
    );
}
