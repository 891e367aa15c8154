// Range mapping: the byte ranges of a model file that each context (buffer type) needs.
//
//   auto ranges = map_ranges(tensors, plan);        // per buffer type: ranges per file
//   for (const file_range& r : ranges[&cpu_buft])   // e.g. wrap [r.begin, r.end) of the mmap in one buffer
//
// For each buffer type and each file: the ranges of the type's own weights, in file order, merged where
// consecutive weights of the file belong to it (the bytes between them are only alignment padding), and
// split wherever a weight of another buffer type lies between them. A weight used by several buffer types
// (placement::add_use) lies in a range of each. So a buffer made over a range never covers bytes its
// context does not read, other than the padding between its own weights.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "loader/gguf.h"
#include "loader/placement.h"

namespace troupe {

struct file_range {
  uint32_t file = 0;   // index of the split file
  uint64_t begin = 0;  // absolute byte offsets in that file
  uint64_t end = 0;
  std::vector<const gguf_tensor_info*> tensors;  // in file order
  uint64_t size() const { return end - begin; }
};

std::map<buffer_type_i*, std::vector<file_range>> map_ranges(const std::vector<gguf_tensor_info>& tensors,
                                                             const placement& plan);

}  // namespace troupe
