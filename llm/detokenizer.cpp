#include "llm/detokenizer.h"

#include <algorithm>
#include <utility>

#include "llm/unicode.h"

namespace troupe::llm {

detokenizer::detokenizer(const vocab& v, detokenize_options options)
    : vocab_(&v), options_(options), at_start_(options.strip_leading_space) {}

std::string detokenizer::push(token_id id) {
  const bool as_text = !as_text_.empty() && std::find(as_text_.begin(), as_text_.end(), id) != as_text_.end();
  std::string piece = vocab_->token_to_piece(id, options_.special || as_text);
  if (at_start_ && !piece.empty()) {
    // The first text out: drop the space the tokenizer prefixed (as vocab::detokenize does).
    const token_type t = vocab_->type_of(id);
    if (vocab_->type() == vocab_type::spm && vocab_->add_space_prefix() && piece.front() == ' ' &&
        (t == token_type::normal || t == token_type::byte)) {
      piece.erase(0, 1);
    }
    at_start_ = false;
  }
  held_ += piece;
  const size_t keep = utf8_incomplete_tail(held_);
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string detokenizer::flush() { return std::exchange(held_, std::string()); }

void detokenizer::reset() {
  held_.clear();
  at_start_ = options_.strip_leading_space;
}

}  // namespace troupe::llm
