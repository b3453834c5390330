# cpack -G DEB (run in the build directory) packs what cmake --install installs into
# ddp_<version>_<arch>.deb. Depends: dpkg-shlibdeps for the installed executables (ddprun) and
# the Debian -dev packages that the CMake package's find_dependency calls need, since the
# static libraries and headers are built against them.
set(CPACK_PACKAGE_NAME ddp)
set(CPACK_PACKAGE_VENDOR "ddp developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "distributed data-parallel training in C++: ddprun launcher, process groups, DDP for LibTorch")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ddp developers <ddp@localhost>")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The long description (CPACK_PACKAGE_DESCRIPTION_SUMMARY is its first line), as one string:
# CMake would join several arguments with ';', which would end up in the control file.
string(CONCAT CPACK_DEBIAN_PACKAGE_DESCRIPTION
       "ddp is what PyTorch users get from torchrun, torch.distributed and\n"
       "DistributedDataParallel, as one C++ system on LibTorch. This package holds the\n"
       "ddprun launcher (torchrun's command line), the static libraries, the public\n"
       "headers (<ddp/ddp.hpp>), the CMake package (find_package(ddp) -> ddp::ddp),\n"
       "the Python package `ddp` (the torch.distributed backend), the documentation and\n"
       "the ddprun man page.")
set(DDP_DEB_DEPENDS libfmt-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libssl-dev
                    zlib1g-dev libcurl4-openssl-dev)
if(DDP_HAVE_GLOO)
  list(APPEND DDP_DEB_DEPENDS libgloo-dev)
endif()
if(DDP_HAVE_MPI)
  list(APPEND DDP_DEB_DEPENDS libopenmpi-dev)
endif()
# LibTorch is not a Debian dependency: Debian's libtorch-dev is 1.13, and ddp is built against a
# PyTorch 2.x wheel's LibTorch, which the CMake package finds through CMAKE_PREFIX_PATH or the
# python3 on PATH (cmake/ddpConfig.cmake.in).
list(JOIN DDP_DEB_DEPENDS ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
include(CPack)
