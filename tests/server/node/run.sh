#!/usr/bin/env bash
# The Node-side tests of `deltafin serve`: the official openai SDK (openai.test.mjs) and the chat
# page in a headless Chromium (browser.test.mjs).
#
#   tests/server/node/run.sh BUILD_DIR DELTAFIN_BIN        (from the repository root)
#
# The npm packages (package.json / package-lock.json here, exact versions) are installed with
# `npm ci` into BUILD_DIR/node, once: a later run reuses them while the lock file is the same. The
# test files are copied beside them (ES modules resolve packages from their own folder) and run
# against one `DELTAFIN_BIN serve --port 0 --api-key testkey`. The chat page's screenshot goes to
# BUILD_DIR/chat-page.png, the server's output to BUILD_DIR/node/server.log. Prints the tests'
# "ok   ..." / "FAIL ..." lines and a last "N passed, M failed"; exits 0 only if all passed.
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR DELTAFIN_BIN" >&2
    exit 2
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1" || exit 1
BUILD=$(cd "$1" && pwd)
BIN=$2
case "$BIN" in /*) ;; *) BIN="$PWD/$BIN" ;; esac
NODEDIR="$BUILD/node"
KEY=testkey

fail_out() { # one FAIL line and the summary, then exit 1
    echo "FAIL node tests: $*"
    echo "0 passed, 1 failed"
    exit 1
}
tail_of() { # the last lines of a file, on one line
    tail -n "${2:-5}" "$1" 2>/dev/null | tr '\n' ' ' | sed 's/  */ /g; s/ $//'
}

[ -x "$BIN" ] || fail_out "$BIN is not an executable (build it first)"
command -v node >/dev/null || fail_out "node is not installed"
command -v npm >/dev/null || fail_out "npm is not installed"

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
        echo "FAIL node tests: npm ci failed: $(printf '%s\n' "$why" | tr '\n' ' ' | sed 's/  */ /g; s/ $//') (log: $NODEDIR/npm.log)"
        echo "0 passed, 1 failed"
        exit 1
    fi
    echo "$want" >"$NODEDIR/.installed"
fi
cp "$HERE/openai.test.mjs" "$HERE/browser.test.mjs" "$NODEDIR/" || fail_out "cannot copy the tests to $NODEDIR"

# ---- the server ----
LOG="$NODEDIR/server.log"
"$BIN" serve --port 0 --api-key "$KEY" >"$LOG" 2>&1 &
SERVER=$!
stop_server() {
    [ -n "${SERVER:-}" ] || return 0
    if kill -0 "$SERVER" 2>/dev/null; then
        kill -TERM "$SERVER" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$SERVER" 2>/dev/null && kill -KILL "$SERVER" 2>/dev/null
    fi
    wait "$SERVER" 2>/dev/null
    SERVER=
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

URL=
for _ in $(seq 300); do # 30 s
    if ! kill -0 "$SERVER" 2>/dev/null; then
        wait "$SERVER" 2>/dev/null
        rc=$?
        SERVER=
        fail_out "the server exited ($rc) before it was ready: $(tail_of "$LOG")"
    fi
    if grep -q '^ready' "$LOG"; then
        URL=$(sed -n 's|^listening on \(http://[^ ]*\).*|\1|p' "$LOG" | head -n 1)
        break
    fi
    sleep 0.1
done
[ -n "$URL" ] || fail_out "the server did not print a ready line and a listening address in 30 s: $(tail_of "$LOG")"

# ---- the tests ----
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

run_test openai.test.mjs 300 openai.test.mjs "$URL" "$KEY"
rm -f "$BUILD/chat-page.png"
run_test browser.test.mjs 420 browser.test.mjs "$URL" "$BUILD/chat-page.png" "$KEY"

if ! kill -0 "$SERVER" 2>/dev/null; then
    echo "FAIL node tests: the server died during the tests: $(tail_of "$LOG")"
    FAILED=$((FAILED + 1))
    SERVER=
fi
stop_server
if grep -q 'deltafin serve: ' "$LOG"; then # a generation that failed inside the server
    echo "FAIL node tests: the server logged errors: $(grep 'deltafin serve: ' "$LOG" | tail -n 3 | tr '\n' ' ')"
    FAILED=$((FAILED + 1))
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
