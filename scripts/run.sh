#!/usr/bin/env bash
# The main job: build, check every path against the fp64 oracle, then benchmark on the best device.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/bootstrap.sh"
cli="$build_dir/tools/replayssm"
"$cli" verify --device auto
"$cli" bench --device auto "$@"
