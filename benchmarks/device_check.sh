#!/usr/bin/env bash
# Every check that needs a GPU, in one command (about 10 minutes on one H100), all output under
# OUT:
#   OUT/tests.log, tests.xml  the cuDNN tests in bf16 (tests/test_cudnn.py: logits, gradients,
#                             prefill + decode vs xla; the H100 AOT compile; the refusals)
#   OUT/bench/                launch/benchmark.py on configs/bench_1b.py (1.3B, bf16, cudnn):
#                             prefill 8K-128K Orthros vs Transformer, decode at 8K / 128K, PT step,
#                             speculative / plain decode at 8K / 128K (benchmarks/spec_suite.py)
#   OUT/summary.md            benchmarks/device_report.py: the speedups and the PT step's MFU
#
#     benchmarks/device_check.sh runs/device_check
#     benchmarks/device_check.sh runs/device_dry --dry-run   # CPU, tiny sizes, xla (the test)
# Flags after --dry-run go to launch/benchmark.py after the dry run's own (the test adds suites).
set -euo pipefail
OUT=${1:?usage: benchmarks/device_check.sh OUT [--dry-run [benchmark flags]]}
DRY=${2:-}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
mkdir -p "$OUT"
if [[ "$DRY" == "--dry-run" ]]; then
  TESTS=(-k "refused")
  BENCH=(--config.model.vocab_size=256 --config.model.d_model=64 --config.model.n_layers=2
         --config.model.n_heads=2 --config.model.n_kv_heads=2 --config.model.head_dim=32
         --config.model.d_ff=128 --config.model.window=16 --config.model.prefill_chunk=64
         --config.model.attention_impl=xla "--config.prefill_lengths=(128,256)"
         "--config.decode_contexts=(128,)" --config.decode_steps=2 --config.train_len=64
         --config.train_batch=1 --config.repeats=1 "--config.spec_contexts=(128,)"
         --config.spec_k=2 --config.spec_acceptance=2.79 --config.spec_new_tokens=3
         "--config.spec_arms=('orthros',)" "${@:3}")
elif [[ -n "$DRY" ]]; then
  echo "device_check.sh: unknown option $DRY (only --dry-run)" >&2; exit 2
else
  TESTS=()
  BENCH=()
  # tests/conftest.py pins the suite to the CPU unless JAX_PLATFORMS says otherwise.
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu}
fi
echo "== cuDNN tests" | tee "$OUT/tests.log"
timeout 200 "$PY" -m pytest -q tests/test_cudnn.py "${TESTS[@]}" --junitxml="$OUT/tests.xml" \
  2>&1 | tee -a "$OUT/tests.log"
echo "== benchmark"
timeout 540 "$PY" launch/benchmark.py --config=configs/bench_1b.py \
  --suites=prefill,decode,train,speculative \
  "${BENCH[@]}" --out="$OUT/bench" 2>&1 | tee "$OUT/bench.log"
"$PY" -m benchmarks.device_report "$OUT/bench/bench.json" > "$OUT/summary.md"
cat "$OUT/summary.md"
