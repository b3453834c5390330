# All dependencies come from Debian packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(ZLIB REQUIRED)

find_package(Gloo QUIET)
set(DDP_HAVE_GLOO ${Gloo_FOUND})

# The CXX component (a user's project that finds ddp is C++, and may not enable C), without the
# deprecated MPI C++ bindings: ddp calls MPI's C API only.
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI QUIET COMPONENTS CXX)
set(DDP_HAVE_MPI ${MPI_CXX_FOUND})

# LibTorch: Debian's libtorch-dev (1.13, CPU) by default; a CUDA LibTorch (for example the one
# inside a PyTorch 2.x wheel, CMAKE_PREFIX_PATH=$(python3 -c "import torch;
# print(torch.utils.cmake_prefix_path)")) turns on DDP_TORCH_CUDA (docs/gpu.md).
set(DDP_TORCH_CUDA OFF)
if(DDP_WITH_TORCH)
  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    message(WARNING "LibTorch not found (or its TorchConfig.cmake failed: a CUDA LibTorch also "
                    "needs the CUDA toolkit): the torch layer, DDP and the examples are not built")
    set(DDP_WITH_TORCH OFF)
  endif()
endif()
if(DDP_WITH_TORCH)
  # Everything below the torch layer passes std::string across its interfaces (and Debian's
  # fmt, spdlog, Gloo and GTest are built with the C++11 ABI), so a LibTorch built with the old
  # ABI could only be mixed in by recompiling all of them: refuse it with the fix instead of
  # failing at link time or, worse, at run time through a virtual call.
  string(FIND "${TORCH_CXX_FLAGS}" "_GLIBCXX_USE_CXX11_ABI=0" DDP_TORCH_OLD_ABI)
  if(NOT DDP_TORCH_OLD_ABI EQUAL -1)
    message(FATAL_ERROR
      "The LibTorch at ${TORCH_INSTALL_PREFIX} was built with the pre-C++11 libstdc++ ABI "
      "(TORCH_CXX_FLAGS: ${TORCH_CXX_FLAGS}; in Python: torch._C._GLIBCXX_USE_CXX11_ABI is "
      "False). ddp and the Debian libraries it links (fmt, spdlog, Gloo, GoogleTest) use the "
      "C++11 ABI, and the two cannot be mixed. Use a LibTorch with the C++11 ABI: a PyTorch "
      "wheel from 2.7 on, the 'cxx11-abi' LibTorch archive, or Debian's libtorch-dev; or "
      "configure with -DDDP_WITH_TORCH=OFF to build everything below the torch layer.")
  endif()
  # TorchConfig.cmake of CUDA builds adds c10_cuda (and the CUDA libraries) to
  # TORCH_CUDA_LIBRARIES; 2.x also imports the torch_cuda target. CPU builds have neither.
  if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
    set(DDP_TORCH_CUDA ON)
  endif()
endif()

# GoogleTest (Debian: libgtest-dev) is optional so that the library and the benchmarks build on
# machines without it (docs/gpu.md); the tests are then skipped with a warning.
if(DDP_BUILD_TESTS)
  find_package(GTest QUIET)
  if(GTest_FOUND)
    enable_testing()
    include(GoogleTest)
  else()
    message(WARNING "GoogleTest not found (Debian package libgtest-dev): the tests are not "
                    "built. Install it, or pass -DDDP_BUILD_TESTS=OFF to silence this warning")
    set(DDP_BUILD_TESTS OFF)
  endif()
endif()
if(DDP_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

message(STATUS "ddp: gloo=${DDP_HAVE_GLOO} mpi=${DDP_HAVE_MPI} torch=${DDP_WITH_TORCH} "
               "torch_cuda=${DDP_TORCH_CUDA} tests=${DDP_BUILD_TESTS}")

# Gives a LibTorch-using target (test, example, bench) the torch layer's precompiled header.
# The header is built for a static library (-fPIC); an executable would get -fPIE and GCC
# rejects the header ("created and used with different settings of -fpie"), silently
# recompiling torch.h. So the executable's own sources are compiled with -fPIC instead (still
# linkable as PIE).
function(ddp_torch_pch target)
  if(TARGET ddp_torch)
    target_precompile_headers(${target} REUSE_FROM ddp_torch)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
      target_compile_options(${target} PRIVATE -fPIC)
    endif()
  endif()
endfunction()
