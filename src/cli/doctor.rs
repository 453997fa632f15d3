//! `codebox doctor`: is Docker reachable, are the images there, and does a container really
//! get the sandbox posture (checked from inside one).

use std::io::Write;
use std::time::Duration;

use crate::app::App;
use crate::images;

/// The posture probe: printed facts, checked one by one.
const PROBE: &str = "echo uid=$(id -u); \
echo capeff=$(awk '/^CapEff/{print $2}' /proc/self/status); \
echo nnp=$(awk '/^NoNewPrivs/{print $2}' /proc/self/status); \
echo net=$(ls /sys/class/net | tr '\\n' ' '); \
if touch /codebox-probe 2>/dev/null; then echo rootfs=writable; else echo rootfs=readonly; fi";

/// One fact of the probe's output (`key=value` lines); `?` when it is missing.
fn probe_fact(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or("?")
        .trim()
        .to_string()
}

/// Each posture fact of the probe's output: (passed, what it says).
pub fn judge_probe(out: &str) -> Vec<(bool, String)> {
    let uid = probe_fact(out, "uid");
    let cap = probe_fact(out, "capeff");
    let nnp = probe_fact(out, "nnp");
    let net = probe_fact(out, "net");
    let rootfs = probe_fact(out, "rootfs");
    vec![
        (
            uid != "0" && uid.parse::<u32>().is_ok(),
            format!("runs as uid {uid}, not root"),
        ),
        (
            !cap.is_empty() && cap != "?" && cap.chars().all(|c| c == '0'),
            format!("no capabilities (CapEff {cap})"),
        ),
        (nnp == "1", format!("no new privileges (NoNewPrivs {nnp})")),
        (
            net == "lo",
            format!("network interfaces: {net} (only lo allowed)"),
        ),
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
    writeln!(out, "Docker:")?;
    let info = match app.engine.ping().await {
        Ok(info) => info,
        Err(e) => {
            check(out, false, e.to_string())?;
            writeln!(out, "{ok} passed, {bad} failed")?;
            return Ok(1);
        }
    };
    check(
        out,
        true,
        format!(
            "reachable at {} (Docker {}, API {})",
            info.address, info.version, info.api_version
        ),
    )?;
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
    writeln!(out, "Images:")?;
    let list = images::status(app.engine.as_ref(), &app.registry).await?;
    for i in &list {
        if i.present {
            let v: Vec<&str> = i.versions.values().map(String::as_str).collect();
            check(out, true, format!("{} present ({})", i.tag, v.join("; ")))?;
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
            Duration::from_secs(30),
        )
        .await
    {
        Err(e) => check(out, false, format!("the probe container failed: {e}"))?,
        Ok(exec) => {
            for (pass, what) in judge_probe(&exec.stdout) {
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
    use super::judge_probe;

    #[test]
    fn probe_facts_pass_only_for_the_locked_down_answers() {
        let good = "uid=10007\ncapeff=0000000000000000\nnnp=1\nnet=lo\nrootfs=readonly\n";
        assert!(judge_probe(good).iter().all(|(pass, _)| *pass));
        for bad in [
            good.replace("uid=10007", "uid=0"),
            good.replace("capeff=0000000000000000", "capeff=00000000a80425fb"),
            good.replace("nnp=1", "nnp=0"),
            good.replace("net=lo", "net=eth0 lo"),
            good.replace("rootfs=readonly", "rootfs=writable"),
            good.replace("uid=10007\n", ""),
        ] {
            let facts = judge_probe(&bad);
            assert_eq!(
                facts.iter().filter(|(pass, _)| !pass).count(),
                1,
                "{bad:?}: {facts:?}"
            );
        }
    }
}
