# Fixture setup for the find_package consumer: installs the current build into a fresh
# prefix and checks that the package files are where find_package looks for them.
#   cmake -DLOOM_BINARY_DIR=... -DLOOM_INSTALL_PREFIX=... -DLOOM_INSTALL_CMAKEDIR=...
#         -DLOOM_CONFIG=... -P install_tree.cmake
file(REMOVE_RECURSE "${LOOM_INSTALL_PREFIX}")
set(config_args "")
if(LOOM_CONFIG)
  set(config_args --config "${LOOM_CONFIG}")
endif()
execute_process(
  COMMAND "${CMAKE_COMMAND}" --install "${LOOM_BINARY_DIR}" --prefix "${LOOM_INSTALL_PREFIX}"
          ${config_args}
  COMMAND_ERROR_IS_FATAL ANY)
foreach(file IN ITEMS
    "${LOOM_INSTALL_CMAKEDIR}/loomConfig.cmake"
    "${LOOM_INSTALL_CMAKEDIR}/loomConfigVersion.cmake"
    "${LOOM_INSTALL_CMAKEDIR}/loomTargets.cmake"
    "include/loom/core/error.hpp")
  if(NOT EXISTS "${LOOM_INSTALL_PREFIX}/${file}")
    message(FATAL_ERROR "install tree: ${LOOM_INSTALL_PREFIX}/${file} is missing")
  endif()
endforeach()
