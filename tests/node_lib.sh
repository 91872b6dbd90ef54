# tests/node_lib.sh — what the Node-side test scripts share (tests/server/node/run.sh,
# tests/hub/node/run.sh); sourced, never run. The sourcing script sets SUITE (its name in FAIL
# lines) and NODEDIR (where its packages live), and counts PASSED / FAILED.
#
#   node_install HERE       npm ci of HERE/package.json + package-lock.json into NODEDIR, once: a
#                           later run reuses it while the lock file is the same
#   run_test NAME LIMIT ARGS...   node ARGS in NODEDIR under a time limit: its "ok"/"FAIL" lines,
#                           its "N passed, M failed" added to PASSED / FAILED (a crash or a timeout
#                           without a FAIL line counts as one)

fail_out() { # one FAIL line and the summary, then exit 1
    echo "FAIL $SUITE: $*"
    echo "0 passed, 1 failed"
    exit 1
}

tail_of() { # the last lines of a file, on one line
    tail -n "${2:-5}" "$1" 2>/dev/null | tr '\n' ' ' | sed 's/  */ /g; s/ $//'
}

node_install() {
    local here=$1 want why
    command -v node >/dev/null || fail_out "node is not installed"
    command -v npm >/dev/null || fail_out "npm is not installed"
    mkdir -p "$NODEDIR" || fail_out "cannot create $NODEDIR"
    want=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)
    if [ -d "$NODEDIR/node_modules" ] && [ "$(cat "$NODEDIR/.installed" 2>/dev/null)" = "$want" ] &&
        cmp -s "$here/package-lock.json" "$NODEDIR/package-lock.json"; then
        return 0 # installed from this very lock file
    fi
    rm -f "$NODEDIR/.installed"
    cp "$here/package.json" "$here/package-lock.json" "$NODEDIR/" || fail_out "cannot copy the package files to $NODEDIR"
    if ! (cd "$NODEDIR" && npm ci --no-audit --no-fund) >"$NODEDIR/npm.log" 2>&1; then
        # the error's code and message lines say what happened; npm's advice after them does not
        why=$(grep -E '^npm error (code|errno|network|syscall|[0-9]{3}|request|notarget|404)' "$NODEDIR/npm.log" | head -n 4)
        [ -n "$why" ] || why=$(grep -v EBADENGINE "$NODEDIR/npm.log" | tail -n 5)
        fail_out "npm ci failed: $(printf '%s\n' "$why" | tr '\n' ' ' | sed 's/  */ /g; s/ $//') (log: $NODEDIR/npm.log)"
    fi
    echo "$want" >"$NODEDIR/.installed"
}

run_test() {
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
