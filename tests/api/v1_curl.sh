#!/usr/bin/env bash
# Plain curl against /v1, as docs/http-api.md shows it. Prints one line per check and
# `N passed, M failed`; exits non-zero on a failure.
#
# Usage: v1_curl.sh http://127.0.0.1:PORT TOKEN
set -uo pipefail
base=$1
token=$2
passed=0
failed=0
field() { python3 -c 'import json,sys; v=json.load(sys.stdin)
for k in sys.argv[1].split("."): v = v[int(k)] if isinstance(v, list) else v.get(k)
print(v)' "$1"; }
check() {
  local name=$1 got=$2 want=$3
  if [ "$got" = "$want" ]; then
    passed=$((passed + 1)); echo "ok   $name"
  else
    failed=$((failed + 1)); echo "FAIL $name: got [$got], wanted [$want]"
  fi
}
auth=(-H "Authorization: Bearer $token")

out=$(curl -sS "${auth[@]}" -d '{"language": "python", "code": "print(6 * 7)"}' "$base/v1/runs")
check "POST /v1/runs waits and answers the report" "$(field status <<<"$out") $(field stdout <<<"$out")" "succeeded 42"

out=$(curl -sS "${auth[@]}" -w '\n%{http_code}' -d '{"language": "cpp", "code": "int main() { return 3; }", "wait": false}' "$base/v1/runs")
code=$(tail -n 1 <<<"$out"); body=$(head -n -1 <<<"$out")
check "POST /v1/runs with wait false answers 202" "$code" "202"
id=$(field run_id <<<"$body")
out=$(curl -sS "${auth[@]}" "$base/v1/runs/$id?wait_seconds=60")
check "GET /v1/runs/ID?wait_seconds=60 long-polls to the end" "$(field status <<<"$out") $(field exit_code <<<"$out")" "failed 3"
out=$(curl -sS "${auth[@]}" -X DELETE "$base/v1/runs/$id")
check "DELETE /v1/runs/ID of a finished run returns its report" "$(field status <<<"$out")" "failed"

out=$(curl -sS "${auth[@]}" -d '{"language": "python", "code": "import time\ntime.sleep(60)", "wait": false}' "$base/v1/runs")
id=$(field run_id <<<"$out")
sleep 2
out=$(curl -sS "${auth[@]}" -X DELETE "$base/v1/runs/$id")
check "DELETE /v1/runs/ID stops a running run" "$(field status <<<"$out")" "stopped"

out=$(curl -sS "${auth[@]}" -w '\n%{http_code}' -d '{"language": "python", "code": "1", "limits": {"memory_mb": 999999}}' "$base/v1/runs")
check "a limit over the ceiling is 400 naming the field" \
  "$(tail -n 1 <<<"$out") $(head -n -1 <<<"$out" | field error.code) $(head -n -1 <<<"$out" | field error.field)" \
  "400 invalid_argument limits.memory_mb"
code=$(curl -sS -o /dev/null -w '%{http_code}' "$base/v1/languages")
check "no token is 401" "$code" "401"
out=$(curl -sS "${auth[@]}" "$base/v1/languages")
check "GET /v1/languages lists python" "$(python3 -c 'import json,sys; print(any(l["language"]=="python" for l in json.load(sys.stdin)["languages"]))' <<<"$out")" "True"
out=$(curl -sS "${auth[@]}" "$base/v1/history?language=cpp&limit=1")
check "GET /v1/history filters by language" "$(field runs.0.language <<<"$out")" "cpp"

echo "curl /v1: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
