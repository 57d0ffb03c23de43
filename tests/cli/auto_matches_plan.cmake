# auto_matches_plan.cmake: `longseq run --auto --budget-mib B` runs the plan that
# `longseq plan --ranks 1 --budget-mib B` prints, at the same length, for every budget in BUDGETS:
# one search, one objective, one tie rule.
# Usage: cmake -DLONGSEQ=path -DBUDGETS="3;5;8" -P auto_matches_plan.cmake
foreach(budget ${BUDGETS})
  execute_process(COMMAND ${LONGSEQ} plan --model tiny-llama --ranks 1 --budget-mib ${budget} --json
                  RESULT_VARIABLE plan_exit OUTPUT_VARIABLE plan_json ERROR_VARIABLE plan_err)
  if(NOT plan_exit EQUAL 0)
    message(FATAL_ERROR "longseq plan failed for ${budget} MiB: ${plan_err}")
  endif()
  string(JSON planned GET "${plan_json}" plan summary)
  string(JSON planned_length GET "${plan_json}" max_seqlen tokens)
  execute_process(COMMAND ${LONGSEQ} run --auto --budget-mib ${budget} --steps 1 --json
                  RESULT_VARIABLE run_exit OUTPUT_VARIABLE run_json ERROR_VARIABLE run_err)
  if(NOT run_exit EQUAL 0)
    message(FATAL_ERROR "longseq run --auto failed for ${budget} MiB: ${run_err}")
  endif()
  string(JSON ran GET "${run_json}" plan)
  string(JSON ran_length GET "${run_json}" seqlen)
  if(NOT ran STREQUAL planned OR NOT ran_length EQUAL planned_length)
    message(FATAL_ERROR "${budget} MiB: run --auto ran '${ran}' at ${ran_length} tokens; plan prints '${planned}' at ${planned_length}")
  endif()
  message(STATUS "${budget} MiB: both choose ${planned} at ${planned_length} tokens")
endforeach()
