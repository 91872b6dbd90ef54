#!/usr/bin/env bash
# The official Hugging Face hub client (npm "@huggingface/hub", hub.test.mjs) against
# tests/hub/testhub.py, the local stand-in for the hub.
#
#   tests/hub/node/run.sh BUILD_DIR        (from the repository root)
#
# The npm packages (package.json / package-lock.json here, exact versions) are installed with
# `npm ci` into BUILD_DIR/hub-node, once: a later run reuses them while the lock file is the same.
# The test file is copied beside them (ES modules resolve packages from their own folder). The
# test repo is models/default-qwen3-drafter plus a file in a subfolder and a file name with a
# space, staged in a temp folder under BUILD_DIR/hub-node; testhub serves it twice, as test/drafter
# and as test/gated (gated, --token). testhub's output goes to BUILD_DIR/hub-node/hub.log, its
# request log to BUILD_DIR/hub-node/requests.log. Prints the test's "ok   ..." / "FAIL ..." lines
# and a last "N passed, M failed"; exits 0 only if all passed.
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 BUILD_DIR" >&2
    exit 2
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
mkdir -p "$1" || exit 1
BUILD=$(cd "$1" && pwd)
NODEDIR="$BUILD/hub-node"
SUITE="hub npm tests"
# shellcheck source=tests/node_lib.sh
. "$HERE/../../node_lib.sh"
MODEL="$ROOT/models/default-qwen3-drafter"
TOKEN=hf_testhubtoken

command -v python3 >/dev/null || fail_out "python3 is not installed"
[ -f "$MODEL/model.safetensors" ] && [ -f "$MODEL/config.json" ] || fail_out "$MODEL is missing its files"

# ---- the packages, cached in the build folder ----
node_install "$HERE"
cp "$HERE/hub.test.mjs" "$NODEDIR/" || fail_out "cannot copy the test to $NODEDIR"

# ---- the test repo and the hub ----
STAGE=$(mktemp -d "$NODEDIR/repo.XXXXXX") || fail_out "cannot create a temp folder in $NODEDIR"
HUB=
stop_hub() {
    if [ -n "${HUB:-}" ]; then
        if kill -0 "$HUB" 2>/dev/null; then
            kill -TERM "$HUB" 2>/dev/null
            for _ in $(seq 50); do kill -0 "$HUB" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$HUB" 2>/dev/null && kill -KILL "$HUB" 2>/dev/null
        fi
        wait "$HUB" 2>/dev/null
        HUB=
    fi
    rm -rf "$STAGE"
}
trap stop_hub EXIT
trap 'stop_hub; exit 130' INT TERM

REPO="$STAGE/drafter"
mkdir -p "$REPO/extra" && cp "$MODEL"/* "$REPO/" || fail_out "cannot stage the test repo in $REPO"
printf '{"note": "a file in a subfolder"}\n' >"$REPO/extra/nested.json" &&
    printf 'a file name with a space\n' >"$REPO/read me.txt" || fail_out "cannot stage the test repo in $REPO"

LOG="$NODEDIR/hub.log"
PORTFILE="$STAGE/port"
rm -f "$NODEDIR/requests.log"
python3 "$HERE/../testhub.py" --repo "test/drafter=$REPO" --repo "test/gated=$REPO" \
    --gated test/gated --token "$TOKEN" --port 0 --port-file "$PORTFILE" --page-size 4 \
    --log "$NODEDIR/requests.log" >"$LOG" 2>&1 &
HUB=$!

URL=
for _ in $(seq 300); do # 30 s
    if ! kill -0 "$HUB" 2>/dev/null; then
        wait "$HUB" 2>/dev/null
        rc=$?
        HUB=
        fail_out "testhub exited ($rc) before it was ready: $(tail_of "$LOG")"
    fi
    if [ -s "$PORTFILE" ]; then
        URL="http://127.0.0.1:$(head -n 1 "$PORTFILE")"
        break
    fi
    sleep 0.1
done
[ -n "$URL" ] || fail_out "testhub did not write its port file in 30 s: $(tail_of "$LOG")"

# ---- the test ----
PASSED=0
FAILED=0

run_test hub.test.mjs 120 hub.test.mjs "$URL" test/drafter "$REPO" test/gated "$TOKEN"

if ! kill -0 "$HUB" 2>/dev/null; then
    echo "FAIL hub npm tests: testhub died during the test: $(tail_of "$LOG")"
    FAILED=$((FAILED + 1))
    HUB=
fi
stop_hub
if grep -q 'Traceback' "$LOG"; then # an exception inside testhub
    echo "FAIL hub npm tests: testhub logged errors: $(tail_of "$LOG" 3)"
    FAILED=$((FAILED + 1))
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
