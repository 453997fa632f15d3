//! The registry we ship: every entry is complete, has an image folder, and smoke samples of
//! each kind.

use codebox::registry::is_safe_file_name;
use codebox::report::Status;

use crate::common::{registry, root};

#[test]
fn shipped_registry_has_the_promised_languages() {
    let r = registry();
    for id in [
        "python",
        "cpp",
        "c",
        "javascript",
        "typescript",
        "go",
        "rust",
        "java",
        "bash",
        "ruby",
        "php",
        "lua",
        "perl",
        "csharp",
        "kotlin",
        "scala",
        "clojure",
        "d",
        "fortran",
        "pascal",
        "cobol",
        "erlang",
        "elixir",
        "ocaml",
        "nim",
        "crystal",
        "prolog",
        "racket",
        "scheme",
        "commonlisp",
        "tcl",
        "awk",
        "octave",
        "verilog",
        // Issue 17.
        "ada",
        "algol68",
        "basic",
        "coffeescript",
        "emacslisp",
        "fish",
        "forth",
        "groovy",
        "haxe",
        "icon",
        "jq",
        "llvmir",
        "modula2",
        "nasm",
        "objectivec",
        "pike",
        "raku",
        "rexx",
        "sml",
        "sql",
        "vala",
        "vhdl",
        "wat",
        "zig",
        "zsh",
    ] {
        assert!(r.languages.contains_key(id), "missing language {id}");
    }
    assert!(r.languages.len() >= 60, "{} languages", r.languages.len());
}

#[test]
fn shipped_registry_tables_are_sorted_by_id() {
    let text = std::fs::read_to_string(root().join("languages.toml")).unwrap();
    for prefix in ["[images.", "[languages."] {
        let ids: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|l| l.trim_end_matches(']'))
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "{prefix}...] tables are not sorted");
    }
}

fn instructions(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with('#'))
        .collect()
}

#[test]
fn the_base_image_holds_what_every_image_shares() {
    let base = &registry().images["base"];
    let dir = root().join(&base.context);
    let text = std::fs::read_to_string(dir.join("Dockerfile")).unwrap();
    let lines = instructions(&text);
    assert!(lines.iter().any(|l| l.starts_with("FROM debian:bookworm")));
    // Each run's containers lease a uid of 10001..=10064: each needs a passwd entry.
    assert!(text.contains("seq 2 64"), "no sandbox2..sandbox64 users");
    assert!(
        text.contains("-m 1777 /workspace"),
        "/workspace is not 1777"
    );
    assert!(
        text.contains("/usr/local/bin/codebox-init"),
        "no codebox-init"
    );
    assert!(
        text.contains("gcc -std=c11 -static"),
        "codebox-init is not static"
    );
    let install = std::fs::read_to_string(dir.join("codebox-install")).unwrap();
    assert!(install.contains("--no-install-recommends"));
    assert!(
        install.contains("rm -rf /var/lib/apt/lists/*"),
        "keeps apt lists"
    );
    assert!(!lines
        .iter()
        .any(|l| l.starts_with("CMD") || l.starts_with("ENTRYPOINT")));
}

#[test]
fn every_language_image_builds_on_the_base_as_a_sandbox_user() {
    let r = registry();
    let base = &r.images["base"];
    for image in r.images.values().filter(|i| i.name != "base") {
        let dockerfile = root().join(&image.context).join("Dockerfile");
        let text = std::fs::read_to_string(&dockerfile)
            .unwrap_or_else(|e| panic!("{}: {e}", dockerfile.display()));
        let lines = instructions(&text);
        let has = |p: &str| lines.iter().any(|l| l.starts_with(p));
        // The final stage is the image; an earlier stage (unpacking a downloaded wheel) is
        // built on the base too.
        assert_eq!(
            lines.iter().rfind(|l| l.starts_with("FROM")).copied(),
            Some(format!("FROM {}", base.tag).as_str()),
            "{}: not built on the base image",
            image.name
        );
        for from in lines.iter().filter(|l| l.starts_with("FROM")) {
            assert!(
                from.starts_with(&format!("FROM {} AS ", base.tag))
                    || *from == format!("FROM {}", base.tag),
                "{}: a stage not built on the base image: {from}",
                image.name
            );
        }
        assert_eq!(
            lines.iter().rfind(|l| l.starts_with("USER")).copied(),
            Some("USER 10001:10001"),
            "{}: does not end as the sandbox user",
            image.name
        );
        assert!(
            !has("CMD") && !has("ENTRYPOINT"),
            "{}: has CMD or ENTRYPOINT",
            image.name
        );
        assert!(
            !text.contains("apt-get install"),
            "{}: installs without codebox-install (which drops apt's caches)",
            image.name
        );
        assert!(image.tag.starts_with("codebox/"), "{}", image.tag);
        assert!(
            r.languages_of_image(&image.name).next().is_some(),
            "{}: no language uses it",
            image.name
        );
    }
}

/// SPEC section 11: these languages keep their interpreter's state in a session. Each names a
/// driver that its image's Dockerfile installs from the image folder (docs/adding-a-language.md,
/// "Adding a session driver"), and no other language has one.
#[test]
fn the_stateful_languages_have_a_driver_their_image_installs() {
    let r = registry();
    let stateful: Vec<&str> = r
        .languages
        .values()
        .filter(|l| l.is_stateful())
        .map(|l| l.id.as_str())
        .collect();
    assert_eq!(stateful, ["bash", "javascript", "python", "r", "ruby"]);
    for lang in r.languages.values().filter(|l| l.is_stateful()) {
        let driver = lang.session_driver.as_ref().unwrap();
        let installed = driver
            .iter()
            .find_map(|a| a.strip_prefix("/usr/local/lib/codebox/"))
            .unwrap_or_else(|| panic!("{}: the driver is not in /usr/local/lib/codebox/", lang.id));
        let context = root().join(&lang.image.context);
        assert!(
            context.join(installed).is_file(),
            "{}: {installed} is not in {}",
            lang.id,
            context.display()
        );
        let dockerfile = std::fs::read_to_string(context.join("Dockerfile")).unwrap();
        let copy = format!("COPY {installed} /usr/local/lib/codebox/{installed}");
        let chmod = format!("RUN chmod 0644 /usr/local/lib/codebox/{installed}");
        let lines = instructions(&dockerfile);
        assert!(
            lines.contains(&copy.as_str()) && lines.contains(&chmod.as_str()),
            "{}: the Dockerfile does not install {installed} world-readable ({copy}, {chmod})",
            lang.id
        );
    }
}

#[test]
fn every_language_entry_is_complete() {
    for lang in registry().languages.values() {
        assert!(
            is_safe_file_name(&lang.source_file),
            "{}: source file",
            lang.id
        );
        assert!(lang.version.is_some(), "{}: no version command", lang.id);
        assert!(
            !lang.extensions.is_empty(),
            "{}: no file extension",
            lang.id
        );
        for (k, v) in &lang.env {
            if v.starts_with('/') {
                assert!(
                    v.starts_with("/tmp") || v.starts_with("/workspace") || v.starts_with("/usr"),
                    "{}: env {k}={v} points outside /tmp and /workspace",
                    lang.id
                );
            }
        }
    }
}

#[test]
fn every_language_has_the_four_kinds_of_smoke_sample() {
    for lang in registry().languages.values() {
        let t = &lang.tests;
        let hello = t.iter().any(|s| {
            s.expect.status == Status::Succeeded
                && s.stdin.is_none()
                && s.expect.stdout.as_deref() == Some("hello\n")
        });
        let stdin = t.iter().any(|s| {
            s.expect.status == Status::Succeeded && s.stdin.is_some() && s.expect.stdout.is_some()
        });
        let exit = t.iter().any(|s| {
            s.expect.status == Status::Failed && matches!(s.expect.exit_code, Some(c) if c != 0)
        });
        let error = if lang.can_fail_to_compile() {
            t.iter().any(|s| {
                s.expect.status == Status::CompileError && s.expect.stderr_contains.is_some()
            })
        } else {
            t.iter()
                .any(|s| s.expect.status == Status::Failed && s.expect.stderr_contains.is_some())
        };
        assert!(
            hello && stdin && exit && error,
            "{}: hello {hello}, stdin {stdin}, exit {exit}, error {error}",
            lang.id
        );
    }
}

#[test]
fn every_extension_maps_to_one_language() {
    let r = registry();
    let mut seen = std::collections::BTreeMap::new();
    for lang in r.languages.values() {
        for ext in &lang.extensions {
            if let Some(other) = seen.insert(ext.clone(), lang.id.clone()) {
                panic!("extension .{ext} is claimed by {other} and {}", lang.id);
            }
        }
    }
}

/// The README's language table, as the registry has it.
fn readme_language_table() -> String {
    let r = registry();
    let mut out = format!(
        "{} languages ship (`codebox languages` adds the toolchain versions):\n\n",
        r.languages.len()
    );
    out.push_str("| id | language | image | syntax errors found |\n|---|---|---|---|\n");
    for lang in r.languages.values() {
        let stage = if lang.is_compiled() {
            "by the compile stage"
        } else if lang.check.is_some() {
            "by a check before the run"
        } else {
            "while running"
        };
        out.push_str(&format!(
            "| `{}` | {} | `{}` | {stage} |\n",
            lang.id, lang.display_name, lang.image.tag
        ));
    }
    // A blank line ends the table before the end marker.
    out.push('\n');
    out
}

#[test]
fn the_readme_lists_the_registry_languages() {
    const BEGIN: &str =
        "<!-- languages: kept in step with languages.toml by tests/it/registry_file.rs -->\n";
    const END: &str = "<!-- /languages -->";
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find(BEGIN)
        .expect("README.md has no languages marker")
        + BEGIN.len();
    let end = start
        + readme[start..]
            .find(END)
            .expect("README.md has no end marker");
    let expected = readme_language_table();
    assert!(
        readme[start..end] == expected,
        "README.md's language table is out of step with languages.toml; between the markers it should read:\n{expected}"
    );
}

/// Judge0 CE 1.13.1's active language ids (`db/languages/active.rb` of that release), with
/// the codebox language that serves each one codebox ships; `None`: a language codebox does
/// not ship.
const JUDGE0_1_13_1: &[(u32, Option<&str>)] = &[
    (43, None), // Plain Text
    (44, None), // Executable
    (45, Some("nasm")),
    (46, Some("bash")),
    (47, None), // Basic (FBC)
    (48, Some("c")),
    (49, Some("c")),
    (50, Some("c")),
    (51, Some("csharp")),
    (52, Some("cpp")),
    (53, Some("cpp")),
    (54, Some("cpp")),
    (55, Some("commonlisp")),
    (56, Some("d")),
    (57, Some("elixir")),
    (58, Some("erlang")),
    (59, Some("fortran")),
    (60, Some("go")),
    (61, Some("haskell")),
    (62, Some("java")),
    (63, Some("javascript")),
    (64, Some("lua")),
    (65, Some("ocaml")),
    (66, Some("octave")),
    (67, Some("pascal")),
    (68, Some("php")),
    (69, Some("prolog")),
    (70, None), // Python 2.7
    (71, Some("python")),
    (72, Some("ruby")),
    (73, Some("rust")),
    (74, Some("typescript")),
    (75, Some("c")),
    (76, Some("cpp")),
    (77, Some("cobol")),
    (78, Some("kotlin")),
    (79, Some("objectivec")),
    (80, Some("r")),
    (81, Some("scala")),
    (82, Some("sql")),
    (83, None), // Swift
    (84, None), // Visual Basic.Net
    (85, Some("perl")),
    (86, Some("clojure")),
    (87, None), // F#
    (88, Some("groovy")),
    (89, None), // Multi-file program
];

#[test]
fn every_language_has_judge0_ids_and_judge0_ids_mean_what_judge0_1_13_1_means() {
    let r = registry();
    for (id, lang) in JUDGE0_1_13_1 {
        assert_eq!(
            r.by_judge0_id(*id as i64).map(|l| l.id.as_str()),
            *lang,
            "Judge0 CE 1.13.1 language id {id}"
        );
    }
    for lang in r.languages.values() {
        let first = lang.judge0_ids.first().copied();
        assert!(
            first.is_some(),
            "language `{}` has no judge0_ids: give it its Judge0 CE 1.13.1 ids, or the next free id from 1001 up",
            lang.id
        );
        for id in &lang.judge0_ids {
            assert!(
                JUDGE0_1_13_1.iter().any(|(j, _)| j == id) || *id >= 1001,
                "language `{}`: id {id} is neither a Judge0 CE 1.13.1 id nor 1001 or above",
                lang.id
            );
        }
    }
}
