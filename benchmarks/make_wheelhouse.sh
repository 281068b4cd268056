#!/usr/bin/env bash
# Build the folder of wheels that lets benchmarks/gpu.sh run on a machine that has only Python and a CUDA torch.
#
#   bash benchmarks/make_wheelhouse.sh                              # for CPython 3.11, glibc >= 2.28, x86_64
#   bash benchmarks/make_wheelhouse.sh --python-version 3.12 --glibc 2.34 --arch aarch64 --out /tmp/wh
#   bash benchmarks/make_wheelhouse.sh --platform manylinux2014_x86_64   # explicit pip platform tag(s)
#
# Run it from a checkout on a machine that reaches the package index. It writes, into --out
# (default benchmarks/wheelhouse, ignored by git):
#   - the project's wheel (pip wheel --no-deps .);
#   - every dependency the project needs on the target, resolved for the target's platform and Python version
#     (pip install --dry-run --report with --only-binary=:all: --platform ... --python-version ...), except torch,
#     torchvision and what a pip-installed torch brings itself (triton, the CUDA libraries nvidia-* and cuda-*,
#     sympy, networkx, jinja2, filelock, fsspec, typing-extensions, setuptools), which the GPU machine has;
#   - requirements.txt, the pinned list, and target.txt, what it was built for.
# Copy the checkout with that folder to the GPU machine and run: bash benchmarks/gpu.sh (it installs offline).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PYVER=""
GLIBC="2.28"
ARCH="x86_64"
OUT="benchmarks/wheelhouse"
PLATFORMS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) PYVER="$2"; shift 2 ;;
        --glibc) GLIBC="$2"; shift 2 ;;
        --arch) ARCH="$2"; shift 2 ;;
        --platform) PLATFORMS+=("$2"); shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "make_wheelhouse.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$PYVER" ] || PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ ${#PLATFORMS[@]} -eq 0 ]; then
    # pip does not widen a manylinux_2_N tag to older glibc versions: list them all (2_17 is manylinux2014)
    minor="${GLIBC#2.}"
    for ((x = minor; x >= 17; x--)); do PLATFORMS+=("manylinux_2_${x}_${ARCH}"); done
    PLATFORMS+=("manylinux2014_${ARCH}")
fi
PLATFORM_ARGS=()
for p in "${PLATFORMS[@]}"; do PLATFORM_ARGS+=(--platform "$p"); done
TARGET=(--only-binary=:all: "${PLATFORM_ARGS[@]}" --python-version "$PYVER" --implementation cp)

start=$(date +%s)
mkdir -p "$OUT"
rm -f "$OUT"/*.whl
echo "building the project's wheel into $OUT"
"$PY" -m pip wheel --no-deps --quiet --wheel-dir "$OUT" .
wheel=$(ls "$OUT"/monai_vce-*.whl)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "resolving its dependencies for CPython $PYVER on ${PLATFORMS[0]}"
"$PY" -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" --target "$work/target" \
    "${TARGET[@]}" --find-links "$OUT" "$wheel"
"$PY" - "$work/report.json" "$OUT/requirements.txt" <<'PY'
import json, re, sys

report, out = sys.argv[1], sys.argv[2]
# torch brings these itself (its CUDA libraries and its own requirements): the GPU machine has them
torch_own = "torch|torchvision|triton|nvidia-.*|cuda-.*|sympy|mpmath|networkx|jinja2|markupsafe|filelock|fsspec"
skip = re.compile(rf"^({torch_own}|typing-extensions|setuptools|monai-vce)$")
pins = []
for item in json.load(open(report))["install"]:
    name = re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower()
    if not skip.match(name):
        pins.append(f"{name}=={item['metadata']['version']}")
open(out, "w").write("\n".join(sorted(pins)) + "\n")
print(f"{len(pins)} dependencies to download (torch, torchvision and what torch brings itself left out)")
PY
"$PY" -m pip download --quiet --no-deps "${TARGET[@]}" --dest "$OUT" -r "$OUT/requirements.txt"
printf 'python %s\nplatforms %s\nbuilt %s\n' "$PYVER" "${PLATFORMS[*]}" "$(date -u +%FT%TZ)" > "$OUT/target.txt"
echo "wheelhouse $OUT: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1), in $(( $(date +%s) - start )) s"
