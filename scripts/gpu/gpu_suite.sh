#!/usr/bin/env bash
# The GPU test suite (every test marked gpu; the 2-GPU p2p tests run when two GPUs are visible),
# then compute-sanitizer memcheck of the CuTe kernels' correctness run (scripts/bench_kda_kernels.py
# --sanitize; after pytest, so the kernels are already compiled and the sanitizer sees no JIT).
#   bash scripts/gpu/gpu_suite.sh
# Writes $OUT/gpu_suite/<RECORD>_{gpu_pytest,memcheck,nvidia_smi}.txt (3 files).
. "$(dirname "$0")/common.sh"
smi gpu_suite
log=$(record gpu_suite gpu_pytest.txt)
timeout "${PYTEST_T:-300}" python3 -m pytest -q -m gpu tests -p no:cacheprovider > "$log" 2>&1; echo "rc=$?" >> "$log"
tail -3 "$log"
log=$(record gpu_suite memcheck.txt)
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$CS" ]; then
  timeout "${SAN_T:-150}" "$CS" --tool memcheck --print-limit 20 python3 scripts/bench_kda_kernels.py --sanitize \
    > "$log" 2>&1; echo "rc=$?" >> "$log"
else
  echo "compute-sanitizer not found" > "$log"
fi
tail -3 "$log"
