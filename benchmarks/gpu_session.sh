#!/usr/bin/env bash
# Every GPU measurement the issues ask for, in parts that each fit one 10-minute command on one H100.
# Run `targets` first: it alone answers the acceptance targets, writing each figure as it comes.
#
#   bash benchmarks/gpu_session.sh targets # Llama-3.2-1B shape MFU (compiled, eager), GPT-2 124M vs nanoGPT
#   bash benchmarks/gpu_session.sh memory  # planned vs measured peak: precision x recompute x batch x accum
#   bash benchmarks/gpu_session.sh tests   # tests/gpu (bf16/fp16/fp32, compile, resume, bench, sweep on CUDA)
#   bash benchmarks/gpu_session.sh train   # matmul ceiling; GPT-2 124M and a ~1.2B LLaMA at seq 2048, compiled
#   bash benchmarks/gpu_session.sh sweep   # the speed/memory table over seq x micro-batch for GPT-2 124M
#
# targets and memory add to benchmarks/results/<gpu>-<date>.json (benchmarks/gpu_acceptance.py; copied to
# $OUT too). memory runs 72 cells per vocabulary and compile mode: give it more than one 10-minute call.
# Needs python3 with torch (CUDA), tokenizers, rich, matplotlib, tensorboard, safetensors, transformers, pyyaml
# and psutil; the package runs from src/ without installing. Results go to $OUT (default gpu-results/): one
# log per part and results-PART.tgz with every plan_vs_run.json, metrics.jsonl, profile and sweep table.
# Copy the figures into docs/benchmarks.md with the date, the machine and these commands.
set -uo pipefail
part=${1:?usage: gpu_session.sh targets|memory|tests|train|sweep}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out=${OUT:-gpu-results}
work=${GPU_SESSION_WORK:-/tmp/pretrain-gpu}
mkdir -p "$out" "$work"
py=${PYTHON:-python3}
pretrain() { "$py" -m pretrain "$@"; }
log="$out/$part.log"
exec > >(tee "$log") 2>&1

echo "== $(date -u +%FT%TZ) part $part"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || true
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() \
if torch.cuda.is_available() else 'no GPU')"

prepare_data() {  # Python's bundled documentation with an 8K BPE: the step time does not depend on the text
    [ -f "$work/data/meta.json" ] && return
    "$py" -c "from pretrain.data import write_sample_corpus; write_sample_corpus('$work/corpus')"
    pretrain tokenizer train --input "$work/corpus" --vocab-size 8192 --out "$work/tokenizer"
    pretrain prepare --input "$work/corpus" --tokenizer "$work/tokenizer" --out "$work/data" --val-fraction 0.05
}

run_train() {  # NAME CONFIG OVERRIDES...: plan, then a short run whose plan_vs_run.json holds memory and MFU
    local name=$1 config=$2
    shift 2
    echo "== $name"
    pretrain plan "$config" "$@"
    rm -rf "$work/runs/$name"
    timeout 280 "$py" -m pretrain train "$config" data.dir="$work/data" run.dir="$work/runs/$name" \
        run.log_every=5 run.eval_every=0 run.eval_batches=2 run.checkpoint_every=0 run.progress=false \
        stability.spike_detection=false "$@"  # no step-0 rollback checkpoint (15 GB for the 1.2B model)
    echo "exit $?"
}

case $part in
targets|memory)
    timeout 580 "$py" benchmarks/gpu_acceptance.py "$part" --work "$work"
    cp benchmarks/results/*.json "$out"/ 2>/dev/null
    ;;
tests)
    timeout 560 "$py" -m pytest tests/gpu tests/plan/test_flops_vs_measured.py -v -p no:cacheprovider -o addopts="" -rs --basetemp="$work/pytest"
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
    echo "unknown part $part (targets | memory | tests | train | sweep)"
    exit 2
    ;;
esac
tar czf "$out/results-$part.tgz" -C "$work" --exclude='checkpoints' --exclude='*.bin' . 2>/dev/null
echo "== done $(date -u +%FT%TZ); results in $out"
