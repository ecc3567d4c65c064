# ctest script: a rank that dies or throws under mpiexec stops the whole job, quickly, with
# a message naming it. What a user sees is checked, whoever prints it:
#  - rank 1 killed (SIGKILL): Open MPI's mpiexec ends the job itself, naming rank 1;
#  - the same with --enable-recovery (mpiexec lets the others run on): each survivor's
#    communicator times out (5 s), finds by a liveness check that rank 1 does not answer,
#    and says so;
#  - rank 1 throws: it reports its error and aborts the job.
# Each run must end within 60 s.
#   cmake -DMPIEXEC=... -DNP_FLAG=-np -DEXTRA=--oversubscribe -DPROGRAM=... -DOPEN_MPI=1 -P dead_rank.cmake
function(run_case out rc_out seconds_out)
  string(TIMESTAMP start "%s" UTC)
  execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 4 ${EXTRA} ${ARGN}
                  OUTPUT_VARIABLE text ERROR_VARIABLE errors RESULT_VARIABLE rc TIMEOUT 90)
  string(TIMESTAMP stop "%s" UTC)
  math(EXPR seconds "${stop} - ${start}")
  set(${out} "${text}\n${errors}" PARENT_SCOPE)
  set(${rc_out} "${rc}" PARENT_SCOPE)
  set(${seconds_out} "${seconds}" PARENT_SCOPE)
endfunction()


run_case(text rc seconds "${PROGRAM}" kill)
message(STATUS "kill: exit ${rc} after ${seconds} s")
if(rc EQUAL 0 OR seconds GREATER_EQUAL 60)
  message(FATAL_ERROR "a job whose rank 1 was killed exited ${rc} after ${seconds} s:\n${text}")
endif()
if(NOT text MATCHES "rank 1[^\n]*(signal 9|Killed)" AND NOT text MATCHES "rank 1 did not answer")
  message(FATAL_ERROR "nothing named rank 1 as the rank that died:\n${text}")
endif()

if(OPEN_MPI)
  run_case(text rc seconds --enable-recovery "${PROGRAM}" kill)
  message(STATUS "kill with --enable-recovery: exit ${rc} after ${seconds} s")
  if(seconds GREATER_EQUAL 60)
    message(FATAL_ERROR "survivors of a killed rank took ${seconds} s to stop:\n${text}")
  endif()
  if(NOT text MATCHES "rank [023]: [^\n]*timed out after 5000 ms: rank 1 did not answer a liveness check")
    message(FATAL_ERROR "no survivor named rank 1 in its error:\n${text}")
  endif()
endif()

run_case(text rc seconds "${PROGRAM}" throw)
message(STATUS "throw: exit ${rc} after ${seconds} s")
if(rc EQUAL 0 OR seconds GREATER_EQUAL 60)
  message(FATAL_ERROR "a job whose rank 1 threw exited ${rc} after ${seconds} s:\n${text}")
endif()
if(NOT text MATCHES "rank 1 failed: rank 1 stops on purpose")
  message(FATAL_ERROR "rank 1's error was not reported:\n${text}")
endif()
