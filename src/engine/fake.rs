//! A fake engine for control-flow tests. It records every spec it is asked to create and
//! every payload a container receives, plays the part of `codebox-init` (frames, phases,
//! files back from a compile stage) according to a scripted [`Behaviour`], keeps the set of
//! live containers, and can be told to fail at any operation. It sleeps on no clock of its
//! own, so tests can run it with paused time.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};

mod program;
mod session;

use program::{phase_end, program};

use super::{
    detail, Attached, BuildProgress, ContainerEngine, ContainerSpec, ContainerState, EngineError,
    EngineInfo, ImageInfo, Leftover, Output, Resources, Signal,
};
use crate::engine::protocol::{frame, parse_payload, Collect, EntryKind, Payload};

/// An operation the fake can be told to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Ping,
    InspectImage,
    CreateContainer,
    Start,
    Attach,
    Wait,
    Kill,
    Inspect,
    Events,
    Update,
    Remove,
}

/// A request's records, by name and value.
pub(super) type Records = Vec<(String, Vec<u8>)>;

/// What the program in the next attached container does.
#[derive(Debug, Clone, PartialEq)]
pub enum Behaviour {
    /// Print, then exit with the code (a compile stage that exits 0 sends its working
    /// directory back, plus an executable `main`).
    Exit {
        code: i64,
        stdout: String,
        stderr: String,
    },
    /// Killed by a signal; `oom` also marks it as an out-of-memory kill.
    Signal { signal: i64, oom: bool },
    /// Start, print `stdout`, and never end until stopped (SIGTERM: reports `stopped`) or
    /// killed.
    Hang { stdout: String },
    /// Like `Hang`, but ignores SIGTERM: only a kill ends it.
    HangHard,
    /// The helper reports the program timed out (it enforces the limit itself).
    TimedOut { stdout: String },
    /// Send these bytes as the container's stdout, then exit with 0.
    Raw(Vec<u8>),
    /// The whole container is killed once the run began, `codebox-init` with the program (as
    /// gVisor's kernel is by an OOM kill): nothing is reported, PID 1 exits 137. With
    /// `oom_event` the engine records an OOM kill, but only as an event after the exit, not in
    /// the container's state.
    KilledWhole { oom_event: bool },
    /// Panic while attaching (a bug in a run task).
    Panic,
    /// A session's cell that does not parse, or a run's source that fails its check: the
    /// check phase fails with this message.
    Syntax(String),
    /// A session's cell whose final expression has this value.
    Result(String),
    /// A session's execution acted out as `then`, whose answer comes `after` this long (for a
    /// hang: this long after the stop), as when `codebox-init` starts the driver again.
    Slow {
        after: std::time::Duration,
        then: Box<Behaviour>,
    },
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour::Exit {
            code: 0,
            stdout: String::new(),
            stderr: String::new(),
        }
    }
}

/// A program that prints `stdout` and exits with `code`.
pub fn exited(code: i64, stdout: &str) -> Behaviour {
    Behaviour::Exit {
        code,
        stdout: stdout.to_string(),
        stderr: String::new(),
    }
}

struct Container {
    spec: ContainerSpec,
    started: bool,
    /// Wakes the program's task on a signal.
    signal_tx: Option<mpsc::UnboundedSender<Signal>>,
    /// The exit code once it exited.
    exit: watch::Sender<Option<i64>>,
    oom: bool,
    /// An OOM kill recorded only as an event.
    oom_event: bool,
}

#[derive(Default)]
struct State {
    specs: Vec<ContainerSpec>,
    containers: BTreeMap<String, Container>,
    fail: BTreeSet<Step>,
    script: VecDeque<Behaviour>,
    /// What programs do once the script is used up.
    default: Behaviour,
    failing_removals: usize,
    attached: usize,
    starts: usize,
    /// Payloads received, in arrival order (kept after removal).
    payloads: Vec<(String, Payload)>,
    /// Signals sent, by container (kept after removal).
    signals: BTreeMap<String, Vec<Signal>>,
    /// The last limits each container was updated to (kept after removal).
    updates: BTreeMap<String, Resources>,
    /// The daemon stopped answering (SIGSTOP): calls and output never come back.
    frozen: bool,
    /// Steps that take this long before they answer (a slow daemon).
    delays: BTreeMap<Step, std::time::Duration>,
    /// Steps that never answer (a daemon stuck on one call).
    stuck: BTreeSet<Step>,
    /// Attach connections whose write half is still held by codebox.
    open_inputs: Arc<std::sync::atomic::AtomicUsize>,
    /// Requests sessions' containers received, with their records (kept after removal).
    session_requests: Vec<(String, Records)>,
    /// Calls asked for, by operation.
    calls: BTreeMap<Step, usize>,
    /// Images say nothing of what their `codebox-init` takes (built before it took more).
    old_init: bool,
    /// How long a session's `read` takes to be answered.
    read_delay: std::time::Duration,
    /// Image builds as they start and end: "start TAG", "end TAG".
    builds: Vec<String>,
    /// Named volumes and their files (path within the volume -> content).
    volumes: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    /// The next this many volume removals fail (a container mounting it is still going).
    failing_volume_removals: usize,
    /// The next this many uploads into a volume stop after half their entries (a copy cut
    /// short).
    cut_uploads: BTreeMap<String, usize>,
}

/// The fake engine.
#[derive(Default)]
pub struct FakeEngine {
    state: Arc<Mutex<State>>,
}

/// A create the caller stopped waiting for: the "daemon" still makes the container, when the
/// call would have answered.
struct PendingCreate {
    state: Arc<Mutex<State>>,
    spec: Option<ContainerSpec>,
    at: Option<tokio::time::Instant>,
}

impl Drop for PendingCreate {
    fn drop(&mut self) {
        let (Some(spec), Some(at)) = (self.spec.take(), self.at) else {
            return;
        };
        if lock(&self.state).fail.contains(&Step::CreateContainer) {
            return;
        }
        let state = self.state.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                tokio::time::sleep_until(at).await;
                insert_created(&state, spec);
            });
        }
    }
}

fn insert_created(state: &Mutex<State>, spec: ContainerSpec) {
    let mut st = lock(state);
    st.specs.push(spec.clone());
    let (exit, _) = watch::channel(None);
    st.containers.insert(
        spec.name.clone(),
        Container {
            spec,
            started: false,
            signal_tx: None,
            exit,
            oom: false,
            oom_event: false,
        },
    );
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeEngine {
    pub fn new() -> Self {
        FakeEngine::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub fn fail_at(&self, step: Step) {
        self.state().fail.insert(step);
    }

    /// Image builds as they started and ended: "start TAG", "end TAG".
    pub fn builds(&self) -> Vec<String> {
        self.state().builds.clone()
    }

    /// The volumes that exist now, with their files.
    pub fn volumes(&self) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
        self.state().volumes.clone()
    }

    /// Make the next `n` volume removals fail (as Docker's "volume is in use").
    #[cfg(test)]
    pub(crate) fn fail_volume_removals(&self, n: usize) {
        self.state().failing_volume_removals = n;
    }

    /// Make the next `n` uploads into `volume` write half their entries, then fail.
    #[cfg(test)]
    pub(crate) fn cut_uploads(&self, volume: &str, n: usize) {
        self.state().cut_uploads.insert(volume.to_string(), n);
    }

    /// Make the next `n` container removals fail.
    pub fn fail_removals(&self, n: usize) {
        self.state().failing_removals = n;
    }

    /// What the program in the next attached container does (in attach order; then the
    /// default, exit 0).
    pub fn script(&self, behaviour: Behaviour) {
        self.state().script.push_back(behaviour);
    }

    /// Sessions' containers take this long to answer a `read`.
    pub fn slow_reads(&self, delay: std::time::Duration) {
        self.state().read_delay = delay;
    }

    /// What every program does once the script is used up.
    pub fn set_default(&self, behaviour: Behaviour) {
        self.state().default = behaviour;
    }

    /// Every program runs until stopped or killed.
    pub fn hang_on_start(&self) {
        self.set_default(Behaviour::Hang {
            stdout: String::new(),
        });
    }

    /// From now on the engine answers nothing, as a daemon stopped with SIGSTOP: every
    /// call, and every container's output, waits forever.
    pub fn freeze(&self) {
        self.state().frozen = true;
    }

    /// Every call of `step` takes `delay` before it answers.
    pub fn delay(&self, step: Step, delay: std::time::Duration) {
        self.state().delays.insert(step, delay);
    }

    /// Every call of `step` from now on never answers.
    pub fn stick_at(&self, step: Step) {
        self.state().stuck.insert(step);
    }

    /// Attach connections whose write half codebox still holds (not yet dropped).
    pub fn open_inputs(&self) -> usize {
        self.state()
            .open_inputs
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every attach panics (a bug in a run task).
    pub fn panic_on_start(&self) {
        self.set_default(Behaviour::Panic);
    }

    /// Every spec `create_container` was given, in order.
    pub fn specs(&self) -> Vec<ContainerSpec> {
        self.state().specs.clone()
    }

    /// Every payload a container received, in creation order of the containers.
    pub fn payloads(&self) -> Vec<Payload> {
        let st = self.state();
        st.specs
            .iter()
            .filter_map(|s| {
                st.payloads
                    .iter()
                    .find(|(name, _)| *name == s.name)
                    .map(|(_, p)| p.clone())
            })
            .collect()
    }

    /// The records of every request sessions' containers received, in order.
    pub fn session_requests(&self) -> Vec<Records> {
        self.state()
            .session_requests
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// The signals a container received.
    pub fn signals(&self, name: &str) -> Vec<Signal> {
        self.state().signals.get(name).cloned().unwrap_or_default()
    }

    /// The limits a container was updated to, if it was.
    pub fn updated(&self, name: &str) -> Option<Resources> {
        self.state().updates.get(name).copied()
    }

    pub fn live_containers(&self) -> Vec<String> {
        self.state().containers.keys().cloned().collect()
    }

    /// How many containers were attached to.
    pub fn attached(&self) -> usize {
        self.state().attached
    }

    /// How many containers were started (by a stage or ahead of time).
    /// From now on images look built before `codebox-init` took more than its first
    /// protocol (no `codebox.init.features` label).
    pub fn old_init(&self) {
        self.state().old_init = true;
    }

    /// How many times `step` was asked for.
    pub fn calls(&self, step: Step) -> usize {
        self.state().calls.get(&step).copied().unwrap_or(0)
    }

    pub fn started(&self) -> usize {
        self.state().starts
    }

    /// Answer a call (never, when frozen), failing it if told to.
    async fn answer(&self, step: Step) -> Result<(), EngineError> {
        let (stuck, delay) = {
            let mut st = self.state();
            *st.calls.entry(step).or_default() += 1;
            (
                st.frozen || st.stuck.contains(&step),
                st.delays.get(&step).copied(),
            )
        };
        if stuck {
            std::future::pending::<()>().await;
        }
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        self.check(step)
    }

    fn check(&self, step: Step) -> Result<(), EngineError> {
        if !self.state().fail.contains(&step) {
            return Ok(());
        }
        let cause = detail(format!("fake failure at {step:?}"));
        Err(match step {
            Step::Ping => EngineError::Unreachable {
                address: "fake://".into(),
                source: cause,
            },
            Step::InspectImage => EngineError::InspectImage(cause),
            Step::CreateContainer => EngineError::CreateContainer(cause),
            Step::Start => EngineError::StartContainer(cause),
            Step::Attach => EngineError::Attach(cause),
            Step::Wait => EngineError::WaitContainer(cause),
            Step::Kill => EngineError::KillContainer(cause),
            Step::Inspect => EngineError::InspectContainer(cause),
            Step::Events => EngineError::ContainerEvents(cause),
            Step::Update => EngineError::UpdateContainer(cause),
            Step::Remove => EngineError::RemoveContainer(cause),
        })
    }

    fn missing(id: &str) -> EngineError {
        EngineError::InspectContainer(detail(format!("no such container: {id}")))
    }
}

/// An attach connection's write half that counts itself in [`FakeEngine::open_inputs`]
/// until it is dropped.
struct TrackedSink {
    inner: tokio::io::DuplexStream,
    open: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for TrackedSink {
    fn drop(&mut self) {
        self.open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl tokio::io::AsyncWrite for TrackedSink {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
#[async_trait]
impl ContainerEngine for FakeEngine {
    async fn ping(&self) -> Result<EngineInfo, EngineError> {
        self.answer(Step::Ping).await?;
        Ok(EngineInfo {
            address: "fake://".into(),
            version: "fake".into(),
            api_version: "1.41".into(),
            runtimes: vec!["runc".into()],
            runtime_args: BTreeMap::new(),
            cgroup_version: None,
            security_options: Vec::new(),
            podman: false,
            default_runtime: "runc".into(),
        })
    }

    async fn inspect_image(&self, tag: &str) -> Result<Option<ImageInfo>, EngineError> {
        self.answer(Step::InspectImage).await?;
        let labels = if self.state().old_init {
            BTreeMap::new()
        } else {
            BTreeMap::from([(
                super::LABEL_INIT_FEATURES.to_string(),
                "check_in_run egress".to_string(),
            )])
        };
        Ok(Some(ImageInfo {
            id: format!("sha256:fake-{tag}"),
            labels,
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
        self.state().builds.push(format!("start {tag}"));
        progress("fake build");
        // Long enough for builds started together to overlap.
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        self.state().builds.push(format!("end {tag}"));
        Ok(format!("sha256:fake-{tag}"))
    }

    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        // As a daemon does: a create it received is carried out even if nobody waits for the
        // answer any more (the container appears when the call would have answered).
        let began = tokio::time::Instant::now();
        let delay = self.state().delays.get(&Step::CreateContainer).copied();
        let mut pending = PendingCreate {
            state: self.state.clone(),
            spec: Some(spec.clone()),
            at: delay.map(|d| began + d),
        };
        self.answer(Step::CreateContainer).await?;
        pending.spec = None;
        insert_created(&self.state, spec.clone());
        Ok(spec.name.clone())
    }

    async fn start_container(&self, id: &str) -> Result<(), EngineError> {
        self.answer(Step::Start).await?;
        let mut st = self.state();
        let c = st
            .containers
            .get_mut(id)
            .ok_or_else(|| FakeEngine::missing(id))?;
        c.started = true;
        st.starts += 1;
        Ok(())
    }

    async fn attach_container(&self, id: &str) -> Result<Attached, EngineError> {
        self.answer(Step::Attach).await?;
        let behaviour = {
            let mut st = self.state();
            st.attached += 1;
            if !st.containers.contains_key(id) {
                return Err(FakeEngine::missing(id));
            }
            let default = st.default.clone();
            st.script.pop_front().unwrap_or(default)
        };
        if behaviour == Behaviour::Panic {
            panic!("fake engine told to panic at attach");
        }
        let (sink, source) = tokio::io::duplex(64 * 1024);
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (sig_tx, sig_rx) = mpsc::unbounded_channel();
        if let Some(c) = self.state().containers.get_mut(id) {
            c.signal_tx = Some(sig_tx);
        }
        tokio::spawn(program(
            self.state.clone(),
            id.to_string(),
            source,
            out_tx,
            sig_rx,
            behaviour,
        ));
        let state = self.state.clone();
        let output = futures_util::stream::unfold(out_rx, move |mut rx| {
            let state = state.clone();
            async move {
                let item = rx.recv().await;
                if lock(&state).frozen {
                    std::future::pending::<()>().await;
                }
                item.map(|item| (item, rx))
            }
        });
        let open = self.state().open_inputs.clone();
        open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Attached {
            output: Box::pin(output),
            input: Box::pin(TrackedSink { inner: sink, open }),
        })
    }

    async fn wait_container(&self, id: &str) -> Result<i64, EngineError> {
        self.answer(Step::Wait).await?;
        let mut rx = {
            let st = self.state();
            st.containers
                .get(id)
                .ok_or_else(|| FakeEngine::missing(id))?
                .exit
                .subscribe()
        };
        let code = rx
            .wait_for(|c| c.is_some())
            .await
            .map_err(|_| EngineError::WaitContainer(detail("the container was removed")))?;
        Ok(code.unwrap_or(0))
    }

    async fn kill_container(&self, id: &str, signal: Signal) -> Result<(), EngineError> {
        self.answer(Step::Kill).await?;
        let mut st = self.state();
        st.signals.entry(id.to_string()).or_default().push(signal);
        if let Some(tx) = st.containers.get(id).and_then(|c| c.signal_tx.as_ref()) {
            let _ = tx.send(signal);
        }
        Ok(())
    }

    async fn inspect_container(&self, id: &str) -> Result<ContainerState, EngineError> {
        self.answer(Step::Inspect).await?;
        let st = self.state();
        let c = st
            .containers
            .get(id)
            .ok_or_else(|| FakeEngine::missing(id))?;
        let exit = *c.exit.borrow();
        Ok(ContainerState {
            running: c.started && exit.is_none(),
            exit_code: exit,
            oom_killed: c.oom,
            image_id: Some(format!("sha256:fake-{}", c.spec.image)),
        })
    }

    async fn oom_event(&self, id: &str) -> Result<bool, EngineError> {
        self.answer(Step::Events).await?;
        let st = self.state();
        let c = st
            .containers
            .get(id)
            .ok_or_else(|| FakeEngine::missing(id))?;
        // A real engine's stream would go on waiting; the fake has nothing more to come.
        Ok(c.oom || c.oom_event)
    }

    async fn update_container(&self, id: &str, resources: Resources) -> Result<(), EngineError> {
        self.answer(Step::Update).await?;
        let mut st = self.state();
        if !st.containers.contains_key(id) {
            return Err(FakeEngine::missing(id));
        }
        st.updates.insert(id.to_string(), resources);
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        self.answer(Step::Remove).await?;
        let mut st = self.state();
        if st.failing_removals > 0 {
            st.failing_removals -= 1;
            return Err(EngineError::RemoveContainer(detail(
                "fake failure at remove",
            )));
        }
        if let Some(c) = st.containers.remove(id) {
            // A removed container's program ends.
            if let Some(tx) = &c.signal_tx {
                let _ = tx.send(Signal::Kill);
            }
        }
        Ok(())
    }

    async fn list_managed_containers(&self) -> Result<Vec<Leftover>, EngineError> {
        Ok(Vec::new())
    }

    async fn list_managed_volumes(&self) -> Result<Vec<Leftover>, EngineError> {
        Ok(Vec::new())
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        let mut st = self.state();
        if st.failing_volume_removals > 0 {
            st.failing_volume_removals -= 1;
            return Err(EngineError::RemoveVolume(detail(
                "fake failure at volume removal: volume is in use",
            )));
        }
        st.volumes.remove(name);
        Ok(())
    }

    async fn create_volume(
        &self,
        name: &str,
        _labels: BTreeMap<String, String>,
    ) -> Result<(), EngineError> {
        self.state().volumes.entry(name.to_string()).or_default();
        Ok(())
    }

    async fn download(&self, id: &str, path: &str, _max: u64) -> Result<Vec<u8>, EngineError> {
        let st = self.state();
        let (volume, _) = mounted(&st, id, path).map_err(EngineError::Download)?;
        let files = st.volumes.get(&volume).cloned().unwrap_or_default();
        // As Docker's archive: the entries under the folder's own name.
        let top = path.rsplit('/').next().unwrap_or("x");
        let mut b = tar::Builder::new(Vec::new());
        for (file, content) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(content.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, format!("{top}/{file}"), &content[..])
                .map_err(|e| EngineError::Download(detail(e.to_string())))?;
        }
        b.into_inner()
            .map_err(|e| EngineError::Download(detail(e.to_string())))
    }

    async fn upload(&self, id: &str, path: &str, tar: Vec<u8>) -> Result<(), EngineError> {
        let mut st = self.state();
        let (volume, read_only) = mounted(&st, id, path).map_err(EngineError::Upload)?;
        if read_only {
            return Err(EngineError::Upload(detail(
                "the volume is mounted read-only",
            )));
        }
        let bad = |e: std::io::Error| EngineError::Upload(detail(e.to_string()));
        let mut files = Vec::new();
        for entry in tar::Archive::new(&tar[..]).entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let name = entry.path().map_err(bad)?.to_string_lossy().into_owned();
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut content).map_err(bad)?;
            files.push((name, content));
        }
        let cut = match st.cut_uploads.get_mut(&volume) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        };
        if cut {
            files.truncate(files.len().div_ceil(2));
        }
        let into = st.volumes.entry(volume).or_default();
        into.extend(files);
        if cut {
            return Err(EngineError::Upload(detail(
                "fake failure: the copy was cut short",
            )));
        }
        Ok(())
    }
}

/// The volume container `id` mounts at `path`, and whether read-only.
fn mounted(st: &State, id: &str, path: &str) -> Result<(String, bool), super::Cause> {
    let c = st
        .containers
        .get(id)
        .ok_or_else(|| detail(format!("no such container: {id}")))?;
    c.spec
        .volumes
        .iter()
        .find(|v| v.target == path)
        .map(|v| (v.volume.clone(), v.read_only))
        .ok_or_else(|| detail(format!("no volume is mounted at {path}")))
}
