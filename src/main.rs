//! The `codebox` binary: parse the command line, send logs to stderr, map errors to exit codes.

use clap::Parser;

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
    let cli = codebox::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
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
