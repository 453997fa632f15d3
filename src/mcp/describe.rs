//! What the model reads about each tool: descriptions written from the running configuration
//! (every number is the one in force), each fact said once. `start_run` points at `run_code`
//! for the arguments they share. A test keeps the whole list (names, descriptions, input
//! schemas) within [`MODEL_FACING_BUDGET`] characters for the shipped registry.

use rmcp::model::ToolAnnotations;

use super::schema::{effective_max_memory_mb, language_ids};
use crate::contract::params::{MAX_HISTORY_LIMIT, MAX_WAIT_SECONDS};
use crate::contract::session_ceilings;
use crate::report::fmt_num;
use crate::runs::RunManager;

/// Characters of `tools/list` the model reads (names, descriptions and input schemas).
pub const MODEL_FACING_BUDGET: usize = 12_000;

/// A tool's description and its behaviour hints.
pub struct Described {
    pub name: &'static str,
    pub description: String,
    pub annotations: ToolAnnotations,
}

fn hints(read_only: bool, destructive: bool, idempotent: bool) -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(read_only)
        .destructive(destructive)
        .idempotent(idempotent)
        .open_world(false)
}

/// Every tool's description, from the running configuration.
pub fn descriptions(manager: &RunManager) -> Vec<Described> {
    let c = manager.config();
    let (d, m) = (c.limits.defaults(), c.ceilings());
    let s = &c.sandbox;
    let ss = &c.sessions;
    let n = language_ids(manager).len();
    let run_code = format!(
        "Run code in a fresh, locked-down container (no network, read-only root, non-root, capped \
         memory, CPU, time and output) and wait for its report: status (succeeded, failed, \
         compile_error, timed_out, out_of_memory, stopped, sandbox_error), exit_code, signal, \
         stdout, stderr, compile, usage, files. A failing program is a normal result. {n} \
         languages. limits: memory_mb default {dm} (max {mm}), timeout_seconds default {dt} (max \
         {mt}), cpus default {dc} (max {mc}); over a max is refused. Output kept to {out} bytes per \
         stream. Files left under outputs/ come back (at most {of}, {ob} bytes), images as image \
         content. tests (at most {cases}) compile once and run each case in its own container. \
         With session_id it runs in that session (create_session); reset: true restarts its \
         interpreter first. At most {conc} runs at once, {queue} queued; a full queue is a \
         retryable error. Cancelling the call stops the run.",
        dm = d.memory_mb,
        mm = effective_max_memory_mb(manager),
        dt = fmt_num(d.timeout_seconds),
        mt = fmt_num(m.timeout_seconds),
        dc = fmt_num(d.cpus),
        mc = fmt_num(m.cpus),
        out = s.output_limit_bytes,
        of = s.max_output_files,
        ob = s.max_output_bytes,
        cases = crate::contract::MAX_TESTS,
        conc = c.runs.max_concurrent_runs,
        queue = c.runs.max_queued_runs,
    );
    let sc = session_ceilings(c);
    let create_session = format!(
        "Open a session: one container that keeps the files of its working directory between \
         executions and, for stateful languages (list_supported_languages: session), the \
         interpreter's variables, imports and definitions. Run code in it with run_code or \
         start_run and session_id; read its files with read_session_file; end it with \
         close_session. Memory and CPU are fixed here: limits.memory_mb at most {ceiling} MB \
         (a session holds it for its whole life), cpus at most {cpus}. It ends after \
         idle_timeout_seconds without \
         a call (default {idle}, max {max_idle}) or {life} s after creation; then, on an \
         out-of-memory kill (the interpreter restarts, files stay) and on a server restart, \
         state is lost. At most {max} sessions holding {share} MB in all; beyond, it fails at \
         once (retry later). files: at most {upload} bytes per call.",
        idle = ss.idle_timeout_seconds,
        max_idle = ss.max_idle_timeout_seconds,
        life = ss.max_lifetime_seconds,
        max = ss.max_sessions,
        share = ss.memory_budget_mb(c),
        upload = ss.max_upload_bytes,
        ceiling = sc.memory_mb,
        cpus = fmt_num(sc.cpus),
    );
    vec![
        Described {
            name: "run_code",
            description: run_code,
            annotations: hints(false, false, false),
        },
        Described {
            name: "start_run",
            description: format!(
                "Start run_code's work and answer at once with {{run_id, status, limits}}; get the \
                 report with get_result (wait_seconds up to {MAX_WAIT_SECONDS:.0}), stop it with \
                 stop_run. Arguments as run_code."
            ),
            annotations: hints(false, false, false),
        },
        Described {
            name: "get_result",
            description: format!(
                "A run's report; queued or running until it ends. wait_seconds (0 to \
                 {MAX_WAIT_SECONDS:.0}) waits for the end. Reports are kept {} s after a run ends.",
                c.runs.result_retention_seconds
            ),
            annotations: hints(true, false, true),
        },
        Described {
            name: "stop_run",
            description: "Stop a run (or a session's execution: its interpreter is interrupted \
                          first, so its state is kept if it answers) and return the report with \
                          the output so far; a finished run's report comes back unchanged."
                .into(),
            annotations: hints(false, true, true),
        },
        Described {
            name: "list_supported_languages",
            description: format!(
                "The {n} languages (id, aliases, image, version, packages programs can import, \
                 session: stateful or files) and the default and maximum limits. Nothing can be \
                 installed at run time."
            ),
            annotations: hints(true, false, true),
        },
        Described {
            name: "get_execution_history",
            description: format!(
                "Past runs, newest first (status, language, limits, durations, output sizes, code \
                 sha256 and preview). Filters: limit (1 to {MAX_HISTORY_LIMIT}, default 20), status, \
                 language, session_id."
            ),
            annotations: hints(true, false, true),
        },
        Described {
            name: "create_session",
            description: create_session,
            annotations: hints(false, false, false),
        },
        Described {
            name: "read_session_file",
            description: format!(
                "Read a file of a session's working directory without running code: an image, \
                 text or a resource, plus its size and sha256; a folder gives its entries. At most \
                 {} bytes per call; offset and max_bytes reach the rest. Symbolic links are not \
                 followed.",
                s.output_limit_bytes
            ),
            annotations: hints(true, false, true),
        },
        Described {
            name: "list_sessions",
            description: "The open sessions: id, language, limits, executions, workspace bytes, \
                          interpreter state, created, last used and expiry times."
                .into(),
            annotations: hints(true, false, true),
        },
        Described {
            name: "close_session",
            description: "Close a session: an execution under way is stopped, then its container \
                          and files are removed at once. Later calls naming it are told it was \
                          closed."
                .into(),
            annotations: hints(false, true, true),
        },
    ]
}
