#!/usr/bin/env bash
# Regenerates every ready-made set in calib-data/ and its manifest. Deterministic: the same
# build, haystack and seeds give byte-identical files (the manifest's sha256 proves it).
#
# Lengths are measured with the small byte-level test tokenizer (tests/fixtures/tokenizers/
# bytelevel_qwen); real model tokenizers with larger vocabularies give ~20-30% fewer tokens
# for the same text, and calibration packs/cuts to --seq-len anyway.
#
# Usage: tools/make_calib_data.sh [path/to/headwise-calc]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLI="${1:-$ROOT/build/bin/headwise-calc}"
OUT="$ROOT/calib-data"
TOK="tests/fixtures/tokenizers/bytelevel_qwen"
TASKS="niah_single niah_multikey niah_multivalue niah_multiquery variable_tracking common_words qa_distractors locomo"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cd "$ROOT"

COMMANDS="$TMP/commands.tsv"
: > "$COMMANDS"
# mixed_<length>: every task, <samples> records each, seeds fixed per task.
make_mixed() {
  local length="$1" samples="$2" name="mixed_$1" seed=100
  : > "$TMP/$name.jsonl"
  for task in $TASKS; do
    seed=$((seed + 1))
    local cmd="headwise-calc make-calib --task $task --length $length --samples $samples --seed $seed --tokenizer $TOK"
    "$CLI" make-calib -q --task "$task" --length "$length" --samples "$samples" --seed "$seed" --tokenizer "$TOK" \
      -o "$TMP/part.jsonl"
    cat "$TMP/part.jsonl" >> "$TMP/$name.jsonl"
    printf '%s\t%s\n' "$name" "$cmd" >> "$COMMANDS"
  done
  mv "$TMP/$name.jsonl" "$OUT/$name.jsonl"
}
make_mixed 4k 4
make_mixed 16k 1

# plain_essays: the haystack prose itself, one {"text": ...} record per essay.
python3 - "$OUT" "$COMMANDS" <<'PY'
import json, pathlib, sys
out, commands = pathlib.Path(sys.argv[1]), sys.argv[2]
records = []
for path in sorted((out / "haystack").glob("*.txt")):
    # An essay starts at a title line (no final full stop) and runs to the next title.
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.rstrip().endswith("."):
            records.append({"text": line.strip() + "\n", "source": f"haystack/{path.name}"})
        elif line.strip():
            records[-1]["text"] += "\n" + line.strip() + "\n"
(out / "plain_essays.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
with open(commands, "a") as f:
    f.write("plain_essays\ttools/make_calib_data.sh (haystack essays, one record each)\n")
PY

# Manifest: name, file, generator commands, sha256, records, token counts.
python3 - "$OUT" "$COMMANDS" "$TOK" <<'PY'
import hashlib, json, pathlib, sys
from tokenizers import Tokenizer
out, commands, tok_dir = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
tok = Tokenizer.from_file(str(pathlib.Path(tok_dir) / "tokenizer.json"))
by_name = {}
for line in open(commands):
    name, cmd = line.rstrip("\n").split("\t")
    by_name.setdefault(name, []).append(cmd)
sets = []
for name, cmds in by_name.items():
    path = out / f"{name}.jsonl"
    data = path.read_bytes()
    records = [json.loads(l) for l in data.decode("utf-8").splitlines() if l.strip()]
    tokens = [len(tok.encode(r["text"]).ids) for r in records]
    sets.append({"name": name, "file": path.name, "generator": cmds, "sha256": hashlib.sha256(data).hexdigest(),
                 "bytes": len(data), "records": len(records), "tasks": sorted({r.get("task", "plain") for r in records}),
                 "token_counter": f"{tok_dir} (tokenizers {__import__('tokenizers').__version__})",
                 "tokens_total": sum(tokens), "tokens_min": min(tokens), "tokens_max": max(tokens)})
(out / "manifest.json").write_text(json.dumps({"sets": sets}, indent=2) + "\n")
for s in sets:
    print(f"{s['name']}: {s['records']} records, {s['tokens_total']} tokens, {s['bytes']} bytes")
PY
