#!/usr/bin/env bash
# Build, GPU tests, sanitizers, kernel timings and the recorded bench on an H200, stage by stage.
# Logs go to $OUT (default ./out).
# Stages (any subset, in order): build tests sanitize tune bench spec
# tune reads L (default 16), BATCHES (1,8,32,128,512), ROWS (chunks: 0,16,32,64) and ROUTE (auto).
# REQUIRE (e.g. H200): run no stage unless the GPU's name contains it, so that a device call that
# was given another GPU costs only its start.
set -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
log() { tee -a "$OUT/$1"; }
if [[ -n ${REQUIRE:-} ]] && ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q "$REQUIRE"; then
  echo "$(nvidia-smi --query-gpu=name --format=csv,noheader) is not an $REQUIRE: no stage run" | log gpu.log
  exit 0
fi
for stage in "$@"; do
  case $stage in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | log build.log
      cmake -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a . \
        > /dev/null && cmake --build build-h200 -j16 2>&1 | tail -5 | log build.log || exit 1 ;;
    tests)
      ./build-h200/tests/replayssm_cuda_tests 2>&1 | tail -30 | log tests.log
      # The CUDA cases of the main test binary in six shards side by side (301 s in one process).
      for k in 0 1 2 3 4 5; do
        GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$k ./build-h200/tests/replayssm_tests --gtest_filter='*cuda*' \
          --gtest_brief=1 > "$OUT/tests-$k.log" 2>&1 &
      done
      wait
      cat "$OUT"/tests-[0-5].log | grep -E '^\[  (PASSED|FAILED) |tests from .* ran|FAILED' | log tests.log ;;
    sanitize)
      # memcheck and racecheck on every CUDA test, one compute-sanitizer process a test case, at most
      # SANITIZE_JOBS (12) at once (more run the GPU out of memory), the longest rollouts first (a
      # Nemotron-H or long-buffer rollout takes minutes under racecheck), every process stopped at
      # one deadline, LIMIT seconds (default 450) after the stage starts. FILTER (default *cuda*)
      # picks the cases of replayssm_tests. sanitize.log has a line a case: its tool and name, then
      # its passed and FAILED counts with the tool's summary, "stopped by LIMIT" or "not started";
      # run those again by FILTER.
      mkdir -p "$OUT/sanitize"
      export SANITIZE_DEADLINE=$(($(date +%s) + ${LIMIT:-450})) SANITIZE_OUT="$OUT/sanitize"
      cases=$(./build-h200/tests/replayssm_tests --gtest_list_tests --gtest_filter="${FILTER:-*cuda*}" |
        awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }')
      long='nemotronh|LongBuffer|WideBatch|mamba2_2p7b'
      { echo "replayssm_cuda_tests *"
        { grep -E "$long" <<< "$cases"; grep -vE "$long" <<< "$cases"; } | sed 's/^/replayssm_tests /'
      } | awk '{ print "memcheck", $0; print "racecheck", $0 }' | nl -w1 -s' ' |
        xargs -P "${SANITIZE_JOBS:-12}" -L1 bash -c '
          log="$SANITIZE_OUT/$0.log"; echo "$1 $2 $3" > "$log"; left=$((SANITIZE_DEADLINE - $(date +%s)))
          if ((left < 10)); then echo "not started: no time left" >> "$log"; exit 0; fi
          timeout $left compute-sanitizer --tool $1 --error-exitcode 3 ./build-h200/tests/$2 \
            --gtest_filter="$3" >> "$log" 2>&1'
      for f in "$OUT"/sanitize/*.log; do
        if grep -q '^not started' "$f"; then status="not started"
        elif grep -qE 'tests? from .* ran\.' "$f"; then
          status="$(grep -cE '^\[       OK \]' "$f") passed, $(grep -cE '^\[  FAILED  \]' "$f") FAILED, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -1)"
        else status="stopped by LIMIT"; fi
        echo "$(head -1 "$f"): $status"
      done | sort | log sanitize.log ;;
    spec)
      # Speculative decoding: the oracle check, then the sweep of the speculative bar (T = 4, all
      # drafts accepted, is the Nemotron-H target; T = 2 and 8 and a random acceptance for context).
      for state in fp32 bf16; do
        ./build-h200/tools/replayssm verify --spec 4 --device cuda --geometry nemotron-h --batch 8 \
          --state-dtype $state 2>&1 | tail -6 | log spec.log
      done
      ./build-h200/tools/replayssm bench --spec 2,4,8 --accept fixed:8 --device cuda --geometry nemotron-h \
        --batch 1,8,32,128,256,512 --L 16,32 --state-dtype fp32,bf16 --json "$OUT/h200-spec.json" 2>&1 | log spec.log
      ./build-h200/tools/replayssm bench --spec 4 --accept mean:2.5 --device cuda --geometry nemotron-h \
        --batch 1,8,128,512 --state-dtype fp32,bf16 --json "$OUT/h200-spec-mean2.5.json" 2>&1 | log spec.log ;;
    tune)
      for state in fp32 bf16; do
        ./build-h200/replayssm_cuda_kernels $state bf16 ${L:-16} ${BATCHES:-1,8,32,128,512} ${ROWS:-0,16,32,64} \
          ${ROUTE:-auto} 2>&1 | log tune.log
      done ;;
    profile)
      for kernel in ${KERNELS:-replay_decode_kernel state_update_kernel}; do
        for state in fp32 bf16; do
          ncu --clock-control none -k regex:$kernel --launch-skip 40 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis \
            ./build-h200/replayssm_cuda_kernels $state bf16 16 128 ${ROWS:-0} auto \
            > "$OUT/ncu_${kernel}_$state.txt" 2>&1
          grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Shared Memory Configuration|Issue Slots Busy|Executed Ipc|No Eligible|Registers Per|Dynamic Shared" \
            "$OUT/ncu_${kernel}_$state.txt" | sed "s/^/$kernel $state: /"
        done
      done ;;
    bench)
      ./build-h200/tools/replayssm bench --device cuda --geometry nemotron-h --batch 1,8,32,128,256,512 \
        --L 8,16,32 --state-dtype fp32,bf16 --act-dtype bf16 --windows ${WINDOWS:-21} --json "$OUT/h200.json" \
        2>&1 | log bench.log ;;
  esac
done
