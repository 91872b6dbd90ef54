#!/usr/bin/env bash
# bench/bench_hub.sh WORKDIR [ROUNDS] [MB_PER_FILE] — the hub client's download rate against the
# loopback link's rate through the same test hub.
#
# WORKDIR gets a repo of 8 random files of MB_PER_FILE MB (default 128) served by
# tests/hub/testhub.py on 127.0.0.1. Each round, alternately:
#   link   `curl` of one file to /dev/null: the hub's own sending rate over loopback;
#   write  `curl` of the 8 files one after another into WORKDIR, then `sync -f`: the same bytes
#          written and made durable, without hashing (the most a client that keeps the files can do);
#   ours   build/bench/bench_hub with 1, 4 and 8 files in flight into an emptied folder in WORKDIR
#          (written, sha256-hashed, fsynced, renamed, as `deltafin setup` does).
# Prints each run and the ratio of each median to the link's and to the write path's. Needs
# `make bench`.
set -euo pipefail
work=${1:?usage: bench/bench_hub.sh WORKDIR [ROUNDS] [MB_PER_FILE]}
rounds=${2:-3}
mb=${3:-128}
bin=build/bench/bench_hub
[ -x "$bin" ] || { echo "bench_hub.sh: $bin missing (make bench)" >&2; exit 1; }
mkdir -p "$work/repo"
for i in 1 2 3 4 5 6 7 8; do
  f="$work/repo/model-0000$i-of-00008.safetensors"
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -eq $((mb * 1000000)) ] || head -c $((mb * 1000000)) /dev/urandom >"$f"
done
rm -f "$work/port"
python3 tests/hub/testhub.py --repo bench/repo="$work/repo" --port 0 --port-file "$work/port" 2>"$work/hub.log" &
hub=$!
trap 'kill $hub 2>/dev/null; wait $hub 2>/dev/null; rm -rf "$work/dl"' EXIT
for _ in $(seq 600); do [ -s "$work/port" ] && break; sleep 0.1; done
url="http://127.0.0.1:$(head -n 1 "$work/port")"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) $(nproc) cpus, $mb MB x 8 files, $rounds rounds"
links=()
writes=()
declare -A rates
for r in $(seq "$rounds"); do
  link=$(curl -s -L -o /dev/null -w '%{speed_download}' "$url/bench/repo/resolve/main/model-00001-of-00008.safetensors")
  link=$(python3 -c "print(f'{$link / 1e9:.3f}')")
  links+=("$link")
  echo "round $r: curl one file: $link GB/s"
  rm -rf "$work/dl"; mkdir -p "$work/dl"
  t0=$(date +%s.%N)
  for i in 1 2 3 4 5 6 7 8; do
    curl -s -L -o "$work/dl/f$i" "$url/bench/repo/resolve/main/model-0000$i-of-00008.safetensors"
  done
  sync -f "$work/dl/f1"
  wr=$(python3 -c "import sys; print(f'{8 * $mb * 1e6 / 1e9 / ($(date +%s.%N) - $t0):.3f}')")
  writes+=("$wr")
  echo "round $r: curl 8 files into WORKDIR + sync: $wr GB/s"
  for p in 1 4 8; do
    rm -rf "$work/dl"
    line=$("$bin" "$url" bench/repo "$work/dl" "$p")
    echo "round $r: $line"
    rates[$p]="${rates[$p]:-} $(printf '%s\n' "$line" | sed -E 's/.* ([0-9.]+) GB\/s.*/\1/')"
  done
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
ml=$(med "${links[@]}")
mw=$(med "${writes[@]}")
echo "median link (curl, one file): $ml GB/s; median write path (curl, 8 files + sync): $mw GB/s"
for p in 1 4 8; do
  # shellcheck disable=SC2086
  m=$(med ${rates[$p]})
  echo "median parallel $p: $m GB/s = $(python3 -c "print(f'{$m / $ml:.2f}')") of the link, $(python3 -c "print(f'{$m / $mw:.2f}')") of the write path"
done
