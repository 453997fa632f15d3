//! The integration test binary. Modules that talk to Docker need a running daemon and the
//! images built (`.ci/run` does both); they never skip when Docker is missing: they fail.

mod cli;
mod common;
mod docker_runs;
mod fake_engine;
mod hardening;
mod reaper;
mod registry_file;
mod mcp_support;
mod runs;
mod mcp_tools;
mod http;
mod mcp_stdio;
mod mcp_load;
mod mcp_crash;
mod mcp_cli;
