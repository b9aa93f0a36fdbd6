# `replayssm bench --window-kernel` (standard and --spec): the JSON names the path; a value other
# than auto on the CPU, whose backend has one path, and an unknown value are usage errors (exit
# code 2) that name the option and the value, before anything is measured.
# Usage: cmake -DREPLAYSSM=<replayssm> -DJSON=<file> -P bench_window_kernel.cmake
set(tiny --device cpu --heads 2 --head-dim 4 --state-dim 4 --groups 1 --batch 1 --windows 1)
foreach(mode standard spec)
  set(args bench ${tiny} --L 4)
  if(mode STREQUAL "spec")
    list(APPEND args --spec 2)
  endif()
  execute_process(COMMAND "${REPLAYSSM}" ${args} --window-kernel auto --json "${JSON}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "window kernel auto")
    message(FATAL_ERROR "${mode} --window-kernel auto: expected a run that names it, got exit code "
                        "${rc}:\n${out}${err}")
  endif()
  file(READ "${JSON}" json)
  string(JSON value GET "${json}" results 0 window_kernel)
  if(NOT value STREQUAL "auto")
    message(FATAL_ERROR "${mode}: results[0].window_kernel: expected auto, got ${value}")
  endif()
  foreach(value fused separate bogus)
    execute_process(COMMAND "${REPLAYSSM}" ${args} --window-kernel ${value}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 2 OR NOT out STREQUAL "" OR NOT err MATCHES "--window-kernel" OR NOT err MATCHES "${value}")
      message(FATAL_ERROR "${mode} --window-kernel ${value} on the CPU: expected a usage error naming "
                          "it, got exit code ${rc}:\n${out}${err}")
    endif()
  endforeach()
endforeach()
