#include "loader/quantize.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "loader/gguf_writer.h"
#include "loader/mmap.h"
#include "runtime/error.h"

namespace troupe {

type quantize_type_for(type want, int64_t ne0) {
  type t = want;
  if (ne0 % block_size(t) != 0) {
    switch (want) {
      case type::q2_K:
      case type::q3_K: t = type::q4_0; break;
      case type::q4_K: t = type::q5_0; break;
      case type::q5_K: t = type::q5_1; break;
      case type::q6_K: t = type::q8_0; break;
      case type::iq4_xs: t = type::iq4_nl; break;
      case type::tq1_0:
      case type::tq2_0: t = type::q4_0; break;  // as llama.cpp
      default: t = type::f16; break;
    }
  }
  if (ne0 % block_size(t) != 0) t = type::f16;
  return t;
}

bool needs_importance_matrix(type t) {
  switch (t) {
    case type::iq2_xxs:
    case type::iq2_xs:
    case type::iq2_s:
    case type::iq3_xxs:
    case type::iq3_s:
    case type::iq1_s:
    case type::iq1_m:
      return true;
    default:
      return false;
  }
}

bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

std::optional<quantize_recipe> quantize_recipe::parse(std::string_view name) {
  quantize_recipe r;
  r.name = std::string(name);
  if (name == "q4_K_M" || name == "Q4_K_M") {
    r.base = type::q4_K;
    r.medium = true;
    return r;
  }
  if (name == "q5_K_M" || name == "Q5_K_M") {
    r.base = type::q5_K;
    r.medium = true;
    return r;
  }
  const auto t = type_from_name(std::string(name));
  if (!t) return std::nullopt;
  r.base = *t;
  return r;
}

type quantize_recipe::type_for(std::string_view tensor, int layer, int n_layer, bool tied) const {
  const bool output = tensor == "output.weight" || (tied && tensor == "token_embd.weight");
  // llama.cpp's IQ4_NL / IQ4_XS files keep the output matrix in q6_K, as its mixes do.
  if (output && (base == type::iq4_nl || base == type::iq4_xs)) return type::q6_K;
  if (!medium) return base;
  if (output) return type::q6_K;
  if (layer >= 0 && (tensor.ends_with(".attn_v.weight") || tensor.ends_with(".ffn_down.weight"))) {
    return use_more_bits(layer, n_layer) ? type::q6_K : base;
  }
  if (tensor.ends_with(".attn_qkv.weight")) return base == type::q4_K ? type::q5_K : type::q6_K;
  return base;
}

int quantize_recipe::file_type() const {
  if (medium) return base == type::q4_K ? 15 : 17;  // Q4_K_M, Q5_K_M
  switch (base) {
    case type::q3_K: return 11;  // one type throughout: the _S files come closest
    case type::q4_K: return 14;
    case type::q5_K: return 16;
    default: return file_type_of(base);
  }
}

int file_type_of(type t) {
  switch (t) {
    case type::f32: return 0;
    case type::f16: return 1;
    case type::q4_0: return 2;
    case type::q4_1: return 3;
    case type::q8_0: return 7;
    case type::q5_0: return 8;
    case type::q5_1: return 9;
    case type::q2_K: return 10;
    case type::q3_K: return 12;  // Q3_K_M
    case type::q4_K: return 15;  // Q4_K_M
    case type::q5_K: return 17;  // Q5_K_M
    case type::q6_K: return 18;
    case type::iq4_nl: return 25;
    case type::iq4_xs: return 30;
    case type::tq1_0: return 36;
    case type::tq2_0: return 37;
    case type::mxfp4: return 38;  // llama.cpp's MXFP4_MOE
    case type::bf16: return 32;
    default: return -1;
  }
}

quantize_report quantize_model(const std::filesystem::path& in, const std::filesystem::path& out, type want,
                               int n_threads) {
  quantize_recipe r;
  r.name = std::string(type_name(want));
  r.base = want;
  return quantize_model(in, out, r, n_threads);
}

namespace {

// The block index of "blk.N.<name>", or -1.
int layer_of(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  int n = 0;
  size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) n = n * 10 + (name[i] - '0');
  return i < name.size() && name[i] == '.' ? n : -1;
}

}  // namespace

quantize_report quantize_model(const std::filesystem::path& in, const std::filesystem::path& out,
                               const quantize_recipe& recipe, int n_threads) {
  for (type t : {recipe.base, type::q6_K}) {
    const type_traits& wt = traits(t);
    if (needs_importance_matrix(t)) {
      throw error("quantize: " + std::string(type_name(t)) +
                  " needs an importance matrix (llama.cpp's --imatrix) to keep its quality, which troupe quantize "
                  "does not compute; of the i-quants it writes iq4_nl and iq4_xs");
    }
    if (!wt.supported || wt.from_float_ref == nullptr || t == type::q8_1 || t == type::q8_K) {
      throw error("quantize: cannot quantize to " + std::string(type_name(t)));
    }
    if (!recipe.medium && recipe.base != type::iq4_nl && recipe.base != type::iq4_xs) break;
  }
  if (n_threads < 1) n_threads = 1;
  const gguf_file f = read_gguf(in);
  const mapped_file m(in);
  for (const auto& t : f.tensors()) require_supported(t.type, t.name);

  gguf_writer w;
  for (const gguf_kv& kv : f.metadata()) {
    if (kv.key == "general.file_type") continue;
    w.add(kv.key, kv.value);
  }
  if (recipe.file_type() >= 0) w.add("general.file_type", static_cast<uint32_t>(recipe.file_type()));
  int n_layer = 0;
  bool has_output = false;
  for (const gguf_tensor_info& t : f.tensors()) {
    n_layer = std::max(n_layer, layer_of(t.name) + 1);
    has_output = has_output || t.name == "output.weight";
  }

  quantize_report r;
  for (const gguf_tensor_info& t : f.tensors()) {
    const std::span<const std::byte> src(m.data() + t.file_offset, t.n_bytes);
    r.bytes_in += t.n_bytes;
    // A mixture of experts' router (ffn_gate_inp) stays as it is, as llama.cpp keeps it: small, and its
    // errors move every token's choice of experts.
    const bool matrix = t.n_dims >= 2 && t.name.size() > 7 && t.name.ends_with(".weight") &&
                        !t.name.ends_with(".ffn_gate_inp.weight");
    const type want = recipe.type_for(t.name, layer_of(t.name), n_layer, !has_output);
    const type target = matrix ? quantize_type_for(want, t.ne[0]) : t.type;
    if (target == t.type) {
      w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), std::max<uint32_t>(t.n_dims, 1)), src);
      r.bytes_out += t.n_bytes;
      ++r.n_kept;
      continue;
    }
    if (target != want) r.fallbacks.push_back({t.name, target, t.ne[0]});
    else ++r.n_quantized;

    const int64_t ne0 = t.ne[0];
    const int64_t rows = t.n_elements() / ne0;
    const size_t in_row = row_size(t.type, ne0);
    const size_t out_row = row_size(target, ne0);
    std::vector<std::byte> dst(out_row * static_cast<size_t>(rows));
    auto work = [&](int ith) {
      std::vector<float> buf(static_cast<size_t>(ne0));
      for (int64_t ir = ith; ir < rows; ir += n_threads) {
        traits(t.type).to_float(src.data() + static_cast<size_t>(ir) * in_row, buf.data(), ne0);
        traits(target).from_float_ref(buf.data(), dst.data() + static_cast<size_t>(ir) * out_row, ne0);
      }
    };
    std::vector<std::thread> threads;
    for (int i = 1; i < n_threads; ++i) threads.emplace_back(work, i);
    work(0);
    for (auto& th : threads) th.join();
    w.add_tensor(t.name, target, std::span<const int64_t>(t.ne.data(), t.n_dims), dst);
    r.bytes_out += dst.size();
  }
  w.write_file(out);
  return r;
}

}  // namespace troupe
