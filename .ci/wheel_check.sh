#!/usr/bin/env bash
# The installed package works away from the checkout (docs/architecture.md, packaging): build a wheel,
# install it into a fresh virtual environment and, from an empty directory, run the main job's three
# commands: a sweep (stallfree-bench +experiment=demo), its report (stallfree-report) and the server
# (stallfree-serve model=tiny: ready, one completion, a clean stop on Ctrl-C).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
WORK="$(mktemp -d)"
trap 'kill "${SERVE_PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

"$PY" -m venv "$WORK/build-env"
"$WORK/build-env/bin/pip" install -q setuptools wheel
# Built from a copy of the tracked (and untracked, not ignored) files: the build leaves nothing in the checkout.
mkdir "$WORK/src"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard | (cd "$ROOT" && xargs -0 tar -cf - --no-recursion) \
  | tar -C "$WORK/src" -xf -
"$WORK/build-env/bin/pip" wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"
"$PY" -m venv "$WORK/venv"
# shellcheck disable=SC2086  # TORCH_SPEC may carry pip options (an index URL)
"$WORK/venv/bin/pip" install -q $TORCH_SPEC "$WORK"/dist/stallfree-*.whl
BIN="$WORK/venv/bin"
mkdir "$WORK/empty" && cd "$WORK/empty"
"$BIN/python" -c "import stallfree.engine as e, sys; assert '$ROOT' not in e.__file__, e.__file__"

"$BIN/stallfree-bench" +experiment=demo
"$BIN/stallfree-report" results/demo
test -s results/demo/report.html

PORT="$("$BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$BIN/stallfree-serve" model=tiny port="$PORT" > serve.log 2>&1 &
SERVE_PID=$!
for _ in $(seq 120); do
  grep -q "stallfree-serve ready" serve.log && break
  kill -0 "$SERVE_PID" 2>/dev/null || { cat serve.log; exit 1; }
  sleep 1
done
"$BIN/python" - "$PORT" <<'PY'
import sys

import httpx

reply = httpx.post(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": "Hello", "max_tokens": 4})
reply.raise_for_status()
assert reply.json()["usage"]["completion_tokens"] == 4, reply.text
PY
kill -INT "$SERVE_PID"
wait "$SERVE_PID"
if grep -q Traceback serve.log; then cat serve.log; exit 1; fi
echo "wheel check: stallfree-bench, stallfree-report and stallfree-serve work from the installed wheel"
