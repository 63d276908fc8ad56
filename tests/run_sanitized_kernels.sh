#!/usr/bin/env bash
# Builds npu_rec's table kernels with -fsanitize=address,undefined and runs the
# kernel tests under the sanitizers (docs/development.md, "Sanitised kernels").
#
#   tests/run_sanitized_kernels.sh [extra pytest args]
#
# Python itself is not instrumented, so libasan is preloaded; leak detection is
# off (the interpreter and TensorFlow keep memory until exit by design). Any
# ASan or UBSan report aborts the test process, which fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CXX=${CXX:-g++}
ASAN=$("$CXX" -print-file-name=libasan.so)
UBSAN=$("$CXX" -print-file-name=libubsan.so)
if [[ ! -e "$ASAN" || ! -e "$UBSAN" ]]; then
  echo "run_sanitized_kernels: $CXX has no libasan/libubsan (install the compiler's sanitizer runtime)" >&2
  exit 2
fi
export NPU_REC_KERNEL_SANITIZE=1 NPU_REC_KERNELS=on
export NPU_REC_KERNEL_CACHE=${NPU_REC_KERNEL_CACHE:-$HOME/.cache/npu_rec/kernels}
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONPATH=$PWD
# Build once, outside pytest, so a compiler error shows plainly.
LD_PRELOAD="$ASAN:$UBSAN" "$PY" -c "from npu_rec._kernels import _build; print('sanitised kernels:', _build.library() and _build.library_path())"
LD_PRELOAD="$ASAN:$UBSAN" "$PY" -m pytest -o addopts="" -q -p no:cacheprovider \
  tests/table/test_table_kernels.py tests/table/test_table_eviction.py tests/table/test_key_map.py \
  tests/distribute/test_step_exchange.py "$@"
