#include "llm/reasoning.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

namespace troupe::llm {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

bool is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool has(std::string_view src, std::string_view what) { return src.find(what) != std::string_view::npos; }

reasoning_markers markers(std::string start, std::string end, std::initializer_list<const char*> strip = {}) {
  reasoning_markers m{std::move(start), std::move(end), {}};
  for (const char* s : strip) m.strip.emplace_back(s);
  return m;
}

// The position of the first m.end in `text`; npos without one (or with no end marker).
size_t find_end(const reasoning_markers& m, std::string_view text) {
  return m.end.empty() ? std::string_view::npos : text.find(m.end);
}

// At the start of `rest`: the length of the longest string of `strip` that `rest` starts with (0: none), and
// whether `rest` is a proper prefix of a longer one (it may still become one).
std::pair<size_t, bool> strip_at(const std::vector<std::string>& strip, std::string_view rest) {
  size_t full = 0;
  bool partial = false;
  for (const std::string& s : strip) {
    if (s.empty()) continue;
    if (rest.starts_with(s)) {
      full = std::max(full, s.size());
    } else if (rest.size() < s.size() && std::string_view(s).starts_with(rest)) {
      partial = true;
    }
  }
  return {full, partial};
}

// The content of the answer: the strings of `strip` removed (leftmost, longest first), then leading whitespace.
std::string content_of(const reasoning_markers& m, std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t full = strip_at(m.strip, text.substr(i)).first;
    if (full > 0) {
      i += full;
    } else {
      out += text[i++];
    }
  }
  return std::string(ltrim(out));
}

// Whether the source reads field `name` of a message: message.NAME, msg['NAME'], m.get("NAME") ...
bool reads_field(std::string_view src, std::string_view name) {
  static constexpr std::string_view receivers[] = {"message", "msg", "m"};
  for (size_t at = src.find(name); at != std::string_view::npos; at = src.find(name, at + 1)) {
    const size_t after = at + name.size();
    if ((after < src.size() && is_ident(src[after])) || (at > 0 && is_ident(src[at - 1]))) continue;
    std::string_view before = src.substr(0, at);
    if (before.ends_with(".")) {
      before.remove_suffix(1);
    } else if (before.ends_with("['") || before.ends_with("[\"")) {
      before.remove_suffix(2);
    } else if (before.ends_with(".get('") || before.ends_with(".get(\"")) {
      before.remove_suffix(6);
    } else {
      continue;
    }
    for (std::string_view r : receivers) {
      if (before.ends_with(r) && (before.size() == r.size() || !is_ident(before[before.size() - r.size() - 1])) &&
          (before.size() == r.size() || before[before.size() - r.size() - 1] != '.')) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

reasoning_markers detect_reasoning(std::string_view src) {
  // The most specific first: several of these templates also mention <think> or <|think|>.
  if (has(src, "<|channel|>") && has(src, "analysis")) {  // gpt-oss (harmony)
    return markers("<|channel|>analysis<|message|>", "<|end|>",
                   {"<|start|>assistant<|channel|>final<|message|>", "<|channel|>final<|message|>", "<|return|>",
                    "<|end|>"});
  }
  if (has(src, "<mm:think>")) return markers("<mm:think>", "</mm:think>");        // MiniMax M3
  if (has(src, "<seed:think>")) return markers("<seed:think>", "</seed:think>");  // Seed-OSS
  if (has(src, "[THINK]")) return markers("[THINK]", "[/THINK]");                // Ministral / Magistral
  if (has(src, "<|START_THINKING|>")) {                                           // Command A (Cohere2)
    return markers("<|START_THINKING|>", "<|END_THINKING|>",
                   {"<|START_TEXT|>", "<|END_TEXT|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"});
  }
  if (has(src, "<|open|>") && has(src, "<|close|>") && has(src, "'think'")) {  // Kimi K3 (tags built by macros)
    return markers("<|open|>think<|sep|>", "<|close|>think<|sep|>",
                   {"<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>",
                    "<|end_of_msg|>"});
  }
  if (has(src, "[BEGIN FINAL RESPONSE]")) {  // Apriel 1.5 (the model writes the opening) and 1.6 (the prompt does)
    return markers("Here are my reasoning steps:\n", "[BEGIN FINAL RESPONSE]", {"[END FINAL RESPONSE]", "<|end|>"});
  }
  if (has(src, "<|channel>")) return markers("<|channel>thought", "<channel|>");  // Gemma 4
  if (has(src, "<|think|>") && has(src, "<|begin|>assistant")) {                // Solar Open
    return markers("<|think|>", "<|end|>", {"<|begin|>assistant<|content|>", "<|content|>", "<|end|>"});
  }
  if (has(src, "assistant to=self<|message|>")) {  // Muse Glimmer (ATEM channels)
    return markers("to=self<|message|>", "<|eom|>",
                   {"<|start|>assistant to=user<|message|>", "to=user<|message|>", "<|eot|>"});
  }
  if (has(src, "<think>") && has(src, "<response>") && has(src, "</response>")) {  // Granite 3.x
    return markers("<think>", "</think>", {"<response>", "</response>"});
  }
  if (has(src, "<think>") || has(src, "</think>")) return markers("<think>", "</think>");
  // Reasoning models whose templates do not show the tags.
  if (has(src, "MiniMax-M1") || has(src, "You are MiMo")) return markers("<think>", "</think>");
  return {};
}

bool prompt_opens_reasoning(const reasoning_markers& m, std::string_view prompt) {
  const std::string_view start = rtrim(m.start), end = rtrim(m.end);
  if (start.empty()) return false;
  prompt = rtrim(prompt);
  // (An end marker that ends with the start marker, e.g. start "think>" and end "/think>", closes the block.)
  const bool closed = !end.empty() && end.size() > start.size() && prompt.ends_with(end);
  return prompt.ends_with(start) && !closed;
}

reasoning_split split_reasoning(const reasoning_markers& m, std::string_view answer, bool open) {
  if (m.empty()) return {"", std::string(answer)};
  std::string_view rest = ltrim(answer);
  const bool started = !m.start.empty() && rest.starts_with(m.start);
  if (!started && !open) return {"", content_of(m, answer)};
  if (started) rest.remove_prefix(m.start.size());
  const size_t end = find_end(m, rest);
  if (end == std::string_view::npos) return {std::string(rtrim(ltrim(rest))), ""};
  return {std::string(rtrim(ltrim(rest.substr(0, end)))), content_of(m, rest.substr(end + m.end.size()))};
}

reasoning_stream::reasoning_stream(reasoning_markers m, bool open)
    : m_(std::move(m)), open_(open), phase_(m_.empty() ? phase::verbatim : phase::begin) {}

bool reasoning_stream::in_reasoning() const {
  return phase_ == phase::reasoning || (phase_ == phase::begin && open_);
}

reasoning_split reasoning_stream::feed(std::string_view piece) {
  reasoning_split out;
  held_.append(piece);
  run(false, out);
  return out;
}

reasoning_split reasoning_stream::finish() {
  reasoning_split out;
  run(true, out);
  pending_ws_.clear();  // the reasoning's trailing whitespace
  return out;
}

void reasoning_stream::emit_reasoning(std::string_view bytes, reasoning_split& out) {
  for (char c : bytes) {
    if (is_space(c)) {
      if (reasoning_started_) pending_ws_ += c;  // sent only if more reasoning follows
      continue;
    }
    out.reasoning += pending_ws_;
    pending_ws_.clear();
    out.reasoning += c;
    reasoning_started_ = true;
  }
}

void reasoning_stream::emit_content(std::string_view bytes, reasoning_split& out) {
  for (char c : bytes) {
    if (!content_started_ && is_space(c)) continue;
    content_started_ = true;
    out.content += c;
  }
}

// Decides what it can of held_ (all of it when final), leaving in held_ what it cannot yet.
void reasoning_stream::run(bool final, reasoning_split& out) {
  std::string_view text = held_;
  for (;;) {
    if (phase_ == phase::verbatim) {
      out.content.append(text);
      text = {};
      break;
    }
    if (phase_ == phase::begin) {
      const std::string_view rest = ltrim(text);
      if (rest.empty() && !final) break;  // only whitespace so far
      if (!m_.start.empty() && rest.starts_with(m_.start)) {
        text = rest.substr(m_.start.size());
        phase_ = phase::reasoning;
        continue;
      }
      const std::string_view start = m_.start;
      if (!final && !start.empty() && rest.size() < start.size() && start.starts_with(rest)) {
        break;  // may still become the start marker
      }
      text = rest;  // the whitespace is leading whitespace of either part
      phase_ = open_ ? phase::reasoning : phase::content;
      continue;
    }
    if (phase_ == phase::reasoning) {
      const size_t end = find_end(m_, text);
      if (end != std::string_view::npos) {
        emit_reasoning(text.substr(0, end), out);
        pending_ws_.clear();
        text.remove_prefix(end + m_.end.size());
        phase_ = phase::content;
        continue;
      }
      // Hold back the longest suffix that may begin the end marker.
      size_t keep = 0;
      if (!final) {
        for (size_t k = std::min(text.size(), m_.end.size() - (m_.end.empty() ? 0 : 1)); k > 0; --k) {
          if (std::string_view(m_.end).starts_with(text.substr(text.size() - k))) {
            keep = k;
            break;
          }
        }
      }
      emit_reasoning(text.substr(0, text.size() - keep), out);
      text.remove_prefix(text.size() - keep);
      break;
    }
    // phase::content
    size_t i = 0, from = 0;
    while (i < text.size()) {
      const auto [full, partial] = strip_at(m_.strip, text.substr(i));
      if (partial && !final) break;  // may still become a (longer) string to strip
      if (full > 0) {
        emit_content(text.substr(from, i - from), out);
        i += full;
        from = i;
      } else {
        ++i;
      }
    }
    emit_content(text.substr(from, i - from), out);
    text.remove_prefix(i);
    break;
  }
  held_ = std::string(text);
}

std::string_view reasoning_field(std::string_view template_source) {
  for (std::string_view f : {"reasoning_content", "reasoning", "thinking"}) {
    if (reads_field(template_source, f)) return f;
  }
  return "";
}

}  // namespace troupe::llm
