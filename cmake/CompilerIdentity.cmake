# The compiler's identity: a SHA-256 over the sources that decide what code
# Kiln generates (compiler/, graph/ and proto/) and the versions of the toolchains it
# links. It is part of every guard key (DESIGN.md, decision 2), so a changed
# compiler never serves an artifact built by an older one.
set(KILN_IDENTITY_OUT ${CMAKE_BINARY_DIR}/generated/kiln/compiler_identity.inc)
file(GLOB_RECURSE KILN_IDENTITY_INPUTS CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/compiler/*.cc ${CMAKE_SOURCE_DIR}/compiler/*.h
     ${CMAKE_SOURCE_DIR}/graph/*.cc ${CMAKE_SOURCE_DIR}/graph/*.h
     ${CMAKE_SOURCE_DIR}/proto/*.proto)
add_custom_command(
  OUTPUT ${KILN_IDENTITY_OUT}
  COMMAND ${CMAKE_COMMAND} -DSRC_DIR=${CMAKE_SOURCE_DIR} -DOUT=${KILN_IDENTITY_OUT}
          "-DEXTRA=llvm=${LLVM_PACKAGE_VERSION},cuda=${CUDAToolkit_VERSION}"
          -P ${CMAKE_SOURCE_DIR}/cmake/compute_identity.cmake
  DEPENDS ${KILN_IDENTITY_INPUTS} ${CMAKE_SOURCE_DIR}/cmake/compute_identity.cmake
  COMMENT "Hashing the compiler's sources for its identity"
  VERBATIM)
add_custom_target(kiln_compiler_identity DEPENDS ${KILN_IDENTITY_OUT})
