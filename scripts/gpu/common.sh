# Sourced by the scripts in scripts/gpu/ on the GPU machine; not run by itself.
#
# Sets what they share: the repository root as working directory, PYTHONPATH with the wheels
# staged into /tmp/site (see scripts/gpu/README.md; CUTE=0 leaves CuTe DSL off the path so every
# op runs on torch), the kernel disk cache, NCCL_NVLS_ENABLE=0, and RECORD, the prefix of every
# file the scripts write:
#     <UTC date>T<HHMM>_<gpu model>[x<gpus>]-<first 8 hex digits of GPU 0's UUID>
#     e.g. 2026-12-01T1030_h200-1de5aaf5, 2026-12-01T1102_h200x2-f49f4a00
# `record CLAIM WHAT` prints the path $OUT/CLAIM/$RECORD_WHAT (the folder is made); copy
# $OUT/CLAIM/* to results/data/CLAIM/ afterwards.
set -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PLANNER_CACHE_DIR=${PLANNER_CACHE_DIR:-$ROOT/.planner_cache}
if [ -d .whl ] && ! python3 -c "import pydantic" 2>/dev/null; then  # carried pydantic wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
fi
pp=$ROOT
[ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ] && [ "${CUTE:-1}" = 1 ] && pp=/tmp/site/nvidia_cutlass_dsl/dsl_packages:$pp
[ -d /tmp/site ] && pp=/tmp/site:$pp
export PYTHONPATH=$pp${PYTHONPATH:+:$PYTHONPATH}

NGPU=$(nvidia-smi -L | wc -l)
model=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | sed 's/^NVIDIA //' | awk '{print tolower($1)}')
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1 | cut -c5-12)
dev=$model; [ "$NGPU" -gt 1 ] && dev=${model}x$NGPU
RECORD=$(date -u +%Y-%m-%dT%H%M)_${dev}-${uuid}

record() {
  mkdir -p "$OUT/$1" && echo "$OUT/$1/${RECORD}_$2"
}

# every claim folder gets the GPUs the run used
smi() {
  nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv,noheader > "$(record "$1" nvidia_smi.txt)"
}
