#!/usr/bin/env bash
# Every GPU measurement the issues ask for, in parts that each fit one 10-minute command on one H100.
#
# Before going to the GPU machine (it has no network, and no ../shared beside the repo), on a machine that has both:
#   bash benchmarks/gpu_session.sh prepare [--nanogpt DIR]  # nanoGPT's files (default ../shared/peers/nanoGPT) and
#                                                           # pytest's wheels into benchmarks/peers/ (git-ignored)
# and take benchmarks/peers/ along with the repo. Then, on the GPU machine, `targets` first:
#   bash benchmarks/gpu_session.sh targets # Llama-3.2-1B shape MFU (compiled, eager, eager with each speed
#                                          # switch), GPT-2 124M vs nanoGPT
#   bash benchmarks/gpu_session.sh features # fp8 vs bf16 (and fp8 x TP 2 on >= 2 GPUs), document masking, an MoE step
#   bash benchmarks/gpu_session.sh memory  # planned vs measured peak, cell by cell: repeat until it says 0 to go
#   bash benchmarks/gpu_session.sh tests   # tests/gpu (bf16/fp16/fp32, compile, resume, bench, sweep on CUDA)
#   bash benchmarks/gpu_session.sh train   # matmul ceiling; GPT-2 124M and a ~1.2B LLaMA at seq 2048, compiled
#   bash benchmarks/gpu_session.sh sweep   # the speed/memory table over seq x micro-batch for GPT-2 124M
# Options: --budget SECONDS (targets: default 420, inside the 480 s target; memory: 540), --nanogpt DIR,
# --dry-run (targets, memory: tiny shapes on a CPU, results in $GPU_SESSION_WORK/dry-run.json; tests: as is).
#
# targets and memory add to benchmarks/results/<gpu>-<date>.json (benchmarks/gpu_acceptance.py), a copy of which
# goes to $OUT; memory skips the cells already in that file, so bring it back into benchmarks/results/ before the
# next call on a fresh machine. Needs python3 with torch (CUDA), numpy, pyyaml and tokenizers; the package runs
# from src/ without installing, and an existing PYTHONPATH is kept (after src/). Results go to $OUT (default
# gpu-results/): one log per part and results-PART.tgz with every plan_vs_run.json, metrics.jsonl and table.
# Copy the figures into docs/benchmarks.md with the date, the machine and these commands.
set -uo pipefail
usage="usage: gpu_session.sh prepare|targets|features|memory|tests|train|sweep [--dry-run] [--nanogpt DIR] [--budget SECONDS]"
part=${1:?$usage}
shift
dry=() nanogpt=() budget=
while [ $# -gt 0 ]; do
    case $1 in
    --dry-run) dry=(--dry-run) ;;
    --nanogpt) nanogpt=(--nanogpt "$(realpath -m "${2:?--nanogpt needs a directory}")"); shift ;;
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    *) echo "gpu_session: unknown option $1; $usage" >&2; exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
peers=benchmarks/peers

if [ "$part" = prepare ]; then  # here, with ../shared and a package index; nothing of it is committed
    src=${nanogpt[1]:-../shared/peers/nanoGPT}
    for f in train.py model.py configurator.py LICENSE; do
        [ -f "$src/$f" ] || { echo "gpu_session: prepare: no $src/$f; give nanoGPT's directory with --nanogpt DIR" >&2
                              exit 2; }
    done
    mkdir -p "$peers/nanoGPT" "$peers/wheels"
    cp -f "$src"/{train.py,model.py,configurator.py,LICENSE} "$peers/nanoGPT/"
    echo "copied nanoGPT's train.py, model.py, configurator.py and LICENSE from $src to $peers/nanoGPT/"
    # pytest for `tests` (the GPU image has none): pure-Python wheels, unpacked there with the standard library.
    if "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$peers/wheels" \
        pytest pluggy iniconfig packaging pygments; then
        # torchao for `features`' fp8 run: its manylinux wheel for the GPU image's Python
        "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
            -d "$peers/wheels" "torchao==0.18.0" || echo "gpu_session: prepare: torchao's wheel not downloaded: fp8 skips"
        echo "downloaded pytest's wheels to $peers/wheels/"
    else
        echo "gpu_session: prepare: pytest's wheels could not be downloaded; \`tests\` needs pytest on the GPU machine"
    fi
    echo "take $peers/ along with the repo (it is git-ignored)"
    exit 0
fi

export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out=${OUT:-gpu-results}
work=${GPU_SESSION_WORK:-/tmp/pretrain-gpu}
mkdir -p "$out" "$work"
pretrain() { "$py" -m pretrain "$@"; }
log="$out/$part.log"
exec > >(tee "$log") 2>&1

echo "== $(date -u +%FT%TZ) part $part ${dry[*]}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || true
"$py" -c "import numpy, tokenizers, yaml" || { echo "gpu_session: numpy, tokenizers and pyyaml are needed"; exit 2; }
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() \
if torch.cuda.is_available() else 'no GPU')" || exit 2

prepare_data() {  # Python's bundled documentation with an 8K BPE: the step time does not depend on the text
    [ -f "$work/data/meta.json" ] && return
    "$py" -c "from pretrain.data import write_sample_corpus; write_sample_corpus('$work/corpus')"
    pretrain tokenizer train --input "$work/corpus" --vocab-size 8192 --out "$work/tokenizer"
    pretrain prepare --input "$work/corpus" --tokenizer "$work/tokenizer" --out "$work/data" --val-fraction 0.05
}

use_wheels() {  # MODULE: where the image lacks it, the wheels `prepare` brought, unpacked (a wheel is a zip)
    if ! "$py" -c "import $1" 2>/dev/null && ls "$peers"/wheels/*.whl >/dev/null 2>&1; then
        for w in "$peers"/wheels/*.whl; do "$py" -m zipfile -e "$w" "$work/site"; done
        export PYTHONPATH=$PYTHONPATH:$work/site
    fi
}

run_train() {  # NAME CONFIG OVERRIDES...: plan, then a short run whose plan_vs_run.json holds memory and MFU
    local name=$1 config=$2
    shift 2
    echo "== $name"
    pretrain plan "$config" "$@"
    rm -rf "$work/runs/$name"
    timeout 280 "$py" -m pretrain train "$config" data.dir="$work/data" run.dir="$work/runs/$name" \
        run.log_every=5 run.eval_every=0 run.eval_batches=2 run.checkpoint_every=0 run.progress=false \
        stability.spike_detection=false "$@"  # no checkpoint at all (15 GB for the 1.2B model)
    echo "exit $?"
}

case $part in
targets|memory|features)
    [ "$part" = features ] && use_wheels torchao
    default=$([ "$part" = memory ] && echo 540 || echo 420)
    budget=${budget:-$default}
    timeout $((${budget%.*} + 40)) "$py" benchmarks/gpu_acceptance.py "$part" --work "$work" --budget "$budget" \
        "${dry[@]}" "${nanogpt[@]}"
    echo "exit $?"
    cp benchmarks/results/*.json "$work/dry-run.json" "$out"/ 2>/dev/null
    ;;
tests)
    use_wheels pytest
    "$py" -c "import pytest" || { echo "gpu_session: pytest is missing: run \`gpu_session.sh prepare\` first"; exit 2; }
    timeout "${budget:-560}" "$py" -m pytest tests/gpu tests/plan/test_flops_vs_measured.py -v -p no:cacheprovider \
        -o addopts="" -rs --basetemp="$work/pytest"
    echo "exit $?"
    ;;
train)
    prepare_data
    timeout 100 "$py" -m pretrain bench --quick --out "$work/profile.json"
    run_train gpt2-124m configs/gpt2-124m.yaml train.grad_accum_steps=4 train.max_steps=40
    run_train llama-1b configs/llama-1b.yaml parallel.gpus=1 parallel.zero_stage=0 train.micro_batch_size=8 \
        train.grad_accum_steps=1 train.batch_ramp_tokens=0 train.max_steps=40
    ;;
sweep)
    timeout 300 "$py" -m pretrain sweep model.preset=gpt2 model.max_seq_len=8192 train.precision=bf16-mixed \
        train.seq_len=1,64,256,1024,2048,4096,8192 train.micro_batch_size=1,8 --out "$work/sweep" \
        --budget-seconds 240
    # Both loops' models live at once (2 x 20 GB of states): micro-batch 4 keeps the pair inside 80 GB.
    timeout 250 "$py" benchmarks/bench_train_step.py model.preset=llama3.2-1b train.seq_len=2048 \
        train.micro_batch_size=4 train.precision=bf16-mixed train.activation_checkpointing=selective \
        train.compile=true train.device=cuda hardware.peak_tflops=989.4 --steps 10 --rounds 3
    ;;
*)
    echo "gpu_session: unknown part $part; $usage"
    exit 2
    ;;
esac
tar czf "$out/results-$part.tgz" -C "$work" --exclude='checkpoints' --exclude='*.bin' --exclude=site . 2>/dev/null
echo "== done $(date -u +%FT%TZ); results in $out"
