#!/usr/bin/env bash
# lumen on a CUDA GPU in one command of a few minutes: Hugging Face parity of every family in float32 and bf16,
# a compiled bf16 training step and its MFU, lumen train and FSDP under torchrun (NCCL), compiled decoding, the
# lens and attribution, and the path of GGUF's quantized matrices (bench/gpu_check.py says what each check does).
#
#   bench/gpu_check.sh                 # on a machine with a CUDA GPU and a CUDA build of torch
#   bench/gpu_check.sh --only parity   # some of the checks
#   bench/gpu_check.sh --device cpu    # a rehearsal of the same code on the CPU (small shapes)
#
# Without a CUDA device it says so in one line and exits 0. Otherwise one PASS/FAIL line per check, and the
# exit code is the number of failures.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
case " $* " in
  *" --device cpu "*|*" --device=cpu "*) ;;
  *) if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
       echo "gpu_check: skipped: no CUDA device here ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "no torch for $PY"))"
       exit 0
     fi ;;
esac
exec timeout 900 "$PY" bench/gpu_check.py "$@"
