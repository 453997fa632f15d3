//! A session's files over `/v1` on real Docker: the working directory is listed at every
//! spelling of its path, and a file that is not there is a `404 not_found` naming it once.

use serde_json::{json, Value};

use crate::http_api::{code_and_field, start, TOKEN};
use crate::mcp_support::{docker_manager, settle};

#[tokio::test]
async fn the_working_directory_is_listed_at_files_files_slash_and_files_dot() {
    let m = docker_manager(|_| {}, None);
    let s = start(m.clone(), Some(TOKEN)).await;
    let open = json!({"language": "bash", "files": [{"path": "a.txt", "content": "hello"}]});
    let (status, session) = s
        .send("POST", "/v1/sessions", Some(&open.to_string()))
        .await;
    assert_eq!(status, 200, "{session}");
    let id = session["session_id"].as_str().unwrap().to_string();
    for path in ["files", "files/", "files/."] {
        let (status, listing) = s
            .send("GET", &format!("/v1/sessions/{id}/{path}"), None)
            .await;
        assert_eq!(status, 200, "GET /v1/sessions/{{id}}/{path}: {listing}");
        let names: Vec<&str> = listing["entries"]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: no entries: {listing}"))
            .iter()
            .filter_map(|e| e["path"].as_str())
            .collect();
        assert!(names.contains(&"a.txt"), "{path}: {listing}");
    }
    let (status, _) = s.send("DELETE", &format!("/v1/sessions/{id}"), None).await;
    assert_eq!(status, 200);
    settle(&m).await;
}

#[tokio::test]
async fn a_missing_session_file_is_404_not_found_naming_it_once() {
    let m = docker_manager(|_| {}, None);
    let s = start(m.clone(), Some(TOKEN)).await;
    let (status, session) = s
        .send("POST", "/v1/sessions", Some(r#"{"language": "bash"}"#))
        .await;
    assert_eq!(status, 200, "{session}");
    let id = session["session_id"].as_str().unwrap().to_string();
    for path in ["nope.txt", "no/such/dir.txt"] {
        let (status, e): (u16, Value) = s
            .send("GET", &format!("/v1/sessions/{id}/files/{path}"), None)
            .await;
        assert_eq!(
            (status, code_and_field(&e)),
            (404, ("not_found".to_string(), Some("path".to_string()))),
            "{path}: {e}"
        );
        let message = e["error"]["message"].as_str().unwrap();
        assert_eq!(message.matches(path).count(), 1, "{message}");
    }
    let (status, _) = s.send("DELETE", &format!("/v1/sessions/{id}"), None).await;
    assert_eq!(status, 200);
    settle(&m).await;
}
