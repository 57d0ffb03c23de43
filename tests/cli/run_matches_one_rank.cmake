# run_matches_one_rank.cmake: `mpirun -np RANKS longseq run ARGS --compare-single-rank` passes when
# every step's loss equals the unsharded replica's (rank 0 trains it on the same samples) to 1e-5
# relative (fp32 sums in another order) and every rank's measured peak equals the prediction
# (the run's own worst-rank difference within 0.1%).
# Usage: cmake -DLONGSEQ=exe -DMPIEXEC=mpirun -DRANKS=n -DARGS="a;b" -DOUTPUT=file -P run_matches_one_rank.cmake
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np ${RANKS} ${LONGSEQ} run ${ARGS} --compare-single-rank
                        --json-out ${OUTPUT} --overwrite
                RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors)
message(STATUS "${output}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "longseq run on ${RANKS} ranks failed (${status}): ${errors}")
endif()
file(READ "${OUTPUT}" json)
string(JSON steps LENGTH "${json}" steps)
math(EXPR last "${steps} - 1")
foreach(i RANGE ${last})
  string(JSON loss GET "${json}" steps ${i} loss)
  string(JSON reference GET "${json}" steps ${i} loss_on_one_rank)
  # CMake has no floating point: compare the first six significant digits of the two decimals.
  string(REGEX MATCH "^[0-9]+\\.[0-9][0-9][0-9][0-9][0-9]" loss_rounded "${loss}")
  string(REGEX MATCH "^[0-9]+\\.[0-9][0-9][0-9][0-9][0-9]" reference_rounded "${reference}")
  if(NOT loss_rounded STREQUAL reference_rounded)
    message(FATAL_ERROR "step ${i}: loss ${loss} on ${RANKS} ranks, ${reference} on one unsharded rank")
  endif()
endforeach()
string(JSON worst GET "${json}" prediction_worst_rank_error)
# (if() compares numbers as doubles, exponents included)
if(worst GREATER 0.001)
  message(FATAL_ERROR "a rank's measured peak differs from the prediction by ${worst}")
endif()
string(JSON ring GET "${json}" ring)
message(STATUS "${steps} steps equal to one rank's; ring=${ring}; worst rank's peak vs prediction ${worst}")
