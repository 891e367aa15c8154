// GGUF metadata values: type names and sizes, exact equality, integer conversions and rendering.
#include "loader/gguf_value.h"

#include <array>
#include <cstring>
#include <limits>

namespace troupe {

namespace {

constexpr std::array<std::string_view, gguf_type_count> type_names = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};

constexpr std::array<size_t, gguf_type_count> type_sizes = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

// Exact comparison of two floating-point sequences: bit patterns, so NaN == NaN and -0 != +0.
template <class F>
bool same_bits(const std::vector<F>& a, const std::vector<F>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(F)) == 0);
}

template <class F>
bool same_bits(F a, F b) {
  return std::memcmp(&a, &b, sizeof(F)) == 0;
}

std::string quoted(std::string_view s, size_t max_chars = 64) {
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

template <class T>
std::string scalar_string(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return quoted(v);
  } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
    return std::to_string(static_cast<int>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    std::string s = std::to_string(v);  // fixed notation; trim trailing zeros for readability
    if (s.find('.') != std::string::npos) {
      while (!s.empty() && s.back() == '0') s.pop_back();
      if (!s.empty() && s.back() == '.') s.pop_back();
    }
    return s;
  } else {
    return std::to_string(v);
  }
}

std::string array_string(const gguf_array& a, size_t max_elems);

template <class T>
std::string element_string(const T& v, size_t max_elems) {
  if constexpr (std::is_same_v<T, gguf_array>) {
    return array_string(v, max_elems);
  } else {
    return scalar_string(v);
  }
}

std::string array_string(const gguf_array& a, size_t max_elems) {
  return std::visit(
      [max_elems](const auto& vec) {
        std::string s = "[";
        const size_t shown = std::min(vec.size(), max_elems);
        for (size_t i = 0; i < shown; ++i) {
          if (i) s += ", ";
          using E = typename std::decay_t<decltype(vec)>::value_type;
          s += element_string(static_cast<E>(vec[i]), max_elems);
        }
        if (shown < vec.size()) s += (shown ? ", ... (" : "... (") + std::to_string(vec.size()) + " elements)";
        return s + "]";
      },
      a.values());
}

}  // namespace

std::string_view gguf_type_name(gguf_type t) {
  const auto id = static_cast<uint32_t>(t);
  return id < gguf_type_count ? type_names[id] : std::string_view("unknown");
}

size_t gguf_type_size(gguf_type t) {
  const auto id = static_cast<uint32_t>(t);
  return id < gguf_type_count ? type_sizes[id] : 0;
}

gguf_array gguf_array::empty_of(gguf_type elem_type) {
  gguf_array a;
  switch (elem_type) {
    case gguf_type::uint8: a.values_.emplace<std::vector<uint8_t>>(); break;
    case gguf_type::int8: a.values_.emplace<std::vector<int8_t>>(); break;
    case gguf_type::uint16: a.values_.emplace<std::vector<uint16_t>>(); break;
    case gguf_type::int16: a.values_.emplace<std::vector<int16_t>>(); break;
    case gguf_type::uint32: a.values_.emplace<std::vector<uint32_t>>(); break;
    case gguf_type::int32: a.values_.emplace<std::vector<int32_t>>(); break;
    case gguf_type::float32: a.values_.emplace<std::vector<float>>(); break;
    case gguf_type::boolean: a.values_.emplace<std::vector<bool>>(); break;
    case gguf_type::string: a.values_.emplace<std::vector<std::string>>(); break;
    case gguf_type::array: a.values_.emplace<std::vector<gguf_array>>(); break;
    case gguf_type::uint64: a.values_.emplace<std::vector<uint64_t>>(); break;
    case gguf_type::int64: a.values_.emplace<std::vector<int64_t>>(); break;
    case gguf_type::float64: a.values_.emplace<std::vector<double>>(); break;
  }
  return a;
}

size_t gguf_array::size() const {
  return std::visit([](const auto& vec) { return vec.size(); }, values_);
}

bool operator==(const gguf_array& a, const gguf_array& b) {
  if (a.values_.index() != b.values_.index()) return false;
  if (const auto* fa = a.get_if<float>()) return same_bits(*fa, *b.get_if<float>());
  if (const auto* da = a.get_if<double>()) return same_bits(*da, *b.get_if<double>());
  return a.values_ == b.values_;
}

bool operator==(const gguf_value& a, const gguf_value& b) {
  if (a.v_.index() != b.v_.index()) return false;
  if (const auto* fa = a.get_if<float>()) return same_bits(*fa, *b.get_if<float>());
  if (const auto* da = a.get_if<double>()) return same_bits(*da, *b.get_if<double>());
  return a.v_ == b.v_;
}

std::optional<uint64_t> gguf_value::as_uint() const {
  return std::visit(
      [](const auto& v) -> std::optional<uint64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_signed_v<T>) {
            if (v < 0) return std::nullopt;
          }
          return static_cast<uint64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      v_);
}

std::optional<int64_t> gguf_value::as_int() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(v);
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<int64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      v_);
}

std::optional<double> gguf_value::as_float() const {
  if (const float* f = get_if<float>()) return static_cast<double>(*f);
  if (const double* d = get_if<double>()) return *d;
  return std::nullopt;
}

std::string gguf_value::to_string(size_t max_elems) const {
  return std::visit([max_elems](const auto& v) { return element_string(v, max_elems); }, v_);
}

}  // namespace troupe
