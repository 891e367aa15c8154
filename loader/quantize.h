// Model quantization: rewrites a GGUF model with its weight matrices in another type.
//
//   quantize_report r = quantize_model("model-f32.gguf", "model-q4_K.gguf", type::q4_K, 2);
//   for (const auto& f : r.fallbacks) ...   // tensors whose rows do not fit the type's blocks
//
// Matrices (two or more dimensions, names ending in ".weight") are converted; vectors (norms, biases) keep
// their type. A matrix whose row length is not a multiple of the type's block size gets a fallback type
// (K-quants: q2_K/q3_K -> q4_0, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0; iq4_xs -> iq4_nl; tq1_0/tq2_0 ->
// q4_0; then f16),
// reported by name.
// Metadata is copied; general.file_type is updated. Rows are converted on n_threads threads.
//
// Recipes (quantize_recipe::parse): a type name ("q4_K": every matrix in it; iq4_nl and iq4_xs as llama.cpp's
// IQ4_NL / IQ4_XS files: every matrix but the output one, which is q6_K) or one of llama.cpp's mixes by
// its name ("q4_K_M", "q5_K_M"), whose rules pick a type per tensor as llama.cpp's quantizer does for a dense
// model: the output matrix (the token embeddings when the model ties them) in q6_K; attn_v and ffn_down in
// q6_K in the layers use_more_bits picks (the first and last eighth and every third between); fused attn_qkv
// one step up (q5_K / q6_K); everything else the mix's base type; then the fallbacks above.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/types.h"

namespace troupe {

struct quantize_report {
  struct fallback {
    std::string tensor;
    type used;
    int64_t row_length;
  };
  size_t n_quantized = 0;  // tensors converted to the type their recipe wanted
  size_t n_kept = 0;       // tensors copied as they were
  std::vector<fallback> fallbacks;
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor data
};

// The type used for rows of length ne0 when `want` is requested.
type quantize_type_for(type want, int64_t ne0);

struct quantize_recipe {
  std::string name;  // as given: "q4_K", "q4_K_M"
  type base = type::f16;
  bool medium = false;  // the _M mixes' per-tensor rules
  // "q4_0".."q6_K", "f16", "bf16", "f32", "q4_K_M", "q5_K_M"; nullopt for anything else.
  static std::optional<quantize_recipe> parse(std::string_view name);
  // The type wanted for a matrix (before the fallback for its row length): `layer` its block index (-1: not
  // in a block), `n_layer` the model's blocks, `tied` whether the token embeddings are also the output.
  type type_for(std::string_view tensor, int layer, int n_layer, bool tied) const;
  int file_type() const;  // llama.cpp's general.file_type (-1: none)
};

// The i-quants of 3 bits and less: their grids are only good with an importance matrix, which troupe does
// not compute, so quantize_model refuses them by name (they load and compute when a file has them).
bool needs_importance_matrix(type t);

// llama.cpp's use_more_bits: the layers of an _M mix that get more bits (i of n).
bool use_more_bits(int i, int n);

// llama.cpp's general.file_type value for a model mostly of this type (-1 when it has none).
int file_type_of(type t);

quantize_report quantize_model(const std::filesystem::path& in, const std::filesystem::path& out, type want,
                               int n_threads);
quantize_report quantize_model(const std::filesystem::path& in, const std::filesystem::path& out,
                               const quantize_recipe& recipe, int n_threads);

}  // namespace troupe
