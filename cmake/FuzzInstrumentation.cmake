# FLEXJIT_FUZZ: every library of the build is compiled with libFuzzer's coverage
# instrumentation (-fsanitize=fuzzer-no-link), AddressSanitizer and UndefinedBehaviorSanitizer,
# so the fuzz targets (tests/fuzz/) see the edges of the code they exercise and every memory
# error or undefined behaviour aborts the run. Only the fuzz targets link libFuzzer itself.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "FLEXJIT_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++-19 "
                      "-DCMAKE_C_COMPILER=clang-19, or run `make fuzz`")
endif()
if(FLEXJIT_SANITIZE)
  message(FATAL_ERROR "FLEXJIT_FUZZ already turns on ASan and UBSan; leave FLEXJIT_SANITIZE off")
endif()

# -O1 whatever the build type: fast enough to fuzz, still exact stack traces. A finding aborts
# (no recovery), so libFuzzer saves the input that caused it.
add_compile_options(-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined)
add_link_options(-fsanitize=address,undefined)
# Clang-only warnings the GCC builds do not have: dsl/sema.cpp evaluates both sides of `&` on
# purpose (each side reports its own errors), and libstdc++ 12's std::stable_sort calls its own
# deprecated get_temporary_buffer; GCC-only warning flags of other targets are unknown to clang.
add_compile_options(-Wno-bitwise-instead-of-logical -Wno-deprecated-declarations -Wno-unknown-warning-option)

# Links a libFuzzer target (its LLVMFuzzerTestOneInput comes from `sources`).
function(flexjit_add_fuzzer name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_LIBS})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
endfunction()
