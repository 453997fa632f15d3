//! `codebox config`: the effective configuration as a config file, every setting at its
//! default, or the list of settings.

use std::io::Write;

use crate::config::Config;

/// `codebox config` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    /// List every setting with its file key, `--set` path and variables.
    #[arg(long, conflicts_with = "defaults")]
    pub list: bool,
    /// Print every setting at its shipped default, with its documentation, as a config file
    /// (what docs/mcp.md shows).
    #[arg(long)]
    pub defaults: bool,
}

pub fn print(
    config: &Config,
    args: &ConfigArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    if args.defaults {
        write!(out, "{}", crate::config::defaults_toml())?;
        super::flush(out)?;
        return Ok(0);
    }
    if !args.list {
        // Comments, so that the output still reads back as a config file.
        match super::registry_file(config) {
            Ok(r) => writeln!(
                out,
                "# language registry in use: {} ({})",
                r.path.display(),
                r.why
            )?,
            Err(e) => writeln!(out, "# {e}")?,
        }
        write!(out, "{}", config.to_toml())?;
        super::flush(out)?;
        return Ok(0);
    }
    writeln!(
        out,
        "{:<34} {:<40} DESCRIPTION",
        "SETTING (file key, --set)", "VARIABLES"
    )?;
    for s in Config::settings() {
        let mut vars = match &s.env_short {
            Some(short) => format!("{} {short}", s.env),
            None => s.env.clone(),
        };
        if let Some(fallback) = &s.env_fallback {
            vars.push_str(&format!(" (else {fallback})"));
        }
        let doc = s.doc.split("\n\n").next().unwrap_or("").replace('\n', " ");
        writeln!(out, "{:<34} {:<40} {doc}", s.path, vars)?;
    }
    super::flush(out)?;
    Ok(0)
}
