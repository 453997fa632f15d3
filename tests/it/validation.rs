//! Bad requests are refused before any engine is asked, naming the field (SECURITY.md row
//! 28): unknown languages and fields, empty or oversized code, bad file paths, contents and
//! counts, limits over a ceiling or not positive and finite; and what is valid is kept
//! exactly.

use codebox::config::Config;
use codebox::contract::{FileInput, LimitsInput, RunRequest, ValidRequest};

use crate::common::{registry, request, valid};

fn reject(req: RunRequest) -> String {
    let e = ValidRequest::new(req, &registry(), &Config::default()).unwrap_err();
    e.to_string()
}

fn with_limits(
    memory_mb: Option<f64>,
    timeout_seconds: Option<f64>,
    cpus: Option<f64>,
) -> RunRequest {
    RunRequest {
        limits: Some(LimitsInput {
            memory_mb,
            timeout_seconds,
            cpus,
        }),
        ..request("python", "print(1)")
    }
}

#[test]
fn unknown_language_is_rejected_naming_the_choices() {
    let msg = reject(request("intercal", "x"));
    assert!(
        msg.starts_with("language: unknown language `intercal`"),
        "{msg}"
    );
    assert!(msg.contains("python"), "{msg}");
}

#[test]
fn aliases_resolve_to_their_language() {
    assert_eq!(valid(request("py", "print(1)")).language.id, "python");
    assert_eq!(valid(request("C++", "int main(){}")).language.id, "cpp");
}

#[test]
fn empty_code_is_rejected() {
    assert_eq!(reject(request("python", "  \n")), "code: must not be empty");
}

#[test]
fn oversized_code_is_rejected() {
    let big = "#".repeat(Config::default().sandbox.max_code_bytes + 1);
    let msg = reject(request("python", &big));
    assert!(
        msg.starts_with("code: is 524289 bytes; the maximum is 524288 bytes"),
        "{msg}"
    );
}

#[test]
fn path_traversal_in_files_is_rejected() {
    for (path, why) in [
        ("../etc/passwd", "contains `..`"),
        ("a/../../x", "contains `..`"),
        ("/etc/passwd", "is absolute"),
        ("main.py", "clashes with the source file"),
        ("./main.py", "clashes with the source file"),
        ("", "relative path of 1 to 255 bytes"),
    ] {
        let req = RunRequest {
            files: Some(vec![FileInput {
                path: path.into(),
                content: "x".into(),
                encoding: None,
            }]),
            ..request("python", "print(1)")
        };
        let msg = reject(req);
        assert!(msg.starts_with("files[0].path:"), "{path}: {msg}");
        assert!(msg.contains(why), "{path}: {msg}");
    }
}

#[test]
fn limits_over_a_ceiling_are_rejected_not_clamped() {
    assert_eq!(
        reject(with_limits(Some(32768.0), None, None)),
        "limits.memory_mb: requested 32768 MB of memory; the maximum is 8192 MB"
    );
    assert_eq!(
        reject(with_limits(None, Some(7200.0), None)),
        "limits.timeout_seconds: requested 7200 s of wall-clock time; the maximum is 3600 s"
    );
    assert_eq!(
        reject(with_limits(None, None, Some(8.0))),
        "limits.cpus: requested 8 cpus of CPU; the maximum is 4 cpus"
    );
}

#[test]
fn non_positive_and_non_finite_limits_are_rejected() {
    for (req, field) in [
        (with_limits(Some(0.0), None, None), "limits.memory_mb"),
        (with_limits(Some(-5.0), None, None), "limits.memory_mb"),
        (with_limits(None, Some(0.0), None), "limits.timeout_seconds"),
        (
            with_limits(None, Some(f64::NAN), None),
            "limits.timeout_seconds",
        ),
        (
            with_limits(None, Some(f64::INFINITY), None),
            "limits.timeout_seconds",
        ),
        (with_limits(None, None, Some(-1.0)), "limits.cpus"),
        (with_limits(Some(100.5), None, None), "limits.memory_mb"),
    ] {
        let msg = reject(req);
        assert!(msg.starts_with(&format!("{field}:")), "{msg}");
    }
}

#[test]
fn a_timeout_under_a_millisecond_is_rejected_as_it_could_not_be_enforced() {
    // codebox-init counts whole milliseconds and reads 0 as "no deadline": a 0.0004 s limit
    // let a 3 s program finish (found by the protocol fuzzer's odd limits).
    for t in [0.0004, 1e-7, 5e-324] {
        let msg = reject(with_limits(None, Some(t), None));
        assert!(
            msg.starts_with("limits.timeout_seconds:") && msg.contains("the minimum is 0.001 s"),
            "{t}: {msg}"
        );
    }
    let v = valid(with_limits(None, Some(0.001), None));
    assert_eq!(v.limits.timeout_seconds, 0.001);
}

#[test]
fn the_memory_ceiling_is_the_smaller_of_the_setting_and_the_budget() {
    // limits.max_memory_mb 16384, runs.memory_budget_mb 8192: 10000 MB could never run.
    assert_eq!(
        reject(with_limits(Some(10000.0), None, None)),
        "limits.memory_mb: requested 10000 MB of memory; the maximum is 8192 MB"
    );
    let mut roomy = Config::default();
    roomy.runs.memory_budget_mb = 32768;
    assert_eq!(
        roomy.ceilings().memory_mb,
        16384,
        "then the setting is the ceiling"
    );
    let v = ValidRequest::new(with_limits(Some(16384.0), None, None), &registry(), &roomy);
    assert_eq!(v.expect("valid").limits.memory_mb, 16384);
}

#[test]
fn a_non_finite_limit_states_no_wrong_minimum() {
    let msg = reject(with_limits(None, Some(f64::NAN), None));
    assert_eq!(
        msg,
        "limits.timeout_seconds: must be a finite number (at most 3600 s)"
    );
}

#[test]
fn limits_within_ceilings_are_kept_exactly() {
    let v = valid(with_limits(Some(8192.0), Some(0.5), Some(4.0)));
    assert_eq!(
        (v.limits.memory_mb, v.limits.timeout_seconds, v.limits.cpus),
        (8192, 0.5, 4.0)
    );
    let d = valid(request("python", "print(1)"));
    assert_eq!(
        (d.limits.memory_mb, d.limits.timeout_seconds, d.limits.cpus),
        (512, 30.0, 1.0)
    );
}

#[test]
fn bad_base64_file_content_is_rejected() {
    let req = RunRequest {
        files: Some(vec![FileInput {
            path: "x.bin".into(),
            content: "not base64!".into(),
            encoding: Some(codebox::contract::Encoding::Base64),
        }]),
        ..request("python", "print(1)")
    };
    assert!(reject(req).starts_with("files[0].content: is not valid base64"));
}

#[test]
fn too_many_files_are_rejected() {
    let files = (0..33)
        .map(|i| FileInput {
            path: format!("f{i}.txt"),
            content: String::new(),
            encoding: None,
        })
        .collect();
    let req = RunRequest {
        files: Some(files),
        ..request("python", "print(1)")
    };
    assert_eq!(reject(req), "files: has 33 files; the maximum is 32");
}

#[test]
fn unknown_request_fields_are_rejected() {
    let err =
        serde_json::from_str::<RunRequest>(r#"{"language":"python","code":"1","network":true}"#)
            .unwrap_err();
    assert!(err.to_string().contains("unknown field `network`"), "{err}");
}
