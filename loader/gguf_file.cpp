// A parsed GGUF file: lookup of metadata and tensors, typed getters and the error message format.
#include <string>

#include "loader/gguf.h"

namespace troupe {

std::string gguf_printable(std::string_view s) {
  constexpr size_t max_shown = 96;
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(s.size(), max_shown) + 8);
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == max_shown) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(s[i]);
    if (u < 0x20 || u == 0x7f || s[i] == '\'' || s[i] == '\\') {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string gguf_describe_type(const gguf_value& v) {
  const gguf_array* a = v.get_if<gguf_array>();
  if (!a) return std::string(gguf_type_name(v.type()));
  return "array of " + std::string(gguf_type_name(a->elem_type()));
}

std::string gguf_tensor_info::describe() const {
  std::string s = "'";  // appends only: GCC 12 misreports "'" + string at -O3 (-Wrestrict)
  s += gguf_printable(name);
  s += "' [";
  for (uint32_t i = 0; i < n_dims && i < max_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "] " + std::string(type_name(type));
}

std::string gguf_file::message(std::string_view subject, std::string_view problem,
                               std::optional<uint64_t> offset) const {
  std::string m = "gguf: ";
  if (!source_.empty()) m += source_ + ": ";
  m += subject;
  m += ": ";
  m += problem;
  m += " (";
  if (offset) m += "offset " + std::to_string(*offset) + ", ";
  m += "file size " + std::to_string(file_size_) + " bytes)";
  return m;
}

std::optional<size_t> gguf_file::find_index(std::string_view key) const {
  const auto it = kv_index_.find(key);
  if (it == kv_index_.end()) return std::nullopt;
  return it->second;
}

const gguf_value* gguf_file::find(std::string_view key) const {
  const auto i = find_index(key);
  return i ? &kv_[*i].value : nullptr;
}

std::string gguf_file::missing_message(std::string_view key) const {
  return message("key '" + gguf_printable(key) + "'", "not found", std::nullopt);
}

std::string gguf_file::type_message(size_t index, std::string_view expected) const {
  return message("key '" + gguf_printable(kv_[index].key) + "'",
                 "has type " + gguf_describe_type(kv_[index].value) + ", expected " + std::string(expected),
                 kv_offsets_[index]);
}

gguf_result<uint64_t> gguf_file::get_uint(std::string_view key) const {
  const auto i = find_index(key);
  if (!i) return gguf_result<uint64_t>::fail(missing_message(key));
  const gguf_value& v = kv_[*i].value;
  if (const auto u = v.as_uint()) return gguf_result<uint64_t>::ok(*u);
  if (v.as_int()) {
    return gguf_result<uint64_t>::fail(message("key '" + gguf_printable(key) + "'",
                                               "value " + v.to_string() + " is negative, expected an unsigned "
                                               "integer", kv_offsets_[*i]));
  }
  return gguf_result<uint64_t>::fail(type_message(*i, "an integer"));
}

gguf_result<int64_t> gguf_file::get_int(std::string_view key) const {
  const auto i = find_index(key);
  if (!i) return gguf_result<int64_t>::fail(missing_message(key));
  const gguf_value& v = kv_[*i].value;
  if (const auto s = v.as_int()) return gguf_result<int64_t>::ok(*s);
  if (v.as_uint()) {
    return gguf_result<int64_t>::fail(message("key '" + gguf_printable(key) + "'",
                                              "value " + v.to_string() + " does not fit int64", kv_offsets_[*i]));
  }
  return gguf_result<int64_t>::fail(type_message(*i, "an integer"));
}

gguf_result<double> gguf_file::get_float(std::string_view key) const {
  const auto i = find_index(key);
  if (!i) return gguf_result<double>::fail(missing_message(key));
  if (const auto d = kv_[*i].value.as_float()) return gguf_result<double>::ok(*d);
  return gguf_result<double>::fail(type_message(*i, "float32 or float64"));
}

const gguf_tensor_info* gguf_file::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const gguf_tensor_info& gguf_file::tensor(std::string_view name) const {
  if (const gguf_tensor_info* t = find_tensor(name)) return *t;
  throw gguf_error(message("tensor '" + gguf_printable(name) + "'", "not found", std::nullopt));
}

}  // namespace troupe
