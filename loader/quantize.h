// Model quantization: rewrites a GGUF model with its weight matrices in another type.
//
//   quantize_report r = quantize_model("model-f32.gguf", "model-q4_K.gguf", type::q4_K, 2);
//   for (const auto& f : r.fallbacks) ...   // tensors whose rows do not fit the type's blocks
//
// Matrices (two or more dimensions, names ending in ".weight") are converted; vectors (norms, biases) keep
// their type. A matrix whose row length is not a multiple of the type's block size gets a fallback type
// (K-quants: q2_K/q3_K -> q4_0, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0; then f16), reported by name.
// Metadata is copied; general.file_type is updated. Rows are converted on n_threads threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/types.h"

namespace troupe {

struct quantize_report {
  struct fallback {
    std::string tensor;
    type used;
    int64_t row_length;
  };
  size_t n_quantized = 0;  // tensors converted to the requested type
  size_t n_kept = 0;       // tensors copied as they were
  std::vector<fallback> fallbacks;
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor data
};

// The type used for rows of length ne0 when `want` is requested.
type quantize_type_for(type want, int64_t ne0);

// llama.cpp's general.file_type value for a model mostly of this type (-1 when it has none).
int file_type_of(type t);

quantize_report quantize_model(const std::filesystem::path& in, const std::filesystem::path& out, type want,
                               int n_threads);

}  // namespace troupe
