#!/usr/bin/env bash
# tests/run.sh BUILD — the whole suite, as `make test` runs it:
#   1. the unit / conformance / exactness tests (BUILD/test_runner, one line per test)
#   2. every fuzz corpus replayed through its target (BUILD/fuzz/fuzz_*, one line per target)
#   3. where ../shared exists, the shared oracle checkers as an extra check (one line each)
# and one closing line "N passed, N failed". Exit status 0 only if nothing failed.
set -u
build=${1:-build}
pass=0
fail=0

./tests/testdata.sh "$build" || { echo "FAIL test data: could not lay out $build/testdata"; echo "0 passed, 1 failed"; exit 1; }
export DF_TEST_DATA="$build/testdata"
# run/serve/eval without --model use a K3 that `deltafin setup` installed under the model root:
# the suite runs with an empty one, whatever this machine has installed
case $build in /*) DELTAFIN_HOME=$build/no-model-root ;; *) DELTAFIN_HOME=$PWD/$build/no-model-root ;; esac
export DELTAFIN_HOME
unset HF_TOKEN HF_ENDPOINT HF_HUB_OFFLINE

out=$("$build/test_runner" 2>&1)
status=$?
printf '%s\n' "$out" | sed '$d'
last=$(printf '%s\n' "$out" | tail -n 1)
if [[ $last =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
  pass=$((pass + BASH_REMATCH[1])); fail=$((fail + BASH_REMATCH[2]))
else
  printf '%s\n' "$last"; echo "FAIL unit tests: runner ended abnormally (status $status)"; fail=$((fail + 1))
fi

for f in "$build"/fuzz/fuzz_*; do
  [ -x "$f" ] || continue
  name=${f##*/fuzz_}
  corpus=tests/fuzz/corpus/$name
  if [ ! -d "$corpus" ]; then
    echo "FAIL fuzz_$name: no corpus at $corpus"; fail=$((fail + 1)); continue
  fi
  if r=$("$f" "$corpus" 2>&1); then
    echo "ok   fuzz_$name corpus (${r##*replayed })"; pass=$((pass + 1))
  else
    echo "FAIL fuzz_$name corpus: $(printf '%s' "$r" | tail -n 3)"; fail=$((fail + 1))
  fi
done

if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null; then
  if r=$(make -s --no-print-directory BUILD="$build" test-neon 2>&1); then
    echo "ok   neon kernels under qemu-aarch64 (${r##*$'\n'})"; pass=$((pass + 1))
  else
    echo "FAIL neon kernels under qemu-aarch64:"; printf '%s\n' "$r" | grep -v '^ok' | sed 's/^/    /'; fail=$((fail + 1))
  fi
else
  echo "skip neon kernels under qemu-aarch64: needs Debian's gcc-aarch64-linux-gnu and qemu-user"
fi

# the CUDA backend's kernels, their GPU test and bench compile wherever nvcc is installed (they run
# on a machine with a GPU: make test-cuda)
if command -v "${NVCC:-nvcc}" >/dev/null; then
  if r=$(make -s --no-print-directory BUILD="$build" cuda-compile 2>&1); then
    echo "ok   cuda backend compiles (nvcc, sm_90 + PTX)"; pass=$((pass + 1))
  else
    echo "FAIL cuda backend does not compile:"; printf '%s\n' "$r" | tail -n 20 | sed 's/^/    /'; fail=$((fail + 1))
  fi
else
  echo "skip cuda backend compile: needs nvcc"
fi

# a script that prints "ok"/"FAIL" lines and ends with "N passed, M failed": its lines, its counts
suite() {
  local name=$1 out last
  shift
  out=$("$@" 2>&1)
  last=$(printf '%s\n' "$out" | tail -n 1)
  printf '%s\n' "$out" | sed '$d' | grep -E '^(ok|FAIL)' || true
  if [[ $last =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    pass=$((pass + BASH_REMATCH[1])); fail=$((fail + BASH_REMATCH[2]))
  else
    echo "FAIL $name: ended abnormally:"; printf '%s\n' "$out" | tail -n 5 | sed 's/^/    /'; fail=$((fail + 1))
  fi
}

# the server from raw HTTP (a DFSP store of the bundled model for its loading check), then from
# the official openai npm client and a real browser (tests/server/node/run.sh installs them into
# $build/node from the committed lockfile)
bin=${DELTAFIN_BIN:-$build/deltafin}
store=$build/server-store
if [ ! -f "$store/manifest.json" ] || [ models/default/model.safetensors -nt "$store/manifest.json" ]; then
  rm -rf "$store"
  "$bin" prepare --model models/default --out "$store" >/dev/null 2>&1 || echo "FAIL server store: deltafin prepare failed"
fi
suite "server http" python3 tests/server/http_test.py "$bin" "$store"
suite "server node" tests/server/node/run.sh "$build" "$bin"

# the test hub (tests/hub/testhub.py) from raw HTTP, and the official @huggingface/hub npm client
# against it: what proves the test hub speaks the real hub's protocol
suite "testhub" python3 tests/hub/testhub_selftest.py
suite "hub node" tests/hub/node/run.sh "$build"
# `deltafin setup` and `setup-qwen` end to end against the test hub on loopback, with faults
suite "setup" python3 tests/hub/setup_test.py "$bin" "$build"
# `deltafin upgrade` against a local bare git upstream
suite "upgrade" tests/upgrade/upgrade_test.sh "$bin"

shared=../shared/oracle
if [ -d "$shared/cases" ] && command -v python3 >/dev/null; then
  if r=$(python3 "$shared/check.py" "$build/deltafin" "$shared/cases" 2>&1); then
    echo "ok   shared oracle check.py (${r##*$'\n'})"; pass=$((pass + 1))
  else
    echo "FAIL shared oracle check.py:"; printf '%s\n' "$r" | grep -v '^ok' | sed 's/^/    /'; fail=$((fail + 1))
  fi
fi

tokdir=../shared/oracle/tokenizers
if [ -d "$tokdir" ] && [ -f ../shared/oracle/tok_check.py ] && command -v python3 >/dev/null; then
  if r=$(python3 ../shared/oracle/tok_check.py "$build/deltafin" "$tokdir" "$tokdir/expected.json" 2>&1); then
    echo "ok   shared oracle tok_check.py (${r##*$'\n'})"; pass=$((pass + 1))
  else
    echo "FAIL shared oracle tok_check.py:"; printf '%s\n' "$r" | sed 's/^/    /'; fail=$((fail + 1))
  fi
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
