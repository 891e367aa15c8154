# Shared compile settings, toolchain detection and the helper every troupe target uses.

find_package(Threads REQUIRED)

# ---- sanitizers: applied to everything we build, so that tests and libraries agree ----
# TROUPE_SANITIZE: OFF; ON or address: ASan + UBSan; thread: ThreadSanitizer (with CAF built by
# scripts/build-tsan-deps, found through TROUPE_CAF_ROOT, see actors/CMakeLists.txt; and cpp-httplib from
# the same script, see net/http/CMakeLists.txt).
string(TOLOWER "${TROUPE_SANITIZE}" troupe_sanitize)
set(TROUPE_TSAN OFF)
set(TROUPE_ASAN OFF)
if(troupe_sanitize STREQUAL "thread")
  set(TROUPE_TSAN ON)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=thread;-fno-omit-frame-pointer>")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC warns that TSan does not model std::atomic_thread_fence (used by Boost.Asio and CAF's headers).
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-Wno-tsan>")
  endif()
  add_link_options(-fsanitize=thread)
elseif(troupe_sanitize STREQUAL "on" OR troupe_sanitize STREQUAL "address" OR troupe_sanitize STREQUAL "yes"
       OR troupe_sanitize STREQUAL "true" OR troupe_sanitize STREQUAL "1")
  set(TROUPE_ASAN ON)
  # C and C++ only: nvcc does not take them (the CUDA kernels' host stubs go uninstrumented).
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # Under ASan, GCC 12 reports maybe-uninitialized false positives inside <regex> and <variant>.
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-Wno-maybe-uninitialized>")
  endif()
  add_link_options(-fsanitize=address,undefined)
elseif(TROUPE_SANITIZE)
  message(FATAL_ERROR "troupe: TROUPE_SANITIZE=${TROUPE_SANITIZE}: use OFF, ON (or address) or thread")
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
  if(TROUPE_TSAN AND kind STREQUAL "EXECUTABLE")
    # Every program carries ThreadSanitizer's options and suppressions (cmake/tsan_defaults.cpp).
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/tsan_defaults.cpp)
  endif()
  if(TROUPE_ASAN AND kind STREQUAL "EXECUTABLE")
    # Every program carries AddressSanitizer's options (cmake/asan_defaults.cpp).
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/asan_defaults.cpp)
  endif()
  if(NOT kind STREQUAL "EXECUTABLE")
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  else()
    target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
  endif()
endfunction()
