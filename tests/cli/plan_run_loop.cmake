# plan_run_loop.cmake: the loop as a user runs it. `longseq plan --ranks R --budget-mib B
# [PLAN_ARGS] --plan-out FILE` writes the planner's choice; the plan it names must match EXPECT (the
# option this budget is meant to make the winner); `mpirun -np R longseq run --plan FILE` runs
# exactly that plan and its measured peak must be within the budget and match the prediction.
# Usage: cmake -DLONGSEQ=path -DMPIEXEC=path -DRANKS=n -DBUDGET=mib -DEXPECT=regex
#              [-DPLAN_ARGS="--zero;2"] -DOUTPUT=dir -P plan_run_loop.cmake
file(REMOVE_RECURSE "${OUTPUT}")
file(MAKE_DIRECTORY "${OUTPUT}")
set(plan_file "${OUTPUT}/plan.json")
execute_process(COMMAND ${LONGSEQ} plan --model tiny-llama --ranks ${RANKS} --budget-mib ${BUDGET} ${PLAN_ARGS} --plan-out ${plan_file}
                RESULT_VARIABLE plan_exit OUTPUT_VARIABLE plan_out ERROR_VARIABLE plan_err)
if(NOT plan_exit EQUAL 0)
  message(FATAL_ERROR "longseq plan failed (${plan_exit}): ${plan_err}")
endif()
file(READ "${plan_file}" plan_json)
string(JSON summary GET "${plan_json}" summary)
string(JSON seqlen GET "${plan_json}" seqlen)
if(NOT summary MATCHES "${EXPECT}")
  message(FATAL_ERROR "with ${BUDGET} MiB on ${RANKS} rank(s) the plan is '${summary}', expected to match '${EXPECT}'")
endif()
message(STATUS "plan for ${BUDGET} MiB x ${RANKS}: ${summary} at ${seqlen} tokens")
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np ${RANKS} ${LONGSEQ} run --plan ${plan_file} --steps 1
                        --json-out ${OUTPUT}/run.json
                RESULT_VARIABLE run_exit OUTPUT_VARIABLE run_out ERROR_VARIABLE run_err)
if(NOT run_exit EQUAL 0)
  message(FATAL_ERROR "longseq run --plan failed (${run_exit}): ${run_out}${run_err}")
endif()
file(READ "${OUTPUT}/run.json" run_json)
string(JSON ran GET "${run_json}" plan)
string(JSON ran_length GET "${run_json}" seqlen)
if(NOT ran STREQUAL summary OR NOT ran_length EQUAL seqlen)
  message(FATAL_ERROR "run --plan ran '${ran}' at ${ran_length} tokens, not the file's '${summary}' at ${seqlen}")
endif()
foreach(expected "measured peak within" "prediction matches the measurement")
  if(NOT run_out MATCHES "${expected}")
    message(FATAL_ERROR "the run does not say '${expected}':\n${run_out}")
  endif()
endforeach()
