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
MODEL="$ROOT/models/default-qwen3-drafter"
TOKEN=hf_testhubtoken

fail_out() { # one FAIL line and the summary, then exit 1
    echo "FAIL hub npm tests: $*"
    echo "0 passed, 1 failed"
    exit 1
}
tail_of() { # the last lines of a file, on one line
    tail -n "${2:-5}" "$1" 2>/dev/null | tr '\n' ' ' | sed 's/  */ /g; s/ $//'
}

command -v node >/dev/null || fail_out "node is not installed"
command -v npm >/dev/null || fail_out "npm is not installed"
command -v python3 >/dev/null || fail_out "python3 is not installed"
[ -f "$MODEL/model.safetensors" ] && [ -f "$MODEL/config.json" ] || fail_out "$MODEL is missing its files"

# ---- the packages, cached in the build folder ----
mkdir -p "$NODEDIR" || fail_out "cannot create $NODEDIR"
want=$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)
if [ -d "$NODEDIR/node_modules" ] && [ "$(cat "$NODEDIR/.installed" 2>/dev/null)" = "$want" ] &&
    cmp -s "$HERE/package-lock.json" "$NODEDIR/package-lock.json"; then
    : # installed from this very lock file
else
    rm -f "$NODEDIR/.installed"
    cp "$HERE/package.json" "$HERE/package-lock.json" "$NODEDIR/" || fail_out "cannot copy the package files to $NODEDIR"
    if ! (cd "$NODEDIR" && npm ci --no-audit --no-fund) >"$NODEDIR/npm.log" 2>&1; then
        # the error's code and message lines say what happened; npm's advice after them does not
        why=$(grep -E '^npm error (code|errno|network|syscall|[0-9]{3}|request|notarget|404)' "$NODEDIR/npm.log" | head -n 4)
        [ -n "$why" ] || why=$(grep -v EBADENGINE "$NODEDIR/npm.log" | tail -n 5)
        echo "FAIL hub npm tests: npm ci failed: $(printf '%s\n' "$why" | tr '\n' ' ' | sed 's/  */ /g; s/ $//') (log: $NODEDIR/npm.log)"
        echo "0 passed, 1 failed"
        exit 1
    fi
    echo "$want" >"$NODEDIR/.installed"
fi
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
run_test() { # NAME TIMEOUT ARGS...: its check lines, its counts added to the totals
    local name=$1 limit=$2 out rc summary
    shift 2
    out=$(cd "$NODEDIR" && timeout -k 10 "$limit" node "$@" 2>&1)
    rc=$?
    printf '%s\n' "$out" | grep -E '^(ok   |FAIL )'
    summary=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -n "$summary" ]; then
        PASSED=$((PASSED + ${summary%% passed*}))
        local f=${summary#*passed, }
        FAILED=$((FAILED + ${f%% failed}))
    fi
    if [ -z "$summary" ] || { [ "$rc" -ne 0 ] && ! printf '%s\n' "$out" | grep -q '^FAIL '; }; then
        local why="exit status $rc"
        [ "$rc" -eq 124 ] && why="timed out after $limit s"
        echo "FAIL $name: $why: $(printf '%s\n' "$out" | grep -vE '^(ok   |FAIL |[0-9]+ passed, [0-9]+ failed$)' | tail -n 5 | tr '\n' ' ' | sed 's/  */ /g; s/ $//')"
        FAILED=$((FAILED + 1))
    fi
}

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
