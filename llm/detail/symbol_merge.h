// The merge loop both tokenizers share: a text is split into symbols (characters), and the best adjacent
// pair that the vocabulary knows is merged again and again until none is left. The tokenizers differ only
// in what "best" means (SentencePiece: highest score; BPE: lowest merge rank), which their bigram type and
// queue order carry.
#pragma once

#include <cstddef>
#include <queue>
#include <vector>

namespace troupe::llm::detail {

struct merge_symbol {
  int prev;       // index of the previous live symbol, -1 at the start
  int next;       // index of the next live symbol, -1 at the end
  size_t offset;  // bytes [offset, offset + n) of the text
  size_t n;       // 0 once merged into its left neighbour
};

// Fills `symbols` with the characters of a text of `size` bytes (char_len(offset) bytes each), then
// merges pairs in queue order. try_add(left, right) pushes the bigram of two live neighbours onto `queue`
// when the vocabulary has it (and ignores indices < 0); a bigram has left, right and size (the merged byte
// length, so an entry whose symbols changed since it was pushed is recognised as stale).
template <class Queue, class CharLen, class TryAdd>
void merge_symbols(std::vector<merge_symbol>& symbols, Queue& queue, size_t size, CharLen char_len, TryAdd try_add) {
  for (size_t off = 0; off < size;) {
    const size_t n = char_len(off);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, off + n == size ? -1 : index + 1, off, n});
    off += n;
  }
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const auto b = queue.top();
    queue.pop();
    merge_symbol& left = symbols[static_cast<size_t>(b.left)];
    merge_symbol& right = symbols[static_cast<size_t>(b.right)];
    if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;  // stale
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }
}

}  // namespace troupe::llm::detail
