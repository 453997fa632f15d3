//! `codebox bench --packages REQUIREMENT MODULE`: what packages on request cost a run. Three
//! kinds of run of the same program shape, interleaved, `n` of each: the requirement
//! installed cold (the cache emptied first), the same with the cache hit, and an import of
//! a module the image ships (the floor a cache hit aims at). Medians and ratios; a cold
//! install split into the install container (download and install) and the copy into the
//! prefix's volume.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::bail;

use crate::app::App;
use crate::contract::RunRequest;
use crate::report::Status;

pub(crate) async fn bench(
    app: &App,
    requirement: &str,
    module: &str,
    n: usize,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    if app.config.packages.python.index_url.is_none() {
        bail!("--packages needs an index: --set packages.python.index_url=URL");
    }
    app.runs.start_pool();
    let packages = app.executor.packages().clone();
    let run = |code: String, with: bool| {
        let req = RunRequest {
            language: "python".into(),
            code,
            packages: with.then(|| vec![requirement.to_string()]),
            ..Default::default()
        };
        async move {
            let began = Instant::now();
            let accepted = app.runs.submit(req)?;
            let r = app.runs.wait_end(&accepted.run_id).await?;
            if r.status != Status::Succeeded {
                bail!("a run ended {}: {} {}", r.status, r.message, r.stderr);
            }
            anyhow::Ok((began.elapsed().as_secs_f64() * 1000.0, r))
        }
    };
    let with_module = format!("import {module}\nprint('ok')\n");
    let shipped = "import json\nprint('ok')\n".to_string();
    // One of each first, not counted: images, pool and network warm.
    run(shipped.clone(), false).await?;
    run(with_module.clone(), true).await?;
    let (mut cold, mut hit, mut floor, mut split) = (vec![], vec![], vec![], vec![]);
    for _ in 0..n {
        // Cold: the pool lets go of the prefix (and its ready containers) first.
        app.executor.pool().forget_packages();
        app.executor
            .cleanup()
            .drain(std::time::Duration::from_secs(10))
            .await;
        packages.evict_all().await;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let c = packages.counters();
        let before = (
            c.install_container_ms.load(Ordering::Relaxed),
            c.copy_ms.load(Ordering::Relaxed),
        );
        let (ms, r) = run(with_module.clone(), true).await?;
        let install_ms = r.packages.as_ref().map_or(0, |p| p.install_ms);
        split.push((
            (c.install_container_ms.load(Ordering::Relaxed) - before.0) as f64,
            (c.copy_ms.load(Ordering::Relaxed) - before.1) as f64,
            install_ms as f64,
        ));
        cold.push(ms);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let (ms, r) = run(with_module.clone(), true).await?;
        if !r.packages.is_some_and(|p| p.cached) {
            bail!("the second run was not a cache hit");
        }
        hit.push(ms);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        floor.push(run(shipped.clone(), false).await?.0);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (c, h, f) = (median(&mut cold), median(&mut hit), median(&mut floor));
    let mut container: Vec<f64> = split.iter().map(|s| s.0).collect();
    let mut copy: Vec<f64> = split.iter().map(|s| s.1).collect();
    let mut install: Vec<f64> = split.iter().map(|s| s.2).collect();
    let (sc, sp, si) = (
        median(&mut container),
        median(&mut copy),
        median(&mut install),
    );
    writeln!(
        out,
        "python, {requirement} (import {module}), n = {n}, runtime {}:",
        app.config.sandbox.runtime
    )?;
    writeln!(out, "  image's module (import json)  median {f:.0} ms")?;
    writeln!(
        out,
        "  cache hit                     median {h:.0} ms  ({:.2}x the image's module; +{:.0} ms)",
        h / f,
        h - f
    )?;
    writeln!(
        out,
        "  cold install                  median {c:.0} ms  ({:.2}x the cache hit)",
        c / h
    )?;
    writeln!(
        out,
        "  cold install_ms median {si:.0}: install container (fetch + install) {sc:.0} ms, copy into the volume {sp:.0} ms, the rest (proxy, volume, lock) {:.0} ms",
        (si - sc - sp).max(0.0)
    )?;
    let pc = app.executor.pool().counters();
    writeln!(
        out,
        "  pool: {} hits, {} misses over all runs",
        pc.hits.load(Ordering::Relaxed) + pc.updated_hits.load(Ordering::Relaxed),
        pc.misses.load(Ordering::Relaxed)
    )?;
    app.executor.pool().forget_packages();
    app.executor
        .cleanup()
        .drain(std::time::Duration::from_secs(10))
        .await;
    packages.evict_all().await;
    Ok(0)
}
