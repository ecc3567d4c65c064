# Compiles one source that must NOT compile and checks that the compiler said why.
#
#   cmake -DCXX=<compiler> -DSOURCE=<file.cpp> -DINCLUDE=<dir>[|<dir>...] [-DFLAGS=<flag>|...]
#         [-DEXPECT_SUCCESS=1] -P check.cmake
#
# The source's first line is `// expect: <text>`: compiling with -std=c++20 -fsyntax-only
# must fail AND print <text> (a static_assert's or a constraint's message), so a file that
# fails for another reason (a typo, a missing include) does not count as a pass. Compilers
# print template arguments with quotes escaped (\" and \'), so <text> should hold none.
# With -DEXPECT_SUCCESS=1 the source must compile instead: a control that proves the
# include path and flags work, so that a broken setup cannot make every check "pass".
# <text> must not hold a semicolon either: CMake would read it as a list separator.
# INCLUDE and FLAGS take several values separated by '|' (a ';' list works from scripts).
cmake_minimum_required(VERSION 3.20)

foreach(required IN ITEMS CXX SOURCE INCLUDE)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "check.cmake: pass -D${required}=...; usage: cmake -DCXX=g++ -DSOURCE=file.cpp "
                        "-DINCLUDE=include [-DFLAGS=...] [-DEXPECT_SUCCESS=1] -P check.cmake")
  endif()
endforeach()
if(NOT EXISTS "${SOURCE}")
  message(FATAL_ERROR "check.cmake: source '${SOURCE}' does not exist")
endif()

string(REPLACE "|" ";" include_dirs "${INCLUDE}")
set(command "${CXX}" -std=c++20 -fsyntax-only)
foreach(dir IN LISTS include_dirs)
  # /usr/include is the compiler's own: naming it with -I would reorder the system headers.
  if(NOT dir STREQUAL "" AND NOT dir STREQUAL "/usr/include")
    list(APPEND command "-I${dir}")
  endif()
endforeach()
if(DEFINED FLAGS AND NOT FLAGS STREQUAL "")
  string(REPLACE "|" ";" extra_flags "${FLAGS}")
  list(APPEND command ${extra_flags})
endif()
list(APPEND command "${SOURCE}")

execute_process(COMMAND ${command}
  RESULT_VARIABLE status
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
string(REPLACE ";" " " command_text "${command}")

if(EXPECT_SUCCESS)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "check.cmake: '${SOURCE}' must compile but failed (status ${status}).\n"
                        "Command: ${command_text}\nCompiler output:\n${output}")
  endif()
  message(STATUS "check.cmake: '${SOURCE}' compiles, as it must")
  return()
endif()

file(STRINGS "${SOURCE}" first_line LIMIT_COUNT 1)
if(NOT first_line MATCHES "^// expect: (.+)$")
  message(FATAL_ERROR "check.cmake: the first line of '${SOURCE}' must be '// expect: <text the compiler "
                      "prints>'; it is '${first_line}'")
endif()
string(STRIP "${CMAKE_MATCH_1}" expected)

if(status EQUAL 0)
  message(FATAL_ERROR "check.cmake: '${SOURCE}' compiled, but it must fail with '${expected}'.\n"
                      "Command: ${command_text}")
endif()
string(FIND "${output}" "${expected}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "check.cmake: '${SOURCE}' failed to compile, but not with the expected message.\n"
                      "Expected text: ${expected}\nCommand: ${command_text}\nCompiler output:\n${output}")
endif()
message(STATUS "check.cmake: '${SOURCE}' fails to compile with '${expected}', as it must")
