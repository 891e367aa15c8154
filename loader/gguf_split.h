// Split GGUF models: one model in several files named <prefix>-00001-of-00003.gguf ... -00003-of-00003.gguf,
// each carrying split.no (0-based), split.count and split.tensors.count (the model's total tensor count).
//
//   gguf_split_files m = open_gguf_splits("models/big-00001-of-00003.gguf");  // or a single-file model
//   const gguf_file& meta = m.metadata();                    // the first split holds the model's metadata
//   for (const gguf_tensor_info& t : m.tensors()) {
//     const std::filesystem::path& file = m.paths()[t.file_index];  // t.file_offset is within that file
//   }
//
// Every split is validated on its own (loader/gguf.h), then together: the split keys agree with each other
// and with the file names, split.tensors.count matches the tensors found, and no tensor name appears twice.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loader/gguf.h"

namespace troupe {

constexpr std::string_view gguf_split_no_key = "split.no";
constexpr std::string_view gguf_split_count_key = "split.count";
constexpr std::string_view gguf_split_tensors_count_key = "split.tensors.count";

// The parts of a split file's name: "<prefix>-<no + 1, 5 digits>-of-<count, 5 digits>.gguf".
struct gguf_split_name {
  std::string prefix;     // everything before "-00001-of-..." (directory included)
  uint32_t split_no = 0;  // 0-based, as in split.no
  uint32_t split_count = 0;
};

// "<prefix>-00002-of-00003.gguf" for split_no 1 (0-based) of 3.
std::string gguf_split_path(std::string_view prefix, uint32_t split_no, uint32_t split_count);
// The parts of a split file name, or empty when `path` does not follow the convention.
std::optional<gguf_split_name> parse_gguf_split_path(std::string_view path);

// All files of one model, with one tensor list across them.
class gguf_split_files {
 public:
  size_t n_files() const { return files_.size(); }
  const std::vector<gguf_file>& files() const { return files_; }
  const std::vector<std::filesystem::path>& paths() const { return paths_; }  // empty names when in memory
  const gguf_file& metadata() const { return files_.front(); }

  // Every tensor of every split, in split order then file order; file_index says which file holds it.
  const std::vector<gguf_tensor_info>& tensors() const { return tensors_; }
  const gguf_tensor_info* find_tensor(std::string_view name) const;
  // Throws gguf_error naming the tensor when there is none.
  const gguf_tensor_info& tensor(std::string_view name) const;

 private:
  friend gguf_split_files combine_gguf_splits(std::vector<gguf_file> files, std::vector<std::filesystem::path> paths);

  std::vector<gguf_file> files_;
  std::vector<std::filesystem::path> paths_;
  std::vector<gguf_tensor_info> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Opens a model from its first split's path (or a single-file model's path), reading every split's header
// region. Throws gguf_error when a split is missing, unreadable or invalid, or when the splits disagree.
gguf_split_files open_gguf_splits(const std::filesystem::path& first);

// Validates already parsed splits (in split order; paths optional, for messages) and joins their tensors.
// A single file without split keys is a model of one split.
gguf_split_files combine_gguf_splits(std::vector<gguf_file> files, std::vector<std::filesystem::path> paths = {});

}  // namespace troupe
