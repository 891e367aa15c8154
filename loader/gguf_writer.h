// Writing GGUF v3 files: metadata of every type (nested arrays included) and tensors with their data.
//
//   gguf_writer w;
//   w.add("general.architecture", "llama");
//   w.add("llama.block_count", uint32_t{5});
//   w.add("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>"});
//   w.add_tensor("token_embd.weight", type::f32, {64, 512}, std::as_bytes(std::span(embd)));  // [n_embd, n_vocab]
//   w.write_file("model.gguf");                 // or: std::vector<std::byte> bytes = w.write();
//
// Layout (as ggml writes it): header, metadata, tensor infos, zero padding to the alignment, then each
// tensor's data in the order added, each followed by zero padding to the alignment. The alignment is
// general.alignment when that key was added (it must be a uint32 power of two), else 32.
// A file this writer produced parses back to the same metadata and tensors, and writing that parse again
// (gguf_writer::from) reproduces it byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "loader/gguf.h"

namespace troupe {

class gguf_writer {
 public:
  gguf_writer() = default;

  // A writer holding f's metadata and tensors (in f's order), the tensor data taken from the bytes of the
  // whole file (copied). Throws gguf_error when `file_bytes` is not the file f was parsed from.
  static gguf_writer from(const gguf_file& f, std::span<const std::byte> file_bytes);

  // Appends a metadata entry. Throws gguf_error on an empty or duplicate key, arrays nested deeper than
  // gguf_max_array_depth, or a general.alignment that is not a uint32 power of two.
  gguf_writer& add(std::string key, gguf_value value);
  // Replaces an existing entry's value in place, or appends it (same checks as add).
  gguf_writer& set(std::string key, gguf_value value);
  // Sets general.alignment.
  gguf_writer& set_alignment(uint32_t alignment) { return set(std::string(gguf_alignment_key), alignment); }

  // Adds a tensor of the given shape (ne[0] first, 0 to 4 dimensions, each positive, ne[0] a multiple of the
  // type's block size); `data` must be exactly its byte size and is copied. Throws gguf_error otherwise, or
  // on a duplicate or too long name or a type id GGUF does not define.
  gguf_writer& add_tensor(std::string name, type t, std::span<const int64_t> shape, std::span<const std::byte> data);
  gguf_writer& add_tensor(std::string name, type t, std::initializer_list<int64_t> shape,
                          std::span<const std::byte> data) {
    return add_tensor(std::move(name), t, std::span<const int64_t>(shape.begin(), shape.size()), data);
  }
  // The same without copying: `data` must stay valid until the last write.
  gguf_writer& add_tensor_ref(std::string name, type t, std::span<const int64_t> shape,
                              std::span<const std::byte> data);
  gguf_writer& add_tensor_ref(std::string name, type t, std::initializer_list<int64_t> shape,
                              std::span<const std::byte> data) {
    return add_tensor_ref(std::move(name), t, std::span<const int64_t>(shape.begin(), shape.size()), data);
  }

  uint32_t alignment() const { return alignment_; }
  const std::vector<gguf_kv>& metadata() const { return kv_; }
  // Tensor infos as they will be written: offsets relative to the data section and absolute ones.
  std::vector<gguf_tensor_info> tensor_infos() const;

  // The whole file.
  std::vector<std::byte> write() const;
  // Writes the whole file to `path` (replacing it). Throws gguf_error naming the path on an I/O error.
  void write_file(const std::filesystem::path& path) const;

 private:
  struct tensor_entry {
    gguf_tensor_info info;
    std::vector<std::byte> owned;     // add_tensor: a copy of the data
    std::span<const std::byte> ref;   // add_tensor_ref: the caller's data
    bool is_ref = false;
    std::span<const std::byte> data() const { return is_ref ? ref : std::span<const std::byte>(owned); }
  };

  void check_value(const std::string& key, const gguf_value& value) const;
  gguf_tensor_info make_info(std::string name, type t, std::span<const int64_t> shape, size_t data_size) const;
  std::vector<std::byte> header_region(std::vector<gguf_tensor_info>& infos) const;

  uint32_t alignment_ = gguf_default_alignment;
  std::vector<gguf_kv> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<tensor_entry> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace troupe
