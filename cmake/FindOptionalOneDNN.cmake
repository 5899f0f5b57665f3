# oneDNN is a peer kernel, never a requirement: this module looks for it without Debian's
# dnnl-config.cmake, whose find_package(OpenCL REQUIRED) is a fatal configure error on a machine
# without OpenCL (libdnnl-dev only recommends it). It finds the header and the library directly,
# then proves they build and link a one-line program; any failure leaves SHARPCHECK_ONEDNN_FOUND
# false with the reason printed, and the build goes on without the oneDNN plugin.
#
# Sets SHARPCHECK_ONEDNN_FOUND and, when true, the imported target sharpcheck_onednn::dnnl.
# SHARPCHECK_WITH_ONEDNN (AUTO, ON, OFF): OFF skips the search; ON makes a missing oneDNN an error.

set(SHARPCHECK_WITH_ONEDNN AUTO CACHE STRING "Build the oneDNN example plugin: AUTO, ON or OFF")
set_property(CACHE SHARPCHECK_WITH_ONEDNN PROPERTY STRINGS AUTO ON OFF)
set(SHARPCHECK_ONEDNN_FOUND FALSE)

function(sharpcheck_find_onednn)
  if(SHARPCHECK_WITH_ONEDNN STREQUAL "OFF")
    message(STATUS "oneDNN plugin: off (SHARPCHECK_WITH_ONEDNN=OFF)")
    return()
  endif()
  find_path(SHARPCHECK_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(SHARPCHECK_ONEDNN_LIBRARY dnnl)
  set(reason "")
  if(NOT SHARPCHECK_ONEDNN_INCLUDE_DIR OR NOT SHARPCHECK_ONEDNN_LIBRARY)
    set(reason "oneapi/dnnl/dnnl.hpp or libdnnl not found (Debian: libdnnl-dev)")
  else()
    set(probe_dir ${PROJECT_BINARY_DIR}/onednn_probe)
    file(WRITE ${probe_dir}/probe.cpp
      "#include <oneapi/dnnl/dnnl.hpp>\nint main() { dnnl::engine engine(dnnl::engine::kind::cpu, 0); return 0; }\n")
    try_compile(links ${probe_dir}/build SOURCES ${probe_dir}/probe.cpp
      CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${SHARPCHECK_ONEDNN_INCLUDE_DIR}"
      LINK_LIBRARIES ${SHARPCHECK_ONEDNN_LIBRARY} CXX_STANDARD 20 OUTPUT_VARIABLE probe_output)
    if(NOT links)
      set(reason "a program using ${SHARPCHECK_ONEDNN_LIBRARY} does not build")
    endif()
  endif()
  if(reason)
    if(SHARPCHECK_WITH_ONEDNN STREQUAL "ON")
      message(FATAL_ERROR "oneDNN requested (SHARPCHECK_WITH_ONEDNN=ON) but ${reason}")
    endif()
    message(STATUS "oneDNN plugin: skipped, ${reason}")
    return()
  endif()
  add_library(sharpcheck_onednn::dnnl UNKNOWN IMPORTED)
  set_target_properties(sharpcheck_onednn::dnnl PROPERTIES IMPORTED_LOCATION ${SHARPCHECK_ONEDNN_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${SHARPCHECK_ONEDNN_INCLUDE_DIR})
  message(STATUS "oneDNN plugin: ${SHARPCHECK_ONEDNN_LIBRARY}")
  set(SHARPCHECK_ONEDNN_FOUND TRUE PARENT_SCOPE)
endfunction()
sharpcheck_find_onednn()
