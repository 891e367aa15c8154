// Split GGUF models: the naming convention, opening every split, and checking that they form one model.
#include "loader/gguf_split.h"

#include <cstdio>
#include <system_error>

namespace troupe {

namespace {

constexpr std::string_view split_suffix = ".gguf";
constexpr size_t split_tail = 15;  // "-00001-of-00003"

std::optional<uint32_t> five_digits(std::string_view s) {
  uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  return v;
}

std::string key_subject(std::string_view key) { return "key '" + std::string(key) + "'"; }

// The offset of `key` in f, for messages.
std::optional<uint64_t> key_offset(const gguf_file& f, std::string_view key) {
  const auto i = f.find_index(key);
  return i ? std::optional<uint64_t>(f.kv_offset(*i)) : std::nullopt;
}

// An unsigned split key's value: empty when absent; throws when it is not a non-negative integer.
std::optional<uint64_t> split_key(const gguf_file& f, std::string_view key) {
  if (!f.contains(key)) return std::nullopt;
  return f.get_uint(key).value();
}

// Checks one split's keys against its position. `n` is the number of files.
void check_split_keys(const gguf_file& f, size_t index, size_t n, uint64_t total_tensors) {
  const auto count = split_key(f, gguf_split_count_key);
  const auto no = split_key(f, gguf_split_no_key);
  const auto tensors = split_key(f, gguf_split_tensors_count_key);
  const std::string position = "file " + std::to_string(index + 1) + " of " + std::to_string(n);

  if (n > 1) {
    if (!count) {
      throw gguf_error(f.message(key_subject(gguf_split_count_key),
                                 "not found, but the model is split (" + position + ")", std::nullopt));
    }
    if (!no) {
      throw gguf_error(f.message(key_subject(gguf_split_no_key),
                                 "not found, but the model is split (" + position + ")", std::nullopt));
    }
  }
  if (count && *count != n) {
    throw gguf_error(f.message(key_subject(gguf_split_count_key),
                               "is " + std::to_string(*count) + ", but the model has " + std::to_string(n) +
                                   (n == 1 ? " file" : " files") +
                                   (n == 1 ? " (open the first split by its <prefix>-00001-of-000NN.gguf name)" : ""),
                               key_offset(f, gguf_split_count_key)));
  }
  if (no && *no != index) {
    throw gguf_error(f.message(key_subject(gguf_split_no_key),
                               "is " + std::to_string(*no) + ", expected " + std::to_string(index) + " for " +
                                   position + " (split.no counts from 0)",
                               key_offset(f, gguf_split_no_key)));
  }
  if (tensors && *tensors != total_tensors) {
    throw gguf_error(f.message(key_subject(gguf_split_tensors_count_key),
                               "is " + std::to_string(*tensors) + ", but the " + std::to_string(n) +
                                   (n == 1 ? " file holds " : " files hold ") + std::to_string(total_tensors) +
                                   " tensors",
                               key_offset(f, gguf_split_tensors_count_key)));
  }
}

}  // namespace

std::string gguf_split_path(std::string_view prefix, uint32_t split_no, uint32_t split_count) {
  char tail[48];
  std::snprintf(tail, sizeof(tail), "-%05u-of-%05u.gguf", split_no + 1, split_count);
  return std::string(prefix) + tail;
}

std::optional<gguf_split_name> parse_gguf_split_path(std::string_view path) {
  if (!path.ends_with(split_suffix)) return std::nullopt;
  const std::string_view stem = path.substr(0, path.size() - split_suffix.size());
  if (stem.size() < split_tail) return std::nullopt;
  const std::string_view tail = stem.substr(stem.size() - split_tail);
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-") return std::nullopt;
  const auto no = five_digits(tail.substr(1, 5));
  const auto count = five_digits(tail.substr(10, 5));
  if (!no || !count || *no < 1 || *count < 1 || *no > *count) return std::nullopt;
  return gguf_split_name{std::string(stem.substr(0, stem.size() - split_tail)), *no - 1, *count};
}

const gguf_tensor_info* gguf_split_files::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const gguf_tensor_info& gguf_split_files::tensor(std::string_view name) const {
  if (const gguf_tensor_info* t = find_tensor(name)) return *t;
  throw gguf_error(metadata().message("tensor '" + gguf_printable(name) + "'",
                                      "not found in any of the " + std::to_string(files_.size()) + " split files",
                                      std::nullopt));
}

gguf_split_files combine_gguf_splits(std::vector<gguf_file> files, std::vector<std::filesystem::path> paths) {
  if (files.empty()) throw gguf_error("gguf: a model needs at least one file");
  if (files.size() > 65535) throw gguf_error("gguf: " + std::to_string(files.size()) + " split files, at most 65535");
  paths.resize(files.size());

  uint64_t total = 0;
  for (const gguf_file& f : files) total += f.tensors().size();
  for (size_t i = 0; i < files.size(); ++i) check_split_keys(files[i], i, files.size(), total);

  gguf_split_files m;
  m.tensors_.reserve(static_cast<size_t>(total));
  for (size_t i = 0; i < files.size(); ++i) {
    for (const gguf_tensor_info& t : files[i].tensors()) {
      if (const auto it = m.tensor_index_.find(t.name); it != m.tensor_index_.end()) {
        const gguf_tensor_info& first = m.tensors_[it->second];
        const gguf_file& first_file = files[first.file_index];
        throw gguf_error(files[i].message(
            "tensor '" + gguf_printable(t.name) + "'",
            "duplicate tensor name: also in split " + std::to_string(first.file_index + 1) + " (" +
                (first_file.source().empty() ? std::string("unnamed") : first_file.source()) + ") at offset " +
                std::to_string(first.file_offset),
            t.file_offset));
      }
      gguf_tensor_info joined = t;
      joined.file_index = static_cast<uint32_t>(i);
      m.tensor_index_.emplace(joined.name, m.tensors_.size());
      m.tensors_.push_back(std::move(joined));
    }
  }
  m.files_ = std::move(files);
  m.paths_ = std::move(paths);
  return m;
}

gguf_split_files open_gguf_splits(const std::filesystem::path& first) {
  const auto name = parse_gguf_split_path(first.string());
  if (!name) return combine_gguf_splits({read_gguf(first)}, {first});
  if (name->split_no != 0) {
    throw gguf_error("gguf: " + first.string() + ": is split " + std::to_string(name->split_no + 1) + " of " +
                     std::to_string(name->split_count) + "; open the first split '" +
                     gguf_split_path(name->prefix, 0, name->split_count) + "'");
  }
  std::vector<std::filesystem::path> paths;
  std::vector<gguf_file> files;
  for (uint32_t i = 0; i < name->split_count; ++i) {
    std::filesystem::path p = i == 0 ? first : std::filesystem::path(gguf_split_path(name->prefix, i, name->split_count));
    std::error_code ec;
    if (!std::filesystem::exists(p, ec)) {
      throw gguf_error("gguf: " + p.string() + ": split " + std::to_string(i + 1) + " of " +
                       std::to_string(name->split_count) + " is missing");
    }
    files.push_back(read_gguf(p));
    paths.push_back(std::move(p));
  }
  return combine_gguf_splits(std::move(files), std::move(paths));
}

}  // namespace troupe
