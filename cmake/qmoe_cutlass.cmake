# Finds CUTLASS's headers for the CUDA build (the SM90 grouped GEMMs in src/cuda/gemm/).
# Sets QMOE_CUTLASS_INCLUDE_DIRS (cutlass/ + cute/, and the util headers).
#
# Where it looks, first match wins; each place is a CUTLASS source root, holding include/ and
# tools/util/include/:
#   1. -DQMOE_CUTLASS_DIR=<root>                  (an explicit choice)
#   2. <repo>/.cutlass/                            (scripts/cutlass-headers.sh copies the headers there
#                                                   so that they travel to a machine without network)
#   3. the pip package nvidia-cutlass               (cutlass_library/source; scripts/install-deps.sh)
# The version must be the one scripts/requirements-build.txt pins.
set(QMOE_CUTLASS_DIR "" CACHE PATH "CUTLASS source root holding include/ and tools/util/include/")
set(_qmoe_cutlass_version_wanted "4.2")

function(_qmoe_cutlass_ok root out)
  if(root AND EXISTS "${root}/include/cutlass/cutlass.h" AND EXISTS "${root}/include/cute/tensor.hpp"
     AND EXISTS "${root}/tools/util/include/cutlass/util/packed_stride.hpp")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

set(_qmoe_cutlass_root "")
if(QMOE_CUTLASS_DIR)
  _qmoe_cutlass_ok("${QMOE_CUTLASS_DIR}" _ok)
  if(NOT _ok)
    message(FATAL_ERROR "QMOE_CUTLASS_DIR=${QMOE_CUTLASS_DIR}: expected a CUTLASS source root "
                        "holding include/cutlass/cutlass.h, include/cute/ and tools/util/include/")
  endif()
  set(_qmoe_cutlass_root "${QMOE_CUTLASS_DIR}")
else()
  _qmoe_cutlass_ok("${PROJECT_SOURCE_DIR}/.cutlass" _ok)
  if(_ok)
    set(_qmoe_cutlass_root "${PROJECT_SOURCE_DIR}/.cutlass")
  else()
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c
                "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))"
        OUTPUT_VARIABLE _py_root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
      if(_rc EQUAL 0)
        _qmoe_cutlass_ok("${_py_root}" _ok)
        if(_ok)
          set(_qmoe_cutlass_root "${_py_root}")
        endif()
      endif()
    endif()
  endif()
endif()

if(NOT _qmoe_cutlass_root)
  message(FATAL_ERROR
    "CUTLASS headers not found; the CUDA backend needs them. Install them with\n"
    "  python3 -m pip install --no-deps -r scripts/requirements-build.txt\n"
    "(or scripts/install-deps.sh), or copy them next to the sources with scripts/cutlass-headers.sh "
    "(.cutlass/), or pass -DQMOE_CUTLASS_DIR=<CUTLASS source root>. Or configure with "
    "-DQMOE_CUDA=OFF for a CPU-only build.")
endif()

file(STRINGS "${_qmoe_cutlass_root}/include/cutlass/version.h" _v
     REGEX "^#define CUTLASS_(MAJOR|MINOR) [0-9]+")
string(REGEX MATCH "MAJOR ([0-9]+)" _m "${_v}")
set(_major "${CMAKE_MATCH_1}")
string(REGEX MATCH "MINOR ([0-9]+)" _m "${_v}")
set(_minor "${CMAKE_MATCH_1}")
if(NOT "${_major}.${_minor}" STREQUAL _qmoe_cutlass_version_wanted)
  message(FATAL_ERROR "CUTLASS at ${_qmoe_cutlass_root} is ${_major}.${_minor}; qmoe is built and "
                      "tested against ${_qmoe_cutlass_version_wanted} "
                      "(scripts/requirements-build.txt)")
endif()
set(QMOE_CUTLASS_INCLUDE_DIRS "${_qmoe_cutlass_root}/include"
    "${_qmoe_cutlass_root}/tools/util/include")
message(STATUS "qmoe: CUTLASS ${_major}.${_minor} at ${_qmoe_cutlass_root}")
