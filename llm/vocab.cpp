// Loading a vocabulary from GGUF metadata, special tokens, and the text <-> token entry points. The two
// tokenizers themselves live in tokenizer_spm.cpp and tokenizer_bpe.cpp.
#include "llm/vocab.h"

#include <algorithm>
#include <string>
#include <utility>

#include "loader/gguf.h"
#include "llm/detail/vocab_impl.h"
#include "llm/unicode.h"
#include "runtime/log.h"

namespace troupe::llm {
namespace {

constexpr std::string_view space_marker = "\xE2\x96\x81";  // U+2581 '▁', SentencePiece's space

// Tokens that end a turn in the chat formats troupe knows, found by their text.
constexpr std::string_view eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "<end_of_utterance>",
};

std::string where(const gguf_file& f) { return f.source().empty() ? std::string() : f.source() + ": "; }

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// The byte of an SPM byte token's text "<0xAB>", or -1.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]), lo = hex(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// The token's piece with special = true (what token_to_piece caches).
std::string make_piece(const vocab::impl& v, const token_data& t) {
  switch (t.type) {
    case token_type::control:
    case token_type::unknown:
    case token_type::user_defined:
      return t.text;
    case token_type::byte: {
      const int b = parse_byte_token(t.text);
      return b < 0 ? t.text : std::string(1, static_cast<char>(b));
    }
    case token_type::normal:
      break;
    case token_type::unused:
    case token_type::undefined:
      return {};
  }
  if (v.type == vocab_type::spm) {
    std::string s = t.text;
    replace_all(s, space_marker, " ");
    return s;
  }
  // Byte-level BPE: each code point stands for one byte; anything else is kept as it is.
  std::string s;
  s.reserve(t.text.size());
  for (size_t off = 0; off < t.text.size();) {
    const utf8_unit u = utf8_decode(t.text, off);
    const int b = gpt2_byte_from_code_point(u.cp);
    if (b >= 0) {
      s.push_back(static_cast<char>(b));
    } else {
      s.append(t.text, off, u.len);
    }
    off += u.len;
  }
  return s;
}

// Reads an optional special token id; ids out of range (the conventional 0xFFFFFFFF included) mean none.
void read_special_id(const gguf_file& f, std::string_view key, size_t n_tokens, token_id& id) {
  if (!f.contains(key)) return;
  const uint64_t v = f.get_uint(key).value();
  if (v < n_tokens) {
    id = static_cast<token_id>(v);
  } else {
    if (v != 0xFFFFFFFFull) TROUPE_LOG(warn, "vocab: " << where(f) << key << " = " << v << " is out of range; ignored");
    id = token_null;
  }
}

void read_flag(const gguf_file& f, std::string_view key, bool& flag) {
  if (f.contains(key)) flag = f.get<bool>(key).value();
}

}  // namespace

vocab::vocab(const gguf_file& f) : impl_(std::make_unique<impl>()) {
  impl& v = *impl_;
  v.model = f.get<std::string>("tokenizer.ggml.model").value();
  if (v.model == "llama") {
    v.type = vocab_type::spm;
  } else if (v.model == "gpt2") {
    v.type = vocab_type::bpe;
  } else {
    throw vocab_error("vocab: " + where(f) + "tokenizer.ggml.model '" + gguf_printable(v.model) +
                      "' is not supported (troupe supports 'llama' (SentencePiece) and 'gpt2' (byte-level BPE))");
  }
  v.pre_name = f.get<std::string>("tokenizer.ggml.pre").value_or("");

  // ---- tokens, scores, types ----
  const std::vector<std::string>& texts = f.get<std::vector<std::string>>("tokenizer.ggml.tokens").value();
  const size_t n = texts.size();
  if (n == 0) throw vocab_error("vocab: " + where(f) + "tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) throw vocab_error("vocab: " + where(f) + "too many tokens");
  const std::vector<float>* scores = nullptr;
  if (f.contains("tokenizer.ggml.scores")) scores = &f.get<std::vector<float>>("tokenizer.ggml.scores").value();
  const std::vector<int32_t>* types = nullptr;
  if (f.contains("tokenizer.ggml.token_type")) {
    types = &f.get<std::vector<int32_t>>("tokenizer.ggml.token_type").value();
  }
  const auto check_len = [&](std::string_view key, size_t len) {
    if (len != n) {
      throw vocab_error("vocab: " + where(f) + std::string(key) + " has " + std::to_string(len) +
                        " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }
  };
  if (scores) check_len("tokenizer.ggml.scores", scores->size());
  if (types) check_len("tokenizer.ggml.token_type", types->size());

  v.tokens.resize(n);
  v.by_text.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    token_data& t = v.tokens[i];
    t.text = texts[i];
    if (t.text.empty()) {
      TROUPE_LOG(warn, "vocab: " << where(f) << "token " << i << " is empty");
      t.text = "[EMPTY_" + std::to_string(i) + "]";
    }
    t.score = scores ? (*scores)[i] : 0.0f;
    const int32_t ty = types ? (*types)[i] : 1;
    t.type = (ty >= 0 && ty <= 6) ? static_cast<token_type>(ty) : token_type::undefined;
    const auto [it, inserted] = v.by_text.emplace(t.text, static_cast<token_id>(i));
    if (!inserted) {
      throw vocab_error("vocab: " + where(f) + "duplicate token '" + gguf_printable(t.text) + "' (ids " +
                        std::to_string(it->second) + " and " + std::to_string(i) + ")");
    }
  }

  // ---- family defaults, then the file's settings ----
  if (v.type == vocab_type::spm) {
    v.bos = n > 1 ? 1 : token_null;
    v.eos = n > 2 ? 2 : token_null;
    v.unk = 0;
    v.add_bos = true;
    v.add_space_prefix = true;
    read_flag(f, "tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  } else {
    if (v.pre_name.empty()) {
      TROUPE_LOG(warn, "vocab: " << where(f) << "tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer "
                                 "(tokenization may differ from the model's own)");
      v.pre = pre_tokenizer_type::default_bpe;
    } else if (const auto pre = pre_tokenizer_from_name(v.pre_name)) {
      v.pre = *pre;
    } else {
      throw vocab_error("vocab: " + where(f) + "pre-tokenizer tokenizer.ggml.pre '" + gguf_printable(v.pre_name) +
                        "' is not supported (troupe supports gpt2, llama3/llama-bpe, qwen2, smollm, default)");
    }
    v.ignore_merges = v.pre == pre_tokenizer_type::llama3;
    v.add_bos = v.pre == pre_tokenizer_type::llama3;
    const std::vector<std::string>& merges = f.get<std::vector<std::string>>("tokenizer.ggml.merges").value();
    v.merge_ranks.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string& m = merges[i];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= m.size()) {
        TROUPE_LOG(warn, "vocab: " << where(f) << "merge " << i << " '" << gguf_printable(m)
                                   << "' has no pair; ignored");
        continue;
      }
      v.merge_ranks.emplace(m, static_cast<int32_t>(i));  // first occurrence wins
    }
  }
  read_special_id(f, "tokenizer.ggml.bos_token_id", n, v.bos);
  read_special_id(f, "tokenizer.ggml.eos_token_id", n, v.eos);
  read_special_id(f, "tokenizer.ggml.eot_token_id", n, v.eot);
  read_special_id(f, "tokenizer.ggml.eom_token_id", n, v.eom);
  read_special_id(f, "tokenizer.ggml.unknown_token_id", n, v.unk);
  read_special_id(f, "tokenizer.ggml.padding_token_id", n, v.pad);
  read_flag(f, "tokenizer.ggml.add_bos_token", v.add_bos);
  read_flag(f, "tokenizer.ggml.add_eos_token", v.add_eos);
  if (v.add_bos && v.bos == token_null) {
    throw vocab_error("vocab: " + where(f) + "tokenizer.ggml.add_bos_token is true but there is no BOS token");
  }
  if (v.add_eos && v.eos == token_null) {
    throw vocab_error("vocab: " + where(f) + "tokenizer.ggml.add_eos_token is true but there is no EOS token");
  }

  // ---- byte tokens ----
  v.byte_tokens.fill(token_null);
  for (int b = 0; b < 256; ++b) {
    token_id id = token_null;
    if (v.type == vocab_type::spm) {
      static constexpr char hex[] = "0123456789ABCDEF";
      const char name[] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', '\0'};
      id = v.find(name);
      if (id == token_null) id = v.find(std::string(1, static_cast<char>(b)));
    } else {
      id = v.find(gpt2_byte_to_utf8(static_cast<uint8_t>(b)));
    }
    v.byte_tokens[b] = id;
  }

  // ---- end of generation ----
  for (const std::string_view text : eog_texts) {
    const token_id id = v.find(text);
    if (id == token_null) continue;
    if (v.eot == token_null && text != "<|eom_id|>") v.eot = id;
    if (v.eom == token_null && text == "<|eom_id|>") v.eom = id;
    token_data& t = v.tokens[id];
    if (t.type != token_type::control) {
      TROUPE_LOG(debug, "vocab: token " << id << " '" << t.text << "' ends a turn but is not a control token; "
                                        << "treating it as one");
      t.type = token_type::control;
    }
    v.eog.push_back(id);
  }
  for (const token_id id : {v.eos, v.eot, v.eom}) {
    if (id != token_null) v.eog.push_back(id);
  }
  std::sort(v.eog.begin(), v.eog.end());
  v.eog.erase(std::unique(v.eog.begin(), v.eog.end()), v.eog.end());

  // ---- special tokens matched in text, longest first ----
  for (size_t i = 0; i < n; ++i) {
    const token_type t = v.tokens[i].type;
    if (t == token_type::control || t == token_type::user_defined || t == token_type::unknown) {
      v.special_tokens.push_back(static_cast<token_id>(i));
    }
  }
  std::stable_sort(v.special_tokens.begin(), v.special_tokens.end(), [&](token_id a, token_id b) {
    return v.tokens[a].text.size() > v.tokens[b].text.size();
  });

  v.pieces.resize(n);
  for (size_t i = 0; i < n; ++i) v.pieces[i] = make_piece(v, v.tokens[i]);

  if (v.type == vocab_type::spm) {
    v.nl = v.byte_tokens['\n'];
  } else {
    std::vector<token_id> ids;
    detail::tokenize_bpe(v, "\n", ids);
    v.nl = ids.empty() ? token_null : ids.front();
  }
}

vocab::~vocab() = default;
vocab::vocab(vocab&&) noexcept = default;
vocab& vocab::operator=(vocab&&) noexcept = default;

vocab_type vocab::type() const { return impl_->type; }
const std::string& vocab::model_name() const { return impl_->model; }
const std::string& vocab::pre_name() const { return impl_->pre_name; }
pre_tokenizer_type vocab::pre() const { return impl_->pre; }
int32_t vocab::n_tokens() const { return static_cast<int32_t>(impl_->tokens.size()); }

const token_data& vocab::data(token_id id) const {
  if (id < 0 || id >= n_tokens()) {
    throw vocab_error("vocab: token id " + std::to_string(id) + " is out of range [0, " +
                      std::to_string(n_tokens()) + ")");
  }
  return impl_->tokens[id];
}

bool vocab::is_eog(token_id id) const { return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id); }
const std::vector<token_id>& vocab::eog_tokens() const { return impl_->eog; }

token_id vocab::bos() const { return impl_->bos; }
token_id vocab::eos() const { return impl_->eos; }
token_id vocab::eot() const { return impl_->eot; }
token_id vocab::unk() const { return impl_->unk; }
token_id vocab::pad() const { return impl_->pad; }
token_id vocab::nl() const { return impl_->nl; }
bool vocab::add_bos() const { return impl_->add_bos; }
bool vocab::add_eos() const { return impl_->add_eos; }
bool vocab::add_space_prefix() const { return impl_->add_space_prefix; }

std::optional<token_id> vocab::find(std::string_view text) const {
  const token_id id = impl_->find(text);
  return id == token_null ? std::nullopt : std::optional<token_id>(id);
}

std::optional<token_id> vocab::byte_to_token(uint8_t byte) const {
  const token_id id = impl_->byte_tokens[byte];
  return id == token_null ? std::nullopt : std::optional<token_id>(id);
}

int32_t vocab::merge_rank(std::string_view left, std::string_view right) const {
  std::string key;
  return impl_->merge_rank_of(left, right, key);
}

std::vector<token_id> vocab::tokenize(std::string_view text, bool add_special, bool parse_special) const {
  const impl& v = *impl_;

  // Split out special tokens: fragments are either a special token or a range of raw text.
  struct fragment {
    token_id special;  // token_null for text
    size_t offset, length;
  };
  std::vector<fragment> fragments;
  if (!text.empty()) fragments.push_back({token_null, 0, text.size()});
  std::vector<fragment> next;
  for (const token_id id : v.special_tokens) {
    const token_data& t = v.tokens[id];
    if (!parse_special && t.type != token_type::user_defined) continue;
    next.clear();
    for (const fragment& fr : fragments) {
      if (fr.special != token_null) {
        next.push_back(fr);
        continue;
      }
      const std::string_view window = text.substr(0, fr.offset + fr.length);
      size_t pos = fr.offset;
      for (size_t hit; (hit = window.find(t.text, pos)) != std::string_view::npos; pos = hit + t.text.size()) {
        if (hit > pos) next.push_back({token_null, pos, hit - pos});
        next.push_back({id, hit, t.text.size()});
      }
      if (pos < fr.offset + fr.length) next.push_back({token_null, pos, fr.offset + fr.length - pos});
    }
    fragments.swap(next);
  }

  std::vector<token_id> out;
  out.reserve(text.size() / 2 + 2);
  if (add_special && v.add_bos) out.push_back(v.bos);
  if (v.type == vocab_type::spm) {
    bool prev_special = true;  // the text at the start, and after a special token, gets the space prefix
    std::string escaped;
    for (const fragment& fr : fragments) {
      if (fr.special != token_null) {
        out.push_back(fr.special);
        prev_special = true;
        continue;
      }
      escaped.clear();
      if (v.add_space_prefix && prev_special) escaped += ' ';
      escaped += text.substr(fr.offset, fr.length);
      replace_all(escaped, " ", space_marker);
      detail::tokenize_spm(v, escaped, out);
      prev_special = false;
    }
  } else {
    for (const fragment& fr : fragments) {
      if (fr.special != token_null) {
        out.push_back(fr.special);
      } else {
        detail::tokenize_bpe(v, text.substr(fr.offset, fr.length), out);
      }
    }
  }
  if (add_special && v.add_bos && out.size() >= 2 && out[1] == v.bos) {
    TROUPE_LOG(warn, "vocab: the text starts with a BOS token and another was added; the prompt now starts with two");
  }
  if (add_special && v.add_eos) out.push_back(v.eos);
  return out;
}

std::string vocab::token_to_piece(token_id id, bool special) const {
  const token_data& t = data(id);
  if (!special && (t.type == token_type::control || t.type == token_type::unknown)) return {};
  return impl_->pieces[id];
}

const vocab::piece_index& vocab::sorted_pieces() const {
  impl& v = *impl_;
  std::call_once(v.sorted_once, [&v] {
    piece_index& p = v.sorted;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      const token_type t = v.tokens[i].type;
      if (t == token_type::control || t == token_type::unknown || v.pieces[i].empty()) continue;
      p.order.push_back(static_cast<token_id>(i));
    }
    std::sort(p.order.begin(), p.order.end(), [&v](token_id a, token_id b) {
      const std::string& x = v.pieces[static_cast<size_t>(a)];
      const std::string& y = v.pieces[static_cast<size_t>(b)];
      return x != y ? x < y : a < b;
    });
    size_t total = 0;
    for (const token_id id : p.order) total += v.pieces[static_cast<size_t>(id)].size();
    p.bytes.reserve(total);
    for (const token_id id : p.order) p.bytes += v.pieces[static_cast<size_t>(id)];
    p.text.reserve(p.order.size());
    p.lcp.assign(p.order.size(), 0);
    size_t at = 0;
    for (size_t i = 0; i < p.order.size(); ++i) {
      const size_t len = v.pieces[static_cast<size_t>(p.order[i])].size();
      p.text.emplace_back(p.bytes.data() + at, len);
      at += len;
      if (i == 0) continue;
      const std::string_view a = p.text[i - 1], b = p.text[i];
      uint32_t k = 0;
      while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
      p.lcp[i] = k;
    }
  });
  return v.sorted;
}

std::string vocab::detokenize(std::span<const token_id> tokens, const detokenize_options& options) const {
  std::string out;
  bool strip = options.strip_leading_space && impl_->type == vocab_type::spm && impl_->add_space_prefix;
  for (const token_id id : tokens) {
    std::string piece = token_to_piece(id, options.special);
    if (strip && !piece.empty()) {
      const token_type t = type_of(id);
      if (piece.front() == ' ' && (t == token_type::normal || t == token_type::byte)) piece.erase(0, 1);
      strip = false;
    }
    out += piece;
  }
  return out;
}

}  // namespace troupe::llm
