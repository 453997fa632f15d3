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
    let rows: Vec<[String; 7]> = cat
        .languages
        .iter()
        .map(|l| {
            [
                l.language.clone(),
                l.display_name.clone(),
                join_or_dash(&l.aliases, ", "),
                join_or_dash(
                    &l.extensions
                        .iter()
                        .map(|e| format!(".{e}"))
                        .collect::<Vec<_>>(),
                    " ",
                ),
                l.image.clone(),
                if l.image_present { "yes" } else { "no" }.to_string(),
                l.version.clone().unwrap_or_else(|| "-".to_string()),
            ]
        })
        .collect();
    let header = [
        "LANGUAGE",
        "NAME",
        "ALIASES",
        "EXTENSIONS",
        "IMAGE",
        "PRESENT",
        "VERSION",
    ];
    // Each column as wide as its widest cell (the last one is not padded).
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 < cells.len() {
                text.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            } else {
                text.push_str(cell);
            }
        }
        text
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in &rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
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

fn join_or_dash(items: &[String], sep: &str) -> String {
    if items.is_empty() {
        "-".to_string()
    } else {
        items.join(sep)
    }
}
