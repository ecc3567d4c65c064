# ctest script: one mpiexec job saves a checkpoint and ends; a second job resumes it and
# checks the losses against an uninterrupted run, bit for bit (tests/mpi/test_checkpoint_mpi.cpp).
file(REMOVE_RECURSE "${WORK}")
foreach(phase IN ITEMS --save --resume)
  execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 4 ${EXTRA} "${PROGRAM}" ${phase} "${WORK}"
                  OUTPUT_VARIABLE text ERROR_VARIABLE errors RESULT_VARIABLE rc TIMEOUT 240)
  message(STATUS "${phase}:\n${text}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mpiexec ${PROGRAM} ${phase} failed (${rc}):\n${text}\n${errors}")
  endif()
endforeach()
if(NOT text MATCHES "resumes the saved one bit-identically +ok")
  message(FATAL_ERROR "the resumed job did not confirm bit-identical losses:\n${text}")
endif()
file(REMOVE_RECURSE "${WORK}")
