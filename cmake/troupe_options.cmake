# Shared compile settings, toolchain detection and the helper every troupe target uses.

find_package(Threads REQUIRED)

# ---- sanitizers: applied to everything we build, so that tests and libraries agree ----
if(TROUPE_SANITIZE)
  # C and C++ only: nvcc does not take them (the CUDA kernels' host stubs go uninstrumented).
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # Under ASan, GCC 12 reports maybe-uninitialized false positives inside <regex> and <variant>.
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-Wno-maybe-uninitialized>")
  endif()
  add_link_options(-fsanitize=address,undefined)
endif()

# ---- OpenBLAS ----
set(TROUPE_HAVE_BLAS OFF)
if(TROUPE_BLAS)
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS)
  find_path(TROUPE_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas)
  if(BLAS_FOUND AND TROUPE_CBLAS_INCLUDE_DIR)
    set(TROUPE_HAVE_BLAS ON)
  else()
    message(WARNING "troupe: OpenBLAS not found; f32 matrix products use troupe's own kernels only")
  endif()
endif()

# ---- CUDA and Vulkan toolkits (auto-detected) ----
set(TROUPE_HAVE_CUDA OFF)
if(NOT TROUPE_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND CUDAToolkit_NVCC_EXECUTABLE)
    set(TROUPE_HAVE_CUDA ON)
    if(NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    endif()
  elseif(TROUPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "troupe: TROUPE_CUDA=ON but the CUDA toolkit was not found")
  endif()
endif()

set(TROUPE_HAVE_VULKAN OFF)
if(NOT TROUPE_VULKAN STREQUAL "OFF")
  find_package(Vulkan QUIET COMPONENTS glslc)
  if(Vulkan_FOUND AND TARGET Vulkan::glslc)
    set(TROUPE_HAVE_VULKAN ON)
  elseif(TROUPE_VULKAN STREQUAL "ON")
    message(FATAL_ERROR "troupe: TROUPE_VULKAN=ON but the Vulkan SDK or glslc was not found")
  endif()
endif()

# troupe_target(<target>): warnings (as errors when TROUPE_WERROR) and include paths for our own code.
function(troupe_target target)
  set(cxx "$<COMPILE_LANGUAGE:CXX>")
  # Designated initializers that leave members at their defaults are intended: no missing-field warnings.
  target_compile_options(${target} PRIVATE "$<${cxx}:-Wall;-Wextra;-Wpedantic;-Wnon-virtual-dtor;-Wno-missing-field-initializers>")
  # GCC's -Wshadow=local; clang has no such level, its -Wshadow is the closest (needed for clang builds,
  # e.g. the libFuzzer targets).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE "$<${cxx}:-Wshadow=local>")
  else()
    target_compile_options(${target} PRIVATE "$<${cxx}:-Wshadow>")
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    # GCC 12 reports -Wrestrict false positives inside std::string concatenation (GCC bug 105329).
    target_compile_options(${target} PRIVATE "$<${cxx}:-Wno-restrict>")
  endif()
  if(TROUPE_WERROR)
    target_compile_options(${target} PRIVATE "$<${cxx}:-Werror>")
  endif()
  # CUDA sources: nvcc's own warnings and the host compiler's on the host side, as errors alike.
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>")
  if(TROUPE_WERROR)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings;-Xcompiler=-Werror>")
  endif()
  get_target_property(kind ${target} TYPE)
  if(NOT kind STREQUAL "EXECUTABLE")
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  else()
    target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
  endif()
endfunction()
