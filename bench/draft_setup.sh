# bench/draft_setup.sh — sourced by bench_draft.sh and bench_draft_ab.sh, with W (the work folder),
# D (the repository) and B (a deltafin binary) set: prepares W/store from models/default once,
# links its drafters beside it, writes the three held-out Python files as W/code1..3.py, and sets
# BUDGET (the store setting's --ram-budget: every non-expert blob and a quarter of the experts,
# 4 KiB-padded as the store keeps them) and CHATS (the three chat prompts).
mkdir -p "$W"
[ -f "$W/store/manifest.json" ] || $B prepare --model "$D/models/default" --out "$W/store" >/dev/null
ln -sfn "$D/models/default-dspark" "$W/store-dspark"
ln -sfn "$D/models/default-qwen3-drafter" "$W/store-qwen3-drafter"
for i in 1 2 3; do tar -xOJf "$D/tests/data/drafting/dspark-ref.tar.xz" "./code$i.py" > "$W/code$i.py"; done
BUDGET=$(python3 - "$W/store/manifest.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["blobs"]
pad = lambda n: (n + 4095) // 4096 * 4096
ex = [pad(x["size"]) for x in b if x["kind"] == "expert"]
print(sum(pad(x["size"]) for x in b if x["kind"] != "expert") + len(ex) // 4 * max(ex))
PY
)
CHATS=("Write a Python function that reverses a linked list." "Explain what a Python generator is, with an example."
       "How do I read a CSV file in Python and sum one of its columns?")
