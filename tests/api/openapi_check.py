#!/usr/bin/env python3
"""codebox's OpenAPI document checked by tools nobody here wrote: the document by
`openapi-spec-validator` (pinned in tests/api/run.sh), and every documented operation
against the running server: its status must be one the document lists for it and its body
must validate (`jsonschema`, Draft 2020-12, the dialect of OpenAPI 3.1) against the
documented schema.

Usage: openapi_check.py http://127.0.0.1:PORT TOKEN
"""

import json
import sys
import urllib.error
import urllib.request

import jsonschema
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

passed = 0
failed = 0


def check(name, fn):
    global passed, failed
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
        failed += 1
        print(f"FAIL {name}: {e}", flush=True)
    else:
        passed += 1
        print(f"ok   {name}", flush=True)


def request(url, method, token, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def main():
    base, token = sys.argv[1], sys.argv[2]
    status, doc = request(f"{base}/v1/openapi.json", "GET", token)
    assert status == 200, status
    check("openapi-spec-validator accepts the document as OpenAPI 3.1", lambda: validate(doc))
    registry = Registry().with_resource(
        "urn:codebox-openapi", Resource.from_contents(doc, default_specification=DRAFT202012)
    )

    def conforms(schema, body):
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        schema = json.loads(json.dumps(schema).replace('"#/components/', '"urn:codebox-openapi#/components/'))
        jsonschema.Draft202012Validator(schema, registry=registry).validate(body)

    exercised = set()

    def exercise(method, template, path, body, tok, want):
        """One call, checked against the document; returns its answer."""
        got = {}

        def one():
            status, answer = request(base + path, method, tok, body)
            got["answer"] = answer
            op = doc["paths"][template][method.lower()]
            assert str(status) in op["responses"], f"answered {status}, documented {list(op['responses'])}"
            assert status == want, f"answered {status}, wanted {want}: {answer}"
            schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
            conforms(schema, answer)
            exercised.add((method, template))

        check(f"{method} {path} answers {want} as documented", one)
        return got.get("answer")

    run = {"language": "python", "code": "print(6 * 7)"}
    accepted = exercise("POST", "/v1/runs", "/v1/runs", {**run, "wait": False}, token, 202) or {}
    run_id = accepted.get("run_id", "none")
    session = exercise("POST", "/v1/sessions", "/v1/sessions", {"language": "python"}, token, 200) or {}
    sid = session.get("session_id", "none")
    # Each operation with requests that reach each of its documented outcomes we can cause.
    calls = [
        ("POST", "/v1/runs", "/v1/runs", run, token, 200),
        ("POST", "/v1/runs", "/v1/runs", {**run, "limits": {"memory_mb": 10**9}}, token, 400),
        ("POST", "/v1/runs", "/v1/runs", run, None, 401),
        ("POST", "/v1/runs", "/v1/runs", {"session_id": sid, "code": "open('note.txt', 'w').write('hi')"}, token, 200),
        ("GET", "/v1/runs/{id}", f"/v1/runs/{run_id}?wait_seconds=30", None, token, 200),
        ("GET", "/v1/runs/{id}", "/v1/runs/x?wait_seconds=99", None, token, 400),
        ("GET", "/v1/runs/{id}", "/v1/runs/nope", None, token, 404),
        ("DELETE", "/v1/runs/{id}", f"/v1/runs/{run_id}", None, token, 200),
        ("DELETE", "/v1/runs/{id}", "/v1/runs/nope", None, token, 404),
        ("GET", "/v1/runs/{id}/events", "/v1/runs/nope/events", None, token, 404),
        ("GET", "/v1/runs/{id}/events", f"/v1/runs/{run_id}/events", None, None, 401),
        ("GET", "/v1/languages", "/v1/languages", None, token, 200),
        ("GET", "/v1/history", "/v1/history?limit=5&language=py", None, token, 200),
        ("GET", "/v1/history", "/v1/history?status=done", None, token, 400),
        ("POST", "/v1/sessions", "/v1/sessions", {"language": "cobra"}, token, 400),
        ("GET", "/v1/sessions", "/v1/sessions", None, token, 200),
        ("GET", "/v1/sessions/{id}/files/{path}", f"/v1/sessions/{sid}/files/note.txt", None, token, 200),
        ("GET", "/v1/sessions/{id}/files/{path}", f"/v1/sessions/{sid}/files/nope.txt", None, token, 404),
        ("GET", "/v1/sessions/{id}/files", f"/v1/sessions/{sid}/files", None, token, 200),
        ("GET", "/v1/sessions/{id}/files", f"/v1/sessions/{sid}/files/", None, token, 200),
        ("GET", "/v1/sessions/{id}/files/{path}", "/v1/sessions/nope/files/x", None, token, 404),
        ("DELETE", "/v1/sessions/{id}", f"/v1/sessions/{sid}", None, token, 200),
        # Closing is idempotent: a second DELETE answers as the first did.
        ("DELETE", "/v1/sessions/{id}", f"/v1/sessions/{sid}", None, token, 200),
        ("DELETE", "/v1/sessions/{id}", "/v1/sessions/nope", None, token, 404),
        ("GET", "/v1/openapi.json", "/v1/openapi.json", None, token, 200),
        ("GET", "/v1/openapi.json", "/v1/openapi.json", None, None, 401),
    ]
    for call in calls:
        exercise(*call)

    def events_of_an_ended_run():
        req = urllib.request.Request(f"{base}/v1/runs/{run_id}/events", method="GET")
        req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=120) as r:
            op = doc["paths"]["/v1/runs/{id}/events"]["get"]
            assert str(r.status) in op["responses"], r.status
            kind = r.headers["Content-Type"]
            assert kind.startswith("text/event-stream"), kind
            assert "text/event-stream" in op["responses"]["200"]["content"], op
            text = r.read().decode()
        blocks = [b for b in text.split("\n\n") if "event:" in b]
        assert len(blocks) == 1 and "event: report" in blocks[0], text
        data = "".join(l[5:].strip() for l in blocks[0].splitlines() if l.startswith("data:"))
        report = json.loads(data)
        conforms(doc["paths"]["/v1/runs/{id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"], report)
        exercised.add(("GET", "/v1/runs/{id}/events"))

    check("GET /v1/runs/{id}/events of an ended run answers its report as an event stream", events_of_an_ended_run)
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    check("every documented operation was exercised",
          lambda: (_ for _ in ()).throw(AssertionError(sorted(documented - exercised)))
          if documented - exercised else None)
    print(f"openapi: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
