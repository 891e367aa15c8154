// Streaming detokenization: turns generated tokens into text as they come, holding back the bytes of a
// UTF-8 character until its last byte has arrived (a character can be split across byte tokens, or across
// byte-level BPE tokens).
//
//   llm::detokenizer d(vocab);
//   for (llm::token_id t : generated) std::cout << d.push(t);   // only whole characters
//   std::cout << d.flush();                                       // whatever is still held back
//
// Text that can never become valid UTF-8 (a stray continuation byte, a truncated sequence followed by
// something else) is passed through as it is, never dropped or replaced.
#pragma once

#include <string>
#include <vector>

#include "llm/vocab.h"

namespace troupe::llm {

class detokenizer {
 public:
  // options.strip_leading_space: drop the space prefixed at tokenization from the first piece of text
  // (after BOS); use it when streaming a sequence from its start, not when streaming only the
  // continuation of a prompt. The vocab must outlive the detokenizer.
  explicit detokenizer(const vocab& v, detokenize_options options = {});

  // Adds a token; returns the text that is complete now (may be empty). Throws vocab_error for a bad id.
  std::string push(token_id id);
  // Returns the bytes held back (an incomplete character at the end) and empties the buffer.
  std::string flush();
  // Forgets held-back bytes and starts again as at construction (leading space handling included).
  void reset();
  // Bytes held back.
  size_t pending() const { return held_.size(); }
  // Control tokens given their text (a chat's markers) while the others print as options.special says.
  void render_as_text(std::vector<token_id> ids) { as_text_ = std::move(ids); }

 private:
  const vocab* vocab_;
  detokenize_options options_;
  bool at_start_;
  std::string held_;
  std::vector<token_id> as_text_;
};

}  // namespace troupe::llm
