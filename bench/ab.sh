#!/usr/bin/env bash
# A/B timing of source trees built side by side and benched in alternating rounds, so that every
# ratio between them comes from one run on one machine (notes/cuda.md keeps these runs).
#
#   OUT=out bench/ab.sh TREE... [-- BENCH_ARGS...]
#
# Each TREE is a source directory; the first is the reference. Another commit's tree is made
# with `git archive REF | tar -x -C DIR` (on a machine without the repository's history, carry the
# directory there). BENCH_ARGS are `replayssm bench` options (default: standard decode, Nemotron-H,
# bf16 activations, fp32 and bf16 states, L = 16, batch 1, 8, 32, 128; add `--spec 4 --accept
# fixed:8` for speculative decoding). Environment: ROUNDS (default 2); TESTS=1 also builds and runs
# the CUDA tests of the last tree; JOBS (default: the machine's cores); CMAKE_ARGS, more configure
# options (e.g. -DCMAKE_CUDA_ARCHITECTURES=90a).
# Writes $OUT/ab_<tree>_r<round>.json and prints the medians per configuration (bench/ab_summary.py).
set -euo pipefail
OUT=${OUT:-out}
ROUNDS=${ROUNDS:-2}
JOBS=${JOBS:-$(nproc)}
here=$(cd "$(dirname "$0")" && pwd)
trees=()
while [[ $# -gt 0 && $1 != -- ]]; do trees+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  # shellcheck disable=SC2054  # the commas are inside option values
  args=(--device cuda --geometry nemotron-h --act-dtype bf16 --windows 5 --state-dtype fp32,bf16 --L 16
        --batch 1,8,32,128)
fi
if [[ ${#trees[@]} -lt 1 ]]; then
  echo "usage: OUT=out $0 TREE... [-- BENCH_ARGS...]" >&2
  exit 2
fi
mkdir -p "$OUT"
names=()
for i in "${!trees[@]}"; do names+=("$i-$(basename "$(cd "${trees[$i]}" && pwd)")"); done

# Builds in parallel, the cores shared among the trees.
per_tree=$(( JOBS / ${#trees[@]} > 1 ? JOBS / ${#trees[@]} : 1 ))
last=$(( ${#trees[@]} - 1 ))
for i in "${!trees[@]}"; do
  (
    targets=(replayssm_tool)
    [[ ${TESTS:-0} == 1 && $i == "$last" ]] && targets+=(replayssm_tests replayssm_cuda_tests)
    # shellcheck disable=SC2086  # CMAKE_ARGS: words on purpose
    cmake -S "${trees[$i]}" -B "build-ab-${names[$i]}" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} > /dev/null
    cmake --build "build-ab-${names[$i]}" -j "$per_tree" --target "${targets[@]}" > "$OUT/build-${names[$i]}.log" 2>&1
  ) &
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
if [[ $failed == 1 ]]; then
  echo "a build failed: see $OUT/build-*.log" >&2
  exit 1
fi

if [[ ${TESTS:-0} == 1 ]]; then
  tests="build-ab-${names[$last]}/tests"
  "$tests/replayssm_cuda_tests" --gtest_brief=1 2>&1 | grep -E '^\[  (PASSED|FAILED) |tests from .* ran'
  # The CUDA cases of the main test binary in six shards (they are independent processes).
  for shard in 0 1 2 3 4 5; do
    GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$shard "$tests/replayssm_tests" --gtest_filter='*cuda*' \
      --gtest_brief=1 > "$OUT/tests-$shard.log" 2>&1 &
  done
  wait
  cat "$OUT"/tests-*.log | grep -E '^\[  (PASSED|FAILED) |tests from .* ran|FAILED' | sort | uniq -c
fi

for round in $(seq 1 "$ROUNDS"); do
  for i in "${!trees[@]}"; do
    "build-ab-${names[$i]}/tools/replayssm" bench "${args[@]}" --json "$OUT/ab_${names[$i]}_r$round.json" \
      > "$OUT/bench-${names[$i]}-r$round.log" 2>&1
  done
done
python3 "$here/ab_summary.py" "$OUT"/ab_*_r*.json
