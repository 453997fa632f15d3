//! The contract apart from the machinery (SPEC sections 4 to 12): what a client may ask and
//! how it is checked, the same for every door (MCP, `/v1`, Piston, Judge0, the CLI).
//!
//! A leaf: it uses only the registry, the configuration and the report's vocabulary; the
//! executor, the run manager and every door use it.
//! - [`ids`]: run ids in both of their forms.

pub mod ids;
