//! codebox: an MCP server that runs untrusted, model-generated code in throwaway,
//! locked-down Docker containers and reports precisely what happened.
//!
//! # Layout
//! One line per folder, top to bottom: a module uses only modules below it (a test in
//! `tests/it/layers.rs` keeps it so). Inside `executor/` and `runs/` the face stands on top:
//! no child imports its parent (`../shared/tools/structure.py` lists the folders where a
//! child still does: registry, config, history, api, transport, cli).
//! - [`cli`]: the `codebox` commands, one file each (`bench/`: codebox beside `docker run`);
//!   with `main.rs` the only place that uses clap and anyhow, and that picks Docker.
//! - [`transport`]: stdio and Streamable HTTP (`/mcp`, `/healthz`, `/metrics`, bearer auth).
//! - [`api`]: the HTTP APIs for programs: `v1/` (runs, sessions, OpenAPI, refusals), Piston
//!   v2, `judge0/` (Judge0 CE); `client.rs` stops a run whose waiting client went away.
//! - [`app`]: the composition root: one builder wires engine, executor, instance, history,
//!   run manager and sessions for every command.
//! - [`mcp`]: the ten MCP tools, their results and descriptions from the running config;
//!   each tool once, in `CodeboxServer`, working on this server only. `forward.rs`:
//!   `ClusterServer`, the wrapper that forwards a call about another server's run or session
//!   to it, and carries out the calls forwarded here.
//! - [`cluster`]: several servers as one (SPEC section 15): which server holds a run or a
//!   session, forwarding a call to it with the cluster secret, the shared queue as the run
//!   manager's dispatch (`dispatch.rs`: submissions, claims, hand-backs, waits and stops at
//!   the owner) and the fencing of a server whose lease was judged lapsed (`fence.rs`).
//! - [`sessions`]: sessions, a wing above runs: `Sessions` owns the table, its lock and
//!   every verb (create, execute, read, list, close, expire, keep ready); it holds its memory
//!   through the run manager's ledger and submits each execution to it as a `Job` that runs
//!   in the session's container; `ends.rs` their names and ends.
//! - [`runs`]: the run manager, whole in `mod.rs` (ids, queue, stop, retention, lookup), its
//!   run table (`table.rs`) and the `Dispatch` seam (`dispatch.rs`: where a new run is
//!   queued, who answers for a run not held here; `Local` by default), with `admission.rs`,
//!   the sans-IO ledger of slots and
//!   memory (runs, the pool's ready containers, and what others hold: sessions and sessions
//!   opened ahead of time, which give way through `budget::Ahead`), `budget.rs`, what a run
//!   or execution is charged (its install step's memory too), and `submit.rs`, what taking
//!   a request answers and a `Job`: a run whoever submits it carries out. It knows nothing
//!   of sessions or of the cluster.
//! - [`history`]: the run history on its own thread, in SQLite or a shared PostgreSQL.
//! - [`catalog`]: the supported languages and limits, as `list_supported_languages` shows them.
//! - [`images`]: building and listing images, recording toolchain versions.
//! - [`reaper`]: removing what a dead instance left.
//! - [`executor`]: `Executor` (whole in `mod.rs`: the stage sequence) holds
//!   `Containers` (`containers.rs`: engine, pool, uid leases, image ids, removals; how a
//!   stage gets, checks and runs its container) and the `Compiler` (`compile.rs`, with its
//!   cache); test cases (`cases.rs`), a session's container (`SessionBox`, `session.rs`),
//!   outcomes; `ends.rs`, the words the stages share (`Call`, `Halt`, `Known`, `Ended`, the
//!   backstop grace, budgets), a leaf; `finish.rs`, the report built once; `program.rs`,
//!   what the run stage lays out; and `exchange.rs`, the one client of codebox-init's protocol that one-shot
//!   stages and session executions share; `pool/` keeps containers ready; `packages/` is
//!   the install step (its container, the egress proxy, the prefix cache).
//! - [`live`]: a run's live events (output as it comes, files, the report), bounded in bytes
//!   and in events; the executor is handed the feed (in its `Call`) and writes it with one
//!   `Pen` per stage or test case, and `/v1/runs/{id}/events`, MCP progress and Piston's WebSocket read.
//! - [`engine`]: the [`engine::ContainerEngine`] trait; `docker/` (the only bollard user),
//!   `fake.rs` and `fake/` (only with the `testing` feature), `guard.rs` (each container's
//!   one owner, which removes it on every path), `posture.rs` (the locked-down spec),
//!   `protocol/` (codebox-init's records and frames).
//! - [`instance`]: this process's identity and liveness lock.
//! - [`contract`]: what clients may ask (run and session requests, tool parameters, ids) and
//!   its validation, one for every door; uses none of the machinery.
//! - [`registry`]: `languages.toml`, raw serde types then validated languages and images.
//! - [`config`]: operator settings, resolved once and validated, one struct per section.
//! - [`report`]: the run report, one shape everywhere.

pub mod api;
pub mod app;
pub mod catalog;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod contract;
pub mod engine;
pub mod executor;
pub mod history;
pub mod images;
pub mod instance;
pub mod live;
pub mod mcp;

pub mod reaper;
pub mod registry;
pub mod report;
pub mod runs;
pub mod sessions;
pub mod transport;
