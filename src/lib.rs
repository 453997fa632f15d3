//! codebox: an MCP server that runs untrusted, model-generated code in throwaway,
//! locked-down Docker containers and reports precisely what happened.
//!
//! # Layout
//! - [`registry`]: `languages.toml`, raw serde types then validated languages and images.
//! - [`engine`]: the [`engine::ContainerEngine`] trait; `docker.rs` (the only bollard user),
//!   `fake.rs` (records specs), `guard.rs` (removal), `posture.rs` (the locked-down spec).
//! - [`executor`]: request validation, the workspace tar, the two stages, outcomes.
//! - [`report`]: the run report, one shape everywhere.
//! - [`config`]: operator settings and `DEFAULT_*` constants.
//! - [`images`]: building and listing images; [`reaper`]: removing what a dead instance left.
//! - [`runs`]: the run manager (admission queue, concurrency cap, memory budget, stop, retention).
//! - [`history`]: the SQLite run history on its own thread, with migrations.
//! - [`mcp`]: the six MCP tools; [`transport`]: stdio and Streamable HTTP (`/mcp`, `/healthz`, `/metrics`).
//! - [`cli`]: the `codebox` commands (with `main.rs`, the only place that uses anyhow).

pub mod catalog;
pub mod cli;
pub mod config;
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
