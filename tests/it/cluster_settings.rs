//! Servers that share a history over HTTP without `cluster.advertise_url` and
//! `cluster.secret_file` (or with a secret that is too short, or an advertise URL on port 0)
//! refuse to start, naming what is missing (SPEC section 15).

use std::process::Stdio;

use crate::cluster::secret_file;
use crate::common::{codebox_bin, root};
use crate::mcp_support::TOKEN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_history_over_http_without_the_cluster_settings_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.secret");
    std::fs::write(&short, "too short\n").unwrap();
    let good = secret_file(dir.path());
    // No database is reached: the refusal comes first.
    let history = "history.url=postgres://codebox@127.0.0.1:9/none";
    let advertise = "cluster.advertise_url=http://127.0.0.1:9";
    let short_set = format!("cluster.secret_file={}", short.display());
    let good_set = format!("cluster.secret_file={}", good.display());
    for (sets, expected) in [
        (
            vec![history],
            "needs cluster.advertise_url and cluster.secret_file",
        ),
        (vec![history, advertise], "needs cluster.secret_file"),
        (
            vec![history, good_set.as_str()],
            "needs cluster.advertise_url",
        ),
        (
            vec![history, advertise, short_set.as_str()],
            "at least 16 characters",
        ),
        (
            vec![
                history,
                "cluster.advertise_url=http://127.0.0.1:0",
                good_set.as_str(),
            ],
            "cluster.advertise_url",
        ),
    ] {
        let mut cmd = std::process::Command::new(codebox_bin());
        cmd.args(["serve", "--transport", "http", "--listen", "127.0.0.1:0"]);
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let out = cmd
            .env("CODEBOX_DATA_DIR", dir.path())
            .env("CODEBOX_LANGUAGES", root().join("languages.toml"))
            .env("CODEBOX_TOKEN", TOKEN)
            .env("CODEBOX_LOG", "error")
            .env_remove("CODEBOX_CONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{sets:?} started: {stderr}");
        assert!(stderr.contains(expected), "{sets:?}: {stderr}");
        assert!(!stderr.contains("serving MCP"), "{sets:?}: {stderr}");
    }
}
