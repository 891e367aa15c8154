// The GGUF writer: serializes metadata and tensor infos little-endian, lays the data section out with the
// alignment, and writes to memory or to a file.
#include "loader/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "loader/detail/bytes.h"

namespace troupe {

namespace {

using detail::checked_add;
using detail::checked_align_up;
using detail::checked_mul;

[[noreturn]] void fail(std::string_view subject, std::string_view problem) {
  throw gguf_error("gguf writer: " + std::string(subject) + ": " + std::string(problem));
}

std::string key_subject(std::string_view key) { return "key '" + gguf_printable(key) + "'"; }
std::string tensor_subject(std::string_view name) { return "tensor '" + gguf_printable(name) + "'"; }

// Appends little-endian bytes to a buffer.
class byte_sink {
 public:
  explicit byte_sink(std::vector<std::byte>& out) : out_(out) {}

  template <class T>
  void put(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    detail::store_le(out_.data() + at, v);
  }
  void put_bytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out_.size();
    out_.resize(at + n);  // resize + memcpy: GCC 12 misreports vector::insert at -O3 (stringop-overflow)
    std::memcpy(out_.data() + at, p, n);
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    put_bytes(s.data(), s.size());
  }
  void pad(uint64_t alignment) { out_.resize(static_cast<size_t>(*checked_align_up(out_.size(), alignment))); }

  void put_array(const gguf_array& a) {
    put<uint32_t>(static_cast<uint32_t>(a.elem_type()));
    put<uint64_t>(a.size());
    std::visit(
        [this](const auto& vec) {
          using E = typename std::decay_t<decltype(vec)>::value_type;
          for (const auto& e : vec) {
            if constexpr (std::is_same_v<E, bool>) {
              put<uint8_t>(e ? 1 : 0);
            } else if constexpr (std::is_same_v<E, std::string>) {
              put_string(e);
            } else if constexpr (std::is_same_v<E, gguf_array>) {
              put_array(e);
            } else {
              put<E>(e);
            }
          }
        },
        a.values());
  }

  void put_value(const gguf_value& v) {
    put<uint32_t>(static_cast<uint32_t>(v.type()));
    std::visit(
        [this](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, bool>) {
            put<uint8_t>(x ? 1 : 0);
          } else if constexpr (std::is_same_v<T, std::string>) {
            put_string(x);
          } else if constexpr (std::is_same_v<T, gguf_array>) {
            // put_value wrote the array type; the array body follows.
            put_array(x);
          } else {
            put<T>(x);
          }
        },
        v.value());
  }

 private:
  std::vector<std::byte>& out_;
};

// Deepest nesting of arrays in a (0 for a scalar, 1 for an array of scalars...).
int array_depth(const gguf_array& a) {
  int deepest = 0;
  if (const auto* inner = a.get_if<gguf_array>()) {
    for (const gguf_array& e : *inner) deepest = std::max(deepest, array_depth(e));
  }
  return deepest + 1;
}

struct file_closer {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

void gguf_writer::check_value(const std::string& key, const gguf_value& value) const {
  if (key.empty()) fail("key ''", "empty key");
  if (const gguf_array* a = value.get_if<gguf_array>()) {
    if (array_depth(*a) > gguf_max_array_depth) {
      fail(key_subject(key), "arrays nested deeper than " + std::to_string(gguf_max_array_depth) + " levels");
    }
  }
  if (key == gguf_alignment_key) {
    const uint32_t* al = value.get_if<uint32_t>();
    if (!al) fail(key_subject(key), "has type " + gguf_describe_type(value) + ", must be uint32");
    if (!detail::is_power_of_two(*al)) {
      fail(key_subject(key), "alignment " + std::to_string(*al) + " is not a power of two");
    }
  }
}

gguf_writer& gguf_writer::add(std::string key, gguf_value value) {
  check_value(key, value);
  if (kv_index_.count(key)) fail(key_subject(key), "duplicate key");
  if (key == gguf_alignment_key) alignment_ = *value.get_if<uint32_t>();
  kv_index_.emplace(key, kv_.size());
  kv_.push_back({std::move(key), std::move(value)});
  return *this;
}

gguf_writer& gguf_writer::set(std::string key, gguf_value value) {
  const auto it = kv_index_.find(key);
  if (it == kv_index_.end()) return add(std::move(key), std::move(value));
  check_value(key, value);
  if (key == gguf_alignment_key) alignment_ = *value.get_if<uint32_t>();
  kv_[it->second].value = std::move(value);
  return *this;
}

gguf_tensor_info gguf_writer::make_info(std::string name, type t, std::span<const int64_t> shape,
                                        size_t data_size) const {
  const std::string subject = tensor_subject(name);
  if (name.size() >= max_name) {
    fail(subject, "name is " + std::to_string(name.size()) + " bytes long, at most " +
                      std::to_string(max_name - 1) + " are allowed");
  }
  if (tensor_index_.count(name)) fail(subject, "duplicate tensor name");
  if (shape.size() > static_cast<size_t>(max_dims)) {
    fail(subject, std::to_string(shape.size()) + " dimensions, at most " + std::to_string(max_dims) + " are allowed");
  }
  if (!type_from_id(static_cast<uint32_t>(t))) {
    fail(subject, "unknown tensor type id " + std::to_string(static_cast<uint32_t>(t)));
  }
  gguf_tensor_info info;
  info.name = std::move(name);
  info.type = t;
  info.n_dims = static_cast<uint32_t>(shape.size());
  int64_t n_elements = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0) {
      fail(subject, "dimension " + std::to_string(d) + " is " + std::to_string(shape[d]) + ", must be positive");
    }
    info.ne[d] = shape[d];
    const auto p = checked_mul<int64_t>(n_elements, shape[d]);
    if (!p) fail(subject, "element count overflows 64 bits");
    n_elements = *p;
  }
  const type_traits& tr = traits(t);
  if (info.ne[0] % tr.block_size != 0) {
    fail(subject, "row length " + std::to_string(info.ne[0]) + " is not a multiple of the " + std::string(tr.name) +
                      " block size " + std::to_string(tr.block_size));
  }
  const auto row = checked_mul<uint64_t>(static_cast<uint64_t>(info.ne[0] / tr.block_size), tr.type_size);
  const auto bytes =
      row ? checked_mul<uint64_t>(*row, static_cast<uint64_t>(info.ne[1] * info.ne[2] * info.ne[3])) : std::nullopt;
  if (!bytes) fail(subject, "byte size overflows 64 bits");
  info.n_bytes = *bytes;
  if (data_size != info.n_bytes) {
    fail(subject, "data is " + std::to_string(data_size) + " bytes, the shape and type need " +
                      std::to_string(info.n_bytes));
  }
  return info;
}

gguf_writer& gguf_writer::add_tensor(std::string name, type t, std::span<const int64_t> shape,
                                     std::span<const std::byte> data) {
  tensor_entry e{make_info(std::move(name), t, shape, data.size()), {}, {}, false};
  e.owned.assign(data.begin(), data.end());
  tensor_index_.emplace(e.info.name, tensors_.size());
  tensors_.push_back(std::move(e));
  return *this;
}

gguf_writer& gguf_writer::add_tensor_ref(std::string name, type t, std::span<const int64_t> shape,
                                         std::span<const std::byte> data) {
  tensor_entry e{make_info(std::move(name), t, shape, data.size()), {}, data, true};
  tensor_index_.emplace(e.info.name, tensors_.size());
  tensors_.push_back(std::move(e));
  return *this;
}

std::vector<std::byte> gguf_writer::header_region(std::vector<gguf_tensor_info>& infos) const {
  infos.clear();
  uint64_t offset = 0;  // relative to the data section
  for (const tensor_entry& e : tensors_) {
    gguf_tensor_info info = e.info;
    info.offset = offset;
    const auto next = checked_add<uint64_t>(offset, info.n_bytes);
    const auto aligned = next ? checked_align_up(*next, alignment_) : std::nullopt;
    if (!aligned) fail(tensor_subject(info.name), "data section size overflows 64 bits");
    offset = *aligned;
    infos.push_back(std::move(info));
  }

  std::vector<std::byte> out;
  byte_sink s(out);
  s.put_bytes(gguf_magic, 4);
  s.put<uint32_t>(gguf_version);
  s.put<uint64_t>(tensors_.size());
  s.put<uint64_t>(kv_.size());
  for (const gguf_kv& kv : kv_) {
    s.put_string(kv.key);
    s.put_value(kv.value);
  }
  for (const gguf_tensor_info& info : infos) {
    s.put_string(info.name);
    s.put<uint32_t>(info.n_dims);
    for (uint32_t d = 0; d < info.n_dims; ++d) s.put<int64_t>(info.ne[d]);
    s.put<uint32_t>(static_cast<uint32_t>(info.type));
    s.put<uint64_t>(info.offset);
  }
  s.pad(alignment_);
  for (gguf_tensor_info& info : infos) info.file_offset = out.size() + info.offset;
  return out;
}

std::vector<gguf_tensor_info> gguf_writer::tensor_infos() const {
  std::vector<gguf_tensor_info> infos;
  header_region(infos);
  return infos;
}

std::vector<std::byte> gguf_writer::write() const {
  std::vector<gguf_tensor_info> infos;
  std::vector<std::byte> out = header_region(infos);
  byte_sink s(out);
  for (const tensor_entry& e : tensors_) {
    s.put_bytes(e.data().data(), e.data().size());
    s.pad(alignment_);
  }
  return out;
}

void gguf_writer::write_file(const std::filesystem::path& path) const {
  const std::string name = path.string();
  auto io_fail = [&name](const char* what) {
    throw gguf_error("gguf writer: " + name + ": cannot " + what + ": " + std::strerror(errno));
  };
  std::unique_ptr<std::FILE, file_closer> f(std::fopen(name.c_str(), "wb"));
  if (!f) io_fail("open for writing");

  std::vector<gguf_tensor_info> infos;
  const std::vector<std::byte> head = header_region(infos);
  if (std::fwrite(head.data(), 1, head.size(), f.get()) != head.size()) io_fail("write");
  static constexpr std::byte zeros[256] = {};
  uint64_t pos = head.size();
  for (const tensor_entry& e : tensors_) {
    const std::span<const std::byte> data = e.data();
    if (!data.empty() && std::fwrite(data.data(), 1, data.size(), f.get()) != data.size()) io_fail("write");
    pos += data.size();
    uint64_t pad = *checked_align_up(pos, alignment_) - pos;
    pos += pad;
    while (pad > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof(zeros)));
      if (std::fwrite(zeros, 1, n, f.get()) != n) io_fail("write");
      pad -= n;
    }
  }
  if (std::fclose(f.release()) != 0) io_fail("close");
}

gguf_writer gguf_writer::from(const gguf_file& f, std::span<const std::byte> file_bytes) {
  if (file_bytes.size() != f.file_size()) {
    throw gguf_error(f.message("writer", "given " + std::to_string(file_bytes.size()) +
                                             " bytes, not the whole file the metadata was parsed from",
                               std::nullopt));
  }
  gguf_writer w;
  for (const gguf_kv& kv : f.metadata()) w.add(kv.key, kv.value);
  for (const gguf_tensor_info& t : f.tensors()) {
    w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), t.n_dims),
                 file_bytes.subspan(static_cast<size_t>(t.file_offset), static_cast<size_t>(t.n_bytes)));
  }
  return w;
}

}  // namespace troupe
