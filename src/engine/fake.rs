//! A fake engine for control-flow tests: it records every spec it is asked to create, keeps a
//! set of live containers and volumes, and can be told to fail or hang at a given step.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{
    BuildProgress, Captured, ContainerEngine, ContainerSpec, Ending, EngineError, EngineInfo,
    Execution, ImageInfo, Leftover, StartOptions,
};
use crate::report::Usage;

/// A step the fake can be told to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Ping,
    CreateVolume,
    CreateContainer,
    Upload,
    Start,
}

#[derive(Default)]
struct State {
    specs: Vec<ContainerSpec>,
    live_containers: BTreeSet<String>,
    live_volumes: BTreeSet<String>,
    fail: BTreeSet<Step>,
    /// Executions handed out by `start_and_wait`, in order; empty: exit 0.
    script: VecDeque<Execution>,
    /// When set, `start_and_wait` blocks until cancelled.
    hang: bool,
    /// When set, `start_and_wait` panics (a bug in a run task).
    panic: bool,
    started: usize,
    /// How many container removals still fail (a flaky or briefly lost daemon).
    failing_removals: usize,
}

/// The fake engine.
#[derive(Default)]
pub struct FakeEngine {
    state: Mutex<State>,
}

impl FakeEngine {
    pub fn new() -> Self {
        FakeEngine::default()
    }

    pub fn fail_at(&self, step: Step) {
        self.state.lock().unwrap().fail.insert(step);
    }

    pub fn hang_on_start(&self) {
        self.state.lock().unwrap().hang = true;
    }

    /// Make the next `n` container removals fail.
    pub fn fail_removals(&self, n: usize) {
        self.state.lock().unwrap().failing_removals = n;
    }

    pub fn panic_on_start(&self) {
        self.state.lock().unwrap().panic = true;
    }

    /// Queue the result of the next `start_and_wait`.
    pub fn script(&self, execution: Execution) {
        self.state.lock().unwrap().script.push_back(execution);
    }

    /// Every spec `create_container` was given, in order.
    pub fn specs(&self) -> Vec<ContainerSpec> {
        self.state.lock().unwrap().specs.clone()
    }

    pub fn live_containers(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .live_containers
            .iter()
            .cloned()
            .collect()
    }

    pub fn live_volumes(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .live_volumes
            .iter()
            .cloned()
            .collect()
    }

    pub fn started(&self) -> usize {
        self.state.lock().unwrap().started
    }

    fn check(&self, step: Step) -> Result<(), EngineError> {
        if self.state.lock().unwrap().fail.contains(&step) {
            let msg = format!("fake failure at {step:?}");
            return Err(match step {
                Step::Ping => EngineError::Unreachable {
                    address: "fake://".into(),
                    detail: msg,
                },
                Step::CreateVolume => EngineError::CreateVolume(msg),
                Step::CreateContainer => EngineError::CreateContainer(msg),
                Step::Upload => EngineError::UploadSources(msg),
                Step::Start => EngineError::StartContainer(msg),
            });
        }
        Ok(())
    }
}

/// An execution that exited with `code` and printed `stdout`.
pub fn exited(code: i64, stdout: &str) -> Execution {
    let mut out = Captured::default();
    out.push(stdout.as_bytes(), u64::MAX);
    Execution {
        ending: Ending::Exited,
        exit_code: Some(code),
        oom_killed: false,
        stdout: out,
        stderr: Captured::default(),
        usage: Usage::default(),
        duration: Duration::from_millis(1),
    }
}

#[async_trait]
impl ContainerEngine for FakeEngine {
    async fn ping(&self) -> Result<EngineInfo, EngineError> {
        self.check(Step::Ping)?;
        Ok(EngineInfo {
            address: "fake://".into(),
            version: "fake".into(),
            api_version: "1.41".into(),
        })
    }

    async fn inspect_image(&self, tag: &str) -> Result<Option<ImageInfo>, EngineError> {
        Ok(Some(ImageInfo {
            id: format!("sha256:fake-{tag}"),
            ..Default::default()
        }))
    }

    async fn build_image(
        &self,
        tag: &str,
        _context_tar: Vec<u8>,
        _labels: BTreeMap<String, String>,
        _no_cache: bool,
        progress: BuildProgress<'_>,
    ) -> Result<String, EngineError> {
        progress("fake build");
        Ok(format!("sha256:fake-{tag}"))
    }

    async fn create_volume(
        &self,
        name: &str,
        _labels: &BTreeMap<String, String>,
    ) -> Result<(), EngineError> {
        self.check(Step::CreateVolume)?;
        self.state
            .lock()
            .unwrap()
            .live_volumes
            .insert(name.to_string());
        Ok(())
    }

    async fn create_tmpfs_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        _size_mb: u64,
        _uid: u32,
    ) -> Result<(), EngineError> {
        self.create_volume(name, labels).await
    }

    async fn start(&self, _id: &str) -> Result<(), EngineError> {
        self.check(Step::Start)
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        self.state.lock().unwrap().live_volumes.remove(name);
        Ok(())
    }

    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        self.check(Step::CreateContainer)?;
        let mut s = self.state.lock().unwrap();
        s.specs.push(spec.clone());
        s.live_containers.insert(spec.name.clone());
        Ok(spec.name.clone())
    }

    async fn upload(&self, _id: &str, _path: &str, _tar: Vec<u8>) -> Result<(), EngineError> {
        self.check(Step::Upload)
    }

    async fn start_and_wait(
        &self,
        _id: &str,
        _options: StartOptions,
        cancel: CancellationToken,
    ) -> Result<Execution, EngineError> {
        self.check(Step::Start)?;
        let (hang, panic, next) = {
            let mut s = self.state.lock().unwrap();
            s.started += 1;
            (s.hang, s.panic, s.script.pop_front())
        };
        if panic {
            panic!("fake engine told to panic on start");
        }
        if hang {
            cancel.cancelled().await;
            let mut e = exited(137, "");
            e.ending = Ending::Cancelled;
            return Ok(e);
        }
        Ok(next.unwrap_or_else(|| exited(0, "")))
    }

    async fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        let mut s = self.state.lock().unwrap();
        if s.failing_removals > 0 {
            s.failing_removals -= 1;
            return Err(EngineError::RemoveContainer(
                "fake failure at remove".into(),
            ));
        }
        s.live_containers.remove(id);
        Ok(())
    }

    async fn list_managed_containers(&self) -> Result<Vec<Leftover>, EngineError> {
        Ok(Vec::new())
    }

    async fn list_managed_volumes(&self) -> Result<Vec<Leftover>, EngineError> {
        Ok(Vec::new())
    }
}
