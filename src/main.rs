//! The `codebox` binary: parse the command line, send logs to stderr, map errors to exit codes.

use clap::FromArgMatches;

/// An error and its causes, each cause said once: most of codebox's errors already quote
/// their cause, which `{:#}` would repeat.
fn describe(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn main() {
    let matches = codebox::cli::command().get_matches();
    let cli = codebox::cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Colour only for a person at a terminal, and never when NO_COLOR is set (no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CODEBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("codebox: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = match runtime.block_on(codebox::cli::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("codebox: {}", describe(&e));
            2
        }
    };
    // Let background cleanups (container removal after a cancelled run) finish.
    runtime.shutdown_timeout(std::time::Duration::from_secs(10));
    std::process::exit(code);
}
