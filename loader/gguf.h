// GGUF files (v2 and v3): parsing and strict validation of the header, metadata and tensor infos.
//
//   gguf_file f = read_gguf("model.gguf");              // reads the header region only, never tensor data
//   uint64_t n_embd = f.get_uint("llama.embedding_length").value();   // throws gguf_error naming the key
//   auto tokens = f.get<std::vector<std::string>>("tokenizer.ggml.tokens");
//   if (!tokens) TROUPE_LOG(warn, tokens.error());
//   for (const gguf_tensor_info& t : f.tensors()) {
//     // t.file_offset: absolute byte offset of t's data in the file, t.n_bytes: its size
//     if (!t.supported()) ...                         // known GGUF type troupe cannot compute with (iq*, ...)
//   }
//
// Parsing allocates nothing for tensor data and touches no byte of it. Everything read from the file is
// validated (see docs/gguf.md); a violation throws gguf_error whose message names the key or tensor, the
// byte offset and the file size:
//   gguf: model.gguf: tensor 'blk.0.attn_q.weight': data of 4096 bytes at [1024, 5120) lies outside the file
//   (offset 1024, file size 3000 bytes)
//
// Writing: loader/gguf_writer.h. Split models (<prefix>-00001-of-00003.gguf): loader/gguf_split.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "loader/gguf_value.h"
#include "runtime/error.h"
#include "runtime/tensor.h"
#include "runtime/types.h"

namespace troupe {

// A GGUF file (or a request on one) that is malformed, inconsistent or unreadable.
class gguf_error : public error {
 public:
  using error::error;
};

constexpr char gguf_magic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t gguf_version = 3;             // what gguf_writer writes; the parser reads 2 and 3
constexpr uint32_t gguf_default_alignment = 32;  // when general.alignment is absent
constexpr int gguf_max_array_depth = 16;         // arrays of arrays nest at most this deep
constexpr std::string_view gguf_alignment_key = "general.alignment";

// Where one tensor's data lies and what it is.
struct gguf_tensor_info {
  std::string name;                          // at most max_name - 1 bytes
  uint32_t n_dims = 1;                       // as stored (0..4); ne beyond n_dims are 1
  std::array<int64_t, max_dims> ne{1, 1, 1, 1};  // elements per dimension, dimension 0 innermost
  ::troupe::type type = ::troupe::type::f32;     // a type GGUF defines; maybe not one troupe supports
  uint64_t offset = 0;       // as stored: relative to the data section, a multiple of the alignment
  uint64_t file_offset = 0;  // absolute: data_offset + offset
  uint64_t n_bytes = 0;      // row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]
  uint32_t file_index = 0;   // which file of a split model holds the data (0 for a single file)

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  // troupe can compute with the type (else the loader refuses the tensor with its name and type).
  bool supported() const { return traits(type).supported; }
  // "name [ne0, ne1] type" with the stored number of dimensions.
  std::string describe() const;

  friend bool operator==(const gguf_tensor_info& a, const gguf_tensor_info& b) = default;
};

// An expected-style lookup result: the value, or an error message naming the key and file.
// value() (and * and ->) throw gguf_error with that message when there is no value.
template <class T>
class gguf_result {
 public:
  static gguf_result ok(const T& v) {
    gguf_result r;
    if constexpr (by_value) {
      r.value_ = v;
    } else {
      r.value_ = &v;
    }
    return r;
  }
  static gguf_result fail(std::string message) {
    gguf_result r;
    r.error_ = std::move(message);
    return r;
  }

  bool has_value() const { return static_cast<bool>(value_); }
  explicit operator bool() const { return has_value(); }
  const T& value() const {
    if (!has_value()) throw gguf_error(error_);
    return *value_;  // the optional's value, or the pointed-to value
  }
  const T& operator*() const { return value(); }
  const T* operator->() const { return &value(); }
  T value_or(T fallback) const { return has_value() ? value() : std::move(fallback); }
  // Why there is no value; empty when there is one.
  const std::string& error() const { return error_; }

 private:
  static constexpr bool by_value = std::is_arithmetic_v<T>;
  std::conditional_t<by_value, std::optional<T>, const T*> value_{};
  std::string error_;
};

// A parsed GGUF file: metadata in file order with lookup by key, tensor infos in file order with lookup by
// name, and the layout (alignment, data section offset, file size). Immutable once parsed.
class gguf_file {
 public:
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section (aligned)
  uint64_t file_size() const { return file_size_; }
  const std::string& source() const { return source_; }  // the path, or the name given to parse_gguf
  // Bytes the parser read: the header region (plus read-ahead up to one buffer when reading a file).
  uint64_t bytes_read() const { return bytes_read_; }

  const std::vector<gguf_kv>& metadata() const { return kv_; }
  const std::vector<gguf_tensor_info>& tensors() const { return tensors_; }
  // Byte offset in the file of the metadata entry (its key's length field), by index into metadata().
  uint64_t kv_offset(size_t index) const { return kv_offsets_.at(index); }

  bool contains(std::string_view key) const { return find(key) != nullptr; }
  const gguf_value* find(std::string_view key) const;
  std::optional<size_t> find_index(std::string_view key) const;

  // The value of `key` when it has exactly type T (a scalar type, std::string, gguf_array or std::vector<E>
  // for an array of E), else an error naming the key, its type and the file.
  template <class T>
  gguf_result<T> get(std::string_view key) const {
    const auto i = find_index(key);
    if (!i) return gguf_result<T>::fail(missing_message(key));
    if (const T* v = kv_[*i].value.template get_if<T>()) return gguf_result<T>::ok(*v);
    return gguf_result<T>::fail(type_message(*i, expected_type_name<T>()));
  }
  // Any integer type whose value fits (negative values do not fit get_uint).
  gguf_result<uint64_t> get_uint(std::string_view key) const;
  gguf_result<int64_t> get_int(std::string_view key) const;
  // float32 or float64.
  gguf_result<double> get_float(std::string_view key) const;

  const gguf_tensor_info* find_tensor(std::string_view name) const;
  // Throws gguf_error naming the tensor and the file when there is none.
  const gguf_tensor_info& tensor(std::string_view name) const;

  // A message in the format of every gguf_error: "gguf: [source: ]subject: problem (offset o, file size n)".
  std::string message(std::string_view subject, std::string_view problem, std::optional<uint64_t> offset) const;

 private:
  friend class gguf_parser;

  template <class T>
  static std::string expected_type_name() {
    if constexpr (std::is_same_v<T, uint8_t>) return "uint8";
    else if constexpr (std::is_same_v<T, int8_t>) return "int8";
    else if constexpr (std::is_same_v<T, uint16_t>) return "uint16";
    else if constexpr (std::is_same_v<T, int16_t>) return "int16";
    else if constexpr (std::is_same_v<T, uint32_t>) return "uint32";
    else if constexpr (std::is_same_v<T, int32_t>) return "int32";
    else if constexpr (std::is_same_v<T, float>) return "float32";
    else if constexpr (std::is_same_v<T, bool>) return "bool";
    else if constexpr (std::is_same_v<T, std::string>) return "string";
    else if constexpr (std::is_same_v<T, gguf_array>) return "array";
    else if constexpr (std::is_same_v<T, uint64_t>) return "uint64";
    else if constexpr (std::is_same_v<T, int64_t>) return "int64";
    else if constexpr (std::is_same_v<T, double>) return "float64";
    else return "array of " + expected_type_name<typename T::value_type>();
  }
  std::string missing_message(std::string_view key) const;
  std::string type_message(size_t index, std::string_view expected) const;

  uint32_t version_ = gguf_version;
  uint32_t alignment_ = gguf_default_alignment;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  uint64_t bytes_read_ = 0;
  std::string source_;
  std::vector<gguf_kv> kv_;
  std::vector<uint64_t> kv_offsets_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<gguf_tensor_info> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Parses a whole GGUF file held in memory. `source` names it in error messages (may be empty).
gguf_file parse_gguf(std::span<const std::byte> bytes, std::string_view source = {});

// Parses a GGUF file on disk, reading (with buffered pread) only its header, metadata and tensor infos.
// Tensor offsets are validated against the file's size. Throws gguf_error if the file cannot be read.
gguf_file read_gguf(const std::filesystem::path& path);

// Description of a metadata value's type for messages: "uint32", "array of string", "array of array".
std::string gguf_describe_type(const gguf_value& v);

// A name, key or string from a file made safe to print: control bytes escaped, at most 96 bytes shown.
std::string gguf_printable(std::string_view s);

}  // namespace troupe
