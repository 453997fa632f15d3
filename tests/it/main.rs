//! The integration test binary. Modules that talk to Docker need a running daemon and the
//! images built (`.ci/run` does both); they never skip when Docker is missing: they fail.

mod batch;
mod cli;
mod cli_fake;
mod cli_first_contact;
mod common;
mod docker_runs;
mod fake_engine;
mod faults;
mod fuzz_gen;
mod hardening;
mod http;
mod http_api;
mod http_session_files;
mod layers;
mod load_http;
mod mcp_cli;
mod mcp_fuzz;
mod mcp_load;
mod mcp_stdio;
mod mcp_support;
mod mcp_tools;
mod pg_cluster;
mod pool;
mod postgres;
mod private_daemon;
mod readme;
mod reaper;
mod registry_file;
mod remote_tls;
mod runs;
mod serve_child;
mod sessions;
mod sessions_fake;
mod shared_store;
mod workspace;
