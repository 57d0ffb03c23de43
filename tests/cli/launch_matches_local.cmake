# launch_matches_local.cmake: `longseq launch` of a run scenario over 2 local ranks writes
# OUTPUT/run.json whose per-step losses equal a one-rank `longseq run` of the same scenario (to 4
# decimals: fp32 sums in a different order), and nothing else is needed to read it.
# Usage: cmake -DLONGSEQ=path -DMPIEXEC=path -DSCENARIO=file -DOUTPUT=dir -P launch_matches_local.cmake
file(REMOVE_RECURSE "${OUTPUT}")
execute_process(COMMAND ${LONGSEQ} run ${SCENARIO} --json RESULT_VARIABLE local_exit OUTPUT_VARIABLE local_json ERROR_VARIABLE local_err)
if(NOT local_exit EQUAL 0)
  message(FATAL_ERROR "the local run failed: ${local_err}")
endif()
execute_process(COMMAND ${LONGSEQ} launch ${SCENARIO} --ranks 2 --output ${OUTPUT}
                        --mpirun-arg=--allow-run-as-root --mpirun-arg=--oversubscribe
                RESULT_VARIABLE launch_exit OUTPUT_VARIABLE launch_out ERROR_VARIABLE launch_err)
if(NOT launch_exit EQUAL 0)
  message(FATAL_ERROR "longseq launch failed (${launch_exit}): ${launch_out}${launch_err}")
endif()
file(WRITE "${OUTPUT}/local.json" "${local_json}")
set(LOCAL "${OUTPUT}/local.json")
set(LAUNCHED "${OUTPUT}/run.json")
set(RANKS 2)
include(${CMAKE_CURRENT_LIST_DIR}/losses_match.cmake)

# `longseq report` reads the launched result as it reads a local one: the run report.
execute_process(COMMAND ${LONGSEQ} report ${OUTPUT} RESULT_VARIABLE report_exit OUTPUT_VARIABLE report_out ERROR_VARIABLE report_err)
if(NOT report_exit EQUAL 0)
  message(FATAL_ERROR "longseq report on the launched run failed: ${report_err}")
endif()
file(READ "${OUTPUT}/report.md" report)
foreach(expected "MEASURED on" "2 rank\\(s\\) = Ulysses sp=2" "\\| 1 \\| [0-9]+\\.[0-9]+ \\|" "\\| 1 \\| [0-9.]+ \\| [+-][0-9.]+% \\|")
  if(NOT report MATCHES "${expected}")
    message(FATAL_ERROR "report.md does not match '${expected}':\n${report}")
  endif()
endforeach()
if(NOT EXISTS "${OUTPUT}/figures/loss.png")
  message(FATAL_ERROR "no figures/loss.png")
endif()
message(STATUS "longseq report wrote the run report for the launched result")
