# `replayssm bench` on the CPU with a baseline state dtype other than the checkpoint's: the table
# and the JSON name both, and the baseline's modelled bytes are those of its own (fp32) state.
# Usage: cmake -DREPLAYSSM=<replayssm> -DJSON=<file> -P bench_baseline_state_dtype.cmake
execute_process(
  COMMAND "${REPLAYSSM}" bench --device cpu --heads 2 --head-dim 4 --state-dim 4 --groups 1
          --batch 1 --L 2 --windows 1 --state-dtype fp16 --baseline-state-dtype fp32 --json "${JSON}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "replayssm bench failed (${rc}):\n${out}${err}")
endif()
if(NOT out MATCHES "\nfp16 +fp32 +bf16 +1 +2 ")
  message(FATAL_ERROR "no row 'fp16 fp32 bf16 1 2' (state, base, act, batch, L) in:\n${out}")
endif()

file(READ "${JSON}" json)
string(JSON result GET "${json}" results 0)
function(expect expected)  # the keys follow
  string(JSON value GET "${result}" ${ARGN})
  if(NOT value STREQUAL expected)
    list(JOIN ARGN "." key)
    message(FATAL_ERROR "results[0].${key}: expected ${expected}, got ${value}")
  endif()
endfunction()
expect(fp16 state_dtype)
expect(fp32 baseline_state_dtype)
# Per head 2 P N 4 + 2 P 2 + 2 N 2 / 2 (fp32 state, bf16 activations, 2 heads per group): 152.
expect(304 baseline modelled_bytes_per_step)
