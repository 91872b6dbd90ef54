#!/usr/bin/env bash
# The Node-side tests of `deltafin serve`: the official openai SDK (openai.test.mjs) and the chat
# page in a headless Chromium (browser.test.mjs).
#
#   tests/server/node/run.sh BUILD_DIR DELTAFIN_BIN        (from the repository root)
#
# The npm packages (package.json / package-lock.json here, exact versions) are installed with
# `npm ci` into BUILD_DIR/node, once: a later run reuses them while the lock file is the same. The
# test files are copied beside them (ES modules resolve packages from their own folder) and run
# against one `DELTAFIN_BIN serve --port 0 --api-key testkey --max-tokens 1024`. The chat page's screenshot goes to
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
SUITE="node tests"
# shellcheck source=tests/node_lib.sh
. "$HERE/../../node_lib.sh"
KEY=testkey

[ -x "$BIN" ] || fail_out "$BIN is not an executable (build it first)"

# ---- the packages, cached in the build folder ----
node_install "$HERE"
cp "$HERE/openai.test.mjs" "$HERE/browser.test.mjs" "$NODEDIR/" || fail_out "cannot copy the tests to $NODEDIR"

# ---- the server ----
LOG="$NODEDIR/server.log"
# --max-tokens: the chat page asks for no limit, and a sampled answer of the bundled model can ramble
# on to the 32768-position context, minutes at the speed decode has there (a full-suite run timed
# out on the second turn that way); 1024 tokens still make an answer long enough to watch grow and
# to stop
"$BIN" serve --port 0 --api-key "$KEY" --max-tokens 1024 >"$LOG" 2>&1 &
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
