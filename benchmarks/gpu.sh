#!/usr/bin/env bash
# Accelerator benchmark in one run, under 8 minutes on one H200-class GPU: installs the project offline from the
# wheelhouse when it is not importable, generates frames, measures end-to-end inference (full and reduced) and
# training frames/s (bf16, full-size DiffAttn ViT-B/16, eager and torch.compile), the plain-ViT / differential-
# attention speed ratio and peak GPU memory, and prints one table.
#
#   bash benchmarks/make_wheelhouse.sh --python-version 3.11   # once, on a machine that reaches the package index
#   bash benchmarks/gpu.sh                                      # on the GPU machine (Python and a CUDA torch only)
#   bash benchmarks/gpu.sh --compile off                        # extra arguments go to benchmarks/gpu_bench.py
#   bash benchmarks/gpu.sh --device cpu --tiny                  # smoke test of the same path on a CPU
#   PYTHON=/path/to/python WHEELHOUSE=/path/to/wheelhouse bash benchmarks/gpu.sh
#
# Installing: when one of the project's dependencies does not import, the wheels of WHEELHOUSE (default
# benchmarks/wheelhouse) are installed with pip --no-index: into PYTHON's environment when it is a virtual
# environment, else into a new one, .venv-gpu, that sees the system's packages (so the machine's CUDA torch is
# used as it is). Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
PY="${PYTHON:-python3}"
WHEELHOUSE="${WHEELHOUSE:-benchmarks/wheelhouse}"
export PYTHONUNBUFFERED=1
device=cuda
prev=""
for a in "$@"; do
    [ "$prev" = "--device" ] && device="$a"
    case "$a" in --device=*) device="${a#--device=}" ;; esac
    prev="$a"
done

missing() {
    "$1" - <<'PY'
import importlib.util
need = ["torch", "torchvision", "monai", "open_clip", "timm", "ignite", "scipy", "PIL", "tqdm", "monai_vce"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PY
}

# the checkout's own package is what is measured, even where an older monai-vce is installed
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
gone=$(missing "$PY")
if [ -n "$gone" ]; then
    if ! ls "$WHEELHOUSE"/monai_vce-*.whl >/dev/null 2>&1; then
        echo "benchmarks/gpu.sh: missing Python packages: $gone, and no wheelhouse at $WHEELHOUSE" \
            "(build it with: bash benchmarks/make_wheelhouse.sh --python-version X.Y)" >&2
        exit 2
    fi
    if ! "$PY" -c "import sys; sys.exit(sys.prefix == sys.base_prefix)"; then
        # not a virtual environment: install into one that sees the system's packages (the CUDA torch)
        [ -x .venv-gpu/bin/python ] || "$PY" -m venv --system-site-packages .venv-gpu
        PY="$PWD/.venv-gpu/bin/python"
    fi
    echo "installing monai-vce and its missing dependencies from $WHEELHOUSE into $("$PY" -c 'import sys; print(sys.prefix)')"
    "$PY" -m pip install --quiet --no-index --find-links "$WHEELHOUSE" monai-vce
    gone=$(missing "$PY")
    if [ -n "$gone" ]; then
        echo "benchmarks/gpu.sh: still missing after the offline install: $gone" >&2
        exit 2
    fi
    echo "installed in $(( $(date +%s) - start )) s"
fi
if [ "$device" = "cuda" ]; then
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'benchmarks/gpu.sh: no CUDA device visible to torch')"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
"$PY" -c "import os, torch, torchvision, monai; print(f'torch {torch.__version__}, torchvision {torchvision.__version__}, monai {monai.__version__}, {os.cpu_count()} CPU cores')"
# hard stop inside 8 minutes in all, the install included; the table is printed at the end of a complete run only
left=$(( 470 - ($(date +%s) - start) ))
timeout "$left" "$PY" benchmarks/gpu_bench.py --device cuda "$@"
