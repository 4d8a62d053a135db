# Run at build time (cmake -P): writes OUT, a C++ file defining qmoe::cli::build_commit(), from
# `git describe` of SRC, and rewrites it only when the commit changed, so that an unchanged tree
# relinks nothing. Outside a git checkout the commit is "unknown".
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=10
                OUTPUT_VARIABLE commit ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
endif()
set(content "// Written at build time by cmake/qmoe_version.cmake: the commit this build was made from.
namespace qmoe::cli {
const char* build_commit() { return \"${commit}\"; }
}  // namespace qmoe::cli
")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
