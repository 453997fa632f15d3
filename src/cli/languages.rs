//! `codebox languages`: the catalog, as a table or as the `list_supported_languages` JSON.

use std::io::Write;

use crate::app::App;
use crate::catalog;

pub async fn languages(app: &App, json: bool, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let cat = catalog::catalog(app.engine.as_ref(), &app.registry, &app.config).await?;
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&cat)?)?;
        super::flush(out)?;
        return Ok(0);
    }
    writeln!(
        out,
        "{:<12} {:<22} {:<24} {:<8} {:<9} VERSION",
        "LANGUAGE", "NAME", "IMAGE", "PRESENT", "COMPILED"
    )?;
    for l in &cat.languages {
        writeln!(
            out,
            "{:<12} {:<22} {:<24} {:<8} {:<9} {}",
            l.language,
            l.display_name,
            l.image,
            if l.image_present { "yes" } else { "no" },
            if l.compiled { "yes" } else { "no" },
            l.version.as_deref().unwrap_or("-")
        )?;
    }
    let (d, c) = (cat.limits.defaults, cat.limits.ceilings);
    writeln!(
        out,
        "\nlimits: memory {} MB (max {}), timeout {} s (max {}), cpus {} (max {})",
        d.memory_mb, c.memory_mb, d.timeout_seconds, c.timeout_seconds, d.cpus, c.cpus
    )?;
    super::flush(out)?;
    Ok(0)
}
