# `replayssm bench --baseline-state-dtype` refuses 8-bit and unknown dtypes as a usage error (exit
# code 2) that names the option and the value, before it measures anything.
# Usage: cmake -DREPLAYSSM=<replayssm> -P bench_baseline_state_dtype_refused.cmake
foreach(value int8 fp8 fp64)
  execute_process(COMMAND "${REPLAYSSM}" bench --device cpu --baseline-state-dtype ${value}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT out STREQUAL "" OR NOT err MATCHES "--baseline-state-dtype" OR
     NOT err MATCHES "${value}")
    message(FATAL_ERROR "--baseline-state-dtype ${value}: expected a usage error naming it, got "
                        "exit code ${rc}:\n${out}${err}")
  endif()
endforeach()
