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
