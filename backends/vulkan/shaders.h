// The compute shaders (backends/vulkan/shaders/*.comp), compiled to SPIR-V by glslc at build time and embedded
// in the library (embed_spirv.cmake writes shaders.cpp).
//
//   shader_bytes s = shader_code("binary");   // s.data: 4-byte aligned SPIR-V words; {nullptr, 0}: no such shader
#pragma once

#include <cstddef>
#include <string_view>

namespace troupe::vulkan {

struct shader_bytes {
  const unsigned char* data = nullptr;  // aligned to 4 bytes (SPIR-V words)
  size_t size = 0;
};

shader_bytes shader_code(std::string_view name);

}  // namespace troupe::vulkan
