#!/usr/bin/env bash
# There, on a lent GPU machine (device `run`, carry [".whl"], timeout_s 540): drill's CUDA paths
# in one go. Writes everything under $OUT: the CUDA tests, the resume benchmark onto cuda
# (drill.sdk.load vs dcp.load into GPU targets; target ≤ 0.5), and a drill with its replay on
# the GPU (deterministic replay there).
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" /tmp/bin
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/bin:$PATH"
printf '#!/bin/sh\nexec python3 -m drill "$@"\n' > /tmp/bin/drill && chmod +x /tmp/bin/drill
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_staging.py 2>&1 | tee "$OUT/tests.txt"
drill demo /tmp/big --steps 1 --save-every 1 --n-layer 8 --n-embd 1024 > /dev/null
timeout 300 python3 benchmarks/resume.py /tmp/big/step-1 --device cuda --repeat 3 --json 2>&1 | tee "$OUT/resume-cuda.json"
drill demo /tmp/demo > /dev/null
drill run --root /tmp/demo --device cuda --db /tmp/d.db --json > "$OUT/drill-cuda.json" 2> "$OUT/drill-cuda.err"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['status'], d['replay'])" "$OUT/drill-cuda.json"
