#!/usr/bin/env bash
# The Python tests: `pip install` the package into a virtual environment under the build
# directory, then pytest. Usage: tests/python/run.sh [BUILD_DIR] (default: build/).
#
# The package is built with CUDA only where a GPU can run it: elsewhere (CI) the CPU-only build
# avoids compiling every CUDA kernel a second time. The environment sees the packages of the
# Python that runs this script (torch where installed, even in a virtual environment); what the
# tests need and is missing comes from PyPI.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=${1:-${BUILD_DIR:-$root/build}}
mkdir -p "$build_dir" && build_dir=$(cd "$build_dir" && pwd)  # pip and pytest run from other folders
python=${PYTHON:-python3}
venv=$build_dir/python-venv

if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -m venv "$venv"; then
    # Debian's system Python ships venv and its headers separately.
    echo "tests/python: installing python3-venv and python3-dev"
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq python3-venv python3-dev >/dev/null
    rm -rf "$venv"
    "$python" -m venv "$venv"
  fi
  venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$python" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
    > "$venv_site/invoking_python_site.pth"
fi
py=$venv/bin/python

missing=()
for requirement in numpy:numpy pytest:pytest scikit_build_core:scikit-build-core nanobind:nanobind; do
  "$py" -c "import ${requirement%%:*}" 2>/dev/null || missing+=("${requirement#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  "$py" -m pip install -q "${missing[@]}"
fi
# Optional (numpy bfloat16 cases skip without it): not fatal on a machine without PyPI.
"$py" -c "import ml_dtypes" 2>/dev/null || "$py" -m pip install -q --retries 1 --timeout 15 ml_dtypes ||
  echo "tests/python: ml_dtypes unavailable, numpy bfloat16 cases will skip"

cuda=OFF
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  cuda=ON
fi
echo "tests/python: pip install (CUDA $cuda)"
REPLAYSSM_ENABLE_CUDA=$cuda CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$py" -m pip install -q --no-build-isolation --no-deps -C build-dir="$build_dir/python-build" "$root"

cd "$root/tests/python"
"$py" -m pytest -q -rs
