//! Test cases (compile once, each case in a fresh container of its own) and the compile
//! cache, on the fake engine and against Docker.

use std::sync::Arc;

use codebox::config::Config;
use codebox::contract::{Compare, RunRequest, TestInput, ValidRequest};
use codebox::engine::fake::{exited, Behaviour, FakeEngine};
use codebox::engine::ContainerEngine;
use codebox::executor::{new_run_id, Executor};
use codebox::report::{RunReport, Stage, Status};
use tokio_util::sync::CancellationToken;

use crate::common::{self, registry, request};

fn case(stdin: &str, expected: Option<&str>) -> TestInput {
    TestInput {
        stdin: Some(stdin.into()),
        expected_stdout: expected.map(str::to_string),
        ..Default::default()
    }
}

fn with_tests(language: &str, code: &str, tests: Vec<TestInput>) -> RunRequest {
    RunRequest {
        tests: Some(tests),
        ..request(language, code)
    }
}

async fn run_on(exec: &Executor, req: RunRequest) -> RunReport {
    let valid = ValidRequest::new(req, &registry(), exec.config()).expect("valid");
    exec.execute(&new_run_id(), &valid, 0, CancellationToken::new())
        .await
}

fn fake_executor(fake: &Arc<FakeEngine>) -> Executor {
    let engine: Arc<dyn ContainerEngine> = fake.clone();
    Executor::new(engine, Arc::new(Config::default()), "fake".into())
}

#[tokio::test]
async fn test_cases_compile_once_and_each_runs_in_a_container_of_its_own() {
    let fake = Arc::new(FakeEngine::new());
    let exec = fake_executor(&fake);
    fake.script(exited(0, "")); // compile
    fake.script(exited(0, "2\n"));
    fake.script(exited(0, "4\n"));
    fake.script(exited(0, "7\n"));
    let tests = vec![
        case("1", Some("2")),
        case("2", Some("4\n\n")),
        case("3", Some("6")),
    ];
    let r = run_on(&exec, with_tests("cpp", "int main(){}", tests)).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let specs = fake.specs();
    assert_eq!(specs.len(), 4, "one compile and three run containers");
    assert!(specs[0].name.ends_with("-compile"));
    let names: std::collections::BTreeSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.len(), 4, "every case has a fresh container");
    let passed: Vec<Option<bool>> = r.tests.iter().map(|t| t.passed).collect();
    assert_eq!(passed, [Some(true), Some(true), Some(false)]);
    let s = r.tests_summary.unwrap();
    assert_eq!((s.passed, s.failed, s.total), (2, 1, 3));
    assert_eq!(r.message, "2 of 3 tests passed");
    let payloads = fake.payloads();
    let stdins: Vec<Option<&[u8]>> = payloads
        .iter()
        .skip(1)
        .map(|p| p.stdin.as_deref())
        .collect();
    assert_eq!(stdins.len(), 3);
    assert!(stdins.contains(&Some(&b"3"[..])));
}

#[tokio::test]
async fn a_check_runs_once_for_all_cases_and_its_failure_ends_the_run() {
    let fake = Arc::new(FakeEngine::new());
    let exec = fake_executor(&fake);
    let tests = vec![case("a", None), case("b", None), case("c", None)];
    let r = run_on(&exec, with_tests("python", "print(input())", tests.clone())).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    // Python checks in the program's own process (check_in_run), for the first case only.
    let checks: Vec<bool> = fake.payloads().iter().map(|p| p.check_in_run).collect();
    assert_eq!(checks, [true, false, false]);
    let runs: Vec<String> = fake
        .payloads()
        .iter()
        .map(|p| p.run.clone().unwrap().join(" "))
        .collect();
    assert_eq!(
        runs[1], "python3 main.py",
        "later cases run the program alone"
    );
    assert_eq!(r.tests[0].passed, None, "no expected_stdout");

    let fake = Arc::new(FakeEngine::new());
    let exec = fake_executor(&fake);
    let mut frames = codebox::engine::protocol::frame(b'P', b"check");
    frames.extend(codebox::engine::protocol::frame(
        b'X',
        b"phase=check\nend=exited\ncode=1\n",
    ));
    frames.extend(codebox::engine::protocol::frame(b'Z', b""));
    fake.script(Behaviour::Raw(frames));
    let r = run_on(&exec, with_tests("python", "print(", tests)).await;
    assert_eq!(
        (r.status, r.stage),
        (Status::CompileError, Some(Stage::Compile))
    );
    assert_eq!(fake.attached(), 1, "no case ran after the failed check");
}

#[tokio::test]
async fn the_top_status_is_the_most_severe_of_the_cases() {
    let fake = Arc::new(FakeEngine::new());
    let exec = fake_executor(&fake);
    fake.script(exited(1, ""));
    fake.script(Behaviour::TimedOut {
        stdout: String::new(),
    });
    fake.script(exited(0, ""));
    let tests = vec![case("1", None), case("2", None), case("3", None)];
    let r = run_on(&exec, with_tests("bash", "cat", tests)).await;
    assert_eq!(r.status, Status::TimedOut);
    let statuses: Vec<Status> = r.tests.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        [Status::Failed, Status::TimedOut, Status::Succeeded]
    );
    assert_eq!(r.tests_summary.unwrap().passed, 1);
}

#[test]
fn test_cases_are_validated_like_a_run() {
    let config = Config::default();
    let reject = |req: RunRequest| {
        ValidRequest::new(req, &registry(), &config)
            .unwrap_err()
            .to_string()
    };
    let mut both = with_tests("python", "print(1)", vec![case("x", None)]);
    both.stdin = Some("y".into());
    assert!(reject(both).starts_with("tests: cannot be combined"));
    let many = with_tests("python", "print(1)", vec![case("x", None); 65]);
    assert_eq!(reject(many), "tests: has 65 cases; the maximum is 64");
    let big = "x".repeat(config.sandbox.max_stdin_bytes + 1);
    let msg = reject(with_tests(
        "python",
        "1",
        vec![case("a", None), case(&big, None)],
    ));
    assert!(msg.starts_with("tests[1].stdin: is "), "{msg}");
    let bad_name = TestInput {
        name: Some("a\nb".into()),
        ..Default::default()
    };
    assert!(reject(with_tests("python", "1", vec![bad_name])).starts_with("tests[0].name"));
    let exact = RunRequest {
        compare: Some(Compare::Exact),
        ..with_tests("python", "1", vec![case("x", Some("y"))])
    };
    let v = ValidRequest::new(exact, &registry(), &config).unwrap();
    assert_eq!(
        (v.compare, v.tests[0].name.as_str()),
        (Compare::Exact, "test-1")
    );
}

#[tokio::test]
async fn the_compile_cache_skips_the_compile_container_for_the_same_inputs_only() {
    let fake = Arc::new(FakeEngine::new());
    let exec = fake_executor(&fake);
    let first = run_on(&exec, request("cpp", "int main(){}")).await;
    assert_eq!(first.status, Status::Succeeded, "{}", first.message);
    assert!(!first.compile.as_ref().unwrap().cached);
    let again = run_on(&exec, request("cpp", "int main(){}")).await;
    assert_eq!(again.status, Status::Succeeded, "{}", again.message);
    let c = again.compile.unwrap();
    assert!(c.cached && c.duration_ms == 0 && c.usage.cpu_time_ms.is_none());
    let compiles = |f: &FakeEngine| {
        f.specs()
            .iter()
            .filter(|s| s.name.ends_with("-compile"))
            .count()
    };
    assert_eq!(compiles(&fake), 1, "the second run compiled nothing");
    let binary = fake
        .payloads()
        .last()
        .unwrap()
        .files
        .entries()
        .iter()
        .any(|e| e.path == "main");
    assert!(binary, "the cached artifacts reach the run stage");
    let other = run_on(&exec, request("cpp", "int main(){return 0;}")).await;
    assert!(!other.compile.unwrap().cached);
    assert_eq!(compiles(&fake), 2);
    // A compile error is remembered too.
    fake.script(Behaviour::Exit {
        code: 1,
        stdout: String::new(),
        stderr: "error: nope".into(),
    });
    let refused = run_on(&exec, request("cpp", "int main(")).await;
    assert_eq!(refused.status, Status::CompileError);
    let refused_again = run_on(&exec, request("cpp", "int main(")).await;
    assert_eq!(refused_again.status, Status::CompileError);
    let c = refused_again.compile.unwrap();
    assert!(c.cached && c.stderr == "error: nope", "{c:?}");
    assert_eq!(compiles(&fake), 3);
}

#[tokio::test]
async fn against_docker_cases_pass_fail_and_compiled_artifacts_come_from_the_cache() {
    let exec = common::docker_executor();
    let code =
        "#include <iostream>\nint main(){long n; std::cin >> n; std::cout << n * 2 << \"\\n\";}";
    let tests = vec![
        case("1", Some("2")),
        case("21", Some("42")),
        case("5", Some("11")),
    ];
    let r = common::run_with(&exec, with_tests("cpp", code, tests.clone())).await;
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    let got: Vec<&str> = r.tests.iter().map(|t| t.stdout.as_str()).collect();
    assert_eq!(got, ["2\n", "42\n", "10\n"]);
    let s = r.tests_summary.unwrap();
    assert_eq!((s.passed, s.failed), (2, 1));
    assert!(r.tests.iter().all(|t| t.usage.cpu_time_ms.is_some()));
    let again = common::run_with(&exec, with_tests("cpp", code, tests)).await;
    assert!(again.compile.as_ref().unwrap().cached, "{again:?}");
    assert_eq!(
        again.tests_summary.unwrap().passed,
        2,
        "the cached binary runs"
    );
}

#[tokio::test]
async fn a_run_that_spoils_its_compiled_program_leaves_the_cached_one_intact() {
    // The run stage gets its own copy of the artifacts in its own tmpfs: replacing the binary
    // there changes nothing for the next run the cache serves.
    let exec = common::docker_executor();
    let code = format!(
        "// {}\n#include <stdio.h>\n#include <sys/stat.h>\n#include <unistd.h>\n\
         int main(int argc, char **argv) {{\n\
           if (argc > 1) {{\n\
             unlink(argv[0]);\n\
             FILE *f = fopen(argv[0], \"w\");\n\
             fputs(\"#!/bin/sh\\necho spoiled\\n\", f);\n\
             fclose(f);\n\
             chmod(argv[0], 0755);\n\
             puts(\"replaced\");\n\
             return 0;\n\
           }}\n\
           puts(\"intact\");\n\
         }}\n",
        new_run_id()
    );
    let spoil = RunRequest {
        args: Some(vec!["spoil".into()]),
        ..request("c", &code)
    };
    let first = common::run_with(&exec, spoil).await;
    assert_eq!(first.status, Status::Succeeded, "{first:?}");
    assert_eq!(first.stdout, "replaced\n");
    assert!(!first.compile.as_ref().unwrap().cached);
    let again = common::run_with(&exec, request("c", &code)).await;
    assert!(again.compile.as_ref().unwrap().cached, "{again:?}");
    assert_eq!(again.stdout, "intact\n", "{again:?}");
}
