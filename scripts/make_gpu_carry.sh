#!/usr/bin/env bash
# Build .carry/ (ignored by git): what scripts/gpu_suite.sh needs on a GPU machine that has
# torch but no network, packed small enough to travel with the repository (64 MiB a call).
#
#   .carry/common/site.tar.xz    Python 3.12 packages, unpacked: transformers, peft, datasets,
#                                pydantic, trl, liger-kernel, bitsandbytes
#                                (CUDA 13 library only), flash-attn-4 and its CuTe DSL (without
#                                the CUDA 13 compiler library, see below)
#   .carry/expert/expert.tar.xz  the benchmark expert (scripts/make_bench_expert.py), carried
#                                with the first half, so that the first call can measure too
#   .carry/fa4a, .carry/fa4b     the CuTe DSL's CUDA 13 library (92 MB as a wheel, 64 MB as
#                                xz), in two parts that travel in two calls to the same machine
#                                (38 MB first: with common, expert and the repository the first
#                                call carries 63 MB of its 64 MiB)
#   .carry/explain/expert.tar.xz the prompt-heavy benchmark expert (make_bench_expert.py --task
#                                explain: the code as the prompt), its data and manifest; it
#                                reads the first expert's model folder (gpu_suite.sh hive)
#   .carry/unsloth/site.tar.xz   Unsloth and what it pins apart from expert-cli's stack (TRL
#                                1.15, datasets 4.3; transformers 5.17 is the machine's own),
#                                unpacked to its own folder for bench_train.py's d_unsloth
#
#   bash scripts/make_gpu_carry.sh        # about 9 minutes on 2 cores (2026-12-06)
set -euo pipefail
cd "$(dirname "$0")/.."
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all:
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p .carry/common .carry/expert .carry/explain .carry/fa4a .carry/fa4b .carry/unsloth
grep -qs '^/.carry/' .git/info/exclude || { mkdir -p .git/info; echo '/.carry/' >> .git/info/exclude; }

python -m pip install -q --no-deps "${PLATFORM[@]}" --target "$WORK/site" \
  transformers==5.23.0 peft==0.21.2 datasets==5.2.0 dill==0.4.0 multiprocess==0.70.18 \
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
  bitsandbytes==0.50.2 liger-kernel==0.8.5 trl==1.16.0 \
  flash-attn-4==4.0.0b36 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 \
  torch-c-dlpack-ext==0.1.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1
# the GPU machines run CUDA 13: bitsandbytes' other builds are dead weight
find "$WORK/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*_cpu.so' \
  ! -name '*_cuda130.so' -delete
find "$WORK/site" -name __pycache__ -type d -prune -exec rm -rf {} +
rm -rf "$WORK/site/bin"
tar -C "$WORK" -cf - site | xz -6 -T0 > .carry/common/site.tar.xz

python -m pip download -q --no-deps "${PLATFORM[@]}" -d "$WORK/cu13" \
  nvidia-cutlass-dsl-libs-cu13==4.8.1
mkdir -p "$WORK/cu13/x"
unzip -q "$WORK"/cu13/*.whl -d "$WORK/cu13/x"
tar -C "$WORK/cu13/x" -cf - . | xz -9e -T0 > "$WORK/cu13.tar.xz"
head -c 38000000 "$WORK/cu13.tar.xz" > .carry/fa4a/cu13.part1
tail -c +38000001 "$WORK/cu13.tar.xz" > .carry/fa4b/cu13.part2

python -m pip install -q --no-deps "${PLATFORM[@]}" --target "$WORK/usite" \
  unsloth==2026.10.9 unsloth-zoo==2026.10.9 trl==1.15.0 datasets==4.3.0 dill==0.3.8 \
  multiprocess==0.70.16 fsspec==2025.9.0 peft==0.21.2 bitsandbytes==0.50.2 torchao==0.18.0 \
  cut-cross-entropy==25.1.1 tyro==1.0.17 docstring-parser==0.17.0 typeguard==4.4.4 \
  msgspec==0.22.0 hf-transfer==0.1.9 json5==0.17.3 nest-asyncio==1.6.0 structlog==26.1.0 \
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5
# Unsloth Studio (a web UI, 82 MB) is not needed to train
rm -rf "$WORK/usite/studio" "$WORK/usite/bin"
find "$WORK/usite/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*_cpu.so' \
  ! -name '*_cuda130.so' -delete
find "$WORK/usite" -name __pycache__ -type d -prune -exec rm -rf {} +
tar -C "$WORK" -cf - usite | xz -6 -T0 > .carry/unsloth/site.tar.xz

if [ ! -f bench_results/tmp/qwen3-expert/manifest.json ]; then
  python scripts/make_bench_expert.py --out bench_results/tmp/qwen3-expert --examples 4000
fi
tar -C bench_results/tmp -cf - qwen3-expert/manifest.json qwen3-expert/model qwen3-expert/data \
  | xz -6 -T0 > .carry/expert/expert.tar.xz
if [ ! -f bench_results/tmp/qwen3-explain/manifest.json ]; then
  python scripts/make_bench_expert.py --out bench_results/tmp/qwen3-explain --examples 4000 \
    --task explain
fi
tar -C bench_results/tmp -cf - qwen3-explain/manifest.json qwen3-explain/data \
  | xz -6 -T0 > .carry/explain/expert.tar.xz
du -sh .carry/*/*
