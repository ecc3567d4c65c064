# Finds OpenBLAS with its CBLAS header and wraps it in the imported target loom::openblas.
# Shared by the build (CMakeLists.txt) and the installed package (loomConfig.cmake), so a
# consumer finds OpenBLAS exactly the way loom was built with it.
#
#   loom_find_openblas(<result-var>)
#
# Sets <result-var> to TRUE and defines loom::openblas (include dir of cblas.h + library)
# when found, FALSE otherwise. Lookup order: pkg-config module `openblas` (Debian puts it in
# /usr/lib/x86_64-linux-gnu/openblas-pthread/), then FindBLAS with BLA_VENDOR=OpenBLAS plus
# a search for cblas.h next to it.
include_guard(GLOBAL)

function(loom_find_openblas result_var)
  if(TARGET loom::openblas)
    set(${result_var} TRUE PARENT_SCOPE)
    return()
  endif()

  set(_loom_blas_include "")
  set(_loom_blas_libraries "")

  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(LOOM_PC_OPENBLAS QUIET openblas)
  endif()
  if(LOOM_PC_OPENBLAS_FOUND)
    find_path(LOOM_CBLAS_INCLUDE_DIR cblas.h
      HINTS ${LOOM_PC_OPENBLAS_INCLUDE_DIRS} NO_DEFAULT_PATH)
    find_library(LOOM_OPENBLAS_LIBRARY NAMES openblas
      HINTS ${LOOM_PC_OPENBLAS_LIBRARY_DIRS} NO_DEFAULT_PATH)
  endif()

  if(NOT LOOM_CBLAS_INCLUDE_DIR OR NOT LOOM_OPENBLAS_LIBRARY)
    set(BLA_VENDOR OpenBLAS)
    find_package(BLAS QUIET)
    if(BLAS_FOUND)
      list(GET BLAS_LIBRARIES 0 _loom_first_blas)
      get_filename_component(_loom_blas_dir "${_loom_first_blas}" DIRECTORY)
      set(LOOM_OPENBLAS_LIBRARY "${_loom_first_blas}" CACHE FILEPATH "OpenBLAS library" FORCE)
      find_path(LOOM_CBLAS_INCLUDE_DIR cblas.h
        HINTS "${_loom_blas_dir}/../../include"
        PATH_SUFFIXES openblas openblas-pthread x86_64-linux-gnu/openblas-pthread
                      x86_64-linux-gnu)
    endif()
  endif()

  if(LOOM_CBLAS_INCLUDE_DIR AND LOOM_OPENBLAS_LIBRARY)
    add_library(loom::openblas INTERFACE IMPORTED)
    set_target_properties(loom::openblas PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${LOOM_CBLAS_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${LOOM_OPENBLAS_LIBRARY}")
    set(${result_var} TRUE PARENT_SCOPE)
  else()
    set(${result_var} FALSE PARENT_SCOPE)
  endif()
endfunction()
