//! The workloads of `codebox bench`, each run both ways (codebox, `docker run --rm`) and
//! printed side by side: latency, runs/s, and the host's CPU per run by process.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt;

use super::docker::Docker;
use super::host::{self, Cost, Meter};
use super::{codebox_run, ms, phases, settle, since_ms, spread, timings};
use crate::app::App;
use crate::registry::Language;
use crate::report::Status;

/// How runs are sent.
#[derive(Debug, Clone, Copy)]
pub(super) enum Sending {
    /// One client, each run sent as soon as the last one ended.
    BackToBack,
    /// All the programs, K at a time.
    Pipeline(usize),
    /// The programs (K of them) released at once, `rounds` times, `pause` apart.
    Burst {
        k: usize,
        rounds: usize,
        pause: Duration,
    },
    /// K clients sending the first program back to back for `seconds`.
    Clients { k: usize, seconds: f64 },
}

impl Sending {
    fn describe(&self, n: usize) -> String {
        match self {
            Sending::BackToBack => format!("{n} runs back to back from one client"),
            Sending::Pipeline(k) => format!("{n} runs, {k} at once"),
            Sending::Burst { k, rounds, pause } => format!(
                "bursts of {k} at once, {rounds} rounds each way, {} ms apart",
                pause.as_millis()
            ),
            Sending::Clients { k, seconds } => {
                format!("{k} clients back to back, {seconds} s each way")
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    Codebox,
    Docker,
}

/// What one way did in a comparison.
#[derive(Default)]
struct Side {
    latencies: Vec<f64>,
    /// Runs that ended as expected.
    ok: usize,
    runs: usize,
    /// Time spent with runs in flight (pauses left out).
    busy: Duration,
    cost: Cost,
    /// Runs that found a ready container (codebox).
    ready: u64,
    first_error: Option<String>,
}

impl Side {
    fn record(&mut self, result: anyhow::Result<(bool, f64)>, expected: bool) {
        self.runs += 1;
        match result {
            Ok((passed, latency)) => {
                self.latencies.push(latency);
                if passed == expected {
                    self.ok += 1;
                }
            }
            Err(e) => {
                self.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }

    fn per_run(&self, d: Duration) -> f64 {
        ms(d) / self.runs.max(1) as f64
    }

    fn rate(&self) -> f64 {
        self.runs as f64 / self.busy.as_secs_f64().max(1e-9)
    }
}

/// What the runs need, shared by the tasks that send them.
struct Ctx<'a> {
    app: &'a App,
    docker: Arc<Docker>,
}

impl Ctx<'_> {
    /// One run; whether it succeeded (exit 0) and its latency in ms.
    async fn timed(
        &self,
        way: Way,
        lang: &Language,
        code: &str,
        nonce: Option<String>,
    ) -> anyhow::Result<(bool, f64)> {
        let t = Instant::now();
        let ok = match way {
            Way::Codebox => {
                codebox_run(self.app, &lang.id, code, nonce).await?.status == Status::Succeeded
            }
            Way::Docker => self.docker.run(lang, code).await?,
        };
        Ok((ok, since_ms(t)))
    }
}

/// Runs comparisons and prints them.
pub(crate) struct Bench<'a> {
    ctx: Ctx<'a>,
    pool: bool,
    meter: Meter,
    out: &'a mut (dyn Write + Send),
}

impl<'a> Bench<'a> {
    pub fn new(
        app: &'a App,
        docker: Arc<Docker>,
        pool: bool,
        out: &'a mut (dyn Write + Send),
    ) -> Bench<'a> {
        Bench {
            ctx: Ctx { app, docker },
            pool,
            meter: Meter::default(),
            out,
        }
    }

    pub fn note(&mut self, text: &str) -> anyhow::Result<()> {
        writeln!(self.out, "{text}")?;
        super::super::flush(self.out)
    }

    fn ready_runs(&self) -> u64 {
        let p = self.ctx.app.runs.stats().pool;
        p.hits + p.updated_hits
    }

    /// The host's CPU per second while nothing of ours runs.
    async fn idle(&mut self) -> Cost {
        host::background(&mut self.meter, Duration::from_secs(2)).await
    }

    /// Latency of `lang`'s hello, `n` runs each way, alternating, each codebox run followed
    /// by a pause until the pool is full again; compiled languages a second time with the
    /// compile cache answering. Returns codebox's median.
    pub(super) async fn latency_with_cache(
        &mut self,
        lang: &Language,
        n: usize,
    ) -> anyhow::Result<f64> {
        let median = self.latency_n(lang, n, lang.is_compiled()).await?;
        if lang.is_compiled() {
            self.latency_n(lang, n, false).await?;
        }
        Ok(median)
    }

    /// [`Bench::latency_with_cache`] with 20 runs, no cache case.
    pub(crate) async fn latency(&mut self, lang: &Language) -> anyhow::Result<f64> {
        self.latency_n(lang, 20, lang.is_compiled()).await
    }

    async fn latency_n(&mut self, lang: &Language, n: usize, fresh: bool) -> anyhow::Result<f64> {
        let code = super::hello(lang)?;
        let label = if lang.is_compiled() && !fresh {
            format!("{} (cache hit)", lang.id)
        } else {
            lang.id.clone()
        };
        // Each codebox run carries a different extra file when `fresh`, so the compile cache
        // cannot answer.
        let nonce = |i: usize| fresh.then(|| format!("{i}-{}", uuid::Uuid::new_v4()));
        let idle = self.idle().await;
        // One of each first, unmeasured: image caches, the pool's first fill, the cache.
        settle(self.ctx.app, lang, self.pool).await;
        self.ctx.timed(Way::Codebox, lang, &code, nonce(0)).await?;
        self.ctx.timed(Way::Docker, lang, &code, None).await?;
        settle(self.ctx.app, lang, self.pool).await;
        let (mut ours, mut theirs) = (Side::default(), Side::default());
        let before = timings(self.ctx.app);
        let ready0 = self.ready_runs();
        for i in 0..n {
            let a = self.meter.snapshot();
            let t = Instant::now();
            let r = codebox_run(self.ctx.app, &lang.id, &code, nonce(i + 1)).await?;
            ours.latencies.push(since_ms(t));
            settle(self.ctx.app, lang, self.pool).await;
            ours.cost.add(&self.meter.snapshot().since(&a));
            ours.runs += 1;
            if r.status != Status::Succeeded {
                bail!(
                    "codebox: {} hello ended {}: {}",
                    lang.id,
                    r.status,
                    r.message
                );
            }
            if lang.is_compiled() && r.compile.as_ref().is_some_and(|c| c.cached) == fresh {
                bail!("codebox: {label}: the compile cache did not behave as measured");
            }
            ours.ok += 1;
            let a = self.meter.snapshot();
            let (ok, latency) = self.ctx.timed(Way::Docker, lang, &code, None).await?;
            theirs.cost.add(&self.meter.snapshot().since(&a));
            theirs.runs += 1;
            if !ok {
                bail!("docker run: {} hello failed", lang.id);
            }
            theirs.ok += 1;
            theirs.latencies.push(latency);
        }
        ours.ready = self.ready_runs() - ready0;
        let breakdown = phases(&before, &timings(self.ctx.app));
        let title = format!(
            "{label}: one run at a time, {n} each way alternating, codebox with a pause after each run"
        );
        self.print(&title, &ours, &theirs, &idle, false)?;
        writeln!(self.out, "  codebox phases (mean ms): {breakdown}")?;
        super::super::flush(self.out)?;
        Ok(spread(ours.latencies).1)
    }

    /// `programs` (name, code, expected to pass) both ways in `sending`, A B B A; returns
    /// codebox's median latency.
    pub async fn compare(
        &mut self,
        lang: &Language,
        sending: Sending,
        programs: &[(String, String, bool)],
    ) -> anyhow::Result<f64> {
        let idle = self.idle().await;
        settle(self.ctx.app, lang, self.pool).await;
        // One of each first, unmeasured.
        self.ctx
            .timed(Way::Codebox, lang, &programs[0].1, None)
            .await?;
        self.ctx
            .timed(Way::Docker, lang, &programs[0].1, None)
            .await?;
        settle(self.ctx.app, lang, self.pool).await;
        let (mut ours, mut theirs) = (Side::default(), Side::default());
        for (half, order) in [
            (0, [Way::Codebox, Way::Docker]),
            (1, [Way::Docker, Way::Codebox]),
        ] {
            for way in order {
                let side = if way == Way::Codebox {
                    &mut ours
                } else {
                    &mut theirs
                };
                let ready0 = self.ready_runs();
                let a = self.meter.snapshot();
                self.block(way, lang, sending, programs, half, side).await;
                if way == Way::Codebox {
                    settle(self.ctx.app, lang, self.pool).await;
                    side.ready += self.ready_runs() - ready0;
                }
                side.cost.add(&self.meter.snapshot().since(&a));
            }
        }
        let title = format!("{}: {}", lang.id, sending.describe(programs.len()));
        let rated = !matches!(sending, Sending::BackToBack);
        self.print(&title, &ours, &theirs, &idle, rated)?;
        Ok(spread(ours.latencies).1)
    }

    /// Half `half` (0 or 1) of a sending's runs, one way.
    async fn block(
        &self,
        way: Way,
        lang: &Language,
        sending: Sending,
        programs: &[(String, String, bool)],
        half: usize,
        side: &mut Side,
    ) {
        let ctx = &self.ctx;
        let halves = |n: usize| if half == 0 { 0..n / 2 } else { n / 2..n };
        let run = |p: &(String, String, bool)| {
            let (code, expected) = (p.1.clone(), p.2);
            async move { (ctx.timed(way, lang, &code, None).await, expected) }
        };
        match sending {
            Sending::BackToBack | Sending::Pipeline(_) => {
                let k = match sending {
                    Sending::Pipeline(k) => k.max(1),
                    _ => 1,
                };
                let t = Instant::now();
                let results: Vec<_> = futures_util::stream::iter(&programs[halves(programs.len())])
                    .map(run)
                    .buffer_unordered(k)
                    .collect()
                    .await;
                side.busy += t.elapsed();
                for (r, expected) in results {
                    side.record(r, expected);
                }
            }
            Sending::Burst { rounds, pause, .. } => {
                for _ in halves(rounds) {
                    let t = Instant::now();
                    let results = futures_util::future::join_all(programs.iter().map(run)).await;
                    side.busy += t.elapsed();
                    for (r, expected) in results {
                        side.record(r, expected);
                    }
                    tokio::time::sleep(pause).await;
                }
            }
            Sending::Clients { k, seconds } => {
                let t = Instant::now();
                let until = t + Duration::from_secs_f64(seconds / 2.0);
                let clients = (0..k).map(|_| async {
                    let mut done = Vec::new();
                    while Instant::now() < until {
                        done.push(run(&programs[0]).await);
                    }
                    done
                });
                let results = futures_util::future::join_all(clients).await;
                side.busy += t.elapsed();
                for (r, expected) in results.into_iter().flatten() {
                    side.record(r, expected);
                }
            }
        }
    }

    fn print(
        &mut self,
        title: &str,
        ours: &Side,
        theirs: &Side,
        idle: &Cost,
        rated: bool,
    ) -> anyhow::Result<()> {
        let idle_per_s = ms(idle.host) / idle.wall.as_secs_f64().max(1e-9);
        writeln!(
            self.out,
            "\n{title}\n  load {}; idle host {:.0} ms CPU per s",
            host::load(),
            idle_per_s
        )?;
        writeln!(
            self.out,
            "  {:<11} {:>7} {:>7} {:>7} | CPU ms per run: {:>6} {:>9} {:>8} {:>7} {:>7} {:>10} {:>10} {:>10} {:>6} {:>6}",
            "",
            "runs/s",
            "median",
            "p95",
            "host",
            "host-idle",
            "codebox",
            "cli",
            "dockerd",
            "containerd",
            "shims+runc",
            "containers",
            "kernel",
            "rest"
        )?;
        let row = |name: &str, s: &Side| {
            let (_, med, p95) = spread(s.latencies.clone());
            let c = &s.cost;
            let host_idle = ms(c.host) - idle_per_s * c.wall.as_secs_f64();
            format!(
                "  {:<11} {:>7} {:>7.0} {:>7.0} |                 {:>6.1} {:>9.1} {:>8.1} {:>7.1} {:>7.1} {:>10.1} {:>10.1} {:>10} {:>6.1} {:>6.1}",
                name,
                if rated { format!("{:.2}", s.rate()) } else { "".into() },
                med,
                p95,
                s.per_run(c.host),
                host_idle / s.runs.max(1) as f64,
                s.per_run(c.own),
                s.per_run(c.children),
                s.per_run(c.dockerd),
                s.per_run(c.containerd),
                s.per_run(c.shims),
                c.containers
                    .map_or_else(|| "n/a".into(), |d| format!("{:.1}", s.per_run(d))),
                s.per_run(c.kernel),
                s.per_run(c.host.saturating_sub(c.accounted())),
            )
        };
        writeln!(self.out, "{}", row("codebox", ours))?;
        writeln!(self.out, "{}", row("docker run", theirs))?;
        let (_, m1, _) = spread(ours.latencies.clone());
        let (_, m2, _) = spread(theirs.latencies.clone());
        writeln!(
            self.out,
            "  {:<11} {:>7} {:>7.2} {:>7} |                 {:>6.2}",
            "ratio",
            if rated {
                format!("{:.2}", ours.rate() / theirs.rate().max(1e-9))
            } else {
                "".into()
            },
            m1 / m2.max(1e-9),
            "",
            ours.per_run(ours.cost.host) / theirs.per_run(theirs.cost.host).max(1e-9),
        )?;
        if self.pool {
            writeln!(
                self.out,
                "  codebox: {} of {} runs took a ready container; {} of {} ended as expected, docker run {} of {}",
                ours.ready, ours.runs, ours.ok, ours.runs, theirs.ok, theirs.runs
            )?;
        } else {
            writeln!(
                self.out,
                "  ended as expected: codebox {} of {}, docker run {} of {}",
                ours.ok, ours.runs, theirs.ok, theirs.runs
            )?;
        }
        for (name, s) in [("codebox", ours), ("docker run", theirs)] {
            if let Some(e) = &s.first_error {
                writeln!(self.out, "  {name}: a run failed: {e}")?;
            }
        }
        let failed = self
            .ctx
            .app
            .executor
            .pool()
            .counters()
            .failed
            .load(Ordering::Relaxed);
        if failed > 0 {
            writeln!(
                self.out,
                "  codebox: {failed} containers could not be started ahead of time"
            )?;
        }
        super::super::flush(self.out)
    }
}
