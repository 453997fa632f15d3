//! One command in a locked-down container with an empty working directory, outside any run:
//! the `doctor` posture probe and the toolchain version checks of `codebox images build`.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::containers::{Containers, Want};
use super::ends::{new_run_id, Halt, SandboxFailure, BACKSTOP_GRACE};
use super::outcome::classify;
use super::outcome::Streams;
use super::stage::{Bound, Interrupted};
use crate::engine::posture::Limits;
use crate::engine::protocol::{Collect, Payload, PhaseName};

/// What a probe container printed.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i64>,
}

/// Run `cmd` in a container of `image_tag` with the default limits.
pub(super) async fn run(
    containers: &Containers,
    image_tag: &str,
    cmd: Vec<String>,
    timeout: Duration,
) -> Result<ProbeOutput, SandboxFailure> {
    let run_id = new_run_id();
    let mut labels = containers.run_labels(&run_id, timeout);
    labels.insert("codebox.probe".into(), "true".into());
    let want = Want {
        name: format!("codebox-{run_id}-probe"),
        image_tag: image_tag.to_string(),
        image_name: image_tag.to_string(),
        limits: Limits {
            memory_mb: containers.config.limits.default_memory_mb,
            cpus: containers.config.limits.default_cpus,
        },
        workspace_mb: containers.config.sandbox.workspace_mb,
        labels,
        prefix: None,
    };
    let payload = Payload {
        run: Some(cmd),
        timeout,
        output_limit: containers.config.sandbox.output_limit_bytes,
        collect: Some(Collect::None),
        ..Default::default()
    };
    let never = CancellationToken::new();
    let bound = Bound::new(
        &never,
        tokio::time::Instant::now() + timeout + BACKSTOP_GRACE,
    );
    let result = async {
        let container = containers.create(&want, bound).await?;
        containers
            .run_in(&want, container, payload, timeout, 0, bound)
            .await
    }
    .await
    .map_err(|halt| match halt {
        Halt::Failed(f) => f,
        Halt::Stopped => SandboxFailure::Late(Interrupted::Stopped),
    })?;
    let phase = result.decoded.phase(PhaseName::Run);
    let o = classify(phase, &result);
    if let Some(problem) = o.problem {
        return Err(SandboxFailure::Unexplained(problem));
    }
    let s = Streams::of(phase);
    Ok(ProbeOutput {
        stdout: s.stdout,
        stderr: s.stderr,
        exit_code: o.exit_code,
    })
}
