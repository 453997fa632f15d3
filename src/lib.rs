//! codebox: an MCP server that runs untrusted, model-generated code in throwaway,
//! locked-down Docker containers and reports precisely what happened.
//!
//! # Layout
//! Top to bottom; a module uses only modules below it (a test in `tests/it/layers.rs` keeps
//! it so).
//! - [`cli`]: the `codebox` commands, one file each; with `main.rs` the only place that uses
//!   clap and anyhow, and the only place that picks Docker as the engine.
//! - [`transport`]: stdio and Streamable HTTP (`/mcp`, `/healthz`, `/metrics`, bearer auth),
//!   which read client messages the same way (`jsonrpc`: invalid requests answered with
//!   their ids).
//! - [`api`]: the HTTP APIs for programs beside `/mcp`: `/v1` (`v1/`: runs, sessions, its
//!   OpenAPI document, its refusals), and the Piston v2 and Judge0 CE compatible routes, on
//!   the same run manager; `client.rs` stops a run whose waiting client went away.
//! - [`app`]: the composition root: one builder wires engine, executor, instance, history and
//!   run manager for every command.
//! - [`mcp`]: the ten MCP tools, typed parameters and results, their descriptions written
//!   from the running configuration.
//! - [`runs`]: the run manager (admission queue, concurrency cap, memory budget, stop,
//!   retention), sessions (`sessions/`: their lifetimes, ends and budget), and metrics.
//! - [`history`]: the run history on its own thread (`actor.rs`: the commands, bounded by
//!   count and bytes, and the thread), in SQLite or a shared PostgreSQL (over TLS as libpq's
//!   `sslmode` says, `pg_tls.rs`) behind one seam, with one list of migrations and the
//!   instances' heartbeats.
//! - [`catalog`]: the supported languages and limits, as `list_supported_languages` shows them.
//! - [`images`]: building and listing images, recording toolchain versions.
//! - [`reaper`]: removing what a dead instance left.
//! - [`executor`]: the workspace, the two stages, outcomes, and a
//!   session's container (`session.rs`).
//! - [`engine`]: the [`engine::ContainerEngine`] trait; `docker/` (the only bollard user:
//!   a local socket, or TCP with TLS trusting only the operator's CA),
//!   `fake.rs` (records specs, fails on demand; only with the `testing` feature, which the
//!   crate's own tests turn on, never in the shipped binary), `guard.rs` (removal),
//!   `posture.rs` (the locked-down spec).
//! - [`instance`]: this process's identity and liveness lock.
//! - [`contract`]: what clients may ask (run and session requests, tool parameters, ids) and
//!   its validation, one for every door; uses none of the machinery.
//! - [`registry`]: `languages.toml`, raw serde types then validated languages and images.
//! - [`config`]: operator settings, resolved once and validated: the `Config` struct
//!   (`mod.rs`), its sections (`sections.rs`, `history.rs` with the PostgreSQL URL and its
//!   TLS parameters in `postgres_tls.rs`, `docker.rs`), where values come from
//!   (`sources.rs`: file, environment, `--set`) and `validate.rs`.
//! - [`report`]: the run report, one shape everywhere.

pub mod api;
pub mod app;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod contract;
pub mod engine;
pub mod executor;
pub mod history;
pub mod images;
pub mod instance;
pub mod mcp;
pub mod reaper;
pub mod registry;
pub mod report;
pub mod runs;
pub mod transport;
