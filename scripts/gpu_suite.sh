#!/usr/bin/env bash
# The GPU measurements of the training step (issue: the step at the hardware's speed), run on
# a lent GPU machine in the repository root, results as JSON under $OUT (default bench_results/gpu).
# Two calls to the same warm machine: flash-attn-4's CUDA 13 library travels in two halves.
#
#   bash scripts/make_gpu_carry.sh                  # here: build .carry/ once
#   bash scripts/gpu_suite.sh prep                  # there, carrying .carry/common + .carry/fa4a
#                                                   #   + .carry/expert
#   bash scripts/gpu_suite.sh main                  # there, next call, carrying .carry/fa4b
#                                                   #   + .carry/unsloth
#   bash scripts/gpu_suite.sh single                # one call without flash-attention 4, when
#                                                   #   the time left is short: .carry/common +
#                                                   #   .carry/unsloth + .carry/expert
#   bash scripts/gpu_suite.sh hive                  # a call of its own (about 5 minutes):
#                                                   #   .carry/common + .carry/expert +
#                                                   #   .carry/explain
#
# prep: packages unpacked, the token cache built, every kernel's correctness without flash-
#       attention 4 (scripts/check_fast_path_gpu.py: packed-vs-alone logits, the fused losses,
#       Liger's own loss function against expert-cli's loop over its kernel (time, host
#       syncs), the fused LoRA linear alone and grouped, the attention probe), then QLoRA
#       through the fused layers and through peft's, and the grouped layers against the fused
#       ones (about 5 minutes in all). main: flash-attention 4 assembled and
#       checked, then the open measurements (docs/PERFORMANCE.md): the default against peft's
#       layers, lora dropout and HiveLLM's 8 x 4 with its micro-batch probed (e_default is
#       the same 8 rows a micro-step), Unsloth (d), and a profile of the step; each
#       under its own time limit so that the call ends inside the device's 10 minutes.
# hive: HiveLLM's experts as they are: the fused DoRA checks (check_fast_path_gpu.py
#       --dora-only); on the prompt-heavy expert (86% of its tokens an
#       untrained prompt, as in the SQL, JSON and Cypher experts), the default (the LM head on
#       the trained tokens alone) against the head on every token; then DoRA with lora dropout
#       0.05 (every HiveLLM expert's adapter), fused against peft's layers, and without dropout.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:?usage: gpu_suite.sh prep|main|single|auto|hive}
OUT=${OUT:-bench_results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
SITE=/tmp/site
log() { echo "[$(date +%H:%M:%S)] $*"; }
untar() {  # untar DEST < ARCHIVE.tar.xz (Python's tarfile: no xz binary needed)
  python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1])" "$1"
}

# --- packages: unpacked once per machine
if [ ! -f "$SITE/.unpacked" ]; then
  untar /tmp < .carry/common/site.tar.xz && touch "$SITE/.unpacked" || exit 3
fi
# --- flash-attn-4's CUDA 13 library: part 1 waits on the machine until part 2 arrives
mkdir -p /root/stash
[ -f .carry/fa4a/cu13.part1 ] && cp .carry/fa4a/cu13.part1 /root/stash/
if [ ! -f "$SITE/.fa4" ] && [ -f /root/stash/cu13.part1 ] && [ -f .carry/fa4b/cu13.part2 ]; then
  if cat /root/stash/cu13.part1 .carry/fa4b/cu13.part2 | untar "$SITE"; then
    touch "$SITE/.fa4"; log "flash-attn-4 library assembled"
  else
    log "flash-attn-4 library could not be assembled"
  fi
fi
[ -f "$SITE/.fa4" ] || { log "flash-attn-4: library not on this machine (needs both parts)";
                         mv "$SITE/flash_attn" "$SITE/flash_attn.off" 2>/dev/null; }
[ -f "$SITE/.fa4" ] && [ -d "$SITE/flash_attn.off" ] && mv "$SITE/flash_attn.off" "$SITE/flash_attn"
export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$PWD/src"
# --- Unsloth pins older transformers/TRL/datasets: its own folder, over the machine's packages
if [ -f .carry/unsloth/site.tar.xz ] && [ ! -f /tmp/usite/.unpacked ]; then
  untar /tmp < .carry/unsloth/site.tar.xz && touch /tmp/usite/.unpacked
fi
[ -f /tmp/usite/.unpacked ] && export UNSLOTH_PYTHONPATH="/tmp/usite:$PWD/src"
# --- the benchmark expert and its token cache
EXPERT=bench_results/tmp/qwen3-expert
if [ ! -f "$EXPERT/manifest.json" ] && [ -f .carry/expert/expert.tar.xz ]; then
  mkdir -p bench_results/tmp && untar bench_results/tmp < .carry/expert/expert.tar.xz
fi
EXPLAIN=bench_results/tmp/qwen3-explain  # its model folder is the first expert's
if [ ! -f "$EXPLAIN/manifest.json" ] && [ -f .carry/explain/expert.tar.xz ]; then
  untar bench_results/tmp < .carry/explain/expert.tar.xz
  [ -d "$EXPERT/model" ] && cp -r "$EXPERT/model" "$EXPLAIN/model"
fi

if [ "$STAGE" != auto ]; then  # the auto stage's variants build the cache themselves
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm \
    --format=csv; nproc; python3 -m pip list 2>/dev/null | grep -iE \
    "^(torch|triton|transformers|peft|accelerate|datasets|trl|liger|cut|flash|nvidia-cutlass|bitsandbytes|tokenizers) "
  python3 -c "import transformers, peft, datasets; print('imported:', transformers.__version__, peft.__version__, datasets.__version__)"
} > "$OUT/env-$STAGE.txt" 2>&1
cat "$OUT/env-$STAGE.txt"
if [ -f "$EXPERT/manifest.json" ] && [ "$STAGE" != hive ]; then
  log "pretokenize"
  python3 -m expert_cli.cli pretokenize --manifest "$EXPERT/manifest.json" 2>&1 | tail -3
fi
fi

bench() {  # bench NAME TIMEOUT ARGS...
  local name=$1 limit=$2; shift 2
  log "bench $name"
  # --budget: the list stops itself inside the limit, so a variant cut short is reported with
  # the end of its output (Unsloth's went with the stop on 2026-11-27); timeout stays a net
  timeout "$limit" python3 scripts/bench_train.py --expert "$EXPERT" --timeout 240 \
    --budget $((limit - 10)) --output "$OUT/bench-$name.json" "$@" 2>&1 | grep -v Warning
}

if [ "$STAGE" = auto ]; then  # what little device time is left: the batch probe alone
  bench auto 200 --variants f_fused_auto,f_batch_auto --steps 25
  log "done"; exit 0
fi
if [ "$STAGE" = hive ]; then
  log "check fused DoRA"  # bf16, NF4, dropout on a base with a bias, against peft / its math
  timeout 60 python3 scripts/check_fast_path_gpu.py --json --dora-only > "$OUT/check-hive.json" \
    2> "$OUT/check-hive.err"; tail -c 600 "$OUT/check-hive.err"; cat "$OUT/check-hive.json"
  if [ -d "$EXPLAIN/model" ]; then
    EXPERT=$EXPLAIN bench prompts 150 --variants e_default,f_loss_every_token --steps 25
    EXPERT=$EXPLAIN bench dora 280 --variants q_dora_hive,q_dora_hive_peft,q_dora,q_dora_peft \
      --steps 25
  else
    log "hive: the prompt-heavy expert or its model folder is not on this machine"
  fi
  log "done"; exit 0
fi
if [ "$STAGE" = prep ] || [ "$STAGE" = single ]; then
  log "check fast path"
  timeout 130 python3 scripts/check_fast_path_gpu.py --json > "$OUT/check-prep.json" \
    2> "$OUT/check-prep.err"; tail -c 1500 "$OUT/check-prep.err"
  python3 -c "import json; [print(r) for r in json.load(open('$OUT/check-prep.json'))['results']]"
  # int4: 0.72x of bf16 through peft's layers on 11-27; the fused layers, and with them the
  # one-kernel dequantization (train/dequant.py)
  bench quant 160 --variants q_int4,q_int4_peft,q_int4_one_kernel --steps 25
  # the layers that read one input as one function, against the fused layers one by one
  bench grouped 110 --variants f_adapters_fused,f_adapters_grouped --steps 25
fi
if [ "$STAGE" = main ] || [ "$STAGE" = single ]; then
  if [ -f "$SITE/.fa4" ]; then
    log "check flash-attention 4"
    timeout 50 python3 scripts/check_fast_path_gpu.py --json --kernels flash_attention_4 \
      --no-loss > "$OUT/check-main.json" 2> "$OUT/check-main.err"
    tail -c 800 "$OUT/check-main.err"; cat "$OUT/check-main.json"
  fi
  # f_batch_8x4 takes 32 rows a step: 15 steps (5 measured) hold more tokens than 25 of 8
  bench fused 280 --variants e_default,f_adapters_peft,f_dropout,f_dropout_peft,f_batch_8x4 \
    --steps 25 --long f_batch_8x4 --long-steps 15
  if [ -n "${UNSLOTH_PYTHONPATH:-}" ]; then
    bench unsloth 160 --variants d_unsloth --steps 25  # 100 s gave no result (2026-11-27)
  else
    log "unsloth: .carry/unsloth not carried"
  fi
  log "profile"
  # 40 s was cut before its first figure on 2026-11-27 (imports, the model, Triton's compiles)
  timeout 70 python3 scripts/profile_step.py --expert "$EXPERT" --output "$OUT/profile.json" 2>&1 | tail -25
fi
log "done"
