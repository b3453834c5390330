# ddp_prepare_cuda_torch(PYTHON CUDA_VERSION WHEEL_RUNTIME): lets find_package(Torch) load a
# CUDA build of PyTorch's wheel. CUDA_VERSION is PYTHON's torch.version.cuda ("": a CPU build,
# nothing to do), WHEEL_RUNTIME the folder of the nvidia CUDA runtime package pip installed with
# it, or "" (both from ddp_query_torch_wheel, cmake/TorchWheel.cmake).
#
# The wheel's TorchConfig.cmake (public/cuda.cmake) insists on finding the CUDA toolkit with
# CMake's old FindCUDA, which locates it through the `nvcc` on PATH; its absence is a
# FATAL_ERROR ("Your installed Caffe2 version uses CUDA but I cannot find the CUDA libraries")
# even under find_package(Torch QUIET). Two ways users hit it (issue 51):
#   - the toolkit is installed, but the nvcc on PATH is a wrapper outside it (/usr/local/bin/nvcc
#     running /usr/local/cuda/bin/nvcc): FindCUDA takes the wrapper's folder for the toolkit's;
#   - there is no toolkit at all, only the nvidia-* runtime packages pip installed beside torch
#     (headers and libcudart; the cluster's login node, a CPU-only build machine).
# In the first case this points CUDA_TOOLKIT_ROOT_DIR and CMAKE_CUDA_COMPILER at the toolkit
# (CUDA_HOME, CUDA_PATH, the real folder of the nvcc on PATH, /usr/local/cuda). In the second it
# defines torch::cudart from the wheel's nvidia runtime package; cuda.cmake treats that target
# as its include guard and returns, so the torch targets load with the wheel's headers and
# runtime. ddp compiles no CUDA code of its own: it needs CUDA's headers and runtime, not nvcc.
# DDP_TORCH_CUDA_RUNTIME says which was used ("toolkit <dir>" or "wheel <dir>") or is empty.
# DDP_CUDA_RUNTIME_FROM=wheel skips the toolkit where one is installed (the package test builds
# so, as on a machine without one); auto (the default) prefers the toolkit. The environment
# variable of that name gives the default, so `pip install`/`pip wheel` builds take it too.
set(ddp_cuda_runtime_from_default auto)
if(DEFINED ENV{DDP_CUDA_RUNTIME_FROM})
  set(ddp_cuda_runtime_from_default "$ENV{DDP_CUDA_RUNTIME_FROM}")
endif()
set(DDP_CUDA_RUNTIME_FROM ${ddp_cuda_runtime_from_default} CACHE STRING
    "CUDA for a CUDA LibTorch: auto (the toolkit if installed, else torch's nvidia wheels), wheel")
set_property(CACHE DDP_CUDA_RUNTIME_FROM PROPERTY STRINGS auto wheel)
if(NOT DDP_CUDA_RUNTIME_FROM MATCHES "^(auto|wheel)$")
  message(FATAL_ERROR "DDP_CUDA_RUNTIME_FROM=${DDP_CUDA_RUNTIME_FROM}: expected auto or wheel")
endif()
function(ddp_prepare_cuda_torch python cuda_version wheel_runtime)
  set(DDP_TORCH_CUDA_RUNTIME "" PARENT_SCOPE)
  if(cuda_version STREQUAL "" OR TARGET torch::cudart)
    return()  # a CPU build of torch, or prepared already
  endif()

  # A toolkit: CUDA_TOOLKIT_ROOT_DIR as given, else CUDA_HOME, CUDA_PATH, the folder of the real
  # nvcc behind the one on PATH, /usr/local/cuda.
  set(candidates "${CUDA_TOOLKIT_ROOT_DIR}" "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}")
  find_program(ddp_nvcc_on_path nvcc)
  if(DDP_CUDA_RUNTIME_FROM STREQUAL "wheel")
    set(candidates "")
  elseif(ddp_nvcc_on_path)
    # A wrapper script (`exec /usr/local/cuda/bin/nvcc "$@"`) names the real one: nvcc's
    # --dryrun prints its own TOP folder, whichever way it was reached.
    execute_process(COMMAND ${ddp_nvcc_on_path} --dryrun --version
                    OUTPUT_VARIABLE dry ERROR_VARIABLE dry_err RESULT_VARIABLE dry_rc)
    if(dry_rc EQUAL 0 AND "${dry}${dry_err}" MATCHES "#\\$ TOP=([^\n]+)")
      file(REAL_PATH "${CMAKE_MATCH_1}" top)
      list(APPEND candidates "${top}")
    endif()
  endif()
  if(NOT DDP_CUDA_RUNTIME_FROM STREQUAL "wheel")
    list(APPEND candidates /usr/local/cuda)
  endif()
  foreach(root IN LISTS candidates)
    if(root AND EXISTS "${root}/bin/nvcc" AND EXISTS "${root}/include/cuda_runtime_api.h")
      # FORCE: a configure that failed before may have cached FindCUDA's wrong guess.
      set(CUDA_TOOLKIT_ROOT_DIR "${root}" CACHE PATH "CUDA toolkit for a CUDA LibTorch" FORCE)
      if(NOT CMAKE_CUDA_COMPILER)
        set(CMAKE_CUDA_COMPILER "${root}/bin/nvcc" CACHE FILEPATH "nvcc for a CUDA LibTorch")
      endif()
      # A toolkit installed in parts (the compiler without NVRTC) leaves FindCUDA's
      # CUDA_nvrtc_LIBRARY unset, which TorchConfig links: take the wheel's NVRTC then.
      file(GLOB toolkit_nvrtc "${root}/lib64/libnvrtc.so*" "${root}/lib/libnvrtc.so*")
      if(NOT toolkit_nvrtc AND wheel_runtime)
        file(GLOB wheel_nvrtc "${wheel_runtime}/lib/libnvrtc.so.*")
        list(FILTER wheel_nvrtc EXCLUDE REGEX "alt|builtins")
        if(wheel_nvrtc)
          list(GET wheel_nvrtc 0 wheel_nvrtc)
          set(CUDA_nvrtc_LIBRARY "${wheel_nvrtc}" CACHE FILEPATH "NVRTC of torch's wheel")
        endif()
      endif()
      set(DDP_TORCH_CUDA_RUNTIME "toolkit ${root}" PARENT_SCOPE)
      return()
    endif()
  endforeach()

  if(wheel_runtime STREQUAL "")
    message(FATAL_ERROR
      "${python}'s torch is a CUDA ${cuda_version} build, and neither the CUDA toolkit (nvcc: "
      "set CUDA_HOME) nor the nvidia CUDA runtime package it was installed with (nvidia/cu*/ "
      "or nvidia/cuda_runtime/ in site-packages) was found. Install the toolkit or reinstall "
      "that torch with pip (it brings the runtime), or build against a CPU torch")
  endif()
  file(GLOB cudart "${wheel_runtime}/lib/libcudart.so*")
  if(NOT cudart)
    message(FATAL_ERROR "${wheel_runtime} has CUDA's headers but no lib/libcudart.so*: "
                        "reinstall the nvidia CUDA runtime package of ${python}'s torch")
  endif()
  list(GET cudart 0 cudart)
  add_library(torch::cudart INTERFACE IMPORTED GLOBAL)
  set_target_properties(torch::cudart PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${wheel_runtime}/include"
    INTERFACE_LINK_LIBRARIES "${cudart}")
  set(DDP_TORCH_CUDA_RUNTIME "wheel ${wheel_runtime}" PARENT_SCOPE)
endfunction()
