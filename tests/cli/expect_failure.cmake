# expect_failure.cmake: runs COMMAND (a ;-list) and passes only if it exits non-zero, prints
# nothing on stdout (unless ALLOW_STDOUT is set: a command that reports progress as it goes), and
# its stderr is one line matching EXPECT (a regex).
# With EXIT_CODE set, the exit status must be exactly that (2: bad input).
# Usage: cmake -DCOMMAND="a;b" -DEXPECT="regex" [-DALLOW_STDOUT=1] [-DEXIT_CODE=2] -P expect_failure.cmake
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE exit_code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(exit_code EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0\nstdout: ${out}\nstderr: ${err}")
endif()
if(DEFINED EXIT_CODE AND NOT exit_code EQUAL EXIT_CODE)
  message(FATAL_ERROR "expected exit ${EXIT_CODE}, got ${exit_code}\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT ALLOW_STDOUT AND NOT out STREQUAL "")
  message(FATAL_ERROR "expected nothing on stdout, got: ${out}")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}': ${err}")
endif()
string(STRIP "${err}" stripped)
string(FIND "${stripped}" "\n" newline)
if(NOT newline EQUAL -1)
  message(FATAL_ERROR "expected a one-line reason, got: ${err}")
endif()
message(STATUS "exit ${exit_code}: ${stripped}")
