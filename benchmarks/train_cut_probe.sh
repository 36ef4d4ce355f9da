#!/bin/bash
# The one-process runs of tests/test_train.py that compile, before and after the merge of its compiled run with
# the non-finite abort run: CPU and wall seconds of each `mtnlg train`, every compile cold (a TMPDIR of its own, so
# inductor's cache starts empty, as in `make test`). Usage: bash benchmarks/train_cut_probe.sh CORPUS_PREFIX
set -e
C=$1; T=$(mktemp -d)
OLD="--preset tiny --layers 5 --global-batch 16 --micro-batch 2 --lr 2e-3 --steps 8 --save-interval 4 --set eval_interval=4 --set eval_batches=2 --set data.split=90,10,0 --no-progress"
NEW="--preset tiny --layers 5 --global-batch 16 --micro-batch 2 --lr 2e-3 --steps 4 --save-interval 2 --set eval_interval=2 --set eval_batches=2 --set data.split=90,10,0 --no-progress"
run() { mkdir -p "$T/tmp_$1"; OMP_NUM_THREADS=1 TMPDIR="$T/tmp_$1" /usr/bin/time -f "$1 %e s wall %U user %S sys" \
        .venv/bin/mtnlg train --out "$T/$1" --data "$C" "${@:2}" 2>&1 | tail -1; }
run before-compiled $OLD --precision fp32 --steps 2 --set compile=true
MTNLG_INJECT_NONFINITE=2,3 run before-abort $OLD --set max_nonfinite=2 || true
MTNLG_INJECT_NONFINITE=3,4 run after-compiled-then-abort $NEW --precision fp32 --set compile=true --set max_nonfinite=2 || true
rm -rf "$T"
