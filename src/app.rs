//! The composition root: one builder wires the engine, the executor, this process's instance,
//! the history and the run manager, for every command alike. The engine comes in as a trait
//! object, so every command can run on the fake engine in tests; the command line is the one
//! place that picks Docker.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::engine::ContainerEngine;
use crate::executor::Executor;
use crate::history::{History, Owner};
use crate::instance::Instance;
use crate::reaper;
use crate::registry::Registry;
use crate::runs::{self, RunManager};
use crate::sessions::Sessions;

/// How long [`App::shutdown`] waits for unfinished runs to stop and remove their containers.
pub(super) const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// How long [`App::shutdown`] waits for the history's last writes.
const HISTORY_FLUSH: Duration = Duration::from_secs(10);

/// Why the application could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The settings and the registry do not fit together.
    #[error(transparent)]
    Budget(#[from] runs::BudgetError),
}

/// Everything a command works with, built once from a resolved configuration.
pub struct App {
    pub config: Arc<Config>,
    pub registry: Arc<Registry>,
    pub engine: Arc<dyn ContainerEngine>,
    /// This process's identity on the daemon; its lock file lives as long as the app.
    pub instance: Arc<Instance>,
    pub executor: Arc<Executor>,
    pub history: History,
    pub runs: RunManager,
    /// The sessions, a wing above the runs.
    pub sessions: Arc<Sessions>,
}

impl App {
    /// Assemble the application. Opens the history (marking runs that a dead instance left
    /// unfinished as interrupted) and starts the run manager: call inside a tokio runtime.
    /// Talks to no container engine; [`App::reap`] does, for the commands that create
    /// containers.
    pub fn build(
        config: Config,
        registry: Registry,
        engine: Arc<dyn ContainerEngine>,
    ) -> Result<App, AppError> {
        runs::check_budget(&registry, &config)?;
        let config = Arc::new(config);
        let registry = Arc::new(registry);
        let instance = Arc::new(Instance::register(&config.data_dir));
        let executor = Arc::new(Executor::new(
            engine.clone(),
            config.clone(),
            instance.id.clone(),
        ));
        let history = History::connect(
            &config.history_store(),
            Owner {
                instance: instance.id.clone(),
                data_dir: config.data_dir.clone(),
                lease: config.cluster.lease(),
                advertise_url: config.cluster.advertise_url.clone(),
            },
        );
        let runs = RunManager::new(
            executor.clone(),
            registry.clone(),
            config.clone(),
            Some(history.clone()),
        );
        crate::cluster::fence::watch(&runs);
        let sessions = Sessions::new(runs.clone());
        Ok(App {
            sessions,
            config,
            registry,
            engine,
            instance,
            executor,
            history,
            runs,
        })
    }

    /// Why containers would not run under the runtimes the settings name, as this daemon
    /// gives them (`EngineInfo::runtime_problem`), one line per setting.
    pub(super) fn runtime_problems(&self, info: &crate::engine::EngineInfo) -> Vec<String> {
        let c = &self.config;
        let mut asked = vec![("sandbox.runtime", c.sandbox.runtime.as_str())];
        if let Some(r) = c.packages.install_runtime.as_deref() {
            asked.push(("packages.install_runtime", r));
        }
        asked
            .into_iter()
            .filter_map(|(setting, runtime)| {
                info.runtime_problem(runtime)
                    .map(|p| format!("{setting} = {runtime}, but {p}"))
            })
            .collect()
    }

    /// Remove what crashed or killed instances left on the daemon; a failure is only logged.
    pub async fn reap(&self) {
        // The history first marks the runs of dead instances, judged by their lock files,
        // which the reaper deletes once it has removed their containers.
        self.history.flush(HISTORY_FLUSH).await;
        match reaper::reap(
            self.engine.as_ref(),
            &self.instance.id,
            &self.config.data_dir,
        )
        .await
        {
            Ok(r) => self.runs.metrics().add_reaped(r.containers),
            Err(e) => {
                tracing::warn!(error = %e, "could not sweep containers left by earlier instances")
            }
        }
    }

    /// End every session and stop every unfinished run, then wait (up to `grace` each) until every container of
    /// this process is gone, and (up to `HISTORY_FLUSH`) until the history has written what
    /// it was sent. If some could not be removed, the instance's lock file is kept
    /// when the process ends, so the next start knows this instance died with objects left
    /// and reaps them at once (not after their expiry).
    pub async fn shutdown(&self, grace: Duration) {
        self.sessions.shutdown(grace).await;
        let cleanup = self.executor.cleanup();
        if !cleanup.drain(grace).await || cleanup.failed() {
            tracing::warn!(
                pending = cleanup.pending(),
                "some containers could not be removed; the next start reaps them"
            );
            self.instance.keep_lock_file();
        }
        if !self.history.flush(HISTORY_FLUSH).await {
            tracing::warn!(store = self.history.store(), "the history database did not take the last writes in time; some runs may be unrecorded");
        }
    }
}
