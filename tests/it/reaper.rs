//! Real Docker: what a dead instance left is removed at the next start; what a live one owns
//! is left alone.

use std::collections::BTreeMap;

use codebox::config::SandboxSettings;
use codebox::engine::docker::DockerEngine;
use codebox::engine::posture::{self, Limits, Plan};
use codebox::engine::ContainerEngine;
use codebox::instance::Instance;
use codebox::reaper::reap;

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

async fn create(engine: &DockerEngine, instance: &str, expires: u64) -> String {
    let run = codebox::executor::new_run_id();
    let labels = BTreeMap::from([
        ("codebox.managed".to_string(), "true".to_string()),
        ("codebox.run".to_string(), run.clone()),
        ("codebox.instance".to_string(), instance.to_string()),
        ("codebox.expires".to_string(), expires.to_string()),
    ]);
    let spec = posture::locked_down(
        &Plan {
            name: format!("codebox-{run}-reaptest"),
            image: "codebox/bash:5.2".into(),
            uid: 10001,
            limits: Limits {
                memory_mb: 64,
                cpus: 1.0,
            },
            workspace_mb: 8,
            labels,
        },
        &SandboxSettings::default(),
    );
    engine.create_container(&spec).await.unwrap();
    run
}

#[tokio::test]
async fn containers_of_dead_or_expired_instances_are_reaped_and_live_ones_kept() {
    let data = tempfile::tempdir().unwrap();
    let engine = crate::common::docker_engine().unwrap();
    let me = Instance::register(data.path());
    let alive = Instance::register(data.path());
    // A dead instance: its lock file is there but nobody holds the lock, as after SIGKILL.
    let dead_id = "deadinstance0000";
    std::fs::write(
        data.path()
            .join("instances")
            .join(format!("{dead_id}.lock")),
        b"",
    )
    .unwrap();
    let dead_run = create(&engine, dead_id, now() + 3600).await;
    // Older versions also left volumes: both must go in one sweep.
    let made = std::process::Command::new("docker")
        .args([
            "volume",
            "create",
            "--label",
            "codebox.managed=true",
            "--label",
            &format!("codebox.run={dead_run}"),
            "--label",
            &format!("codebox.instance={dead_id}"),
            "--label",
            &format!("codebox.expires={}", now() + 3600),
            &format!("codebox-{dead_run}"),
        ])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let live_run = create(&engine, &alive.id, now() + 3600).await;
    let expired_run = create(&engine, "someotherhost", now() - 1).await;
    let mine_run = create(&engine, &me.id, now() + 3600).await;

    reap(&engine, &me.id, data.path()).await.unwrap();

    let live_left = crate::common::leftovers(&live_run);
    let mine_left = crate::common::leftovers(&mine_run);
    let expired_left = crate::common::leftovers(&expired_run);
    let dead_left = crate::common::leftovers(&dead_run);
    for run in [&dead_run, &live_run, &expired_run, &mine_run] {
        for id in crate::common::leftovers(run) {
            engine.remove_container(&id).await.unwrap();
            engine.remove_volume(&id).await.unwrap();
        }
    }
    assert_eq!(live_left.len(), 1, "a live instance's container was reaped");
    assert_eq!(mine_left.len(), 1, "our own container was reaped");
    assert!(expired_left.is_empty(), "an expired container was kept");
    assert!(
        dead_left.is_empty(),
        "a dead instance's container or volume was kept: {dead_left:?}"
    );
    assert!(
        !data
            .path()
            .join("instances")
            .join(format!("{dead_id}.lock"))
            .exists(),
        "the dead instance's lock file was kept after its objects were removed"
    );
    drop(alive);
}
