# Dependencies: Debian packages, and torch from the package index in a virtual environment
# (scripts/install-deps.sh installs both).
include(${CMAKE_CURRENT_LIST_DIR}/TorchIncludeLink.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/TorchWheel.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/TorchCuda.cmake)
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(ZLIB REQUIRED)
# libcurl (Debian libcurl4-openssl-dev): the etcd rendezvous backend's HTTP client.
find_package(CURL REQUIRED)

find_package(Gloo QUIET)
set(DDP_HAVE_GLOO ${Gloo_FOUND})

# The CXX component (a user's project that finds ddp is C++, and may not enable C), without the
# deprecated MPI C++ bindings: ddp calls MPI's C API only.
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI QUIET COMPONENTS CXX)
set(DDP_HAVE_MPI ${MPI_CXX_FOUND})

# The one Python interpreter of the build: the Python extension is built for it, and the Python
# tests, the cross-checks against PyTorch and the benchmarks' PyTorch peers run it. Default: the
# virtual environment scripts/install-deps.sh makes ($DDP_VENV, else .venv/ in the checkout),
# else the python3 on PATH.
# Under pip (scikit-build-core, pyproject.toml): the interpreter pip runs, whose environment
# the package is installed into.
if(SKBUILD AND Python_EXECUTABLE)
  set(DDP_PYTHON_DEFAULT "${Python_EXECUTABLE}")
elseif(DEFINED ENV{DDP_VENV} AND EXISTS "$ENV{DDP_VENV}/bin/python")
  set(DDP_PYTHON_DEFAULT "$ENV{DDP_VENV}/bin/python")
elseif(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(DDP_PYTHON_DEFAULT "${PROJECT_SOURCE_DIR}/.venv/bin/python")
else()
  find_program(DDP_PYTHON_DEFAULT python3)
endif()
set(DDP_PYTHON "${DDP_PYTHON_DEFAULT}" CACHE FILEPATH
    "Interpreter (with torch) the ddp Python package is built for and the tests run")

# DDP_PYTHON's torch, asked once (cmake/TorchWheel.cmake): its version and CUDA, its CMake
# folder, its site-packages (python/CMakeLists.txt checks the extension's match with them).
set(DDP_TORCH_WHEEL_FOUND FALSE)
if(DDP_WITH_TORCH AND DDP_PYTHON)
  ddp_query_torch_wheel(${DDP_PYTHON})
endif()
# LibTorch: the one inside DDP_PYTHON's torch wheel (torch.utils.cmake_prefix_path), unless
# Torch_DIR or CMAKE_PREFIX_PATH names another (a LibTorch archive, a CUDA build: docs/gpu.md).
# A CUDA LibTorch turns on DDP_TORCH_CUDA.
if(DDP_TORCH_WHEEL_FOUND AND NOT Torch_DIR)
  list(APPEND CMAKE_PREFIX_PATH "${DDP_TORCH_WHEEL_CMAKE_PREFIX}")
endif()
# A CUDA build of torch: its TorchConfig.cmake must find CUDA (cmake/TorchCuda.cmake). Also on
# a configure again, when Torch_DIR is cached from the first.
if(DDP_TORCH_WHEEL_FOUND)
  ddp_prepare_cuda_torch(${DDP_PYTHON} "${DDP_TORCH_WHEEL_CUDA}" "${DDP_TORCH_WHEEL_CUDA_RUNTIME}")
endif()
set(DDP_TORCH_CUDA OFF)
if(DDP_WITH_TORCH)
  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    message(WARNING "LibTorch not found in ${DDP_PYTHON}'s torch nor on CMAKE_PREFIX_PATH (or its "
                    "TorchConfig.cmake failed: a CUDA LibTorch also needs the CUDA toolkit): the "
                    "torch layer, DDP and the examples are not built. Run scripts/install-deps.sh "
                    "(it makes .venv/ with torch), or pass -DDDP_PYTHON=/path/to/python")
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
      "wheel from 2.7 on, the 'cxx11-abi' LibTorch archive; or "
      "configure with -DDDP_WITH_TORCH=OFF to build everything below the torch layer.")
  endif()
  # LibTorch 2.x ships fmt 12's headers in its include directory; ddp (and Debian's spdlog) are
  # built against Debian's fmt 9, whose compiled library they link. A translation unit that
  # sees both include paths would pick torch's fmt (LibTorch's directories come first) and
  # then fail to compile, or link against a library of another fmt. So every target searches
  # a directory holding only Debian's fmt/ before LibTorch's. Torch's own inline headers use
  # fmt's stable API only and compile against either.
  get_target_property(ddp_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT ddp_fmt_include)
    set(ddp_fmt_include /usr/include)
  endif()
  list(GET ddp_fmt_include 0 ddp_fmt_include)
  set(DDP_FMT_SHIM_DIR ${PROJECT_BINARY_DIR}/fmt-before-torch)
  file(MAKE_DIRECTORY ${DDP_FMT_SHIM_DIR})
  file(CREATE_LINK ${ddp_fmt_include}/fmt ${DDP_FMT_SHIM_DIR}/fmt SYMBOLIC)
  include_directories(BEFORE SYSTEM ${DDP_FMT_SHIM_DIR})
  # Every target includes LibTorch's headers through a link in the build folder, torch-include,
  # instead of their place in some environment: ccache (CCACHE_BASEDIR, CMakeLists.txt) then
  # sees the same command line in every build folder whichever environment holds the torch, so
  # a build against another copy of the same torch (the pip test's `pip install` into a fresh
  # venv, with build isolation) reuses this build's objects; the headers' contents still decide
  # each hit. Before, that build compiled all of ddp's torch layer again (issue 47).
  ddp_include_torch_through_link(${PROJECT_BINARY_DIR}/torch-include)
  # LibTorch 2.14's headers need C++20 (`requires`, string_view::starts_with). The CXX_STANDARD
  # its TorchConfig.cmake puts on the imported `torch` target says 20 from 2.13 on, whose headers
  # still compile as C++17, and CMake does not pass that property on anyway. From 2.14 on, the
  # standard is a compile feature of that target, which CMake does pass on: what includes
  # LibTorch compiles as C++20, the LibTorch-free layers stay C++17 (and keep their ccache
  # entries across builds against different torches). C++20 is not asked of older LibTorch:
  # it costs compile time (libstdc++'s C++20 headers are heavier).
  if(Torch_VERSION VERSION_GREATER_EQUAL 2.14)
    message(STATUS "ddp: C++20 where LibTorch ${Torch_VERSION} is used, as its headers require")
    set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
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
if(DDP_TORCH_CUDA_RUNTIME)
  message(STATUS "ddp: CUDA for the CUDA LibTorch from the ${DDP_TORCH_CUDA_RUNTIME}")
endif()

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
