#!/usr/bin/env bash
# bench/bench_stream.sh WORKDIR [ROUNDS] [MBPS] — a pass that must fetch its experts from the hub
# (setup --stream) against the same pass from the drive: the streamed install once its experts are
# there, and a DFSP store (setup --full).
#
# WORKDIR/src is a `synth --preset k3-wide` checkpoint (K3's own 17.5 MB experts; made if missing),
# served by tests/hub/testhub.py as moonshotai/Kimi-K3 beside the bundled DSpark. WORKDIR/s gets
# `setup --stream` (its spine fetched unthrottled), WORKDIR/f gets `setup --full`. Then each round,
# alternately, with the page cache dropped before each run when /proc/sys/vm/drop_caches is
# writable: the stream install forgets its experts (its journal back to the spine) and runs with
# the hub's expert ranges throttled to MBPS MB/s (default 100); the same run again (every expert
# now on the drive); the DFSP store. Each run is `run --tokens 1 --max-new 8 --draft none --stats`:
# its first pass routes to every expert of every layer (k3-wide at --size-gb 3 has 16 experts per
# layer, all routed), so time to first token is the pass that fetches. Prints each run's time to
# first token and decode rate, and the fetch rate against MBPS. Needs ./deltafin.
set -euo pipefail
work=${1:?usage: bench/bench_stream.sh WORKDIR [ROUNDS] [MBPS]}
rounds=${2:-3}
mbps=${3:-100}
bin=$PWD/deltafin
mkdir -p "$work"
[ -f "$work/src/model.safetensors" ] || "$bin" synth --preset k3-wide --size-gb 3 --out "$work/src" >/dev/null
rm -f "$work/port"
python3 tests/hub/testhub.py --repo "moonshotai/Kimi-K3=$work/src" \
  --repo "Inferact/Kimi-K3-DSpark=$PWD/models/default-dspark@cf6b8244620e7ea4b0651d214f28e89eac75bed6" \
  --port 0 --port-file "$work/port" 2>"$work/hub.log" &
hub=$!
trap 'kill $hub 2>/dev/null; wait $hub 2>/dev/null' EXIT
for _ in $(seq 1200); do [ -s "$work/port" ] && break; sleep 0.1; done
url="http://127.0.0.1:$(head -n 1 "$work/port")"
export HF_ENDPOINT=$url
"$bin" setup --stream --model-root "$work/s" >/dev/null
[ -f "$work/f/install.json" ] || "$bin" setup --full --model-root "$work/f" >/dev/null
cp "$work/s/k3-stream/stream.journal" "$work/spine.journal"
drop() { if [ -w /proc/sys/vm/drop_caches ]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi; }
run() { # ROOT: the stats lines of one run
  DELTAFIN_HOME=$1 "$bin" run --tokens 1 --max-new 8 --draft none --stats 2>&1 >/dev/null | grep -E 'time to first token|decode|streamed from'
}
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) $(nproc) cpus; experts throttled to $mbps MB/s; drop_caches $([ -w /proc/sys/vm/drop_caches ] && echo yes || echo no)"
for r in $(seq "$rounds"); do
  cp "$work/spine.journal" "$work/s/k3-stream/stream.journal"
  curl -s -X POST "$url/_control/faults" -d "[{\"repo\": \"moonshotai/Kimi-K3\", \"path\": \"model.safetensors\", \"kind\": \"throttle\", \"mbps\": $mbps, \"count\": 100000}]" >/dev/null
  drop; echo "round $r: stream, fetching:"; run "$work/s" | sed 's/^/  /'
  curl -s -X DELETE "$url/_control/faults" >/dev/null
  drop; echo "round $r: stream, on the drive:"; run "$work/s" | sed 's/^/  /'
  drop; echo "round $r: DFSP store:"; run "$work/f" | sed 's/^/  /'
done
