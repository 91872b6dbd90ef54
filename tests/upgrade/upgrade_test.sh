#!/usr/bin/env bash
# tests/upgrade/upgrade_test.sh BIN — `deltafin upgrade` against a local bare upstream, run from the
# repository root. The working tree (committed or not) is snapshotted into TMP/up.git; TMP/work is a
# clone of it, built fast by copying BIN's object files (BIN's folder: src/ and build-options) so
# that make only relinks; TMP/push pushes upstream commits. Checks: not a checkout, up to date,
# --dry-run, a dirty tree, a fast-forward (pull, one object recompiled, the recorded options), the
# model root unchanged (every name, size, mtime and sha256) with its store's version reported, a
# diverged tree, a detached HEAD, no upstream, a failed rebuild. Prints "ok   upgrade: ..." /
# "FAIL upgrade: ..." lines and "N passed, M failed"; exit 0 only if all passed. No network.
# shellcheck disable=SC2015  # `cond && ok ... || bad ...`: ok always succeeds
set -u
bin=${1:?usage: tests/upgrade/upgrade_test.sh BIN}
src=$(pwd)
objdir=$(cd "$(dirname "$bin")" && pwd)
pass=0
fail=0
ok() { echo "ok   upgrade: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL upgrade: $1"; fail=$((fail + 1)); }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# git and make see nothing of the caller: no user or system git config, no outer make's flags
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE MAKEFLAGS MFLAGS MAKELEVEL
export HOME=$tmp/home GIT_CONFIG_NOSYSTEM=1 DELTAFIN_HOME=$tmp/root
mkdir -p "$HOME"
g() { git -c user.name=t -c user.email=t@t "$@"; }
now() { date +%s%N; }
secs() { local ms=$((($2 - $1) / 1000000)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); } # FROM TO (ns)
t0=$(now)

# the snapshot: HEAD's history plus the working tree as one more commit, on branch main
if ! { g clone -q --local --no-checkout "$src" "$tmp/seed" && g -C "$tmp/seed" checkout -q -B main &&
       g -C "$tmp/seed" --work-tree="$src" add -A &&
       { g -C "$tmp/seed" diff --cached --quiet || g -C "$tmp/seed" commit -q -m "working tree"; } &&
       g clone -q --bare "$tmp/seed" "$tmp/up.git" && g clone -q "$tmp/up.git" "$tmp/work" &&
       g clone -q "$tmp/up.git" "$tmp/push"; } >"$tmp/log" 2>&1; then
  bad "could not make the upstream and clones: $(tail -n 3 "$tmp/log")"; finish
fi
work=$tmp/work
if [ ! -f "$objdir/build-options" ]; then bad "no $objdir/build-options (build $bin with make first)"; finish; fi
# BIN's options, CFLAGS marked so the test can see that upgrade rebuilds with the recorded ones
mapfile -t opts < <(sed 's/^CFLAGS=\(..*\)$/CFLAGS=\1 -DDF_UPGRADE_TEST/; s/^CFLAGS=$/CFLAGS=-DDF_UPGRADE_TEST/' \
  "$objdir/build-options")
build=$(sed -n 's/^BUILD=//p' "$objdir/build-options")
# objects copied after the checkout, without their mtimes, are newer than every source: make relinks
mkdir -p "$work/$build" && cp -r "$objdir/src" "$work/$build/src"
if ! make -s -C "$work" "${opts[@]}" deltafin >"$tmp/log" 2>&1 || [ ! -x "$work/deltafin" ]; then
  bad "the clone did not build: $(tail -n 3 "$tmp/log")"; finish
fi
t1=$(now)
if grep -qx 'CFLAGS=.*-DDF_UPGRADE_TEST' "$work/$build/build-options" && [ -z "$(git -C "$work" status --porcelain)" ]; then
  ok "a clone built by relinking BIN's objects in $(secs "$t0" "$t1") s, its tree clean"
else
  bad "the clone's build-options lack the test's CFLAGS, or its tree is not clean"
fi

# the model root: an install.json with other keys, a store by absolute and by relative path, caches
root=$DELTAFIN_HOME
mkdir -p "$root/stores" "$root/cache" "$root/models/x"
if [ -f "$objdir/server-store/manifest.json" ]; then cp -r "$objdir/server-store" "$root/stores/k3"
else "$bin" prepare --model models/default --out "$root/stores/k3" >/dev/null 2>&1; fi
printf '{"k3": {"store": "%s", "model": "default"}, "mini": {"store": "stores/k3"}, "version": 3,\n "caches": [1, "x"]}\n' \
  "$root/stores/k3" >"$root/install.json"
head -c 4096 /dev/urandom >"$root/cache/blob"; echo hi >"$root/models/x/readme"
tree_hash() { (cd "$root" && find . -printf '%y %p %s %T@ %m\n' | sort && find . -type f -print0 | sort -z |
  xargs -0 sha256sum) | sha256sum; }
root_before=$(tree_hash)

up() { out=$("$@" 2>&1); status=$?; }          # runs one upgrade: $out, $status
head_of() { git -C "$1" rev-parse HEAD; }
push_change() { # FILE SED-EXPRESSION|+TEXT MESSAGE: a commit in push, pushed upstream
  if [[ $2 == +* ]]; then printf '%s\n' "${2#+}" >>"$tmp/push/$1"; else sed -i "$2" "$tmp/push/$1"; fi
  g -C "$tmp/push" commit -q -am "$3" && g -C "$tmp/push" push -q origin HEAD >/dev/null 2>&1
}
sum() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "$tmp/bin" && cp "$work/deltafin" "$tmp/bin/deltafin"
up "$tmp/bin/deltafin" upgrade
[ $status -eq 1 ] && [[ $out == *"not in a git checkout"* ]] && ok "a binary outside a checkout is refused" ||
  bad "outside a checkout: status $status: $out"

up "$work/deltafin" upgrade
[ $status -eq 0 ] && [[ $out == *"already up to date"* ]] && ok "up to date: says so, exit 0" ||
  bad "up to date: status $status: $out"

# upstream moves: cli_prepare.c gains a line at the top (its object, and so the binary, change)
push_change src/cli/cli_prepare.c '1i /* a line added upstream by the upgrade test */' "upstream change" ||
  { bad "could not push an upstream commit"; finish; }
new=$(git -C "$tmp/up.git" rev-parse HEAD)
old=$(head_of "$work")
bin_before=$(sum "$work/deltafin")

up "$work/deltafin" upgrade --dry-run
[ $status -eq 0 ] && [[ $out == *"would pull 1 commit"* ]] && [ "$(head_of "$work")" = "$old" ] &&
  [ "$(sum "$work/deltafin")" = "$bin_before" ] && ok "--dry-run says what it would pull and changes nothing" ||
  bad "--dry-run: status $status: $out"

echo "# a local edit" >>"$work/README.md"
up "$work/deltafin" upgrade
[ $status -eq 1 ] && [[ $out == *"uncommitted changes (README.md)"* ]] && [ "$(head_of "$work")" = "$old" ] &&
  ok "a dirty tree is refused, naming the file; nothing pulled" || bad "dirty tree: status $status: $out"
git -C "$work" checkout -q -- README.md

obj=$work/$build/src/cli
prep_before=$(stat -c %y "$obj/cli_prepare.o"); cli_before=$(stat -c %y "$obj/cli.o")
t2=$(now)
up "$work/deltafin" upgrade
t3=$(now)
if [ $status -eq 0 ] && [ "$(head_of "$work")" = "$new" ] && [[ $out == *"${old:0:7}"*"${new:0:7}"* ]] &&
   [ "$(sum "$work/deltafin")" != "$bin_before" ] && [ "$(stat -c %y "$obj/cli_prepare.o")" != "$prep_before" ] &&
   [ "$(stat -c %y "$obj/cli.o")" = "$cli_before" ]; then
  ok "a fast-forward pulls ${old:0:7} -> ${new:0:7} and rebuilds (one object) in $(secs "$t2" "$t3") s"
else
  bad "fast-forward: status $status: $out"
fi
rebuilt_with=$(printf '%s\n' "$out" | grep '^upgrade: rebuilding:')
all=1; for o in "${opts[@]}"; do [[ " $rebuilt_with " == *" $o "* ]] || all=0; done
[ $all -eq 1 ] && grep -qx 'CFLAGS=.*-DDF_UPGRADE_TEST' "$work/$build/build-options" &&
  ok "make ran with the recorded options (${opts[*]})" || bad "recorded options not used: $rebuilt_with"
[[ $out == *"store k3 ($root/stores/k3): format version 1, current"* ]] &&
  [[ $out == *"store mini ($root/stores/k3): format version 1, current"* ]] &&
  ok "the new binary checks each registered store's format version" || bad "no store version check: $out"
[ "$(tree_hash)" = "$root_before" ] && ok "the model root is unchanged (names, sizes, mtimes, sha256)" ||
  bad "the model root changed"

g -C "$work" commit -q --allow-empty -m "a local commit"
push_change README.md "+upstream's line" "another upstream change"
local_head=$(head_of "$work")
up "$work/deltafin" upgrade
[ $status -eq 1 ] && [[ $out == *"has diverged from origin/main (1 local commit, 1 upstream)"* ]] &&
  [ "$(head_of "$work")" = "$local_head" ] && ok "a diverged tree is refused" || bad "diverged: status $status: $out"
g -C "$work" reset -q --hard HEAD~1

git -C "$work" checkout -q --detach
up "$work/deltafin" upgrade
[ $status -eq 1 ] && [[ $out == *"detached HEAD"* ]] && ok "a detached HEAD is refused" ||
  bad "detached HEAD: status $status: $out"
git -C "$work" checkout -q main

git -C "$work" branch -q --unset-upstream
up "$work/deltafin" upgrade
[ $status -eq 1 ] && [[ $out == *"no upstream configured"* ]] && ok "a branch without upstream is refused" ||
  bad "no upstream: status $status: $out"
git -C "$work" branch -q -u origin/main

# shellcheck disable=SC2016  # a sed address, not an expansion
push_change src/cli/cli_prepare.c '$a #error the upgrade test breaks the build' "a broken commit"
bin_before=$(sum "$work/deltafin")
up "$work/deltafin" upgrade
last=$(printf '%s\n' "$out" | tail -n 1)
[ $status -eq 1 ] && [[ $last == "deltafin upgrade: the rebuild failed (make exited with status 2)"* ]] &&
  [ "$(sum "$work/deltafin")" = "$bin_before" ] && ok "a failed rebuild says make's status; the old binary stays" ||
  bad "failed rebuild: status $status: $out"
[ "$(tree_hash)" = "$root_before" ] || bad "the model root changed after the later runs"

echo "# $(secs "$t0" "$(now)") s in all"
finish
