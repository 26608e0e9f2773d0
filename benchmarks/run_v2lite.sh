#!/usr/bin/env bash
# The README's speed table: stock llama-cpp-python 0.3.36 vs deepseek-cpu on random-weight
# GGUFs with DeepSeek-V2-Lite's exact shapes (Q4_0 and Q4_K_M), 2 threads, side by side.
#
#   benchmarks/run_v2lite.sh                      # full size (8.9 / 10.4 GB files; stock peaks ~2x the file)
#   LAYERS=4 REPEAT=1 benchmarks/run_v2lite.sh    # quick, truncated model
#
# Environment: OUT (results dir, default benchmarks/results), LAYERS (default: all 27),
# QUANTS (default "q4_0 q4_k_m"), THREADS (2), REPEAT (3), PP (512), TG (128), DEPTH (4096),
# DSC (default "deepseek-cpu": the installed package, `pip install .` first),
# EXTRA (more `bench` options, e.g. "--flash-attn on").
# The first --compare-stock builds stock llama.cpp once into ~/.cache/deepseek-cpu (minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
THREADS=${THREADS:-2}
REPEAT=${REPEAT:-3}
PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-4096}
QUANTS=${QUANTS:-"q4_0 q4_k_m"}
EXTRA=${EXTRA:-}
DSC=${DSC:-"deepseek-cpu"}
mkdir -p "$OUT"
layers_opt=""
tag="v2-lite"
if [ -n "${LAYERS:-}" ]; then layers_opt="--layers $LAYERS"; tag="v2-lite-L$LAYERS"; fi

jsons=()
for q in $QUANTS; do
    model="$OUT/$tag-$q.gguf"
    [ -f "$model" ] || { set -x; $DSC synth --shape v2-lite $layers_opt --quant "$q" "$model"; set +x; }
    json="$OUT/bench-$tag-$q-t$THREADS.json"
    set -x
    $DSC bench "$model" --pp "$PP" --tg "$TG" --ctx-depth "$DEPTH" --threads "$THREADS" --repeat "$REPEAT" \
        --compare-stock --json "$json" $EXTRA
    set +x
    if python -c "import matplotlib" 2>/dev/null; then
        python benchmarks/table.py --plot "${json%.json}.png" "$json" >/dev/null
    fi
    jsons+=("$json")
done
python benchmarks/table.py "${jsons[@]}" | tee "$OUT/table-$tag-t$THREADS.md"
