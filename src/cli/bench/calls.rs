//! `codebox bench --calls`: what each Engine API call, and each part of the container spec,
//! costs the host in CPU. Containers here run nothing but `codebox-init` and a `true`
//! payload; they are made from codebox's locked-down spec, with one part left out at a time
//! to price it (a measurement, never a run: no request's code goes near them).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::host::{self, Cost, Meter};
use super::ms;
use crate::app::App;
use crate::engine::posture::{self, Limits, Plan};
use crate::engine::protocol::{Collect, DecodeLimits, Payload};
use crate::engine::uids::UidPool;
use crate::engine::{ContainerEngine, ContainerSpec, Signal};
use crate::executor::stage::{run_stage, Bound, StageRequest};
use crate::registry::Language;

/// A change to codebox's spec, to price what it leaves out.
struct Variant {
    name: &'static str,
    change: fn(&mut ContainerSpec),
}

const VARIANTS: [Variant; 6] = [
    Variant {
        name: "codebox's spec",
        change: |_| {},
    },
    Variant {
        name: "without its labels",
        change: |s| s.labels.clear(),
    },
    Variant {
        name: "without the /tmp tmpfs",
        change: |s| {
            s.tmpfs.remove(posture::SCRATCH);
        },
    },
    Variant {
        name: "without the /workspace tmpfs",
        change: |s| {
            s.tmpfs.remove(posture::WORKSPACE);
        },
    },
    Variant {
        name: "without the ulimits",
        change: |s| s.ulimits.clear(),
    },
    Variant {
        name: "with Docker's default seccomp profile",
        change: |s| s.security_opt.retain(|o| !o.starts_with("seccomp")),
    },
];

struct Pricing<'a> {
    engine: &'a Arc<dyn ContainerEngine>,
    meter: Meter,
    out: &'a mut (dyn Write + Send),
    n: usize,
}

impl Pricing<'_> {
    fn row(&mut self, what: &str, c: &Cost, per: usize) -> anyhow::Result<()> {
        let p = |d: Duration| ms(d) / per.max(1) as f64;
        writeln!(
            self.out,
            "  {:<40} {:>7.2} {:>8.2} {:>10.2} {:>10.2} {:>10} {:>7.2}",
            what,
            p(c.host),
            p(c.dockerd),
            p(c.containerd),
            p(c.shims),
            c.containers
                .map_or_else(|| "n/a".into(), |d| format!("{:.2}", p(d))),
            p(c.kernel),
        )?;
        super::super::flush(self.out)
    }

    /// Create, start, deliver a `true` payload, wait, inspect and remove, `n` times.
    async fn lifecycle(&mut self, spec: &ContainerSpec) -> anyhow::Result<Cost> {
        let payload = Payload {
            run: Some(vec!["true".into()]),
            timeout: Duration::from_secs(10),
            output_limit: 1024,
            collect: Some(Collect::None),
            ..Default::default()
        };
        let request = StageRequest {
            payload: payload.encode(),
            backstop: Duration::from_secs(20),
            run_backstop: None,
            limits: DecodeLimits {
                output: 1024,
                content: 0,
                entries: 0,
            },
            live: None,
        };
        let never = CancellationToken::new();
        let a = self.meter.snapshot();
        for _ in 0..self.n {
            let mut spec = spec.clone();
            spec.name = format!("codebox-bench-{}", uuid::Uuid::new_v4().simple());
            self.engine.create_container(&spec).await?;
            let bound = Bound::new(
                &never,
                tokio::time::Instant::now() + Duration::from_secs(30),
            );
            let ran = run_stage(
                self.engine.as_ref(),
                &spec.name,
                true,
                request.clone(),
                bound,
            )
            .await;
            self.engine.remove_container(&spec.name).await?;
            let ran = ran.map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::ensure!(ran.decoded.complete, "codebox-init did not finish: {ran:?}");
        }
        Ok(self.meter.snapshot().since(&a))
    }

    /// `call` ten times `n` on a container that is there (a call costs little: many of
    /// them make a figure out of clock ticks).
    async fn each<F, Fut>(&mut self, what: &str, call: F) -> anyhow::Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let times = self.n * 10;
        let a = self.meter.snapshot();
        for _ in 0..times {
            call().await?;
        }
        let c = self.meter.snapshot().since(&a);
        self.row(what, &c, times)
    }
}

pub async fn calls(
    app: &App,
    lang: &Language,
    n: usize,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let config = &app.config;
    let uids = UidPool::new(&config.data_dir);
    let lease = uids.lease();
    let limits = Limits {
        memory_mb: config.limits.default_memory_mb,
        cpus: config.limits.default_cpus,
    };
    let plan = Plan {
        name: String::new(),
        image: lang.image.tag.clone(),
        uid: lease.uid,
        limits,
        workspace_mb: crate::executor::pool::run_workspace_mb(config, limits.memory_mb),
        labels: crate::executor::labels("bench", app.executor.instance(), Duration::from_secs(600)),
    };
    let base = posture::locked_down(&plan, &config.sandbox);
    posture::check(&base, &config.sandbox).context("codebox's own spec")?;
    let mut p = Pricing {
        engine: &app.engine,
        meter: Meter::default(),
        out,
        n,
    };
    writeln!(
        p.out,
        "The host's CPU per container ({n} each) or call ({} each), ms, image {} (load {})",
        n * 10,
        lang.image.tag,
        host::load()
    )?;
    writeln!(
        p.out,
        "  {:<40} {:>7} {:>8} {:>10} {:>10} {:>10} {:>7}",
        "", "host", "dockerd", "containerd", "shims+runc", "containers", "kernel"
    )?;
    for v in &VARIANTS {
        let mut spec = base.clone();
        (v.change)(&mut spec);
        let c = p.lifecycle(&spec).await?;
        p.row(&format!("a container, {}", v.name), &c, n)?;
    }
    // Single calls, on one container that waits for its payload.
    let mut spec = base.clone();
    spec.name = format!("codebox-bench-{}", uuid::Uuid::new_v4().simple());
    let engine = app.engine.clone();
    engine.create_container(&spec).await?;
    let name = spec.name.clone();
    let result = async {
        engine.start_container(&name).await?;
        p.each("inspect_container", || async {
            engine.inspect_container(&name).await?;
            Ok(())
        })
        .await?;
        p.each("inspect_image", || async {
            engine.inspect_image(&spec.image).await?;
            Ok(())
        })
        .await?;
        p.each("update_container (the same limits)", || async {
            engine.update_container(&name, limits.resources()).await?;
            Ok(())
        })
        .await?;
        p.each("attach_container (then dropped)", || async {
            drop(engine.attach_container(&name).await?);
            Ok(())
        })
        .await?;
        engine.kill_container(&name, Signal::Kill).await?;
        engine.wait_container(&name).await?;
        p.each("wait_container (exited)", || async {
            engine.wait_container(&name).await?;
            Ok(())
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    engine.remove_container(&name).await?;
    result?;
    drop(lease);
    Ok(0)
}
