#!/usr/bin/env bash
# Accelerator benchmark in one run (installs nothing; under 8 minutes on one H200-class GPU): generates frames,
# measures end-to-end inference and training frames/s (bf16, full-size DiffAttn ViT-B/16, eager and
# torch.compile), the plain-ViT / differential-attention speed ratio and peak GPU memory, and prints one table.
#
#   bash benchmarks/gpu.sh                      # defaults of benchmarks/gpu_bench.py
#   bash benchmarks/gpu.sh --compile off        # extra arguments go to gpu_bench.py
#   PYTHON=/path/to/python bash benchmarks/gpu.sh
#
# Needs the project's dependencies importable (torch, torchvision, monai, open_clip, timm, pytorch-ignite);
# the repository itself is put on PYTHONPATH when monai_vce is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if ! "$PY" -c "import monai_vce" 2>/dev/null; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
missing=$("$PY" - <<'PY'
import importlib
need = ["torch", "torchvision", "monai", "open_clip", "timm", "ignite", "scipy", "PIL", "tqdm"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
    echo "benchmarks/gpu.sh: missing Python packages: $missing (install the project's dependencies first)" >&2
    exit 2
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'benchmarks/gpu.sh: no CUDA device visible to torch')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import os, torch, torchvision, monai; print(f'torch {torch.__version__}, torchvision {torchvision.__version__}, monai {monai.__version__}, {os.cpu_count()} CPU cores')"
# hard stop well inside 8 minutes; the table is printed at the end of a complete run only
timeout 460 "$PY" benchmarks/gpu_bench.py --device cuda "$@"
