# Install rules and the CMake package.
#
#   cmake --install build --prefix P
#   find_package(ddp CONFIG REQUIRED)   # with CMAKE_PREFIX_PATH=P
#   target_link_libraries(trainer PRIVATE ddp::ddp)
#
# ddp::ddp is everything a trainer needs (the torch layer and all below it, with include path
# and dependencies); the LibTorch-free layers are there on their own as ddp::util, ddp::store,
# ddp::rendezvous, ddp::cluster, ddp::launcher, ddp::comm (and ddp::comm_mpi, ddp::comm_nccl
# when built). The libraries are static, so a trainer carries no runtime dependency on ddp.
include(CMakePackageConfigHelpers)

set(DDP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)

set(DDP_EXPORTED_TARGETS)
foreach(layer util store rendezvous cluster launcher comm_types comm comm_mpi comm_nccl torch)
  if(TARGET ddp_${layer})
    set_target_properties(ddp_${layer} PROPERTIES EXPORT_NAME ${layer})
    list(APPEND DDP_EXPORTED_TARGETS ddp_${layer})
  endif()
endforeach()

# The umbrella target, ddp::ddp inside this build as well as for installed users.
add_library(ddp_ddp INTERFACE)
set_target_properties(ddp_ddp PROPERTIES EXPORT_NAME ddp)
if(TARGET ddp_torch)
  target_link_libraries(ddp_ddp INTERFACE ddp_torch)
elseif(TARGET ddp_comm)
  target_link_libraries(ddp_ddp INTERFACE ddp_comm)
else()
  target_link_libraries(ddp_ddp INTERFACE ddp_store)
endif()
add_library(ddp::ddp ALIAS ddp_ddp)
list(APPEND DDP_EXPORTED_TARGETS ddp_ddp)

install(TARGETS ${DDP_EXPORTED_TARGETS}
        EXPORT ddpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/ddp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/ddp/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddp)
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${DDP_INSTALL_CMAKEDIR})

set(DDP_BACKENDS)
foreach(backend cpu gloo mpi nccl)
  if((backend MATCHES "cpu|gloo" AND TARGET ddp_comm) OR TARGET ddp_comm_${backend})
    list(APPEND DDP_BACKENDS ${backend})
  endif()
endforeach()
configure_package_config_file(cmake/ddpConfig.cmake.in ${PROJECT_BINARY_DIR}/ddpConfig.cmake
                              INSTALL_DESTINATION ${DDP_INSTALL_CMAKEDIR})
# 0.x: minor versions may break the API, so a user asking for 0.1 gets only 0.1.z.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
        DESTINATION ${DDP_INSTALL_CMAKEDIR})

# Reference docs and the man page (gzipped, as Debian ships man pages).
file(GLOB DDP_DOCS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${DDP_DOCS} ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
configure_file(docs/man/ddprun.1 ${PROJECT_BINARY_DIR}/man/ddprun.1 @ONLY)
set(DDP_MAN_PAGE ${PROJECT_BINARY_DIR}/man/ddprun.1.gz)
add_custom_command(OUTPUT ${DDP_MAN_PAGE}
                   COMMAND gzip -9 -n -f -k ${PROJECT_BINARY_DIR}/man/ddprun.1
                   DEPENDS ${PROJECT_BINARY_DIR}/man/ddprun.1
                   COMMENT "Compressing the ddprun man page")
add_custom_target(ddp_man_page ALL DEPENDS ${DDP_MAN_PAGE})
install(FILES ${DDP_MAN_PAGE} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

# ddp_installable: everything `cmake --install` copies, and nothing else (no examples, tests or
# benchmarks). scripts/cpp_package.sh builds it in the wheel's build tree, which then installs.
add_custom_target(ddp_installable)
add_dependencies(ddp_installable ddp_man_page)
foreach(target ${DDP_EXPORTED_TARGETS} ddprun ddp_python_ext)
  if(TARGET ${target})
    add_dependencies(ddp_installable ${target})
  endif()
endforeach()

# The shared libraries behind the imported targets that ddp's exported targets link, one per
# line: "<target>|<library file>|<include folders>|<compile definitions>". scripts/cpp_package.sh
# copies them (and what they load) into a relocatable package and defines these targets over the
# copies (cpp_package_bundle.py), so find_package(ddp) needs none of Debian's -dev packages.
set(ddp_bundled_dependencies)
foreach(dep fmt::fmt spdlog::spdlog CURL::libcurl OpenSSL::Crypto ZLIB::ZLIB gloo)
  if(TARGET ${dep})
    string(APPEND ddp_bundled_dependencies
           "${dep}|$<TARGET_FILE:${dep}>|$<TARGET_PROPERTY:${dep},INTERFACE_INCLUDE_DIRECTORIES>|"
           "$<TARGET_PROPERTY:${dep},INTERFACE_COMPILE_DEFINITIONS>\n")
  endif()
endforeach()
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/ddp-bundled-dependencies.txt
     CONTENT "${ddp_bundled_dependencies}")
