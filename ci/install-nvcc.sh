#!/usr/bin/env bash
# Installs a pinned nvcc (CUDA 13.0, matching the GPU machine's driver) from PyPI
# wheels into PREFIX, with no system CUDA, then fixes the wheel layout so nvcc finds
# its libraries and headers. Idempotent: a second run only re-checks the layout.
#
#   bash ci/install-nvcc.sh [PREFIX]        # default: $HOME/.cache/twolock/nvcc
#   export NVCC=PREFIX/nvidia/cu13/bin/nvcc # printed at the end
#
# Never install a newer nvcc: PTX/SASS from a newer toolkit does not load on the
# CUDA 13.0 driver.
set -euo pipefail

PREFIX="${1:-${TWOLOCK_NVCC_PREFIX:-$HOME/.cache/twolock/nvcc}}"
PYTHON="${PYTHON:-python3}"
PINS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
)

CU="$PREFIX/nvidia/cu13"
NVCC="$CU/bin/nvcc"

installed() {
    # Every pinned wheel's dist-info must be present at its exact version.
    local pin name ver
    for pin in "${PINS[@]}"; do
        name="${pin%%==*}"
        ver="${pin##*==}"
        [ -d "$PREFIX/${name//-/_}-${ver}.dist-info" ] || return 1
    done
    [ -x "$NVCC" ]
}

if installed; then
    echo "install-nvcc: pinned wheels already in $PREFIX" >&2
else
    mkdir -p "$PREFIX"
    "$PYTHON" -m pip install --disable-pip-version-check --no-deps --upgrade \
        --target "$PREFIX" "${PINS[@]}"
fi

# Layout fixes: the wheels ship lib/ and include/ but nvcc.profile expects lib64/ and
# targets/x86_64-linux/{lib,include}; cccl (cuda/std, cub, thrust) lives in a
# subfolder that nvcc does not search.
link() {  # link TARGET NAME: make NAME a symlink to TARGET unless it already is one
    local target="$1" name="$2"
    if [ -L "$name" ]; then
        [ "$(readlink "$name")" = "$target" ] && return 0
        rm -f "$name"
    elif [ -e "$name" ]; then
        echo "install-nvcc: $name exists and is not a symlink; leaving it" >&2
        return 0
    fi
    ln -s "$target" "$name"
}
link lib "$CU/lib64"
mkdir -p "$CU/targets/x86_64-linux"
link ../../lib "$CU/targets/x86_64-linux/lib"
link ../../include "$CU/targets/x86_64-linux/include"
if [ -d "$CU/include/cccl" ]; then
    cp -a "$CU/include/cccl/." "$CU/include/"
fi
# Some wheel versions keep cccl under a separate top-level folder.
for cccl in "$PREFIX/nvidia/cuda_cccl/include" "$PREFIX/nvidia/cu13/cccl/include"; do
    if [ -d "$cccl" ]; then
        cp -a "$cccl/." "$CU/include/"
    fi
done
chmod +x "$CU"/bin/* "$CU"/nvvm/bin/* 2>/dev/null || true

"$NVCC" --version >&2
echo "export NVCC=$NVCC"
