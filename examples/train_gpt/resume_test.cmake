# ctest script: train_gpt saves, the process ends, a new process resumes, and the losses
# after the checkpoint equal (all 17 digits) those of a run that never stopped; then a run
# with another --devices count reshards the same checkpoint and trains on.
#   cmake -DTRAIN_GPT=<exe> -DWORK=<dir> -P resume_test.cmake
set(args --devices 1 --steps 8 --layers 2 --hidden 32 --heads 2 --seq 16 --batch 4 --dropout 0.1 --exact)
set(dir "${WORK}/train_gpt_resume_checkpoints")
file(REMOVE_RECURSE "${dir}")

function(run_demo out)
  execute_process(COMMAND "${TRAIN_GPT}" ${ARGN} OUTPUT_VARIABLE text ERROR_VARIABLE errors
                  RESULT_VARIABLE rc TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "train_gpt ${ARGN} failed (${rc}):\n${text}\n${errors}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The losses of steps >= first, one "step N loss L" per line.
function(losses_from text first out)
  string(REGEX MATCHALL "step +[0-9]+ \\| loss [^ ]+" lines "${text}")
  set(kept "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "step +([0-9]+) \\| loss ([^ ]+)" "\\1" step "${line}")
    string(REGEX REPLACE "step +([0-9]+) \\| loss ([^ ]+)" "step \\1 loss \\2" entry "${line}")
    if(step GREATER_EQUAL first)
      list(APPEND kept "${entry}")
    endif()
  endforeach()
  set(${out} "${kept}" PARENT_SCOPE)
endfunction()

run_demo(whole ${args})
run_demo(first ${args} --checkpoint "${dir}" --save-every 2 --stop-after 5)
if(NOT first MATCHES "saved [^\n]*step-00000004: step 4")
  message(FATAL_ERROR "the first run did not report saving step 4:\n${first}")
endif()
run_demo(second ${args} --checkpoint "${dir}" --resume)
if(NOT second MATCHES "resumed from [^\n]*step-00000004: step 4")
  message(FATAL_ERROR "the second run did not resume from step 4:\n${second}")
endif()
losses_from("${whole}" 4 expected)
losses_from("${second}" 4 resumed)
list(LENGTH expected n)
if(NOT n EQUAL 4 OR NOT expected STREQUAL resumed)
  message(FATAL_ERROR "resumed losses differ from the uninterrupted run:\n  expected: ${expected}\n  resumed:  ${resumed}")
endif()

# Another device count: the searched plan for 2 ranks loads the one-device checkpoint.
list(REMOVE_ITEM args --devices 1)
run_demo(third ${args} --devices 2 --checkpoint "${dir}" --resume --stop-after 6)
if(NOT third MATCHES "resumed from [^\n]*step-00000004: step 4" OR NOT third MATCHES "step +5 \\| loss")
  message(FATAL_ERROR "the 2-rank run did not reshard and continue:\n${third}")
endif()
file(REMOVE_RECURSE "${dir}")
message(STATUS "resumed losses equal the uninterrupted run: ${resumed}")
