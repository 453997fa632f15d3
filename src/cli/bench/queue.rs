//! `codebox bench --shared-queue`: the shared queue's own cost (SPEC section 15), without
//! Docker, on the operator's PostgreSQL history: `n` runs submitted through three queue
//! handles at once (three servers), then claimed by the three one slot at a time, as a busy
//! cluster claims, each settled once claimed.
//!
//! Everything happens in a schema of its own ([`Scratch`]), dropped at the end: the real
//! `runs` and `queue` rows are never read or written, and live servers never see these.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::future::join_all;

use crate::config::{CodePolicy, HistoryStore};
use crate::history::{NewRun, Room, Scratch, SharedQueue, Submitted};
use crate::report::{RunLimits, RunReport, Status};

/// The queue handles, as many servers.
const HANDLES: usize = 3;
/// A claim's room: one free slot, as a busy server has.
const ROOM: Room = Room {
    slots: 1,
    memory_mb: 1024,
    max_slots: 4,
    budget_mb: 4096,
};
/// How long the first submit may wait for the queue's connection and tables.
const READY_WITHIN: Duration = Duration::from_secs(10);

pub async fn bench(
    store: &HistoryStore,
    n: usize,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let schema = format!("codebox_bench_{}", std::process::id());
    let scratch = Scratch::create(store, &schema).context("--shared-queue")?;
    writeln!(
        out,
        "the shared queue on {store}, in the schema {} made for it (dropped at the end): \
         {n} runs, {HANDLES} queue handles",
        scratch.schema()
    )?;
    out.flush()?;
    let measured = measure(&scratch.store(), n, out).await;
    // The handles are gone: their connections leave the schema's tables alone.
    scratch.remove()?;
    measured?;
    Ok(0)
}

async fn measure(
    store: &HistoryStore,
    n: usize,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let queues: Vec<SharedQueue> = (1..=HANDLES)
        .map(|k| {
            SharedQueue::connect(store, &format!("bench-queue-{k}"))
                .context("the shared queue needs a PostgreSQL history")
        })
        .collect::<anyhow::Result<_>>()?;
    // Warm: each connection open, the tables made.
    for (k, q) in queues.iter().enumerate() {
        ready(q, &format!("bench-queue-{}", k + 1)).await?;
    }
    let t = Instant::now();
    let submits = queues.iter().enumerate().map(|(k, q)| async move {
        for i in (k..n).step_by(HANDLES) {
            let id = format!("bench-queue-run-{i:06}");
            q.submit(run(&id, &format!("bench-queue-{}", k + 1)))
                .await?;
        }
        anyhow::Ok(())
    });
    join_all(submits)
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    let submitted = t.elapsed();
    let t = Instant::now();
    let claims = queues.iter().map(|q| async move {
        let mut got = 0;
        loop {
            let claimed = q.claim(ROOM).await?;
            if claimed.is_empty() {
                return anyhow::Ok(got);
            }
            for c in claimed {
                q.settle(&c.run_id);
                got += 1;
            }
        }
    });
    let got = join_all(claims)
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<usize>>>()?;
    let claimed = t.elapsed();
    let per_run = |d: Duration| super::stats::ms(d) / n.max(1) as f64;
    let per_second = |d: Duration| n as f64 / d.as_secs_f64().max(f64::MIN_POSITIVE);
    writeln!(
        out,
        "  submit (history row and queue row, one transaction, NOTIFY): {:.2} ms a run, {:.0} submits/s",
        per_run(submitted),
        per_second(submitted)
    )?;
    writeln!(
        out,
        "  claim, one slot at a time (FOR UPDATE SKIP LOCKED), then settle: {:.2} ms a run, \
         {:.0} claims/s, by handle {}",
        per_run(claimed),
        per_second(claimed),
        got.iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join("/")
    )?;
    let total: usize = got.iter().sum();
    anyhow::ensure!(total == n, "{n} runs submitted, {total} claimed");
    Ok(())
}

/// Submit a first run through `queue` of `instance` (tried again while its thread connects
/// and makes the tables), then claim and settle it.
async fn ready(queue: &SharedQueue, instance: &str) -> anyhow::Result<()> {
    let warm = run(&format!("{instance}-warm"), instance);
    let began = Instant::now();
    loop {
        match queue.submit(warm.clone()).await {
            Ok(_) => break,
            Err(e) if began.elapsed() > READY_WITHIN => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    for c in queue.claim(ROOM).await? {
        queue.settle(&c.run_id);
    }
    Ok(())
}

/// A run of the measurement, submitted by `instance`: a Python one-liner of one slot.
fn run(run_id: &str, instance: &str) -> Submitted {
    let code = format!("print('{run_id}')");
    let limits = RunLimits {
        memory_mb: 256,
        timeout_seconds: 10.0,
        cpus: 1.0,
    };
    let base = RunReport::new(run_id, "python", Status::Queued, limits, "queued");
    Submitted {
        row: NewRun::new(
            run_id,
            "python",
            limits,
            &code,
            CodePolicy::Preview,
            instance,
        ),
        request: serde_json::json!({"language": "python", "code": code}).to_string(),
        base: serde_json::to_string(&base).unwrap_or_default(),
        slots: 1,
        charge_mb: 256,
        claim_here: false,
    }
}
