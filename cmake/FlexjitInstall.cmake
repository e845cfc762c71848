# What `cmake --install` puts in the prefix: the public headers under include/flexjit/, the
# shared and static libraries (libflexjit; the CPU backend as libflexjit_cpu), the CLI, the
# CMake package (find_package(flexjit): flexjit::flexjit, flexjit::cpu, ...) and pkg-config
# files. The internal libraries' objects are linked once more into these, so consumers see
# one library with the C and C++ APIs and no NVRTC, LLVM, fmt or json on their compile line.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# --- Public headers: staged under <build>/include/flexjit/ as they are installed ---------
# They include each other as "dsl/x.h" in the source tree; the staged copies say
# "flexjit/dsl/x.h", so an include path holding only the prefix's include/ finds them all.
set(FLEXJIT_PUBLIC_HEADERS
  runtime/flexjit.hpp=flexjit.hpp
  runtime/capi/flexjit.h=flexjit.h
  dsl/spec.h=dsl/spec.h
  dsl/decl.h=dsl/decl.h
  dsl/ast.h=dsl/ast.h
  dsl/builtins.h=dsl/builtins.h
  dsl/diagnostic.h=dsl/diagnostic.h
  dsl/source.h=dsl/source.h
  dsl/token.h=dsl/token.h
  dsl/error.h=dsl/error.h
  dsl/compile_error.h=dsl/compile_error.h)
if(FLEXJIT_CPU_BACKEND)
  list(APPEND FLEXJIT_PUBLIC_HEADERS runtime/cpu/cpu_backend.h=cpu_backend.h)
endif()
set(FLEXJIT_STAGED_INCLUDE_DIR ${PROJECT_BINARY_DIR}/include)
set(_public_sources "")
foreach(pair IN LISTS FLEXJIT_PUBLIC_HEADERS)
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 _src)
  list(APPEND _public_sources ${_src})
endforeach()
foreach(pair IN LISTS FLEXJIT_PUBLIC_HEADERS)
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 _src)
  list(GET pair 1 _dst)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${_src})
  file(READ ${PROJECT_SOURCE_DIR}/${_src} _text)
  # Every project header a public header includes must be public too.
  string(REGEX MATCHALL "#include \"[^\"]+\"" _includes "${_text}")
  foreach(inc IN LISTS _includes)
    string(REGEX REPLACE "#include \"([^\"]+)\"" "\\1" inc "${inc}")
    if(NOT inc IN_LIST _public_sources)
      message(FATAL_ERROR "flexjit: the public header ${_src} includes \"${inc}\", which is not installed. "
                          "Add it to FLEXJIT_PUBLIC_HEADERS in cmake/FlexjitInstall.cmake or drop the include.")
    endif()
  endforeach()
  foreach(other IN LISTS FLEXJIT_PUBLIC_HEADERS)
    string(REPLACE "=" ";" other "${other}")
    list(GET other 0 _other_src)
    list(GET other 1 _other_dst)
    string(REPLACE "#include \"${_other_src}\"" "#include \"flexjit/${_other_dst}\"" _text "${_text}")
  endforeach()
  get_filename_component(_dst_dir ${FLEXJIT_STAGED_INCLUDE_DIR}/flexjit/${_dst} DIRECTORY)
  file(MAKE_DIRECTORY ${_dst_dir})
  file(WRITE ${PROJECT_BINARY_DIR}/include.tmp/${_dst} "${_text}")
  file(COPY_FILE ${PROJECT_BINARY_DIR}/include.tmp/${_dst} ${FLEXJIT_STAGED_INCLUDE_DIR}/flexjit/${_dst} ONLY_IF_DIFFERENT)
endforeach()

# --- Libraries ----------------------------------------------------------------------------
set(_core_objects $<TARGET_OBJECTS:flexjit_dsl> $<TARGET_OBJECTS:flexjit_templates>
                  $<TARGET_OBJECTS:flexjit_compiler> $<TARGET_OBJECTS:flexjit_runtime>)
# The libraries' private link dependencies, by path, so the exported package names no
# target of this build.
set(_core_link_deps "${FLEXJIT_NVRTC_LIBRARY}" Threads::Threads ${CMAKE_DL_LIBS})

function(flexjit_public_library target kind output_name export_name)
  add_library(${target} ${kind} ${ARGN})
  add_library(flexjit::${export_name} ALIAS ${target})
  target_include_directories(${target} INTERFACE $<BUILD_INTERFACE:${FLEXJIT_STAGED_INCLUDE_DIR}>
                                                 $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${target} INTERFACE cxx_std_20)
  set_target_properties(${target} PROPERTIES OUTPUT_NAME ${output_name} EXPORT_NAME ${export_name}
                        LINKER_LANGUAGE CXX POSITION_INDEPENDENT_CODE ON)
  if(kind STREQUAL "SHARED")
    set_target_properties(${target} PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
                          INSTALL_RPATH "$ORIGIN" INSTALL_RPATH_USE_LINK_PATH ON)
    target_link_options(${target} PRIVATE -Wl,--no-undefined)
  endif()
endfunction()

flexjit_public_library(flexjit_shared SHARED flexjit flexjit ${_core_objects})
target_link_libraries(flexjit_shared PRIVATE ${_core_link_deps})
flexjit_public_library(flexjit_static STATIC flexjit flexjit_static ${_core_objects})
# A C program links the static library with the C driver, which adds no C++ runtime.
target_link_libraries(flexjit_static PRIVATE ${_core_link_deps} stdc++ m)
set(_installed_libraries flexjit_shared flexjit_static)

if(FLEXJIT_CPU_BACKEND)
  # runtime/cpu/CMakeLists.txt sets FLEXJIT_CPU_OBJECTS and FLEXJIT_LLVM_LIBRARY.
  flexjit_public_library(flexjit_cpu_shared SHARED flexjit_cpu cpu ${FLEXJIT_CPU_OBJECTS})
  target_link_libraries(flexjit_cpu_shared PUBLIC flexjit_shared PRIVATE "${FLEXJIT_LLVM_LIBRARY}" Threads::Threads)
  flexjit_public_library(flexjit_cpu_static STATIC flexjit_cpu cpu_static ${FLEXJIT_CPU_OBJECTS})
  target_link_libraries(flexjit_cpu_static PUBLIC flexjit_static PRIVATE "${FLEXJIT_LLVM_LIBRARY}" Threads::Threads)
  list(APPEND _installed_libraries flexjit_cpu_shared flexjit_cpu_static)
endif()

set_target_properties(flexjit PROPERTIES EXPORT_NAME cli INSTALL_RPATH_USE_LINK_PATH ON)

# --- Install rules ------------------------------------------------------------------------
set(FLEXJIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flexjit)
install(TARGETS ${_installed_libraries} flexjit EXPORT flexjitTargets
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${FLEXJIT_STAGED_INCLUDE_DIR}/flexjit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT flexjitTargets NAMESPACE flexjit:: DESTINATION ${FLEXJIT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flexjitConfig.cmake.in ${PROJECT_BINARY_DIR}/flexjitConfig.cmake
                              INSTALL_DESTINATION ${FLEXJIT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flexjitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flexjitConfig.cmake ${PROJECT_BINARY_DIR}/flexjitConfigVersion.cmake DESTINATION ${FLEXJIT_CMAKE_DIR})

# pkg-config: the prefix is found relative to the .pc file, so an installed tree can move.
set(_pkgconfig_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH FLEXJIT_PC_PREFIX_FROM_PCFILEDIR /prefix/${_pkgconfig_dir} /prefix)
string(REGEX REPLACE "/$" "" FLEXJIT_PC_PREFIX_FROM_PCFILEDIR "${FLEXJIT_PC_PREFIX_FROM_PCFILEDIR}")
set(FLEXJIT_PC_LIBS_PRIVATE "${FLEXJIT_NVRTC_LIBRARY} -lpthread -ldl -lstdc++ -lm")
configure_file(${PROJECT_SOURCE_DIR}/cmake/flexjit.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/flexjit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/flexjit.pc DESTINATION ${_pkgconfig_dir})
if(FLEXJIT_CPU_BACKEND)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/flexjit_cpu.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/flexjit_cpu.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/flexjit_cpu.pc DESTINATION ${_pkgconfig_dir})
endif()
