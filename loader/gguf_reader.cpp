// The GGUF parser: reads the header, metadata and tensor infos from a byte source (memory, or a file through
// buffered pread) and validates every field against the file's size before using it. Nothing here reads
// tensor data; allocations are bounded by the bytes the file actually has.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "loader/detail/bytes.h"
#include "loader/gguf.h"

namespace troupe {

namespace {

using detail::checked_add;
using detail::checked_align_up;
using detail::checked_mul;
using detail::load_le;

constexpr uint64_t min_kv_bytes = 8 + 1 + 4 + 1;  // key length, a 1-byte key, value type, a 1-byte value
constexpr uint64_t min_tensor_info_bytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

// Space reserved up front for a count read from the file. Counts are checked against the bytes left, but an
// element in memory can be several times its minimum size in the file (and nested arrays each check against
// the same bytes), so reserving more than this could claim many times the file's size before the elements
// are read; beyond it, vectors grow as elements actually arrive.
size_t reserve_for(uint64_t count) { return static_cast<size_t>(std::min<uint64_t>(count, 65536)); }

// Where the parser's bytes come from. read() is only called for ranges inside [0, size).
class byte_source {
 public:
  virtual ~byte_source() = default;
  virtual void read(uint64_t offset, void* dst, size_t n) = 0;
  virtual uint64_t bytes_read() const = 0;
};

class memory_source final : public byte_source {
 public:
  explicit memory_source(std::span<const std::byte> bytes) : bytes_(bytes) {}
  void read(uint64_t offset, void* dst, size_t n) override {
    if (n == 0) return;
    std::memcpy(dst, bytes_.data() + offset, n);
    high_ = std::max<uint64_t>(high_, offset + n);
  }
  uint64_t bytes_read() const override { return high_; }

 private:
  std::span<const std::byte> bytes_;
  uint64_t high_ = 0;
};

// An open file descriptor, closed on destruction.
class file_handle {
 public:
  explicit file_handle(int fd) : fd_(fd) {}
  ~file_handle() {
    if (fd_ >= 0) ::close(fd_);
  }
  file_handle(const file_handle&) = delete;
  file_handle& operator=(const file_handle&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads a file through a small window with pread: sequential parsing costs one syscall per window, and
// large strings or arrays are read straight into their destination.
class file_source final : public byte_source {
 public:
  static constexpr size_t window = 64 * 1024;

  file_source(int fd, std::string path) : fd_(fd), path_(std::move(path)), buf_(window) {}

  void read(uint64_t offset, void* dst, size_t n) override {
    auto* out = static_cast<std::byte*>(dst);
    while (n > 0) {
      if (offset >= buf_start_ && offset < buf_start_ + buf_len_) {
        const size_t at = static_cast<size_t>(offset - buf_start_);
        const size_t take = std::min(n, buf_len_ - at);
        std::memcpy(out, buf_.data() + at, take);
        out += take;
        offset += take;
        n -= take;
      } else if (n >= window) {
        pread_all(offset, out, n);
        return;
      } else {
        buf_len_ = 0;
        pread_all(offset, buf_.data(), window, /*allow_short=*/true);
        buf_start_ = offset;
      }
    }
  }
  uint64_t bytes_read() const override { return bytes_read_; }

 private:
  // Reads n bytes at offset; with allow_short, stops at the end of the file (into buf_len_).
  void pread_all(uint64_t offset, std::byte* dst, size_t n, bool allow_short = false) {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        throw gguf_error("gguf: " + path_ + ": cannot read " + std::to_string(n) + " bytes at offset " +
                         std::to_string(offset) + ": " + std::strerror(errno));
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    bytes_read_ += done;
    if (allow_short) {
      buf_len_ = done;
      if (done > 0) return;
    }
    if (done < n) {
      throw gguf_error("gguf: " + path_ + ": file ended at offset " + std::to_string(offset + done) +
                       " while reading " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                       " (was it truncated while being read?)");
    }
  }

  int fd_;
  std::string path_;
  std::vector<std::byte> buf_;
  uint64_t buf_start_ = 0;
  size_t buf_len_ = 0;
  uint64_t bytes_read_ = 0;
};

std::string key_subject(std::string_view key) { return "key '" + gguf_printable(key) + "'"; }
std::string tensor_subject(std::string_view name) { return "tensor '" + gguf_printable(name) + "'"; }

std::string shape_string(const gguf_tensor_info& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

std::string range_string(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

}  // namespace

// Builds a gguf_file from a byte source. One parser per file; parse() once.
class gguf_parser {
 public:
  gguf_parser(byte_source& src, uint64_t size, std::string source) : src_(src) {
    f_.file_size_ = size;
    f_.source_ = std::move(source);
  }

  gguf_file parse() {
    read_header();
    for (uint64_t i = 0; i < n_kv_; ++i) read_kv(i);
    read_alignment();
    for (uint64_t i = 0; i < n_tensors_; ++i) read_tensor_info(i);
    place_tensors();
    f_.bytes_read_ = src_.bytes_read();
    return std::move(f_);
  }

 private:
  [[noreturn]] void fail(std::string_view subject, std::string_view problem, uint64_t offset) const {
    throw gguf_error(f_.message(subject, problem, offset));
  }

  uint64_t size() const { return f_.file_size_; }
  uint64_t remaining() const { return size() - pos_; }

  // Fails unless n more bytes exist; `what` names the field being read.
  void need(uint64_t n, std::string_view subject, std::string_view what) const {
    if (n > remaining()) {
      fail(subject,
           "unexpected end of file reading " + std::string(what) + " (needs " + std::to_string(n) +
               " bytes, " + std::to_string(remaining()) + " left)",
           pos_);
    }
  }

  void read_raw(void* dst, uint64_t n, std::string_view subject, std::string_view what) {
    need(n, subject, what);
    src_.read(pos_, dst, static_cast<size_t>(n));
    pos_ += n;
  }

  template <class T>
  T read(std::string_view subject, std::string_view what) {
    unsigned char b[sizeof(T)];
    read_raw(b, sizeof(T), subject, what);
    return load_le<T>(b);
  }

  // A length-prefixed string; `what` and `index` (when >= 0) say which one in messages.
  std::string read_string(std::string_view subject, std::string_view what, int64_t index = -1) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>(subject, what);
    if (len > remaining()) {
      std::string w(what);
      if (index >= 0) w += " " + std::to_string(index);
      fail(subject,
           w + ": string of " + std::to_string(len) + " bytes runs past the end of the file (" +
               std::to_string(remaining()) + " bytes left)",
           at);
    }
    std::string s(static_cast<size_t>(len), '\0');
    read_raw(s.data(), len, subject, what);
    return s;
  }

  void read_header() {
    const std::string_view subject = "header";
    char magic[4];
    read_raw(magic, 4, subject, "the magic");
    if (std::memcmp(magic, gguf_magic, 4) != 0) {
      fail(subject, "bad magic '" + gguf_printable(std::string_view(magic, 4)) + "', expected 'GGUF'", 0);
    }
    const uint64_t version_at = pos_;
    const auto version = read<uint32_t>(subject, "the version");
    if (version != 2 && version != 3) {
      std::string why = "unsupported version " + std::to_string(version) + " (troupe reads GGUF v2 and v3)";
      if (version == 1) why = "GGUF v1 is not supported (troupe reads GGUF v2 and v3)";
      if (version != 0 && (version & 0xffffu) == 0) {
        why += "; the version looks byte-swapped: a big-endian file? troupe reads little-endian files";
      }
      fail(subject, why, version_at);
    }
    f_.version_ = version;

    const uint64_t n_tensors_at = pos_;
    n_tensors_ = read<uint64_t>(subject, "the tensor count");
    const uint64_t n_kv_at = pos_;
    n_kv_ = read<uint64_t>(subject, "the metadata count");

    // Each entry takes at least a fixed number of bytes: counts that cannot fit are refused before anything
    // is allocated for them.
    const uint64_t left = remaining();
    if (n_tensors_ > left / min_tensor_info_bytes) {
      fail(subject,
           "tensor count " + std::to_string(n_tensors_) + " cannot fit in the " + std::to_string(left) +
               " bytes after the header (a tensor info takes at least " + std::to_string(min_tensor_info_bytes) +
               " bytes)",
           n_tensors_at);
    }
    const uint64_t left_for_kv = left - n_tensors_ * min_tensor_info_bytes;
    if (n_kv_ > left_for_kv / min_kv_bytes) {
      fail(subject,
           "metadata count " + std::to_string(n_kv_) + " cannot fit in the " + std::to_string(left_for_kv) +
               " bytes left for metadata after the header (" + std::to_string(n_tensors_) +
               " tensor infos take at least " + std::to_string(n_tensors_ * min_tensor_info_bytes) +
               "; an entry at least " + std::to_string(min_kv_bytes) + ")",
           n_kv_at);
    }
    f_.kv_.reserve(reserve_for(n_kv_));
    f_.kv_offsets_.reserve(reserve_for(n_kv_));
    f_.tensors_.reserve(reserve_for(n_tensors_));
    info_offsets_.reserve(reserve_for(n_tensors_));
  }

  void read_kv(uint64_t index) {
    const uint64_t at = pos_;
    const std::string numbered = "key #" + std::to_string(index);
    std::string key = read_string(numbered, "the key");
    if (key.empty()) fail(numbered, "empty key", at);
    const std::string subject = key_subject(key);
    if (const auto first = f_.find_index(key)) {
      fail(subject, "duplicate key (first at offset " + std::to_string(f_.kv_offsets_[*first]) + ")", at);
    }
    const uint64_t type_at = pos_;
    const auto type_id = read<uint32_t>(subject, "the value type");
    gguf_value value = read_value(type_id, type_at, subject, 0);
    f_.kv_index_.emplace(key, f_.kv_.size());
    f_.kv_.push_back({std::move(key), std::move(value)});
    f_.kv_offsets_.push_back(at);
  }

  // A value of the type with id `type_id` (read at type_at); depth = arrays enclosing it.
  gguf_value read_value(uint32_t type_id, uint64_t type_at, const std::string& subject, int depth) {
    if (type_id >= gguf_type_count) fail(subject, "unknown value type " + std::to_string(type_id), type_at);
    switch (static_cast<gguf_type>(type_id)) {
      case gguf_type::uint8: return read<uint8_t>(subject, "a uint8 value");
      case gguf_type::int8: return read<int8_t>(subject, "an int8 value");
      case gguf_type::uint16: return read<uint16_t>(subject, "a uint16 value");
      case gguf_type::int16: return read<int16_t>(subject, "an int16 value");
      case gguf_type::uint32: return read<uint32_t>(subject, "a uint32 value");
      case gguf_type::int32: return read<int32_t>(subject, "an int32 value");
      case gguf_type::float32: return read<float>(subject, "a float32 value");
      case gguf_type::boolean: return read_bool(subject, -1);
      case gguf_type::string: return read_string(subject, "the value");
      case gguf_type::array: return read_array(subject, depth + 1);
      case gguf_type::uint64: return read<uint64_t>(subject, "a uint64 value");
      case gguf_type::int64: return read<int64_t>(subject, "an int64 value");
      case gguf_type::float64: return read<double>(subject, "a float64 value");
    }
    fail(subject, "unknown value type " + std::to_string(type_id), type_at);  // not reached
  }

  bool read_bool(const std::string& subject, int64_t index) {
    const uint64_t at = pos_;
    const auto b = read<uint8_t>(subject, "a bool value");
    if (b > 1) {
      std::string what = index >= 0 ? "element " + std::to_string(index) + ": " : "";
      fail(subject, what + "bool value " + std::to_string(b) + " is neither 0 nor 1", at);
    }
    return b == 1;
  }

  template <class T>
  void read_scalars(std::vector<T>& out, uint64_t count, const std::string& subject) {
    out.resize(static_cast<size_t>(count));
    read_raw(out.data(), count * sizeof(T), subject, "the array elements");
    if constexpr (std::endian::native == std::endian::big) {
      for (T& v : out) v = detail::byte_swapped(v);
    }
  }

  // An array (its element type, count and elements); depth counts this array.
  gguf_array read_array(const std::string& subject, int depth) {
    const uint64_t at = pos_;
    if (depth > gguf_max_array_depth) {
      fail(subject, "arrays nested deeper than " + std::to_string(gguf_max_array_depth) + " levels", at);
    }
    const auto elem_id = read<uint32_t>(subject, "the array element type");
    const uint64_t count_at = pos_;
    const auto count = read<uint64_t>(subject, "the array length");
    if (elem_id >= gguf_type_count) fail(subject, "unknown array element type " + std::to_string(elem_id), at);
    const auto elem = static_cast<gguf_type>(elem_id);
    const uint64_t min_elem = elem == gguf_type::string ? 8 : elem == gguf_type::array ? 12 : gguf_type_size(elem);
    if (count > remaining() / min_elem) {
      fail(subject,
           "array of " + std::to_string(count) + " " + std::string(gguf_type_name(elem)) +
               " elements runs past the end of the file (each takes at least " + std::to_string(min_elem) +
               " bytes, " + std::to_string(remaining()) + " bytes left)",
           count_at);
    }
    gguf_array a = gguf_array::empty_of(elem);
    std::visit(
        [&](auto& vec) {
          using E = typename std::decay_t<decltype(vec)>::value_type;
          if constexpr (std::is_same_v<E, bool>) {
            vec.reserve(reserve_for(count));
            for (uint64_t i = 0; i < count; ++i) vec.push_back(read_bool(subject, static_cast<int64_t>(i)));
          } else if constexpr (std::is_same_v<E, std::string>) {
            vec.reserve(reserve_for(count));
            for (uint64_t i = 0; i < count; ++i) {
              vec.push_back(read_string(subject, "element", static_cast<int64_t>(i)));
            }
          } else if constexpr (std::is_same_v<E, gguf_array>) {
            vec.reserve(reserve_for(count));
            for (uint64_t i = 0; i < count; ++i) vec.push_back(read_array(subject, depth + 1));
          } else {
            read_scalars(vec, count, subject);
          }
        },
        a.values());
    return a;
  }

  void read_alignment() {
    const auto i = f_.find_index(gguf_alignment_key);
    if (!i) return;
    const std::string subject = key_subject(gguf_alignment_key);
    const uint64_t at = f_.kv_offsets_[*i];
    const gguf_value& v = f_.kv_[*i].value;
    const uint32_t* a = v.get_if<uint32_t>();
    if (!a) fail(subject, "has type " + gguf_describe_type(v) + ", must be uint32", at);
    if (!detail::is_power_of_two(*a)) {
      fail(subject, "alignment " + std::to_string(*a) + " is not a power of two", at);
    }
    f_.alignment_ = *a;
  }

  void read_tensor_info(uint64_t index) {
    const uint64_t at = pos_;
    gguf_tensor_info t;
    t.name = read_string("tensor #" + std::to_string(index), "the name");
    const std::string subject = tensor_subject(t.name);
    if (t.name.size() >= max_name) {
      fail(subject,
           "name is " + std::to_string(t.name.size()) + " bytes long, at most " + std::to_string(max_name - 1) +
               " are allowed",
           at);
    }
    if (const auto it = f_.tensor_index_.find(t.name); it != f_.tensor_index_.end()) {
      fail(subject, "duplicate tensor name (first at offset " + std::to_string(info_offsets_[it->second]) + ")",
           at);
    }

    const uint64_t dims_at = pos_;
    t.n_dims = read<uint32_t>(subject, "the number of dimensions");
    if (t.n_dims > static_cast<uint32_t>(max_dims)) {
      fail(subject, std::to_string(t.n_dims) + " dimensions, at most " + std::to_string(max_dims) + " are allowed",
           dims_at);
    }
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne_at = pos_;
      t.ne[d] = read<int64_t>(subject, "a dimension");
      if (t.ne[d] <= 0) {
        fail(subject, "dimension " + std::to_string(d) + " is " + std::to_string(t.ne[d]) + ", must be positive",
             ne_at);
      }
    }
    int64_t n_elements = 1;
    for (int64_t ne : t.ne) {
      const auto p = checked_mul<int64_t>(n_elements, ne);
      if (!p) fail(subject, "element count of shape " + shape_string(t) + " overflows 64 bits", dims_at);
      n_elements = *p;
    }

    const uint64_t type_at = pos_;
    const auto type_id = read<uint32_t>(subject, "the type");
    const auto ty = type_from_id(type_id);
    if (!ty) fail(subject, "unknown tensor type id " + std::to_string(type_id), type_at);
    t.type = *ty;
    const type_traits& tr = traits(t.type);
    if (t.ne[0] % tr.block_size != 0) {
      fail(subject,
           "row length " + std::to_string(t.ne[0]) + " is not a multiple of the " + std::string(tr.name) +
               " block size " + std::to_string(tr.block_size),
           dims_at);
    }
    const auto row = checked_mul<uint64_t>(static_cast<uint64_t>(t.ne[0] / tr.block_size), tr.type_size);
    const auto n_rows = static_cast<uint64_t>(t.ne[1] * t.ne[2] * t.ne[3]);  // <= n_elements: no overflow
    const auto bytes = row ? checked_mul<uint64_t>(*row, n_rows) : std::nullopt;
    if (!bytes) {
      fail(subject, "byte size of " + shape_string(t) + " " + std::string(tr.name) + " overflows 64 bits", dims_at);
    }
    t.n_bytes = *bytes;

    const uint64_t offset_at = pos_;
    t.offset = read<uint64_t>(subject, "the data offset");
    if (t.offset % f_.alignment_ != 0) {
      fail(subject,
           "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
               std::to_string(f_.alignment_),
           offset_at);
    }
    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(t));
    info_offsets_.push_back(at);
  }

  // Computes the data section's offset and checks that each tensor's data lies in the file and that no two
  // tensors share bytes.
  void place_tensors() {
    const auto data_offset = checked_align_up(pos_, f_.alignment_);
    if (!data_offset) fail("header", "data section offset overflows 64 bits", pos_);
    f_.data_offset_ = *data_offset;

    for (size_t i = 0; i < f_.tensors_.size(); ++i) {
      gguf_tensor_info& t = f_.tensors_[i];
      const auto begin = checked_add<uint64_t>(f_.data_offset_, t.offset);
      const auto end = begin ? checked_add<uint64_t>(*begin, t.n_bytes) : std::nullopt;
      if (!end) {
        fail(tensor_subject(t.name),
             "data offset " + std::to_string(t.offset) + " + " + std::to_string(t.n_bytes) +
                 " bytes overflows 64 bits",
             info_offsets_[i]);
      }
      t.file_offset = *begin;
      if (*end > size()) {
        fail(tensor_subject(t.name),
             "data of " + std::to_string(t.n_bytes) + " bytes at " + range_string(*begin, *end) +
                 " lies outside the file",
             *begin);
      }
    }

    std::vector<size_t> order(f_.tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [this](size_t a, size_t b) {
      return f_.tensors_[a].file_offset < f_.tensors_[b].file_offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const gguf_tensor_info& prev = f_.tensors_[order[k - 1]];
      const gguf_tensor_info& cur = f_.tensors_[order[k]];
      const uint64_t prev_end = prev.file_offset + prev.n_bytes;
      if (prev_end > cur.file_offset) {
        fail(tensor_subject(cur.name),
             "data " + range_string(cur.file_offset, cur.file_offset + cur.n_bytes) + " overlaps tensor '" +
                 gguf_printable(prev.name) + "' " + range_string(prev.file_offset, prev_end),
             cur.file_offset);
      }
    }
  }

  byte_source& src_;
  uint64_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  std::vector<uint64_t> info_offsets_;  // where each tensor info starts
  gguf_file f_;
};

gguf_file parse_gguf(std::span<const std::byte> bytes, std::string_view source) {
  memory_source src(bytes);
  return gguf_parser(src, bytes.size(), std::string(source)).parse();
}

gguf_file read_gguf(const std::filesystem::path& path) {
  const std::string name = path.string();
  file_handle fd(::open(name.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw gguf_error("gguf: " + name + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw gguf_error("gguf: " + name + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw gguf_error("gguf: " + name + ": not a regular file");
  file_source src(fd.get(), name);
  return gguf_parser(src, static_cast<uint64_t>(st.st_size), name).parse();
}

}  // namespace troupe
