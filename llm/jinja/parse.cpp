// The Jinja lexer and parser: template text into the tree of llm/jinja/ast.h, with Jinja2's whitespace rules
// (-/+ markers, trim_blocks, lstrip_blocks, the source's one trailing newline dropped) and raw blocks.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "llm/jinja/ast.h"

namespace troupe::llm::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

[[noreturn]] void fail(int line, const std::string& what) {
  throw error("template line " + std::to_string(line) + ": " + what);
}

// ---- tokens of one tag ----

struct token {
  enum kind { name, integer, real, string, op, end } k = end;
  std::string text;
  int64_t i = 0;
  double d = 0;
  int line = 0;
};

std::vector<token> tokenize(std::string_view s, int line) {
  std::vector<token> out;
  size_t p = 0;
  while (p < s.size()) {
    const char c = s[p];
    if (c == '\n') ++line;
    if (is_space(c)) {
      ++p;
      continue;
    }
    token t;
    t.line = line;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < s.size() && (std::isalnum(static_cast<unsigned char>(s[q])) || s[q] == '_')) ++q;
      t.k = token::name;
      t.text = std::string(s.substr(p, q - p));
      p = q;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t q = p;
      bool real = false;
      while (q < s.size() && (std::isdigit(static_cast<unsigned char>(s[q])) || s[q] == '_')) ++q;
      if (q + 1 < s.size() && s[q] == '.' && std::isdigit(static_cast<unsigned char>(s[q + 1]))) {
        real = true;
        ++q;
        while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
      }
      if (q < s.size() && (s[q] == 'e' || s[q] == 'E')) {
        size_t r = q + 1;
        if (r < s.size() && (s[r] == '+' || s[r] == '-')) ++r;
        if (r < s.size() && std::isdigit(static_cast<unsigned char>(s[r]))) {
          real = true;
          q = r;
          while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
        }
      }
      std::string num;
      for (size_t i = p; i < q; ++i) {
        if (s[i] != '_') num += s[i];
      }
      if (real) {
        t.k = token::real;
        t.d = std::strtod(num.c_str(), nullptr);
      } else {
        t.k = token::integer;
        errno = 0;
        t.i = std::strtoll(num.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(line, "integer literal out of range: " + num);
      }
      p = q;
    } else if (c == '"' || c == '\'') {
      size_t q = p + 1;
      std::string v;
      for (;;) {
        if (q >= s.size()) fail(line, "unterminated string literal");
        const char ch = s[q];
        if (ch == c) break;
        if (ch == '\n') ++line;
        if (ch == '\\' && q + 1 < s.size()) {
          const char e = s[++q];
          switch (e) {
            case 'n': v += '\n'; break;
            case 't': v += '\t'; break;
            case 'r': v += '\r'; break;
            case '\\': v += '\\'; break;
            case '\'': v += '\''; break;
            case '"': v += '"'; break;
            case '\n': ++line; break;
            default: v += '\\'; v += e;
          }
          ++q;
          continue;
        }
        v += ch;
        ++q;
      }
      t.k = token::string;
      t.text = std::move(v);
      p = q + 1;
    } else {
      static const char* const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                        "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
      bool found = false;
      for (const char* o : ops) {
        const size_t n = std::strlen(o);
        if (s.substr(p, n) == o) {
          t.k = token::op;
          t.text = o;
          p += n;
          found = true;
          break;
        }
      }
      if (!found) fail(line, std::string("unexpected character '") + c + "'");
    }
    out.push_back(std::move(t));
  }
  token e;
  e.line = line;
  out.push_back(e);
  return out;
}

// ---- the template's pieces: text and tags ----

struct piece {
  enum kind { text, output, block } k = text;
  std::string body;  // text, or the tag's inside
  int line = 1;
};

std::vector<piece> split(std::string_view src, const options& opt) {
  std::vector<piece> out;
  if (!src.empty() && src.back() == '\n') {  // Jinja2 drops one trailing newline (keep_trailing_newline=False)
    src.remove_suffix(1);
    if (!src.empty() && src.back() == '\r') src.remove_suffix(1);
  }
  size_t p = 0;
  int line = 1;
  bool strip_next = false;  // a -%} before: the next text loses its leading whitespace
  bool trim_next = false;   // trim_blocks after a block tag or comment: one newline
  // The start of the text after a tag, as the tag asks (then the next tag decides again).
  const auto lead = [&](std::string& t) {
    if (strip_next) {
      size_t i = 0;
      while (i < t.size() && is_space(t[i])) ++i;
      t.erase(0, i);
    } else if (trim_next && !t.empty()) {
      if (t[0] == '\n') t.erase(0, 1);
      else if (t.size() > 1 && t[0] == '\r' && t[1] == '\n') t.erase(0, 2);
    }
    strip_next = trim_next = false;
  };
  const auto strip_end = [](std::string& t) {  // a {%- after: the text loses its trailing whitespace
    while (!t.empty() && is_space(t.back())) t.pop_back();
  };
  const auto count_lines = [](std::string_view t) { return static_cast<int>(std::count(t.begin(), t.end(), '\n')); };
  while (p <= src.size()) {
    size_t open = src.find('{', p);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open != std::string_view::npos && open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(src.substr(p, open == std::string_view::npos ? std::string_view::npos : open - p));
    lead(text);
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({piece::text, text, line});
      break;
    }
    const char kind = src[open + 1];
    size_t inner = open + 2;
    const bool minus = inner < src.size() && src[inner] == '-';
    const bool plus = inner < src.size() && src[inner] == '+';
    if (minus || plus) ++inner;
    if (minus) {
      strip_end(text);
    } else if (opt.lstrip_blocks && !plus && kind != '{') {
      // Spaces and tabs between the start of the tag's line and the tag go (from this text's end).
      size_t ws = open;
      while (ws > 0 && (src[ws - 1] == ' ' || src[ws - 1] == '\t')) --ws;
      if (ws == 0 || src[ws - 1] == '\n') text.resize(text.size() - std::min(open - ws, text.size()));
    }
    if (!text.empty()) out.push_back({piece::text, text, line});
    line += count_lines(src.substr(p, open - p));
    const int tag_line = line;
    if (kind == '#') {
      const size_t close = src.find("#}", inner);
      if (close == std::string_view::npos) fail(tag_line, "unterminated comment");
      const bool cminus = close > inner && src[close - 1] == '-';
      line += count_lines(src.substr(open, close + 2 - open));
      p = close + 2;
      strip_next = cminus;
      trim_next = !cminus && opt.trim_blocks;
      continue;
    }
    // Find the closer outside string literals.
    const char* closer = kind == '{' ? "}}" : "%}";
    size_t q = inner;
    char quote = 0;
    size_t close = std::string_view::npos;
    while (q + 1 < src.size()) {
      const char ch = src[q];
      if (quote) {
        if (ch == '\\') ++q;
        else if (ch == quote) quote = 0;
      } else if (ch == '"' || ch == '\'') {
        quote = ch;
      } else if (ch == closer[0] && src[q + 1] == closer[1]) {
        close = q;
        break;
      }
      ++q;
    }
    if (close == std::string_view::npos) fail(tag_line, std::string("unterminated ") + (kind == '{' ? "{{" : "{%"));
    const bool cminus = close > inner && src[close - 1] == '-';
    std::string body(src.substr(inner, (cminus ? close - 1 : close) - inner));
    line += count_lines(src.substr(open, close + 2 - open));
    p = close + 2;
    strip_next = cminus;
    if (kind == '{') {
      out.push_back({piece::output, body, tag_line});
      continue;
    }
    trim_next = !cminus && opt.trim_blocks;
    // raw: everything up to {% endraw %} as text.
    size_t b = 0;
    while (b < body.size() && is_space(body[b])) ++b;
    size_t e = body.size();
    while (e > b && is_space(body[e - 1])) --e;
    if (body.substr(b, e - b) == "raw") {
      size_t search = p;
      for (;;) {
        const size_t o = src.find("{%", search);
        if (o == std::string_view::npos) fail(tag_line, "raw without endraw");
        size_t r = o + 2;
        const bool rminus = r < src.size() && src[r] == '-';
        if (rminus || (r < src.size() && src[r] == '+')) ++r;
        while (r < src.size() && is_space(src[r])) ++r;
        if (src.substr(r, 6) == "endraw") {
          size_t c2 = src.find("%}", r);
          if (c2 == std::string_view::npos) fail(tag_line, "unterminated endraw");
          std::string raw(src.substr(p, o - p));
          lead(raw);
          if (rminus) strip_end(raw);
          if (!raw.empty()) out.push_back({piece::text, raw, line});
          const bool eminus = c2 > 0 && src[c2 - 1] == '-';
          line += count_lines(src.substr(p, c2 + 2 - p));
          p = c2 + 2;
          strip_next = eminus;
          trim_next = !eminus && opt.trim_blocks;
          break;
        }
        search = o + 2;
      }
      continue;
    }
    out.push_back({piece::block, body, tag_line});
  }
  return out;
}

// ---- expressions ----

class expr_parser {
 public:
  explicit expr_parser(std::vector<token> t) : t_(std::move(t)) {}

  const token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  bool at_end() const { return peek().k == token::end; }
  bool is_op(const char* o, size_t ahead = 0) const { return peek(ahead).k == token::op && peek(ahead).text == o; }
  bool is_name(const char* n, size_t ahead = 0) const { return peek(ahead).k == token::name && peek(ahead).text == n; }
  token next() { return t_[std::min(i_++, t_.size() - 1)]; }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(peek().line, std::string("expected '") + o + "', got " + describe(peek()));
    ++i_;
  }
  std::string expect_name() {
    if (peek().k != token::name) fail(peek().line, "expected a name, got " + describe(peek()));
    return next().text;
  }
  static std::string describe(const token& t) {
    switch (t.k) {
      case token::end: return "the end of the tag";
      case token::string: return "a string";
      case token::integer:
      case token::real: return "a number";
      default: return "'" + t.text + "'";
    }
  }
  void expect_end() {
    if (!at_end()) fail(peek().line, "unexpected " + describe(peek()));
  }

  // A macro's or caller's parameters, "(a, b=default, ...)", the defaults unevaluated.
  std::vector<std::pair<std::string, expr_ptr>> parameters() {
    std::vector<std::pair<std::string, expr_ptr>> out;
    expect_op("(");
    while (!is_op(")")) {
      out.push_back({expect_name(), nullptr});
      if (is_op("=")) {
        next();
        out.back().second = expression();
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    return out;
  }

  // The filters of a {% filter f(a) | g %} tag (its rest: "f(a) | g"), applied to `subject`.
  expr_ptr filter_chain(expr_ptr subject) {
    expr_ptr n = std::move(subject);
    for (;;) {
      auto f = make(expr::filter, peek().line);
      f->a = n;
      f->name = expect_name();
      if (is_op("(")) call_arguments(*f);
      n = f;
      if (!is_op("|")) return n;
      next();
    }
  }

  expr_ptr expression() {
    // Nesting is bounded (parentheses, lists, calls): a template is untrusted input.
    if (++depth_ > max_nesting) fail(peek().line, "expressions nest deeper than " + std::to_string(max_nesting));
    expr_ptr e = conditional();
    --depth_;
    return e;
  }
  static constexpr int max_nesting = 128;
  // Operators chained without parentheses (a + b + ...) build a tree as deep as the chain: bounded too.
  static void chained(int& n, int line) {
    if (++n > 256) fail(line, "more than 256 operators chained in one expression");
  }

  // The tuple of a for target or a set target: names (a, b).
  std::vector<std::string> targets() {
    std::vector<std::string> out{expect_name()};
    while (is_op(",")) {
      next();
      out.push_back(expect_name());
    }
    return out;
  }

  // An expression, or a tuple of them without parentheses (for ... in a, b / set x = a, b).
  expr_ptr tuple_or_expression() {
    expr_ptr first = expression();
    if (!is_op(",")) return first;
    auto t = make(expr::list_lit, first->line);
    t->tuple = true;
    t->args.push_back(first);
    while (is_op(",")) {
      next();
      if (at_end() || is_op(")")) break;
      t->args.push_back(expression());
    }
    return t;
  }

 private:
  static std::shared_ptr<expr> make(expr::kind k, int line) {
    auto e = std::make_shared<expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  expr_ptr conditional() {
    expr_ptr then = or_expr();
    while (is_name("if")) {
      const int line = next().line;
      auto c = make(expr::cond, line);
      c->a = then;
      c->b = or_expr();
      if (is_name("else")) {
        next();
        c->c = conditional();
      }
      then = c;
    }
    return then;
  }
  // One level of left-associative operators (Jinja2's: or, and, + -, ~, * / // %, ** too): operands from
  // `operand`, joined while `op` names an operator at the current token ("": none).
  template <class Operand, class Op>
  expr_ptr left_assoc(expr::kind k, Operand operand, Op op) {
    int chain = 0;
    expr_ptr l = operand();
    for (std::string o = op(); !o.empty(); o = op()) {
      auto e = make(k, next().line);
      e->name = o;
      chained(chain, e->line);
      e->a = l;
      e->b = operand();
      l = e;
    }
    return l;
  }
  std::string word_op(const char* w) const { return is_name(w) ? w : ""; }
  std::string symbol_op(std::initializer_list<const char*> ops) const {
    for (const char* o : ops) {
      if (is_op(o)) return o;
    }
    return "";
  }
  expr_ptr or_expr() {
    return left_assoc(expr::logic_or, [this] { return and_expr(); }, [this] { return word_op("or"); });
  }
  expr_ptr and_expr() {
    return left_assoc(expr::logic_and, [this] { return not_expr(); }, [this] { return word_op("and"); });
  }
  expr_ptr not_expr() {
    if (is_name("not")) {
      auto e = make(expr::logic_not, next().line);
      if (++depth_ > max_nesting) fail(e->line, "expressions nest deeper than " + std::to_string(max_nesting));
      e->a = not_expr();
      --depth_;
      return e;
    }
    return compare();
  }
  expr_ptr compare() {
    return left_assoc(expr::binary, [this] { return math1(); }, [this]() -> std::string {
      std::string o = symbol_op({"==", "!=", "<", "<=", ">", ">="});
      if (!o.empty()) return o;
      if (is_name("in")) return "in";
      if (is_name("not") && is_name("in", 1)) {
        next();  // "not" here, "in" as the operator
        return "not in";
      }
      return "";
    });
  }
  expr_ptr math1() {
    return left_assoc(expr::binary, [this] { return concat(); }, [this] { return symbol_op({"+", "-"}); });
  }
  expr_ptr concat() {
    return left_assoc(expr::binary, [this] { return math2(); }, [this] { return symbol_op({"~"}); });
  }
  expr_ptr math2() {
    return left_assoc(expr::binary, [this] { return power(); }, [this] { return symbol_op({"*", "/", "//", "%"}); });
  }
  expr_ptr power() {
    return left_assoc(expr::binary, [this] { return unary(true); }, [this] { return symbol_op({"**"}); });
  }
  expr_ptr unary(bool with_filter) {
    expr_ptr n;
    if (is_op("-") || is_op("+")) {
      auto e = make(expr::unary, peek().line);
      e->name = next().text;
      if (++depth_ > max_nesting) fail(e->line, "expressions nest deeper than " + std::to_string(max_nesting));
      e->a = unary(false);
      --depth_;
      n = e;
    } else {
      n = primary();
    }
    n = postfix(n);
    if (with_filter) n = filters(n);
    return n;
  }
  expr_ptr primary() {
    const token t = next();
    switch (t.k) {
      case token::integer: {
        auto e = make(expr::literal, t.line);
        e->lit = value(t.i);
        return e;
      }
      case token::real: {
        auto e = make(expr::literal, t.line);
        e->lit = value(t.d);
        return e;
      }
      case token::string: {
        std::string s = t.text;
        while (peek().k == token::string) s += next().text;  // adjacent literals join
        auto e = make(expr::literal, t.line);
        e->lit = value(std::move(s));
        return e;
      }
      case token::name: {
        auto e = make(expr::literal, t.line);
        if (t.text == "true" || t.text == "True") e->lit = value(true);
        else if (t.text == "false" || t.text == "False") e->lit = value(false);
        else if (t.text == "none" || t.text == "None") e->lit = value::none();
        else {
          e->k = expr::variable;
          e->name = t.text;
        }
        return e;
      }
      case token::op:
        if (t.text == "(") {
          if (is_op(")")) {
            next();
            auto empty = make(expr::list_lit, t.line);  // ()
            empty->tuple = true;
            return empty;
          }
          expr_ptr inner = expression();
          if (is_op(",")) {
            auto tup = make(expr::list_lit, t.line);
            tup->tuple = true;
            tup->args.push_back(inner);
            while (is_op(",")) {
              next();
              if (is_op(")")) break;
              tup->args.push_back(expression());
            }
            inner = tup;
          }
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          auto e = make(expr::list_lit, t.line);
          while (!is_op("]")) {
            e->args.push_back(expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          auto e = make(expr::dict_lit, t.line);
          while (!is_op("}")) {
            e->args.push_back(expression());
            expect_op(":");
            e->args.push_back(expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    fail(t.line, "unexpected " + describe(t));
  }
  void call_arguments(expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().k == token::name && is_op("=", 1)) {
        std::string k = next().text;
        next();
        call.kwargs.emplace_back(std::move(k), expression());
      } else {
        call.args.push_back(expression());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }
  expr_ptr postfix(expr_ptr n) {
    for (;;) {
      if (is_op(".")) {
        const int line = next().line;
        auto e = make(expr::attr, line);
        e->a = n;
        if (peek().k == token::integer) e->name = std::to_string(next().i);
        else e->name = expect_name();
        n = e;
      } else if (is_op("[")) {
        const int line = next().line;
        expr_ptr parts[3];
        bool slice = false;
        int part = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            next();
            slice = true;
            if (++part > 2) fail(line, "a slice has at most three parts");
            continue;
          }
          parts[part] = expression();
        }
        expect_op("]");
        auto e = make(slice ? expr::slice : expr::item, line);
        e->a = n;
        if (slice) {
          e->b = parts[0];
          e->c = parts[1];
          e->d = parts[2];
        } else {
          if (!parts[0]) fail(line, "an empty subscript");
          e->b = parts[0];
        }
        n = e;
      } else if (is_op("(")) {
        auto e = make(expr::call, peek().line);
        e->a = n;
        call_arguments(*e);
        n = e;
      } else {
        return n;
      }
    }
  }
  expr_ptr filters(expr_ptr n) {
    for (;;) {
      if (is_op("|")) {
        const int line = next().line;
        auto e = make(expr::filter, line);
        e->a = n;
        e->name = expect_name();
        while (is_op(".")) {  // dotted filter names are not Jinja's; refuse below at render
          next();
          e->name += "." + expect_name();
        }
        if (is_op("(")) call_arguments(*e);
        n = e;
      } else if (is_name("is")) {
        const int line = next().line;
        auto e = make(expr::test, line);
        e->a = n;
        if (is_name("not")) {
          next();
          e->negated = true;
        }
        e->name = expect_name();
        if (is_op("(")) {
          call_arguments(*e);
        } else if (!at_end() && (peek().k == token::integer || peek().k == token::real || peek().k == token::string ||
                                 (peek().k == token::name && !is_name("and") && !is_name("or") && !is_name("else") &&
                                  !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is")))) {
          e->args.push_back(unary(false));  // one argument without parentheses: x is divisibleby 3
        }
        n = e;
      } else {
        return n;
      }
    }
  }

  std::vector<token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

// ---- statements ----

class stmt_parser {
 public:
  stmt_parser(std::vector<piece> pieces, bool generation_tag) : p_(std::move(pieces)), generation_tag_(generation_tag) {}

  node_ptr parse_all() {
    auto root = std::make_shared<node>();
    root->k = node::sequence;
    root->line = 1;
    const std::string stop = body(*root, {});
    if (!stop.empty()) fail(line_, "unexpected '" + stop + "'");
    return root;
  }

 private:
  // Parses statements into into.body until a block tag whose first word is in `ends` (returned, with the
  // tag's parser left at the tag's rest in end_); "" at the end of the template.
  std::string body(node& into, std::initializer_list<const char*> ends) {
    while (i_ < p_.size()) {
      const piece& pc = p_[i_++];
      line_ = pc.line;
      if (pc.k == piece::text) {
        auto n = std::make_shared<node>();
        n->k = node::text_piece;
        n->text = pc.body;
        n->line = pc.line;
        into.body.push_back(n);
        continue;
      }
      expr_parser ep(tokenize(pc.body, pc.line));
      if (pc.k == piece::output) {
        auto n = std::make_shared<node>();
        n->k = node::output;
        n->line = pc.line;
        if (ep.at_end()) fail(pc.line, "an empty {{ }}");
        n->e = ep.expression();
        ep.expect_end();
        into.body.push_back(n);
        continue;
      }
      if (ep.at_end()) fail(pc.line, "an empty {% %}");
      const std::string word = ep.expect_name();
      for (const char* e : ends) {
        if (word == e) {
          end_ = std::make_unique<expr_parser>(std::move(ep));
          return word;
        }
      }
      into.body.push_back(statement(word, ep, pc.line));
    }
    if (ends.size() > 0) fail(line_, std::string("missing '") + *(ends.end() - 1) + "': the template ended first");
    return "";
  }

  node_ptr statement(const std::string& word, expr_parser& ep, int line) {
    if (++nesting_ > 128) fail(line, "blocks nest deeper than 128");
    node_ptr n = statement_inner(word, ep, line);
    --nesting_;
    return n;
  }

  node_ptr statement_inner(const std::string& word, expr_parser& ep, int line) {
    auto n = std::make_shared<node>();
    n->line = line;
    if (word == "if") {
      n->k = node::if_;
      n->e = ep.expression();
      ep.expect_end();
      auto branch = std::make_shared<node>();
      branch->k = node::sequence;
      std::string stop = body(*branch, {"elif", "else", "endif"});
      n->branches.push_back({n->e, branch});
      while (stop == "elif") {
        expr_ptr c = end_->expression();
        end_->expect_end();
        auto b = std::make_shared<node>();
        b->k = node::sequence;
        stop = body(*b, {"elif", "else", "endif"});
        n->branches.push_back({c, b});
      }
      if (stop == "else") {
        end_->expect_end();
        auto b = std::make_shared<node>();
        b->k = node::sequence;
        body(*b, {"endif"});
        n->branches.push_back({nullptr, b});
      }
      end_->expect_end();
      return n;
    }
    if (word == "for") {
      n->k = node::for_;
      n->names = ep.targets();
      if (!ep.is_name("in")) fail(line, "expected 'in' in for");
      ep.next();
      // The iterable: no conditional expression (its 'if' is the loop's filter).
      n->e = ep.tuple_or_expression();
      if (n->e->k == expr::cond && !n->e->c) {  // for x in xs if cond: the filter
        n->filter = n->e->b;
        n->e = n->e->a;
      }
      if (ep.is_name("recursive")) fail(line, "recursive loops are not supported");
      ep.expect_end();
      auto b = std::make_shared<node>();
      b->k = node::sequence;
      std::string stop = body(*b, {"else", "endfor"});
      n->branches.push_back({nullptr, b});
      if (stop == "else") {
        end_->expect_end();
        auto e = std::make_shared<node>();
        e->k = node::sequence;
        body(*e, {"endfor"});
        n->branches.push_back({nullptr, e});
      }
      end_->expect_end();
      return n;
    }
    if (word == "set") {
      // set a = x | set a, b = x | set ns.attr = x | set a %}...{% endset
      if (ep.peek().k == token::name && ep.is_op(".", 1)) {
        n->k = node::set_attr;
        n->names = {ep.expect_name()};
        ep.next();
        n->names.push_back(ep.expect_name());
        ep.expect_op("=");
        n->e = ep.tuple_or_expression();
        ep.expect_end();
        return n;
      }
      n->names = ep.targets();
      if (ep.is_op("=")) {
        ep.next();
        n->k = node::set;
        n->e = ep.tuple_or_expression();
        ep.expect_end();
        return n;
      }
      if (n->names.size() != 1) fail(line, "a block set takes one name");
      n->k = node::set_block;
      if (ep.is_op("|")) fail(line, "filters on a block set are not supported");
      ep.expect_end();
      auto b = std::make_shared<node>();
      b->k = node::sequence;
      body(*b, {"endset"});
      end_->expect_end();
      n->branches.push_back({nullptr, b});
      return n;
    }
    if (word == "macro" || word == "call") {
      n->k = word == "macro" ? node::macro : node::call_block;
      if (word == "call") {
        if (ep.is_op("(")) n->params = ep.parameters();  // caller's parameters
        n->e = ep.expression();
        if (n->e->k != expr::call) fail(line, "call needs a call expression");
      } else {
        n->names = {ep.expect_name()};
        n->params = ep.parameters();
      }
      ep.expect_end();
      auto b = std::make_shared<node>();
      b->k = node::sequence;
      body(*b, {word == "macro" ? "endmacro" : "endcall"});
      if (!end_->at_end() && word == "macro") end_->expect_name();  // endmacro name
      end_->expect_end();
      n->branches.push_back({nullptr, b});
      return n;
    }
    if (word == "filter") {
      n->k = node::filter_block;
      // The chain applied to the block's text, bound to a name no template can write.
      auto placeholder = std::make_shared<expr>();
      placeholder->k = expr::variable;
      placeholder->name = "\x01block";
      placeholder->line = line;
      n->e = ep.filter_chain(placeholder);
      ep.expect_end();
      auto b = std::make_shared<node>();
      b->k = node::sequence;
      body(*b, {"endfilter"});
      end_->expect_end();
      n->branches.push_back({nullptr, b});
      return n;
    }
    if (word == "break" || word == "continue") {
      n->k = word == "break" ? node::break_ : node::continue_;
      ep.expect_end();
      return n;
    }
    if (word == "do") {
      n->k = node::output;
      n->e = ep.expression();
      n->discard = true;
      ep.expect_end();
      return n;
    }
    if (word == "generation" && generation_tag_) {
      ep.expect_end();
      n->k = node::sequence;
      body(*n, {"endgeneration"});
      end_->expect_end();
      return n;
    }
    fail(line, "unknown tag '" + word + "'");
  }

  std::vector<piece> p_;
  bool generation_tag_ = false;
  size_t i_ = 0;
  int line_ = 1;
  std::unique_ptr<expr_parser> end_;  // the parser of the end tag that stopped body()
  int nesting_ = 0;
};

}  // namespace

node_ptr parse_template(std::string_view source, const options& opt) {
  return stmt_parser(split(source, opt), opt.generation_tag).parse_all();
}

}  // namespace troupe::llm::jinja
