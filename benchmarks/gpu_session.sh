#!/usr/bin/env bash
# Every GPU measurement the issues ask for, in parts that each fit one 10-minute command on one H200.
#
# A 15-minute window (machine start-up included, at most 10 minutes a command) runs `first` and nothing else:
#   bash benchmarks/gpu_session.sh first   # in order: the compiled Llama-3.2-1B shape's MFU and its peak against
#                                          # the plan, GPT-2 124M vs nanoGPT, the 1B eager, document masking on vs
#                                          # off, fp8 vs bf16, the MoE step; ~8 minutes, every figure in $OUT as
#                                          # soon as it is measured
# It needs, carried with the repo (git-ignored, so name it in the call's carry): benchmarks/peers/, which
#   bash benchmarks/gpu_session.sh prepare [--nanogpt DIR]  # nanoGPT's files (default ../shared/peers/nanoGPT)
#                                                           # and torchao's and pytest's wheels
# fills here, where ../shared and a package index are. Without nanoGPT or torchao `first` refuses to start (one
# line, exit 2) unless told --skip nanogpt / --skip fp8. Later windows, each one command:
#   bash benchmarks/gpu_session.sh memory  # the ~20 cells of planned vs measured peak that decide the plan's terms
#                                          # first, then the rest: carry the returned memory.json as
#                                          # benchmarks/peers/memory.json and call it again
#   bash benchmarks/gpu_session.sh targets # a second GPT-2 / nanoGPT round, the eager 1B with each speed switch
#   bash benchmarks/gpu_session.sh features # fp8 with tensor parallelism (>= 2 GPUs)
#   bash benchmarks/gpu_session.sh tests   # tests/gpu (bf16/fp16/fp32, compile, resume, bench, sweep on CUDA)
#   bash benchmarks/gpu_session.sh train   # matmul ceiling; GPT-2 124M and a ~1.2B LLaMA at seq 2048, compiled
#   bash benchmarks/gpu_session.sh sweep   # the speed/memory table over seq x micro-batch for GPT-2 124M
# Options: --budget SECONDS (first: default 470, memory 500, targets 420), --nanogpt DIR, --skip nanogpt,fp8,
# --from FILE (an earlier call's results JSON: what it measured is not run again; default
# benchmarks/peers/PART.json where carried), --cells N (memory), --dry-run (first, targets, features, memory:
# tiny shapes on a CPU; tests: as is).
#
# Results go to $OUT (default gpu-results/) the moment each is measured: PART.json (benchmarks/gpu_acceptance.py,
# rewritten atomically after every figure), runs/NAME/ (each run's train.log as it runs, its plan_vs_run.json and
# metrics.jsonl when it ends), PART.log (this command's output), and inductor-cache/ (torch.compile's and
# triton's caches: carry it back as benchmarks/peers/inductor-cache and a fresh machine compiles from it). A kill
# at any moment keeps every finished figure. Needs python3 with torch (CUDA), numpy, pyyaml and tokenizers; the
# package runs from src/ without installing, and an existing PYTHONPATH is kept (after src/). Copy the figures
# into docs/benchmarks.md with the date, the machine and these commands.
set -uo pipefail
usage="usage: gpu_session.sh prepare|first|memory|targets|features|tests|train|sweep [--dry-run] [--nanogpt DIR] \
[--skip nanogpt,fp8] [--from FILE] [--budget SECONDS] [--cells N]"
part=${1:?$usage}
shift
dry=() nanogpt=() budget= skip= from=() cells=()
while [ $# -gt 0 ]; do
    case $1 in
    --dry-run) dry=(--dry-run) ;;
    --nanogpt) nanogpt=(--nanogpt "$(realpath -m "${2:?--nanogpt needs a directory}")"); shift ;;
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --skip) skip=${2:?--skip needs a comma list of nanogpt, fp8}; shift ;;
    --from) from=(--from "$(realpath -m "${2:?--from needs a results file}")"); shift ;;
    --cells) cells=(--cells "${2:?--cells needs a number}"); shift ;;
    *) echo "gpu_session: unknown option $1; $usage" >&2; exit 2 ;;
    esac
    shift
done
case $part in prepare|first|memory|targets|features|tests|train|sweep) ;;
*) echo "gpu_session: unknown part $part; $usage" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
peers=benchmarks/peers
skipped() { [[ ",$skip," == *",$1,"* ]]; }

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
out=$(realpath -m "${OUT:-gpu-results}")
work=${GPU_SESSION_WORK:-/tmp/pretrain-gpu}
mkdir -p "$out" "$work"
pretrain() { "$py" -m pretrain "$@"; }

use_wheels() {  # MODULE: where the image lacks it, the wheels `prepare` brought, unpacked (a wheel is a zip)
    if ! "$py" -c "import $1" >/dev/null 2>&1 && ls "$peers"/wheels/*.whl >/dev/null 2>&1; then
        for w in "$peers"/wheels/*.whl; do "$py" -m zipfile -e "$w" "$work/site"; done
        export PYTHONPATH=$PYTHONPATH:$work/site
    fi
}

# Refusals, before anything runs or prints: a window's figure must not go missing for want of a file.
case $part in first|targets)
    if ! skipped nanogpt; then
        dir=${nanogpt[1]:-$peers/nanoGPT}
        for f in train.py model.py configurator.py; do
            [ -f "$dir/$f" ] || { echo "gpu_session: no $dir/$f: run \`gpu_session.sh prepare\` where ../shared is and carry \
benchmarks/peers (or give --nanogpt DIR), or add --skip nanogpt" >&2; exit 2; }
        done
        nanogpt=(--nanogpt "$(realpath "$dir")")
    fi ;;
esac
case $part in first|features)
    if ! skipped fp8; then
        use_wheels torchao
        "$py" -c "import torchao.float8" >/dev/null 2>&1 || { echo "gpu_session: torchao is not importable (fp8 needs \
it): run \`gpu_session.sh prepare\` and carry benchmarks/peers/wheels, or add --skip fp8" >&2; exit 2; }
        export GPU_SESSION_TORCHAO=found  # gpu_acceptance.py does not probe it again
    fi ;;
esac

log="$out/$part.log"
exec > >(tee "$log") 2>&1

echo "== $(date -u +%FT%TZ) part $part ${dry[*]}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || true
"$py" -c "import numpy, tokenizers, yaml, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" \
    || { echo "gpu_session: torch, numpy, tokenizers and pyyaml are needed"; exit 2; }

prepare_data() {  # the sample corpus with an 8K BPE, a validation split of a 2048-token window at least
    "$py" -c "import sys; sys.path.insert(0, 'benchmarks'); from gpu_runs import prepare_data; \
from pathlib import Path; print('data', prepare_data(Path('$work'), 8192, 2048))" || exit 2
}

run_train() {  # NAME CONFIG OVERRIDES...: plan, then a short run whose plan_vs_run.json holds memory and MFU
    local name=$1 config=$2
    shift 2
    echo "== $name"
    pretrain plan "$config" "$@"
    rm -rf "$work/runs/$name"
    timeout 280 "$py" -m pretrain train "$config" data.dir="$work/data8192" run.dir="$work/runs/$name" \
        run.log_every=5 run.eval_every=0 run.eval_batches=2 run.checkpoint_every=0 run.progress=false \
        stability.spike_detection=false "$@"  # no checkpoint at all (15 GB for the 1.2B model)
    echo "exit $?"
}

case $part in
first|targets|features|memory)
    # torch.compile's and triton's caches in $OUT, started from the ones an earlier window brought back
    export TORCHINDUCTOR_CACHE_DIR=$out/inductor-cache
    if [ -d "$peers/inductor-cache" ] && [ ! -d "$TORCHINDUCTOR_CACHE_DIR" ]; then
        cp -r "$peers/inductor-cache" "$TORCHINDUCTOR_CACHE_DIR"
    fi
    [ ${#from[@]} -eq 0 ] && [ -f "$peers/$part.json" ] && from=(--from "$peers/$part.json")
    declare -A budgets=([first]=470 [memory]=500 [targets]=420 [features]=420)
    budget=${budget:-${budgets[$part]}}
    # past the budget (each run is capped inside it), TERM: the script stops the run it waits for, then exits
    timeout -k 20 $((${budget%.*} + 60)) "$py" benchmarks/gpu_acceptance.py "$part" --out "$out" --work "$work" \
        --budget "$budget" ${skip:+--skip "$skip"} "${dry[@]}" "${nanogpt[@]}" "${from[@]}" "${cells[@]}"
    echo "exit $?"
    echo "== done $(date -u +%FT%TZ); results in $out"
    exit 0
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
esac
tar czf "$out/results-$part.tgz" -C "$work" --exclude='checkpoints' --exclude='*.bin' --exclude=site . 2>/dev/null
echo "== done $(date -u +%FT%TZ); results in $out"
