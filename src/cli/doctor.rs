//! `codebox doctor`: is Docker reachable, are the images there, and does a container really
//! get the sandbox posture (checked from inside one).

use std::io::Write;
use std::time::Duration;

use crate::app::App;
use crate::engine::EngineInfo;
use crate::images;

/// AppArmor on the daemon's host, when that host is this one (a local socket).
#[derive(Debug, Clone, Copy, PartialEq)]
struct LocalAppArmor {
    /// The kernel has AppArmor on (`/sys/module/apparmor/parameters/enabled` is `Y`).
    pub enabled: bool,
    /// `apparmor_parser`, which the daemon needs to load its default profile, is installed.
    pub parser: bool,
}

impl LocalAppArmor {
    /// Read this host's AppArmor state.
    pub fn read() -> LocalAppArmor {
        let enabled = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|v| v.trim_start().starts_with('Y'));
        let in_path = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join("apparmor_parser").exists()))
            .unwrap_or(false);
        let parser = in_path
            || ["/sbin/apparmor_parser", "/usr/sbin/apparmor_parser"]
                .iter()
                .any(|p| std::path::Path::new(p).exists());
        LocalAppArmor { enabled, parser }
    }
}

/// The daemon, named as what it is (Podman answers Docker's API with its own version).
pub fn reachable(info: &EngineInfo) -> String {
    let daemon = if info.podman { "Podman" } else { "Docker" };
    format!(
        "reachable at {} ({daemon} {}, API {})",
        info.address, info.version, info.api_version
    )
}

/// What the doctor says about the daemon's host: cgroup version, rootful or rootless Docker
/// or Podman, AppArmor's state (`local`: read on this host when the daemon is on it).
/// (passed, what it says).
fn host_facts(info: &EngineInfo, local: Option<LocalAppArmor>) -> Vec<(bool, String)> {
    let has = |name: &str| {
        info.security_options
            .iter()
            .any(|o| o.split(',').any(|kv| kv == format!("name={name}")))
    };
    let rootless = has("rootless");
    let daemon = if info.podman { "Podman" } else { "Docker" };
    let mode = if rootless { "rootless" } else { "rootful" };
    let mut facts = vec![(true, format!("{daemon}, {mode}"))];
    facts.push(match (info.cgroup_version, rootless) {
        (Some(2), _) => (
            true,
            "cgroup v2 (unified hierarchy): CPU time and peak memory are measured in the \
             container's own cgroup (memory.peak where the kernel has it, else the largest \
             process's resident set)"
                .to_string(),
        ),
        (Some(1), false) => (true, "cgroup v1".to_string()),
        (Some(1), true) => (
            false,
            format!(
                "cgroup v1 under a rootless {daemon}: the memory, CPU and process limits \
                 cannot be applied; boot the host with the unified cgroup v2 hierarchy \
                 (systemd.unified_cgroup_hierarchy=1) and delegate controllers to the user"
            ),
        ),
        _ => (
            true,
            "cgroup version: not reported by the daemon".to_string(),
        ),
    });
    facts.push(match local {
        Some(LocalAppArmor {
            enabled: true,
            parser: false,
        }) => (
            false,
            format!(
                "AppArmor is on in the kernel but apparmor_parser is not installed, so {daemon} \
                 cannot load its default profile and every run fails (\"AppArmor enabled on \
                 system but the docker-default profile could not be loaded\"): install it \
                 (Debian, Ubuntu: apt-get install apparmor) and restart {daemon}"
            ),
        ),
        Some(LocalAppArmor { enabled: true, .. }) => (
            true,
            format!("AppArmor is on: {daemon} confines each container with its default profile"),
        ),
        Some(LocalAppArmor { enabled: false, .. }) if !has("apparmor") => (
            true,
            "AppArmor is off in this kernel (containers are confined by seccomp, capabilities \
             and namespaces)"
                .to_string(),
        ),
        _ if has("apparmor") => (
            true,
            format!("AppArmor is on: {daemon} confines each container with its default profile"),
        ),
        _ => (
            true,
            format!("AppArmor: {daemon} does not list it (off, or not reported)"),
        ),
    });
    facts
}

/// The posture probe: printed facts, checked one by one. Each works under runc and gVisor
/// alike (gVisor's sysfs has no `/sys/class/net`, so interfaces come from `/proc/net/dev`;
/// its kernel log names it).
/// How long the posture probe may take: it bounds a hang only (on a healthy host it ends in
/// well under a second), and a slow daemon (Podman under emulation beside other work took over
/// 30 s to attach) must not turn it into a failed check.
const PROBE_LIMIT: Duration = Duration::from_secs(120);

/// What Podman loses under gVisor, said by the doctor. Measured with Podman 4.3 and conmon
/// 2.1.6: the memory cgroup kills gVisor's kernel (the kernel log says so), and Podman records
/// no OOM kill (`OOMKilled` false, no `oom` event), so codebox cannot tell it from a kill.
const PODMAN_GVISOR_OOM: &str = "; under gVisor Podman does not report out-of-memory kills: a \
run that exceeds its memory ends as sandbox_error (killed by SIGKILL before codebox-init \
reported), not out_of_memory";

const PROBE: &str = "echo uid=$(id -u); \
echo capeff=$(awk '/^CapEff/{print $2}' /proc/self/status); \
echo nnp=$(awk '/^NoNewPrivs/{print $2}' /proc/self/status); \
if net=$(awk -F: 'NR>2{gsub(/ /,\"\",$1); print $1}' /proc/net/dev); then \
echo net=$(echo ${net:-none}); fi; \
if dmesg 2>/dev/null | grep -q gVisor; then echo kernel=gvisor; else echo kernel=host; fi; \
if touch /codebox-probe 2>/dev/null; then echo rootfs=writable; else echo rootfs=readonly; fi";

/// One fact of the probe's output (`key=value` lines); `?` when it is missing or empty.
fn probe_fact(out: &str, key: &str) -> String {
    match out
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::trim)
    {
        Some(v) if !v.is_empty() => v.to_string(),
        _ => "?".to_string(),
    }
}

/// Each posture fact of the probe's output, for the configured runtime: (passed, what it
/// says).
fn judge_probe(out: &str, runtime: &str) -> Vec<(bool, String)> {
    let uid = probe_fact(out, "uid");
    let cap = probe_fact(out, "capeff");
    let nnp = probe_fact(out, "nnp");
    let net = probe_fact(out, "net");
    let kernel = probe_fact(out, "kernel");
    let rootfs = probe_fact(out, "rootfs");
    let gvisor = kernel == "gvisor";
    vec![
        (
            uid != "0" && uid.parse::<u32>().is_ok(),
            format!("runs as uid {uid}, not root"),
        ),
        (
            cap != "?" && cap.chars().all(|c| c == '0'),
            format!("no capabilities (CapEff {cap})"),
        ),
        if gvisor && nnp == "?" {
            (
                true,
                "no new privileges: set in the container's spec (gVisor's /proc does not show \
                 NoNewPrivs)"
                    .to_string(),
            )
        } else {
            (nnp == "1", format!("no new privileges (NoNewPrivs {nnp})"))
        },
        if net == "none" {
            // gVisor under Podman's network "none" sees no interface up, so it makes none.
            (true, "network interfaces: none, not even lo".to_string())
        } else {
            (
                net == "lo",
                format!("network interfaces: {net} (only lo allowed)"),
            )
        },
        match runtime {
            "runsc" => (
                gvisor,
                format!("kernel: {kernel} (sandbox.runtime runsc must give gVisor's)"),
            ),
            "runc" => (
                kernel == "host",
                format!("kernel: {kernel} (sandbox.runtime runc shares the host's)"),
            ),
            other => (
                kernel != "?",
                format!("kernel: {kernel} (under sandbox.runtime {other})"),
            ),
        },
        (rootfs == "readonly", format!("root filesystem is {rootfs}")),
    ]
}

pub async fn doctor(app: &App, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let (mut ok, mut bad) = (0, 0);
    let mut check = |out: &mut (dyn Write + Send), pass: bool, what: String| {
        if pass {
            ok += 1
        } else {
            bad += 1
        }
        writeln!(out, "  {} {what}", if pass { "ok  " } else { "FAIL" })
    };
    let why = super::registry_file(&app.config)
        .ok()
        .filter(|r| r.path == app.registry.path)
        .map(|r| format!("; {}", r.why))
        .unwrap_or_default();
    writeln!(
        out,
        "Language registry: {} ({} languages{why})",
        app.registry.path.display(),
        app.registry.languages.len()
    )?;
    writeln!(out, "Docker:")?;
    let info = match app.engine.ping().await {
        Ok(info) => info,
        Err(e) => {
            check(out, false, e.to_string())?;
            writeln!(out, "{ok} passed, {bad} failed")?;
            return Ok(1);
        }
    };
    check(out, true, reachable(&info))?;
    writeln!(out, "Host:")?;
    let local = info.address.starts_with("unix://") || info.address.starts_with('/');
    for (pass, what) in host_facts(&info, local.then(LocalAppArmor::read)) {
        check(out, pass, what)?;
    }
    let runtime = &app.config.sandbox.runtime;
    check(
        out,
        info.runtimes.iter().any(|r| r == runtime),
        if info.runtimes.iter().any(|r| r == runtime) {
            format!(
                "runtime `{runtime}` (sandbox.runtime) is registered; the daemon offers {}",
                info.runtimes.join(", ")
            )
        } else {
            format!(
                "runtime `{runtime}` (sandbox.runtime) is not registered with the daemon, which offers {}: register it in the daemon's daemon.json (for gVisor: scripts/ensure-docker.sh --with-runsc) or set sandbox.runtime to one of those",
                info.runtimes.join(", ")
            )
        },
    )?;
    let problems = app.runtime_problems(&info);
    if info.podman || !problems.is_empty() {
        check(
            out,
            problems.is_empty(),
            if problems.is_empty() {
                format!(
                    "Podman runs every container under its default runtime `{}` (its API \
                     ignores the one a container names){}",
                    info.default_runtime,
                    if info.default_runtime == "runsc" {
                        PODMAN_GVISOR_OOM
                    } else {
                        ""
                    }
                )
            } else {
                problems.join("; ")
            },
        )?;
    }
    writeln!(out, "Images:")?;
    let list = images::status(app.engine.as_ref(), &app.registry).await?;
    for i in &list {
        if i.present {
            let v: Vec<&str> = i.versions.values().map(String::as_str).collect();
            let versions = if v.is_empty() {
                String::new()
            } else {
                format!(" ({})", v.join("; "))
            };
            check(out, true, format!("{} present{versions}", i.tag))?;
        } else {
            check(
                out,
                false,
                format!("{} missing: run `codebox images build {}`", i.tag, i.name),
            )?;
        }
    }
    let Some(probe_image) = list.iter().find(|i| i.present) else {
        writeln!(out, "Posture probe: skipped, no image is present")?;
        writeln!(out, "{ok} passed, {} failed", bad + 1)?;
        return Ok(1);
    };
    writeln!(
        out,
        "Posture probe (a locked-down container from {}):",
        probe_image.tag
    )?;
    match app
        .executor
        .probe(
            &probe_image.tag,
            vec!["sh".into(), "-c".into(), PROBE.into()],
            PROBE_LIMIT,
        )
        .await
    {
        Err(e) => check(out, false, format!("the probe container failed: {e}"))?,
        Ok(exec) => {
            for (pass, what) in judge_probe(&exec.stdout, &app.config.sandbox.runtime) {
                check(out, pass, what)?;
            }
        }
    }
    writeln!(out, "{ok} passed, {bad} failed")?;
    super::flush(out)?;
    Ok(if bad == 0 { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::{host_facts, judge_probe, reachable, LocalAppArmor};
    use crate::engine::EngineInfo;

    fn info(cgroup: Option<u8>, options: &[&str]) -> EngineInfo {
        EngineInfo {
            address: "unix:///var/run/docker.sock".into(),
            version: "20.10".into(),
            api_version: "1.41".into(),
            runtimes: vec!["runc".into()],
            cgroup_version: cgroup,
            security_options: options.iter().map(|o| o.to_string()).collect(),
            podman: false,
            ..Default::default()
        }
    }

    #[test]
    fn the_doctor_names_the_cgroup_version_and_apparmors_state() {
        let v2 = info(
            Some(2),
            &[
                "name=apparmor",
                "name=seccomp,profile=default",
                "name=cgroupns",
            ],
        );
        let on = LocalAppArmor {
            enabled: true,
            parser: true,
        };
        let facts = host_facts(&v2, Some(on));
        assert!(facts.iter().all(|(pass, _)| *pass), "{facts:?}");
        let text: Vec<&str> = facts.iter().map(|(_, s)| s.as_str()).collect();
        assert!(text.iter().any(|s| s.starts_with("cgroup v2")), "{text:?}");
        assert!(
            text.iter().any(|s| s.starts_with("AppArmor is on")),
            "{text:?}"
        );
        assert!(text.contains(&"Docker, rootful"), "{text:?}");
        let v1 = host_facts(
            &info(Some(1), &[]),
            Some(LocalAppArmor {
                enabled: false,
                parser: false,
            }),
        );
        assert!(v1.iter().all(|(pass, _)| *pass), "{v1:?}");
        assert!(v1.iter().any(|(_, s)| s == "cgroup v1"), "{v1:?}");
        assert!(
            v1.iter().any(|(_, s)| s.starts_with("AppArmor is off")),
            "{v1:?}"
        );
        // Each fact is one line of prose: no run of spaces left by a wrapped literal.
        for (_, s) in facts.iter().chain(&v1) {
            assert!(!s.contains("  "), "{s:?}");
        }
    }

    #[test]
    fn the_doctor_names_podman_as_podman() {
        let mut podman = info(Some(2), &["name=seccomp"]);
        podman.podman = true;
        podman.version = "4.3.1".into();
        assert!(
            reachable(&podman).contains("(Podman 4.3.1,"),
            "{}",
            reachable(&podman)
        );
        let facts = host_facts(&podman, None);
        assert!(facts.iter().any(|(_, s)| s.contains("Podman")), "{facts:?}");
        podman.podman = false;
        assert!(reachable(&podman).contains("(Docker 4.3.1,"));
    }

    #[test]
    fn the_doctor_says_what_to_install_when_apparmor_is_on_but_its_parser_is_missing() {
        let facts = host_facts(
            &info(Some(2), &["name=apparmor"]),
            Some(LocalAppArmor {
                enabled: true,
                parser: false,
            }),
        );
        let failed: Vec<&String> = facts.iter().filter(|(p, _)| !p).map(|(_, s)| s).collect();
        assert_eq!(failed.len(), 1, "{facts:?}");
        assert!(failed[0].contains("apt-get install apparmor"), "{failed:?}");
    }

    #[test]
    fn a_rootless_daemon_on_cgroup_v1_fails_the_doctor_because_limits_cannot_apply() {
        let facts = host_facts(&info(Some(1), &["name=rootless"]), None);
        assert!(
            facts
                .iter()
                .any(|(p, s)| !p && s.contains("cannot be applied")),
            "{facts:?}"
        );
        let facts = host_facts(&info(Some(2), &["name=rootless"]), None);
        assert!(facts.iter().all(|(p, _)| *p), "{facts:?}");
        assert!(
            facts.iter().any(|(_, s)| s == "Docker, rootless"),
            "{facts:?}"
        );
    }

    #[test]
    fn probe_facts_pass_only_for_the_locked_down_answers() {
        let good =
            "uid=10007\ncapeff=0000000000000000\nnnp=1\nnet=lo\nkernel=host\nrootfs=readonly\n";
        assert!(judge_probe(good, "runc").iter().all(|(pass, _)| *pass));
        // No interface at all (gVisor under Podman's network "none") is stricter than lo;
        // an unreadable /proc/net/dev prints no line, and fails.
        let none = good.replace("net=lo", "net=none");
        assert!(judge_probe(&none, "runc").iter().all(|(pass, _)| *pass));
        for bad in [
            good.replace("uid=10007", "uid=0"),
            good.replace("capeff=0000000000000000", "capeff=00000000a80425fb"),
            good.replace("nnp=1", "nnp=0"),
            good.replace("nnp=1", "nnp="),
            good.replace("net=lo", "net=eth0 lo"),
            good.replace("net=lo\n", ""),
            good.replace("kernel=host", "kernel=gvisor"),
            good.replace("rootfs=readonly", "rootfs=writable"),
            good.replace("uid=10007\n", ""),
        ] {
            let facts = judge_probe(&bad, "runc");
            assert_eq!(
                facts.iter().filter(|(pass, _)| !pass).count(),
                1,
                "{bad:?}: {facts:?}"
            );
        }
    }

    #[test]
    fn under_gvisor_the_kernel_must_be_gvisors_and_a_missing_no_new_privs_line_is_expected() {
        let good =
            "uid=10007\ncapeff=0000000000000000\nnnp=\nnet=lo\nkernel=gvisor\nrootfs=readonly\n";
        assert!(judge_probe(good, "runsc").iter().all(|(pass, _)| *pass));
        let host = good.replace("kernel=gvisor", "kernel=host");
        let facts = judge_probe(&host, "runsc");
        // The host's kernel under runsc fails twice: the kernel, and NoNewPrivs now missing.
        assert_eq!(
            facts.iter().filter(|(pass, _)| !pass).count(),
            2,
            "{facts:?}"
        );
        let facts = judge_probe(&good.replace("nnp=", "nnp=0"), "runsc");
        assert_eq!(
            facts.iter().filter(|(pass, _)| !pass).count(),
            1,
            "{facts:?}"
        );
    }
}
