#!/usr/bin/env bash
# Every test: the C++ suite through ctest and the Python package through pytest (GPU cases
# skip where there is no GPU).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/bootstrap.sh"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
"$root/tests/python/run.sh" "$build_dir"  # the Python package: pip install, then pytest
