//! `codebox images build|list`, and building a missing image on first use, with progress.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::app::App;
use crate::images;
use crate::registry::{Image, Language};

/// Images built at once by `codebox images build` unless `--jobs` says otherwise.
const DEFAULT_BUILD_JOBS: u16 = 3;

#[derive(Debug, clap::Subcommand)]
pub enum ImagesAction {
    /// Build images (default: all) from their folders under `images/`.
    Build {
        names: Vec<String>,
        /// Rebuild every layer, e.g. to pick up Debian's security updates.
        #[arg(long)]
        no_cache: bool,
        /// Images built at once (each after the images it builds on).
        #[arg(long, default_value_t = DEFAULT_BUILD_JOBS, value_parser = clap::value_parser!(u16).range(1..=16))]
        jobs: u16,
    },
    /// Show which images are present.
    List {
        #[arg(long)]
        json: bool,
    },
}

pub async fn images(
    app: &App,
    action: ImagesAction,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    match action {
        ImagesAction::Build {
            names,
            no_cache,
            jobs,
        } => {
            app.engine.ping().await?;
            let names: Vec<String> = if names.is_empty() {
                app.registry.images.keys().cloned().collect()
            } else {
                names
            };
            // An image another one builds on comes first; one that was not asked for is
            // built only when it is missing.
            let mut todo = Vec::new();
            for image in images::build_order(&app.registry, &names)? {
                let asked = names.contains(&image.name);
                if asked || app.engine.inspect_image(&image.tag).await?.is_none() {
                    todo.push(image);
                }
            }
            let started = Instant::now();
            let built = todo.len();
            build_all(app, todo, no_cache, usize::from(jobs)).await?;
            if built > 1 {
                eprintln!(
                    "built {built} images in {:.1} s ({jobs} at once)",
                    started.elapsed().as_secs_f64()
                );
            }
            Ok(0)
        }
        ImagesAction::List { json } => {
            let list = images::status(app.engine.as_ref(), &app.registry).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
                super::flush(out)?;
                return Ok(0);
            }
            writeln!(
                out,
                "{:<10} {:<24} {:<8} {:>9}  VERSIONS",
                "IMAGE", "TAG", "PRESENT", "SIZE"
            )?;
            for i in &list {
                let versions: Vec<String> = i
                    .versions
                    .iter()
                    .map(|(l, v)| format!("{l}: {v}"))
                    .collect();
                writeln!(
                    out,
                    "{:<10} {:<24} {:<8} {:>9}  {}",
                    i.name,
                    i.tag,
                    if i.present { "yes" } else { "missing" },
                    i.size_bytes
                        .map(|s| format!("{} MB", s / 1_000_000))
                        .unwrap_or_else(|| "-".into()),
                    versions.join("; ")
                )?;
            }
            super::flush(out)?;
            Ok(0)
        }
    }
}

/// Build the image of `lang` (and what it builds on) if it is missing, showing progress on
/// stderr.
pub async fn ensure(app: &App, lang: &Language) -> anyhow::Result<()> {
    if app.engine.inspect_image(&lang.image.tag).await?.is_some() {
        return Ok(());
    }
    for image in images::build_order(&app.registry, std::slice::from_ref(&lang.image.name))? {
        if app.engine.inspect_image(&image.tag).await?.is_some() {
            continue;
        }
        eprintln!(
            "codebox: image {} is missing; building it from {} (first use only)",
            image.tag,
            image.context.display()
        );
        build(app, image, false, &indicatif::MultiProgress::new()).await?;
    }
    Ok(())
}

/// Build `todo` (each after the images it builds on, which come earlier in it), up to `jobs`
/// at once. After a failure no new build starts; those under way finish, and the first error
/// is returned.
async fn build_all(
    app: &App,
    todo: Vec<&Image>,
    no_cache: bool,
    jobs: usize,
) -> anyhow::Result<()> {
    let bars = indicatif::MultiProgress::new();
    let mut pending = todo;
    let waits_for = |image: &Image, pending: &[&Image], running: &BTreeSet<String>| {
        images::dependencies(&app.registry, image)
            .iter()
            .any(|d| running.contains(&d.name) || pending.iter().any(|p| p.name == d.name))
    };
    let mut running = BTreeSet::new();
    let mut under_way = FuturesUnordered::new();
    let mut first_error = None;
    loop {
        while first_error.is_none() && under_way.len() < jobs.max(1) {
            let Some(i) = pending
                .iter()
                .position(|img| !waits_for(img, &pending, &running))
            else {
                break;
            };
            let image = pending.remove(i);
            running.insert(image.name.clone());
            let bars = &bars;
            under_way.push(async move { (image, build(app, image, no_cache, bars).await) });
        }
        let Some((image, result)) = under_way.next().await else {
            break;
        };
        running.remove(&image.name);
        // The first failure is returned (and printed by the caller); later ones are printed.
        match (result, &first_error) {
            (Err(e), None) => {
                // Say which image, unless the error already does.
                let named = format!("{e:#}").contains(&image.tag);
                first_error = Some(if named {
                    e
                } else {
                    e.context(format!("building {}", image.tag))
                });
            }
            (Err(e), Some(_)) => bars.suspend(|| eprintln!("failed to build {}: {e:#}", image.tag)),
            (Ok(()), _) => {}
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Build one image with a spinner on stderr (or, when stderr is not a terminal, one line per
/// Dockerfile step, prefixed with the image's tag since several may build at once).
async fn build(
    app: &App,
    image: &Image,
    no_cache: bool,
    bars: &indicatif::MultiProgress,
) -> anyhow::Result<()> {
    let bar = bars.add(indicatif::ProgressBar::new_spinner());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {prefix} [{elapsed}] {wide_msg}")
            .expect("static template"),
    );
    bar.set_prefix(image.tag.clone());
    bar.enable_steady_tick(Duration::from_millis(120));
    let started = Instant::now();
    let progress = {
        let bar = bar.clone();
        let tag = image.tag.clone();
        move |line: &str| {
            if line.starts_with("Step ") || !bar.is_hidden() {
                bar.set_message(line.to_string());
            }
            if bar.is_hidden() && line.starts_with("Step ") {
                eprintln!("  {tag}: {line}");
            }
        }
    };
    let result = images::build(&app.executor, &app.registry, image, no_cache, &progress).await;
    bar.finish_and_clear();
    bars.remove(&bar);
    let id = result?;
    bars.suspend(|| {
        eprintln!(
            "built {} ({}) in {:.1} s",
            image.tag,
            short_id(&id),
            started.elapsed().as_secs_f64()
        )
    });
    Ok(())
}

/// The first 12 hex digits of an image id, however short or odd the daemon's answer.
fn short_id(id: &str) -> String {
    id.trim_start_matches("sha256:").chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn short_ids_never_slice_past_the_end() {
        assert_eq!(super::short_id("sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(super::short_id("sha256:ab"), "ab");
        assert_eq!(super::short_id(""), "");
        assert_eq!(super::short_id("é"), "é");
    }
}
