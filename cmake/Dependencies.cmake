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

find_package(MPI QUIET COMPONENTS C)
set(DDP_HAVE_MPI ${MPI_C_FOUND})

if(DDP_WITH_TORCH)
  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    message(WARNING "LibTorch not found: the torch layer, DDP and the examples are not built")
    set(DDP_WITH_TORCH OFF)
  endif()
endif()

if(DDP_BUILD_TESTS)
  enable_testing()
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(DDP_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

message(STATUS "ddp: gloo=${DDP_HAVE_GLOO} mpi=${DDP_HAVE_MPI} torch=${DDP_WITH_TORCH}")

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
