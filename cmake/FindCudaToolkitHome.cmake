# Locates the CUDA 13 toolkit through $CUDA_HOME or /usr/local/cuda and defines the
# imported target flexjit::nvrtc (headers: nvrtc.h, cuda.h; library: libnvrtc).
set(_flexjit_cuda_candidates "$ENV{CUDA_HOME}" "${CUDA_HOME}" "/usr/local/cuda")
set(FLEXJIT_CUDA_HOME "")
foreach(dir IN LISTS _flexjit_cuda_candidates)
  if(dir AND EXISTS "${dir}/include/nvrtc.h" AND EXISTS "${dir}/include/cuda.h")
    set(FLEXJIT_CUDA_HOME "${dir}")
    break()
  endif()
endforeach()
if(NOT FLEXJIT_CUDA_HOME)
  message(FATAL_ERROR
    "flexjit: the CUDA toolkit was not found (looked for include/nvrtc.h and include/cuda.h "
    "under $CUDA_HOME and /usr/local/cuda).\n"
    "Install the CUDA 13 toolkit, or point CUDA_HOME at it: CUDA_HOME=/path/to/cuda make build")
endif()
find_library(FLEXJIT_NVRTC_LIBRARY nvrtc HINTS "${FLEXJIT_CUDA_HOME}/lib64" "${FLEXJIT_CUDA_HOME}/lib" NO_DEFAULT_PATH)
if(NOT FLEXJIT_NVRTC_LIBRARY)
  message(FATAL_ERROR "flexjit: libnvrtc was not found under ${FLEXJIT_CUDA_HOME}/lib64. The toolkit looks incomplete.")
endif()
add_library(flexjit_nvrtc INTERFACE)
target_include_directories(flexjit_nvrtc SYSTEM INTERFACE "${FLEXJIT_CUDA_HOME}/include")
target_link_libraries(flexjit_nvrtc INTERFACE "${FLEXJIT_NVRTC_LIBRARY}")
target_compile_definitions(flexjit_nvrtc INTERFACE FLEXJIT_CUDA_HOME="${FLEXJIT_CUDA_HOME}")
add_library(flexjit::nvrtc ALIAS flexjit_nvrtc)
message(STATUS "flexjit: CUDA toolkit at ${FLEXJIT_CUDA_HOME}")
