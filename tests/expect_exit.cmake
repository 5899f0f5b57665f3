# Runs COMMAND (a ;-list) and fails unless it exits with EXPECTED_EXIT and its output matches
# EXPECTED_OUTPUT (a regular expression). Used by ctest to check the program's exit codes.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE exit_code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT exit_code STREQUAL EXPECTED_EXIT)
  message(FATAL_ERROR "exit code ${exit_code}, expected ${EXPECTED_EXIT}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECTED_OUTPUT}")
  message(FATAL_ERROR "output does not match '${EXPECTED_OUTPUT}'\nstdout:\n${out}\nstderr:\n${err}")
endif()
