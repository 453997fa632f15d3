//! `codebox config`: the effective configuration as a config file, or the list of settings.

use std::io::Write;

use crate::config::Config;

pub fn print(config: &Config, list: bool, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    if !list {
        // A comment, so that the output still reads back as a config file.
        writeln!(
            out,
            "# language registry in use: {}",
            super::registry_path(config).display()
        )?;
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
