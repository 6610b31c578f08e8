#!/usr/bin/env bash
# Issue 29 on a machine with two GPUs, in one call: the multi-rank GPU tests (their reports kept as
# fixtures), then the cost of a two-rank DDP loop, plain against under the tool. Logs and results
# go to OUT (the device tool's $OUT, or the first argument); the fixtures come back as one archive,
# ranks-fixtures.tgz, to unpack into tests/fixtures/ (ranks_two_gpus/, judged by
# tests/test_ranks_two_gpus.py).
#
#   python3 -m pip install -q --no-deps --no-build-isolation -e . && bash tests/gpu/record_ranks.sh "$OUT"
#
# NVLink multicast stays off in every program started (NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1). About 6-8 minutes on two H100s.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-${OUT:-/tmp/gpumemdoctor-issue29}}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FX="$(mktemp -d)"
{
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
    git log --oneline -1
} > "$OUT/machine.txt" 2>&1
GPUMEMDOCTOR_FIXTURE_DIR="$FX" timeout 390 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_ranks.py \
    > "$OUT/test_ranks.log" 2>&1
echo "tests/gpu/test_ranks.py: exit $?" | tee -a "$OUT/machine.txt"
tail -n 30 "$OUT/test_ranks.log"
timeout 180 python3 benchmarks/overhead.py --only ddp --repeats 3 --ddp-steps 300 --json "$OUT/ddp-overhead.json" \
    > "$OUT/ddp-overhead.txt" 2>&1
echo "benchmarks/overhead.py --only ddp: exit $?" | tee -a "$OUT/machine.txt"
tail -n 14 "$OUT/ddp-overhead.txt"
tar czf "$OUT/ranks-fixtures.tgz" -C "$FX" .
ls -l "$OUT"
