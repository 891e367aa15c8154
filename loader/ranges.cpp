#include "loader/ranges.h"

#include <algorithm>

namespace troupe {

std::map<buffer_type_i*, std::vector<file_range>> map_ranges(const std::vector<gguf_tensor_info>& tensors,
                                                             const placement& plan) {
  // Every tensor in (file, offset) order.
  std::vector<const gguf_tensor_info*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const gguf_tensor_info* a, const gguf_tensor_info* b) {
    return a->file_index != b->file_index ? a->file_index < b->file_index : a->file_offset < b->file_offset;
  });

  std::map<buffer_type_i*, std::vector<file_range>> out;
  for (buffer_type_i* buft : plan.buffer_types()) {
    auto& ranges = out[buft];
    bool open = false;  // the previous tensor in file order extended a range of buft
    for (const gguf_tensor_info* t : order) {
      const auto& uses = plan.uses(t->name);
      const bool mine = std::find(uses.begin(), uses.end(), buft) != uses.end();
      if (!mine) {
        open = false;  // another context's weight: the next range of buft starts after it
        continue;
      }
      if (t->n_bytes == 0) continue;
      if (open && ranges.back().file == t->file_index) {
        ranges.back().end = t->file_offset + t->n_bytes;
        ranges.back().tensors.push_back(t);
      } else {
        ranges.push_back(file_range{t->file_index, t->file_offset, t->file_offset + t->n_bytes, {t}});
      }
      open = true;
    }
  }
  return out;
}

}  // namespace troupe
