//! The contract apart from the machinery (SPEC sections 4 to 12): what a client may ask and
//! how it is checked, the same for every door (MCP, `/v1`, Piston, Judge0, the CLI).
//!
//! A leaf: it uses only the registry, the configuration and the report's vocabulary; the
//! executor, the run manager and every door use it, and it uses none of them.
//! - [`run`]: a run request (code, stdin, args, files, limits, test cases) and its validation;
//! - [`session`]: a session request, validated as itself, and the session ceilings;
//! - [`files`]: the files a request places (paths, encodings, sizes);
//! - [`limits`]: memory, time and CPU, checked against a ceiling;
//! - [`checks`]: the other checks (stdin, args, language), each naming the field and the
//!   allowed range, and [`RequestError`];
//! - [`params`]: the other tools' parameters (`get_result`, `stop_run`, history, session
//!   files) and their checks;
//! - [`answers`]: what `read_session_file` answers, whichever door asks;
//! - [`schema`]: the published JSON schemas keep to standard formats;
//! - [`ids`]: run ids in both of their forms.

pub mod answers;
pub mod checks;
pub mod files;
pub mod ids;
pub mod limits;
pub mod params;
pub mod run;
pub mod schema;
pub mod session;

pub(crate) use checks::{RequestError, MIN_TIMEOUT_SECONDS};
pub use files::{check_relative_path, stays_inside, Encoding, FileInput};
pub use limits::LimitsInput;
pub use run::{
    Compare, CompileLimitsInput, RunRequest, SessionTarget, SessionTerms, TestInput, ValidRequest,
    ValidTest, MAX_TESTS,
};
pub use session::{session_ceilings, SessionError, SessionRequest, ValidSession};
