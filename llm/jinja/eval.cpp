// Rendering a parsed template (llm/jinja/ast.h): scopes, the loop object, macros and caller, filters, tests,
// the string / list / dict methods templates call, and the globals of Hugging Face's environment
// (raise_exception, strftime_now, range, namespace, dict).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include "llm/jinja/ast.h"
#include "llm/unicode.h"

namespace troupe::llm::jinja {

namespace {

[[noreturn]] void fail(int line, const std::string& what) { throw error("template line " + std::to_string(line) + ": " + what); }

// ---- UTF-8 code points (Python's str indexes them) ----

// Bytes of the character at s[i] (llm/unicode.h's decoding: a byte of invalid UTF-8 counts as one).
size_t code_point_bytes(const std::string& s, size_t i) { return utf8_decode(s, i).len; }
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = code_point_bytes(s, i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}
int64_t str_len(const std::string& s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); i += code_point_bytes(s, i)) ++n;
  return n;
}

bool py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip_chars(const std::string& s, const value* chars, bool left, bool right) {
  const auto drop = [&](char c) {
    if (chars == nullptr || chars->is_none()) return py_space(c);
    return chars->is_string() && chars->str().find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && drop(s[b])) ++b;
  }
  if (right) {
    while (e > b && drop(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

// Python's str.lower / str.upper for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (ß upper is "SS");
// other characters are left as they are.
uint32_t cp_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
  if (c >= 0x100 && c <= 0x137 && c % 2 == 0) return c + 1;
  if (c >= 0x139 && c <= 0x148 && c % 2 == 1) return c + 1;
  if (c >= 0x14a && c <= 0x177 && c % 2 == 0) return c + 1;
  if (c == 0x178) return 0xff;
  if (c >= 0x179 && c <= 0x17e && c % 2 == 1) return c + 1;
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}
uint32_t cp_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x101 && c <= 0x137 && c % 2 == 1) return c - 1;
  if (c >= 0x13a && c <= 0x148 && c % 2 == 0) return c - 1;
  if (c >= 0x14b && c <= 0x177 && c % 2 == 1) return c - 1;
  if (c >= 0x17a && c <= 0x17e && c % 2 == 0) return c - 1;
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x3b1 && c <= 0x3c9) return c - 32;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}
std::string map_case(const std::string& s, bool up) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const utf8_unit u = utf8_decode(s, i);
    if (u.cp == invalid_code_point) {  // a byte that is not UTF-8: as it is
      out += s[i++];
      continue;
    }
    if (up && u.cp == 0xdf) {
      out += "SS";
    } else {
      utf8_append(out, up ? cp_upper(u.cp) : cp_lower(u.cp));
    }
    i += u.len;
  }
  return out;
}
std::string lower(const std::string& s) { return map_case(s, false); }
std::string upper(const std::string& s) { return map_case(s, true); }

// Python's comparison for sorting and <, <=, >, >=.
int compare_values(const value& a, const value& b, int line) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    const double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str() ? -1 : a.str() > b.str() ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    const list& x = a.items();
    const list& y = b.items();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (!(x[i] == y[i])) return compare_values(x[i], y[i], line);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail(line, "'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

// The items a value iterates over (a dict: its keys; a string: its characters; undefined: none).
list iterate(const value& v, int line) {
  switch (v.type()) {
    case value::kind::list: return v.items();
    case value::kind::dict: {
      list out;
      for (const auto& [k, x] : v.entries()) out.emplace_back(k);
      return out;
    }
    case value::kind::string: {
      list out;
      for (std::string& c : code_points(v.str())) out.emplace_back(std::move(c));
      return out;
    }
    case value::kind::undefined: return {};
    default: fail(line, "'" + v.type_name() + "' object is not iterable");
  }
}

int64_t length_of(const value& v, int line) {
  switch (v.type()) {
    case value::kind::string: return str_len(v.str());
    case value::kind::list:
      if (v.is_generator()) fail(line, "object of type 'generator' has no len()");
      return static_cast<int64_t>(v.items().size());
    case value::kind::dict: return static_cast<int64_t>(v.entries().size());
    case value::kind::undefined: return 0;
    default: fail(line, "object of type '" + v.type_name() + "' has no len()");
  }
}

// Python's slice indices for a sequence of n.
std::vector<int64_t> slice_indices(int64_t n, const value& start, const value& stop, const value& step, int line) {
  const auto num = [&](const value& v, int64_t dflt) -> int64_t {
    if (v.is_undefined() || v.is_none()) return dflt;
    if (!v.is_int() && !v.is_bool()) fail(line, "slice indices must be integers or None");
    return v.as_int();
  };
  const int64_t st = num(step, 1);
  if (st == 0) fail(line, "slice step cannot be zero");
  int64_t lo, hi;
  if (st > 0) {
    lo = num(start, 0);
    hi = num(stop, n);
    if (lo < 0) lo = std::max<int64_t>(0, lo + n);
    if (hi < 0) hi = std::max<int64_t>(0, hi + n);
    lo = std::min(lo, n);
    hi = std::min(hi, n);
  } else {
    lo = num(start, n - 1);
    hi = start.is_undefined() && stop.is_undefined() ? -1 : num(stop, -n - 1);
    if (!(stop.is_undefined() || stop.is_none())) {
      if (hi < 0) hi += n;
      if (hi < -1) hi = -1;
    } else {
      hi = -1;
    }
    if (lo < 0) lo += n;
    lo = std::min(lo, n - 1);
  }
  std::vector<int64_t> out;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) out.push_back(i);
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

struct scope {
  std::map<std::string, value, std::less<>> vars;
};

// The render's output limit also bounds every string it builds on the way (join, replace, ...): set by the
// renderer for the helpers below.
thread_local size_t string_limit = SIZE_MAX;
void check_size(size_t n) {
  if (n > string_limit) throw error("a string of the template grows past the output limit (" + std::to_string(string_limit) + " bytes)");
}

struct loop_break {};
struct loop_continue {};

class renderer {
 public:
  renderer(const options& opt, value context) : opt_(opt) {
    string_limit = opt.max_output;
    scopes_.emplace_back();
    for (auto& [k, v] : context.entries()) scopes_.back().vars[k] = v;
    globals();
  }

  void run(const node& n, std::string& out) {
    ++depth_;
    if (depth_ > opt_.max_depth) fail(n.line, "the template nests deeper than " + std::to_string(opt_.max_depth));
    exec(n, out);
    --depth_;
  }

 private:
  void step(int line) {
    if (++steps_ > opt_.max_steps) fail(line, "the template ran more than " + std::to_string(opt_.max_steps) + " steps");
  }
  void emit(std::string& out, const std::string& s, int line) {
    if (out.size() + s.size() > opt_.max_output) fail(line, "the output exceeds " + std::to_string(opt_.max_output) + " bytes");
    out += s;
  }

  value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto f = it->vars.find(name);
      if (f != it->vars.end()) return f->second;
    }
    const auto g = globals_.find(name);
    if (g != globals_.end()) return g->second;
    return value::undefined_named(name);
  }
  void assign(const std::string& name, value v) { scopes_.back().vars[name] = std::move(v); }

  void exec(const node& n, std::string& out) {
    step(n.line);
    switch (n.k) {
      case node::sequence:
        for (const node_ptr& c : n.body) exec(*c, out);
        return;
      case node::text_piece: emit(out, n.text, n.line); return;
      case node::output: {
        const value v = eval(*n.e);
        if (!n.discard) emit(out, v.to_str(), n.line);
        return;
      }
      case node::if_:
        for (const auto& [c, b] : n.branches) {
          if (!c || eval(*c).truthy()) {
            exec(*b, out);
            return;
          }
        }
        return;
      case node::for_: run_for(n, out); return;
      case node::set: {
        value v = eval(*n.e);
        unpack(n.names, std::move(v), n.line);
        return;
      }
      case node::set_attr: {
        value ns = lookup(n.names[0]);
        if (!ns.is_dict() || !is_namespace(ns)) fail(n.line, "cannot assign attribute on non-namespace object");
        ns.set(n.names[1], eval(*n.e));
        return;
      }
      case node::set_block: {
        std::string s;
        exec(*n.branches[0].second, s);
        assign(n.names[0], value(std::move(s)));
        return;
      }
      case node::macro: assign(n.names[0], make_macro(n)); return;
      case node::call_block: {
        const value caller = make_macro(n);
        const expr& call = *n.e;
        value fn = eval(*call.a);
        call_args args = arguments(call);
        args.kw.emplace_back("caller", caller);
        emit(out, invoke(fn, args, call.line).to_str(), n.line);
        return;
      }
      case node::filter_block: {
        std::string s;
        exec(*n.branches[0].second, s);
        scopes_.emplace_back();
        assign("\x01block", value(std::move(s)));
        const value v = eval(*n.e);
        scopes_.pop_back();
        emit(out, v.to_str(), n.line);
        return;
      }
      case node::break_: throw loop_break{};
      case node::continue_: throw loop_continue{};
    }
  }

  void unpack(const std::vector<std::string>& names, value v, int line) {
    if (names.size() == 1) {
      assign(names[0], std::move(v));
      return;
    }
    const list items = iterate(v, line);
    if (items.size() != names.size()) {
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(names.size()) + " names");
    }
    for (size_t i = 0; i < names.size(); ++i) assign(names[i], items[i]);
  }

  void run_for(const node& n, std::string& out) {
    const value seq = eval(*n.e);
    list items = iterate(seq, n.line);
    if (n.filter) {  // the loop's filter sees each item bound to the targets
      list kept;
      for (const value& it : items) {
        scopes_.emplace_back();
        unpack(n.names, it, n.line);
        const bool keep = eval(*n.filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.branches.size() > 1) exec(*n.branches[1].second, out);
      return;
    }
    const auto len = static_cast<int64_t>(items.size());
    scopes_.emplace_back();
    for (int64_t i = 0; i < len; ++i) {
      scopes_.back().vars.clear();
      dict loop;
      loop.emplace_back("index", value(i + 1));
      loop.emplace_back("index0", value(i));
      loop.emplace_back("revindex", value(len - i));
      loop.emplace_back("revindex0", value(len - i - 1));
      loop.emplace_back("first", value(i == 0));
      loop.emplace_back("last", value(i == len - 1));
      loop.emplace_back("length", value(len));
      loop.emplace_back("depth", value(1));
      loop.emplace_back("depth0", value(0));
      loop.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : value::undefined_named("previtem"));
      loop.emplace_back("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : value::undefined_named("nextitem"));
      loop.emplace_back("cycle", value(function([i](const call_args& a) -> value {
                          if (a.pos.empty()) throw error("loop.cycle needs at least one value");
                          return a.pos[static_cast<size_t>(i) % a.pos.size()];
                        })));
      assign("loop", value(std::move(loop)));
      unpack(n.names, items[static_cast<size_t>(i)], n.line);
      try {
        exec(*n.branches[0].second, out);
      } catch (const loop_break&) {
        break;
      } catch (const loop_continue&) {
        continue;
      }
    }
    scopes_.pop_back();
  }

  static bool is_namespace(const value& v) {
    const value* tag = v.find("\x01namespace");
    return tag != nullptr;
  }

  value make_macro(const node& n) {
    // Parameters with defaults evaluated at the call; the body sees the template's top scope.
    const node* def = &n;
    return value(function([this, def](const call_args& a) -> value {
      scope s;
      size_t pos = 0;
      for (const auto& [name, dflt] : def->params) {
        const value* given = nullptr;
        for (const auto& [k, v] : a.kw) {
          if (k == name) given = &v;
        }
        if (given == nullptr && pos < a.pos.size()) given = &a.pos[pos];
        ++pos;
        s.vars[name] = given ? *given : dflt ? eval(*dflt) : value::undefined_named(name);
      }
      list varargs;
      for (size_t i = def->params.size(); i < a.pos.size(); ++i) varargs.push_back(a.pos[i]);
      s.vars["varargs"] = value::tuple(std::move(varargs));
      dict kwargs;
      for (const auto& [k, v] : a.kw) {
        bool param = k == "caller";
        for (const auto& p : def->params) param = param || p.first == k;
        if (!param) kwargs.emplace_back(k, v);
      }
      s.vars["kwargs"] = value(std::move(kwargs));
      for (const auto& [k, v] : a.kw) {
        if (k == "caller") s.vars["caller"] = v;
      }
      // Macros see the globals and the template's top-level names, not the caller's loop variables.
      std::vector<scope> saved;
      saved.swap(scopes_);
      scopes_.push_back(saved.front());
      scopes_.push_back(std::move(s));
      std::string out;
      try {
        run(*def->branches[0].second, out);
      } catch (...) {
        scopes_.swap(saved);
        throw;
      }
      // Top-level names the macro set stay the template's (set in a macro is local in Jinja2: drop them).
      scopes_.swap(saved);
      return value(std::move(out));
    }));
  }

  call_args arguments(const expr& e) {
    call_args a;
    for (const expr_ptr& x : e.args) a.pos.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  value invoke(const value& fn, const call_args& a, int line) {
    if (!fn.is_function()) {
      if (fn.is_undefined()) fail(line, "'" + fn.undefined_name() + "' is undefined");
      fail(line, "'" + fn.type_name() + "' object is not callable");
    }
    ++depth_;
    if (depth_ > opt_.max_depth) fail(line, "the template nests deeper than " + std::to_string(opt_.max_depth));
    value r;
    try {
      r = fn.fn()(a);
    } catch (const error& e) {
      --depth_;
      const std::string what = e.what();
      if (what.rfind("template line", 0) == 0) throw;
      fail(line, what);
    }
    --depth_;
    return r;
  }

  // ---- expressions ----

  value eval(const expr& e) {
    value v = eval_inner(e);
    if ((v.is_string() && v.str().size() > opt_.max_output) || (v.is_list() && v.items().size() > opt_.max_output)) {
      fail(e.line, "a value of the template grows past the output limit (" + std::to_string(opt_.max_output) + ")");
    }
    return v;
  }

  value eval_inner(const expr& e) {
    step(e.line);
    switch (e.k) {
      case expr::literal: return e.lit;
      case expr::variable: return lookup(e.name);
      case expr::list_lit: {
        list l;
        for (const expr_ptr& x : e.args) l.push_back(eval(*x));
        return e.tuple ? value::tuple(std::move(l)) : value(std::move(l));
      }
      case expr::dict_lit: {
        value d{dict{}};
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const value k = eval(*e.args[i]);
          d.set(k.is_string() ? k.str() : k.to_str(), eval(*e.args[i + 1]));
        }
        return d;
      }
      case expr::attr: return get_attr(eval(*e.a), e.name, e.line);
      case expr::item: return get_item(eval(*e.a), eval(*e.b), e.line);
      case expr::slice: {
        const value v = eval(*e.a);
        const value s0 = e.b ? eval(*e.b) : value(), s1 = e.c ? eval(*e.c) : value(), s2 = e.d ? eval(*e.d) : value();
        if (v.is_list()) {
          list out;
          for (int64_t i : slice_indices(static_cast<int64_t>(v.items().size()), s0, s1, s2, e.line)) out.push_back(v.items()[static_cast<size_t>(i)]);
          return value(std::move(out));
        }
        if (v.is_string()) {
          const std::vector<std::string> cps = code_points(v.str());
          std::string out;
          for (int64_t i : slice_indices(static_cast<int64_t>(cps.size()), s0, s1, s2, e.line)) out += cps[static_cast<size_t>(i)];
          return value(std::move(out));
        }
        fail(e.line, "'" + v.type_name() + "' object is not subscriptable");
      }
      case expr::call: {
        const value fn = eval(*e.a);
        return invoke(fn, arguments(e), e.line);
      }
      case expr::filter:
        try {
          return apply_filter(e);
        } catch (const error& x) {  // a value's own error (tojson's) gets the line
          const std::string what = x.what();
          if (what.rfind("template line", 0) == 0) throw;
          fail(e.line, what);
        }
      case expr::test: {
        const bool r = apply_test(e);
        return value(e.negated ? !r : r);
      }
      case expr::unary: {
        const value v = eval(*e.a);
        if (!v.is_number() && !v.is_bool()) fail(e.line, "bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v.is_real() ? value(v.as_number()) : value(v.as_int());
        return v.is_real() ? value(-v.as_number()) : value(-v.as_int());
      }
      case expr::logic_and: {
        value l = eval(*e.a);
        if (!l.truthy()) return l;
        return eval(*e.b);
      }
      case expr::logic_or: {
        value l = eval(*e.a);
        if (l.truthy()) return l;
        return eval(*e.b);
      }
      case expr::logic_not: return value(!eval(*e.a).truthy());
      case expr::cond: {
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : value::undefined_named("");
      }
      case expr::binary: return binary(e);
    }
    fail(e.line, "unknown expression");
  }

  value binary(const expr& e) {
    const std::string& op = e.name;
    const value a = eval(*e.a);
    const value b = eval(*e.b);
    if (op == "==") return value(a == b);
    if (op == "!=") return value(!(a == b));
    if (op == "<") return value(compare_values(a, b, e.line) < 0);
    if (op == "<=") return value(compare_values(a, b, e.line) <= 0);
    if (op == ">") return value(compare_values(a, b, e.line) > 0);
    if (op == ">=") return value(compare_values(a, b, e.line) >= 0);
    if (op == "in" || op == "not in") {
      bool r = false;
      if (b.is_string()) {
        if (!a.is_string()) fail(e.line, "'in <string>' requires string as left operand, not " + a.type_name());
        r = b.str().find(a.str()) != std::string::npos;
      } else if (b.is_list()) {
        r = std::find(b.items().begin(), b.items().end(), a) != b.items().end();
      } else if (b.is_dict()) {
        r = a.is_string() && b.find(a.str()) != nullptr;
      } else if (b.is_undefined()) {
        r = false;
      } else {
        fail(e.line, "argument of type '" + b.type_name() + "' is not iterable");
      }
      return value(op == "in" ? r : !r);
    }
    if (op == "~") return value(a.to_str() + b.to_str());
    const bool nums = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
    if (op == "+") {
      if ((a.is_markup() && b.is_string()) || (a.is_string() && b.is_markup())) {  // markupsafe escapes the plain side
        return value::markup((a.is_markup() ? a.str() : html_escape(a.str())) + (b.is_markup() ? b.str() : html_escape(b.str())));
      }
      if (nums) return (a.is_real() || b.is_real()) ? value(a.as_number() + b.as_number()) : value(a.as_int() + b.as_int());
      if (a.is_string() && b.is_string()) return value(a.str() + b.str());
      if (a.is_list() && b.is_list()) {
        list l = a.items();
        l.insert(l.end(), b.items().begin(), b.items().end());
        return value(std::move(l));
      }
    } else if (op == "-") {
      if (nums) return (a.is_real() || b.is_real()) ? value(a.as_number() - b.as_number()) : value(a.as_int() - b.as_int());
    } else if (op == "*") {
      if (nums) return (a.is_real() || b.is_real()) ? value(a.as_number() * b.as_number()) : value(a.as_int() * b.as_int());
      const auto repeat = [&](const value& s, const value& n) {
        std::string out;
        for (int64_t i = 0; i < n.as_int(); ++i) {
          out += s.str();
          if (out.size() > opt_.max_output) fail(e.line, "a repeated string exceeds the output limit");
        }
        return value(std::move(out));
      };
      if (a.is_string() && b.is_int()) return repeat(a, b);
      if (a.is_int() && b.is_string()) return repeat(b, a);
    } else if (op == "/") {
      if (nums) {
        if (b.as_number() == 0) fail(e.line, "division by zero");
        return value(a.as_number() / b.as_number());
      }
    } else if (op == "//" || op == "%") {
      if (nums) {
        if (b.as_number() == 0) fail(e.line, "integer division or modulo by zero");
        if (a.is_real() || b.is_real()) {
          const double q = std::floor(a.as_number() / b.as_number());
          return op == "//" ? value(q) : value(a.as_number() - q * b.as_number());
        }
        const int64_t x = a.as_int(), y = b.as_int();
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return op == "//" ? value(q) : value(x - q * y);
      }
      if (op == "%" && a.is_string()) {  // "%s" % x: printf-style with %s / %d
        const list args = b.is_list() ? b.items() : list{b};
        std::string out;
        size_t ai = 0;
        const std::string& f = a.str();
        for (size_t i = 0; i < f.size(); ++i) {
          if (f[i] != '%' || i + 1 >= f.size()) {
            out += f[i];
            continue;
          }
          const char c = f[++i];
          if (c == '%') {
            out += '%';
          } else if (c == 's' || c == 'd' || c == 'r') {
            if (ai >= args.size()) fail(e.line, "not enough arguments for format string");
            const value& x = args[ai++];
            out += c == 'r' ? x.repr() : c == 'd' ? std::to_string(static_cast<int64_t>(x.as_number())) : x.to_str();
          } else {
            fail(e.line, std::string("unsupported format character '") + c + "'");
          }
        }
        return value(std::move(out));
      }
    } else if (op == "**") {
      if (nums) {
        if (a.is_int() && b.is_int() && b.as_int() >= 0) {
          int64_t r = 1;
          for (int64_t i = 0; i < b.as_int() && i < 64; ++i) r *= a.as_int();
          return value(r);
        }
        return value(std::pow(a.as_number(), b.as_number()));
      }
    }
    fail(e.line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  }

  value get_item(const value& v, const value& key, int line) {
    if (v.is_dict()) {
      if (key.is_string()) {
        if (const value* x = v.find(key.str())) return *x;
        return method(v, key.str(), line);
      }
      if (const value* x = v.find(key.to_str())) return *x;
      return value::undefined_named(key.to_str());
    }
    if (v.is_list() || v.is_string()) {
      if (!key.is_int()) {
        if (key.is_string()) return method(v, key.str(), line);
        fail(line, "indices must be integers, not " + key.type_name());
      }
      const int64_t n = length_of(v, line);
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return value::undefined_named("[" + std::to_string(key.as_int()) + "]");
      if (v.is_list()) return v.items()[static_cast<size_t>(i)];
      return value(code_points(v.str())[static_cast<size_t>(i)]);
    }
    if (v.is_undefined()) fail(line, "'" + v.undefined_name() + "' is undefined");
    return value::undefined_named(key.to_str());
  }

  value get_attr(const value& v, const std::string& name, int line) {
    if (v.is_undefined()) fail(line, "'" + v.undefined_name() + "' is undefined (looking up ." + name + ")");
    // Python's attribute first (a dict's methods), then the item.
    value m = method(v, name, line);
    if (!m.is_undefined()) return m;
    if (v.is_dict()) {
      if (const value* x = v.find(name)) return *x;
      return value::undefined_named(name);
    }
    return value::undefined_named(name);
  }

  // A bound method of a string, list or dict; undefined when the type has none of that name.
  value method(const value& self, const std::string& name, int line) {
    const auto fn = [](auto f) { return value(function(std::move(f))); };
    if (self.is_string()) {
      const std::string s = self.str();
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const bool l = name != "rstrip", r = name != "lstrip";
        return fn([s, l, r](const call_args& a) { return value(strip_chars(s, a.get(0, "chars"), l, r)); });
      }
      if (name == "upper") return fn([s](const call_args&) { return value(upper(s)); });
      if (name == "lower") return fn([s](const call_args&) { return value(lower(s)); });
      if (name == "startswith" || name == "endswith") {
        const bool start = name == "startswith";
        return fn([s, start, line](const call_args& a) {
          const value* p = a.get(0, "prefix");
          if (p == nullptr) fail(line, "startswith / endswith take one argument");
          const list cands = p->is_list() ? p->items() : list{*p};
          for (const value& c : cands) {
            if (!c.is_string()) fail(line, "startswith / endswith take strings");
            const std::string& x = c.str();
            if (start ? s.compare(0, x.size(), x) == 0 && s.size() >= x.size()
                      : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0) {
              return value(true);
            }
          }
          return value(false);
        });
      }
      if (name == "split" || name == "rsplit") {
        return fn([s, line](const call_args& a) {
          const value* sep = a.get(0, "sep");
          const value* maxv = a.get(1, "maxsplit");
          const int64_t maxsplit = maxv && maxv->is_int() ? maxv->as_int() : -1;
          list out;
          if (sep == nullptr || sep->is_none()) {
            size_t i = 0;
            int64_t n = 0;
            while (i < s.size()) {
              while (i < s.size() && py_space(s[i])) ++i;
              if (i >= s.size()) break;
              if (maxsplit >= 0 && n >= maxsplit) {
                size_t e = s.size();
                while (e > i && py_space(s[e - 1])) --e;
                out.emplace_back(s.substr(i, e - i));
                break;
              }
              size_t j = i;
              while (j < s.size() && !py_space(s[j])) ++j;
              out.emplace_back(s.substr(i, j - i));
              ++n;
              i = j;
            }
            return value(std::move(out));
          }
          if (!sep->is_string() || sep->str().empty()) fail(line, "split: empty separator");
          const std::string& d = sep->str();
          size_t i = 0;
          int64_t n = 0;
          for (;;) {
            const size_t j = s.find(d, i);
            if (j == std::string::npos || (maxsplit >= 0 && n >= maxsplit)) {
              out.emplace_back(s.substr(i));
              break;
            }
            out.emplace_back(s.substr(i, j - i));
            i = j + d.size();
            ++n;
          }
          return value(std::move(out));
        });
      }
      if (name == "replace") {
        return fn([s, line](const call_args& a) {
          const value* o = a.get(0, "old");
          const value* n = a.get(1, "new");
          if (!o || !n || !o->is_string() || !n->is_string()) fail(line, "replace takes two strings");
          const value* c = a.get(2, "count");
          return value(replace_all(s, o->str(), n->str(), c && c->is_int() ? c->as_int() : -1));
        });
      }
      if (name == "find" || name == "rfind" || name == "count" || name == "index") {
        return fn([s, name, line](const call_args& a) {
          const value* x = a.get(0, "sub");
          if (!x || !x->is_string()) fail(line, name + " takes a string");
          if (name == "count") {
            int64_t n = 0;
            if (x->str().empty()) return value(str_len(s) + 1);
            for (size_t p = s.find(x->str()); p != std::string::npos; p = s.find(x->str(), p + x->str().size())) ++n;
            return value(n);
          }
          const size_t p = name == "rfind" ? s.rfind(x->str()) : s.find(x->str());
          if (p == std::string::npos) {
            if (name == "index") fail(line, "substring not found");
            return value(int64_t{-1});
          }
          return value(str_len(s.substr(0, p)));
        });
      }
      if (name == "join") {
        return fn([s, line](const call_args& a) {
          const value* it = a.get(0, "iterable");
          if (!it) fail(line, "join takes an iterable");
          std::string out;
          bool first = true;
          for (const value& x : iterate(*it, line)) {
            if (!x.is_string()) fail(line, "sequence item: expected str instance, " + x.type_name() + " found");
            if (!first) out += s;
            out += x.str();
            check_size(out.size());
            first = false;
          }
          return value(std::move(out));
        });
      }
      if (name == "title") return fn([s](const call_args&) { return value(title_case(s)); });
      if (name == "capitalize") return fn([s](const call_args&) { return value(capitalize(s)); });
      if (name == "splitlines") {
        return fn([s](const call_args&) {
          list out;
          size_t i = 0;
          while (i < s.size()) {
            size_t j = i;
            while (j < s.size() && s[j] != '\n' && s[j] != '\r') ++j;
            out.emplace_back(s.substr(i, j - i));
            if (j < s.size() && s[j] == '\r' && j + 1 < s.size() && s[j + 1] == '\n') ++j;
            i = j + 1;
          }
          return value(std::move(out));
        });
      }
      if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isupper" || name == "islower" || name == "isalnum") {
        return fn([s, name](const call_args&) {
          if (s.empty()) return value(false);
          bool cased = false;
          for (const char ch : s) {
            const auto c = static_cast<unsigned char>(ch);
            if (name == "isdigit" && !std::isdigit(c)) return value(false);
            if (name == "isalpha" && !std::isalpha(c)) return value(false);
            if (name == "isalnum" && !std::isalnum(c)) return value(false);
            if (name == "isspace" && !py_space(ch)) return value(false);
            if (name == "isupper" && std::islower(c)) return value(false);
            if (name == "islower" && std::isupper(c)) return value(false);
            cased = cased || std::isalpha(c);
          }
          return value(name == "isupper" || name == "islower" ? cased : true);
        });
      }
      if (name == "removeprefix" || name == "removesuffix") {
        const bool pre = name == "removeprefix";
        return fn([s, pre, line](const call_args& a) {
          const value* x = a.get(0, "fix");
          if (!x || !x->is_string()) fail(line, "removeprefix / removesuffix take a string");
          const std::string& f = x->str();
          if (pre && s.compare(0, f.size(), f) == 0) return value(s.substr(f.size()));
          if (!pre && s.size() >= f.size() && s.compare(s.size() - f.size(), f.size(), f) == 0) return value(s.substr(0, s.size() - f.size()));
          return value(s);
        });
      }
      if (name == "format") {
        return fn([s, line](const call_args& a) {
          std::string out;
          size_t ai = 0;
          for (size_t i = 0; i < s.size(); ++i) {
            if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') { out += '{'; ++i; continue; }
            if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') { out += '}'; ++i; continue; }
            if (s[i] != '{') { out += s[i]; continue; }
            const size_t j = s.find('}', i);
            if (j == std::string::npos) fail(line, "format: single '{'");
            const std::string field = s.substr(i + 1, j - i - 1);
            const value* v = nullptr;
            if (field.empty()) v = ai < a.pos.size() ? &a.pos[ai++] : nullptr;
            else if (std::isdigit(static_cast<unsigned char>(field[0]))) v = field.size() < 6 ? a.get(static_cast<size_t>(std::stoul(field)), "") : nullptr;
            else v = a.get(SIZE_MAX, field);
            if (!v) fail(line, "format: no value for {" + field + "}");
            out += v->to_str();
            i = j;
          }
          return value(std::move(out));
        });
      }
      return value::undefined_named(name);
    }
    if (self.is_dict()) {
      if (is_namespace(self)) return value::undefined_named(name);
      if (name == "items") {
        return fn([self](const call_args&) {
          list out;
          for (const auto& [k, v] : self.entries()) out.push_back(value::tuple(list{value(k), v}));
          return value(std::move(out));
        });
      }
      if (name == "keys") {
        return fn([self](const call_args&) {
          list out;
          for (const auto& [k, v] : self.entries()) out.emplace_back(k);
          return value(std::move(out));
        });
      }
      if (name == "values") {
        return fn([self](const call_args&) {
          list out;
          for (const auto& [k, v] : self.entries()) out.push_back(v);
          return value(std::move(out));
        });
      }
      if (name == "get") {
        return fn([self](const call_args& a) {
          const value* k = a.get(0, "key");
          const value* d = a.get(1, "default");
          if (k && k->is_string()) {
            if (const value* x = self.find(k->str())) return *x;
          }
          return d ? *d : value::none();
        });
      }
      if (opt_.mutable_values && (name == "update" || name == "pop" || name == "setdefault")) {
        return fn([this, target = self, name, line](const call_args& a) mutable {
          if (name == "update") {
            const value* o = a.get(0, "other");
            if (o && o->is_dict()) {
              for (const auto& [k, v] : o->entries()) target.set(k, fresh(v, line));
            }
            return value::none();
          }
          const value* k = a.get(0, "key");
          const value* d = a.get(1, "default");
          if (!k || !k->is_string()) fail(line, "dict." + name + " takes a string key");
          if (const value* x = target.find(k->str())) {
            value out = *x;
            if (name == "pop") {
              dict& e = target.entries();
              e.erase(std::find_if(e.begin(), e.end(), [&](const auto& kv) { return kv.first == k->str(); }));
            }
            return out;
          }
          if (name == "pop" && !d) fail(line, "KeyError: " + k->repr());
          const value v = d ? *d : value::none();
          if (name == "setdefault") target.set(k->str(), fresh(v, line));
          return v;
        });
      }
      if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" || name == "popitem") {
        return sandboxed(name, "dict", line);
      }
      return value::undefined_named(name);
    }
    if (self.is_list()) {
      if (opt_.mutable_values && (name == "append" || name == "pop" || name == "insert" || name == "extend" || name == "clear")) {
        return fn([this, target = self, name, line](const call_args& a) mutable {
          list& items = target.items();
          const value* x = a.get(0, "value");
          if (name == "append") {
            if (!x) fail(line, "list.append takes a value");
            items.push_back(fresh(*x, line));
          } else if (name == "extend") {
            if (!x || !x->is_list()) fail(line, "list.extend takes a list");
            const list more = x->items();
            for (const value& m : more) items.push_back(fresh(m, line));
          } else if (name == "clear") {
            items.clear();
          } else if (name == "insert") {
            const value* v = a.get(1, "value");
            if (!x || !x->is_int() || !v) fail(line, "list.insert takes an index and a value");
            int64_t i = x->as_int();
            const int64_t n = static_cast<int64_t>(items.size());
            i = i < 0 ? std::max<int64_t>(0, n + i) : std::min(i, n);
            items.insert(items.begin() + i, fresh(*v, line));
          } else if (name == "pop") {
            if (items.empty()) fail(line, "IndexError: pop from empty list");
            int64_t i = x && x->is_int() ? x->as_int() : -1;
            const int64_t n = static_cast<int64_t>(items.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) fail(line, "IndexError: pop index out of range");
            value out = items[static_cast<size_t>(i)];
            items.erase(items.begin() + i);
            return out;
          }
          if (items.size() > opt_.max_output) fail(line, "a list grows past the output limit (" + std::to_string(opt_.max_output) + ")");
          return value::none();
        });
      }
      if (name == "append" || name == "pop" || name == "insert" || name == "extend" || name == "remove" || name == "sort" ||
          name == "reverse" || name == "clear") {
        return sandboxed(name, "list", line);
      }
      if (name == "index" || name == "count") {
        const bool count = name == "count";
        return fn([self, count, line](const call_args& a) {
          const value* x = a.get(0, "value");
          if (!x) fail(line, "index / count take a value");
          int64_t n = 0;
          for (size_t i = 0; i < self.items().size(); ++i) {
            if (self.items()[i] == *x) {
              if (!count) return value(static_cast<int64_t>(i));
              ++n;
            }
          }
          if (!count) fail(line, x->repr() + " is not in list");
          return value(n);
        });
      }
      return value::undefined_named(name);
    }
    return value::undefined_named(name);
  }

  // A container stored into another by a mutating method is a copy of it, so that no list or dict can come
  // to hold itself (a cycle would never print).
  // Each copied value is a step (a list built of shared halves is cheap to make and costly to copy).
  value fresh(const value& v, int line, int depth = 0) {
    if (depth > opt_.max_depth) fail(line, "a value nests deeper than " + std::to_string(opt_.max_depth) + " levels");
    step(line);
    if (v.is_list()) {
      list out;
      for (const value& x : v.items()) out.push_back(fresh(x, line, depth + 1));
      value c(std::move(out));
      return v.is_tuple() ? value::tuple(c.items()) : c;
    }
    if (v.is_dict()) {
      dict out;
      for (const auto& [k, x] : v.entries()) out.emplace_back(k, fresh(x, line, depth + 1));
      return value(std::move(out));
    }
    return v;
  }

  // The sandbox refuses what would modify a list or a dict (jinja2.sandbox.ImmutableSandboxedEnvironment).
  static value sandboxed(const std::string& name, const std::string& type, int line) {
    return value(function([name, type, line](const call_args&) -> value {
      fail(line, "access to attribute '" + name + "' of '" + type + "' object is unsafe.");
    }));
  }

  static std::string replace_all(const std::string& s, const std::string& o, const std::string& n, int64_t count) {
    if (o.empty()) {  // Python inserts between characters
      std::string out;
      int64_t done = 0;
      for (const std::string& c : code_points(s)) {
        if (count < 0 || done < count) {
          out += n;
          ++done;
        }
        out += c;
        check_size(out.size());
      }
      if (count < 0 || done < count) out += n;
      return out;
    }
    std::string out;
    size_t i = 0;
    int64_t done = 0;
    for (;;) {
      const size_t j = s.find(o, i);
      if (j == std::string::npos || (count >= 0 && done >= count)) {
        out += s.substr(i);
        return out;
      }
      out += s.substr(i, j - i) + n;
      check_size(out.size());
      i = j + o.size();
      ++done;
    }
  }
  static std::string title_case(const std::string& s) {
    std::string out = s;
    bool prev_alpha = false;
    for (char& c : out) {
      const auto u = static_cast<unsigned char>(c);
      c = static_cast<char>(prev_alpha ? std::tolower(u) : std::toupper(u));
      prev_alpha = std::isalpha(u) != 0;
    }
    return out;
  }
  static std::string capitalize(const std::string& s) {
    std::string out = lower(s);
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return out;
  }

  // ---- filters ----

  value attribute_of(const value& v, const value& path, int line) {
    value cur = v;
    const std::string p = path.to_str();
    size_t i = 0;
    while (i <= p.size()) {
      const size_t j = p.find('.', i);
      const std::string key = p.substr(i, j == std::string::npos ? std::string::npos : j - i);
      if (cur.is_undefined()) return cur;
      bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      digits = digits && key.size() < 12;
      cur = digits && cur.is_list() ? get_item(cur, value(static_cast<int64_t>(std::stoll(key))), line)
            : cur.is_dict()       ? (cur.find(key) ? *cur.find(key) : value::undefined_named(key))
                                  : value::undefined_named(key);
      if (j == std::string::npos) break;
      i = j + 1;
    }
    return cur;
  }

  value apply_filter(const expr& e) {
    const value v = eval(*e.a);
    call_args a = arguments(e);
    const int line = e.line;
    const std::string& f = e.name;
    const auto arg = [&](size_t i, const char* name) { return a.get(i, name); };
    if (f == "safe") return v.is_markup() ? v : value::markup(v.to_str());
    if (f == "string" && v.is_string()) return v;
    if (f == "string") return value(v.to_str());
    if (f == "tojson") {
      const value* ind = arg(0, "indent");
      const value* seps = a.get(SIZE_MAX, "separators");
      const value* sk = a.get(SIZE_MAX, "sort_keys");
      const value* ea = a.get(SIZE_MAX, "ensure_ascii");
      const int indent = ind && ind->is_int() ? static_cast<int>(ind->as_int()) : -1;
      std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
      if (seps && seps->is_list() && seps->items().size() == 2) {
        item_sep = seps->items()[0].to_str();
        key_sep = seps->items()[1].to_str();
      }
      std::string out = to_json(v, indent, item_sep, key_sep, sk && sk->truthy());
      if (ea && ea->truthy()) out = ascii_escape(out);
      return value(std::move(out));
    }
    if (f == "length" || f == "count") return value(length_of(v, line));
    if (f == "trim") return value(strip_chars(v.to_str(), arg(0, "chars"), true, true));
    if (f == "upper") return value(upper(v.to_str()));
    if (f == "lower") return value(lower(v.to_str()));
    if (f == "capitalize") return value(capitalize(v.to_str()));
    if (f == "title") return value(title_case(v.to_str()));
    if (f == "default" || f == "d") {
      const value* dflt = arg(0, "default_value");
      const value* boolean = arg(1, "boolean");
      const bool use = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
      return use ? (dflt ? *dflt : value(std::string())) : v;
    }
    if (f == "join") {
      const value* sep = arg(0, "d");
      const value* attr = arg(1, "attribute");
      std::string out;
      bool first = true;
      for (const value& x : iterate(v, line)) {
        if (!first) out += sep ? sep->to_str() : "";
        out += (attr ? attribute_of(x, *attr, line) : x).to_str();
        check_size(out.size());
        first = false;
      }
      return value(std::move(out));
    }
    if (f == "items") {
      if (v.is_undefined()) return value(list{});
      if (!v.is_dict()) fail(line, "items: expected a mapping, got " + v.type_name());
      list out;
      for (const auto& [k, x] : v.entries()) out.push_back(value::tuple(list{value(k), x}));
      return value(std::move(out));
    }
    if (f == "list") return value(iterate(v, line));  // a generator becomes a list
    if (f == "first") {
      const list l = iterate(v, line);
      return l.empty() ? value::undefined_named("first") : l.front();
    }
    if (f == "last") {
      if (v.is_generator()) fail(line, "'generator' object is not reversible");
      const list l = iterate(v, line);
      return l.empty() ? value::undefined_named("last") : l.back();
    }
    if (f == "reverse") {
      if (v.is_string()) {
        std::vector<std::string> cps = code_points(v.str());
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return value(std::move(out));
      }
      list l = iterate(v, line);
      std::reverse(l.begin(), l.end());
      return value(std::move(l));
    }
    if (f == "unique") {
      list out;
      for (const value& x : iterate(v, line)) {
        if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
      }
      return value::generator(std::move(out));
    }
    if (f == "sort") {
      list l = iterate(v, line);
      const value* rev = arg(0, "reverse");
      const value* attr = a.get(SIZE_MAX, "attribute");
      std::stable_sort(l.begin(), l.end(), [&](const value& x, const value& y) {
        const value kx = attr ? attribute_of(x, *attr, line) : x, ky = attr ? attribute_of(y, *attr, line) : y;
        const value lx = kx.is_string() ? value(lower(kx.str())) : kx, ly = ky.is_string() ? value(lower(ky.str())) : ky;
        return compare_values(lx, ly, line) < 0;
      });
      if (rev && rev->truthy()) std::reverse(l.begin(), l.end());
      return value(std::move(l));
    }
    if (f == "dictsort") {
      if (!v.is_dict()) fail(line, "dictsort: expected a mapping");
      const value* cs = arg(0, "case_sensitive");
      const value* by = arg(1, "by");
      const value* rev = arg(2, "reverse");
      list l;
      for (const auto& [k, x] : v.entries()) l.push_back(value::tuple(list{value(k), x}));
      const bool by_value = by && by->is_string() && by->str() == "value";
      std::stable_sort(l.begin(), l.end(), [&](const value& x, const value& y) {
        value kx = x.items()[by_value ? 1 : 0], ky = y.items()[by_value ? 1 : 0];
        if (!(cs && cs->truthy())) {
          if (kx.is_string()) kx = value(lower(kx.str()));
          if (ky.is_string()) ky = value(lower(ky.str()));
        }
        return compare_values(kx, ky, line) < 0;
      });
      if (rev && rev->truthy()) std::reverse(l.begin(), l.end());
      return value(std::move(l));
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool keep_true = f == "selectattr" || f == "select";
      size_t ti = 0;
      value attr;
      if (by_attr) {
        if (a.pos.empty()) fail(line, f + " needs an attribute");
        attr = a.pos[0];
        ti = 1;
      }
      list out;
      if (!v.truthy()) return value::generator({});  // Jinja2 yields nothing for a false sequence (None)
      for (const value& x : iterate(v, line)) {
        const value subject = by_attr ? attribute_of(x, attr, line) : x;
        bool r;
        if (a.pos.size() > ti) {
          call_args targs;
          for (size_t i = ti + 1; i < a.pos.size(); ++i) targs.pos.push_back(a.pos[i]);
          r = run_test(a.pos[ti].to_str(), subject, targs, line);
        } else {
          r = subject.truthy();
        }
        if (r == keep_true) out.push_back(x);
      }
      return value::generator(std::move(out));
    }
    if (f == "map") {
      list out;
      if (!v.truthy()) return value::generator({});
      const value* attr = a.get(SIZE_MAX, "attribute");
      const value* dflt = a.get(SIZE_MAX, "default");
      for (const value& x : iterate(v, line)) {
        if (attr) {
          value r = attribute_of(x, *attr, line);
          if (r.is_undefined() && dflt) r = *dflt;
          out.push_back(r);
        } else {
          if (a.pos.empty()) fail(line, "map needs a filter name or attribute=");
          call_args fa;
          for (size_t i = 1; i < a.pos.size(); ++i) fa.pos.push_back(a.pos[i]);
          out.push_back(filter_by_name(a.pos[0].to_str(), x, fa, line));
        }
      }
      return value::generator(std::move(out));
    }
    if (f == "indent") {
      const value* width = arg(0, "width");
      const value* first = arg(1, "first");
      const value* blank = arg(2, "blank");
      const int64_t w = width && !width->is_string() ? width->as_int() : 4;
      if (w < 0) fail(line, "indent: a negative width");
      check_size(static_cast<size_t>(w));
      const std::string pad = width && width->is_string() ? width->str() : std::string(static_cast<size_t>(w), ' ');
      const std::string s = v.to_str();
      std::string out;
      size_t i = 0;
      bool first_line = true;
      while (i <= s.size()) {
        size_t j = s.find('\n', i);
        const std::string ln = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
        const bool indent_it = first_line ? (first && first->truthy()) : (!ln.empty() || (blank && blank->truthy()));
        if (indent_it) out += pad;
        out += ln;
        check_size(out.size());
        if (j == std::string::npos) break;
        out += '\n';
        i = j + 1;
        first_line = false;
      }
      return value(std::move(out));
    }
    if (f == "replace") {
      const value* o = arg(0, "old");
      const value* n = arg(1, "new");
      const value* c = arg(2, "count");
      if (!o || !n) fail(line, "replace takes two arguments");
      return value(replace_all(v.to_str(), o->to_str(), n->to_str(), c && c->is_int() ? c->as_int() : -1));
    }
    if (f == "int") {
      if (v.is_int() || v.is_bool()) return value(v.as_int());
      if (v.is_real()) return value(static_cast<int64_t>(v.as_number()));
      if (v.is_string()) {
        try {
          return value(static_cast<int64_t>(std::stoll(v.str())));
        } catch (...) {
        }
      }
      const value* d = arg(0, "default");
      return d ? *d : value(int64_t{0});
    }
    if (f == "float") {
      if (v.is_number() || v.is_bool()) return value(v.as_number());
      if (v.is_string()) {
        try {
          return value(std::stod(v.str()));
        } catch (...) {
        }
      }
      const value* d = arg(0, "default");
      return d ? *d : value(0.0);
    }
    if (f == "abs") {
      if (v.is_int()) return value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      if (v.is_real()) return value(std::fabs(v.as_number()));
      fail(line, "bad operand type for abs()");
    }
    if (f == "round") {
      const value* prec = arg(0, "precision");
      const double m = std::pow(10.0, prec ? static_cast<double>(prec->as_int()) : 0.0);
      return value(std::nearbyint(v.as_number() * m) / m);  // Python's round: halves to even
    }
    if (f == "sum") {
      value total(int64_t{0});
      const value* attr = a.get(SIZE_MAX, "attribute");
      for (const value& x : iterate(v, line)) {
        const value y = attr ? attribute_of(x, *attr, line) : x;
        total = total.is_real() || y.is_real() ? value(total.as_number() + y.as_number()) : value(total.as_int() + y.as_int());
      }
      return total;
    }
    if (f == "min" || f == "max") {
      const list l = iterate(v, line);
      if (l.empty()) return value::undefined_named(f);
      value best = l[0];
      for (const value& x : l) {
        const int c = compare_values(x, best, line);
        if (f == "min" ? c < 0 : c > 0) best = x;
      }
      return best;
    }
    if (f == "attr") {
      const value* n = arg(0, "name");
      if (!n) fail(line, "attr needs a name");
      return get_attr(v, n->to_str(), line);
    }
    if (f == "e" || f == "escape") return v.is_markup() ? v : value::markup(html_escape(v.to_str()));
    if (f == "forceescape") return value::markup(html_escape(v.to_str()));
    if (f == "wordcount") return value(static_cast<int64_t>(iterate(method(v.is_string() ? v : value(v.to_str()), "split", line).fn()({}), line).size()));
    if (f == "center") {
      const value* w = arg(0, "width");
      const std::string s = v.to_str();
      const int64_t width = w ? w->as_int() : 80, n = str_len(s);
      if (width <= n) return value(s);
      check_size(static_cast<size_t>(width));
      const int64_t total = width - n, left = total / 2 + (total & width & 1);
      return value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(total - left), ' '));
    }
    if (f == "batch") {
      const value* n = arg(0, "linecount");
      if (!n || !n->is_int() || n->as_int() <= 0) fail(line, "batch needs a positive count");
      list out, cur;
      for (const value& x : iterate(v, line)) {
        cur.push_back(x);
        if (static_cast<int64_t>(cur.size()) == n->as_int()) {
          out.emplace_back(cur);
          cur.clear();
        }
      }
      if (!cur.empty()) out.emplace_back(cur);
      return value(std::move(out));
    }
    if (f == "format") {
      call_args fa;
      fa.pos = a.pos;
      return binary_format(v.to_str(), fa, line);
    }
    fail(line, "no filter named '" + f + "'");
  }

  value binary_format(const std::string& fmt, const call_args& a, int line) {
    auto e = std::make_shared<expr>();
    e->k = expr::binary;
    e->name = "%";
    e->line = line;
    auto l = std::make_shared<expr>();
    l->lit = value(fmt);
    auto r = std::make_shared<expr>();
    r->lit = value(a.pos);
    e->a = l;
    e->b = r;
    return binary(*e);
  }

  // A filter by name over a value (map("upper"), select's tests use run_test).
  value filter_by_name(const std::string& name, const value& v, const call_args& fa, int line) {
    auto e = std::make_shared<expr>();
    e->k = expr::filter;
    e->name = name;
    e->line = line;
    auto lit = std::make_shared<expr>();
    lit->lit = v;
    e->a = lit;
    for (const value& x : fa.pos) {
      auto p = std::make_shared<expr>();
      p->lit = x;
      e->args.push_back(p);
    }
    return apply_filter(*e);
  }

  static std::string ascii_escape(const std::string& json) {
    std::string out;
    for (size_t i = 0; i < json.size();) {
      const utf8_unit u = utf8_decode(json, i);
      if (u.cp < 0x80 || u.cp == invalid_code_point) {  // ASCII, or a byte that is not UTF-8: as it is
        out += json[i++];
        continue;
      }
      uint32_t cp = u.cp;
      i += u.len;
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      out += b;
    }
    return out;
  }

  // ---- tests ----

  bool apply_test(const expr& e) {
    if (e.name == "defined" || e.name == "undefined") {
      const bool defined = !eval(*e.a).is_undefined();
      return e.name == "defined" ? defined : !defined;
    }
    const value v = eval(*e.a);
    return run_test(e.name, v, arguments(e), e.line);
  }

  bool run_test(const std::string& t, const value& v, const call_args& a, int line) {
    const value* x = a.pos.empty() ? nullptr : &a.pos[0];
    const auto need = [&] {
      if (!x) fail(line, "test '" + t + "' needs an argument");
      return *x;
    };
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "boolean") return v.is_bool();
    if (t == "true") return v.is_bool() && v.as_bool();
    if (t == "false") return v.is_bool() && !v.as_bool();
    if (t == "integer") return v.is_int();
    if (t == "float") return v.is_real();
    if (t == "number") return v.is_number() || v.is_bool();
    if (t == "string") return v.is_string();
    if (t == "mapping") return v.is_dict();
    if (t == "sequence") return v.is_list() || v.is_string() || v.is_dict();
    if (t == "iterable") return v.is_list() || v.is_string() || v.is_dict();
    if (t == "callable") return v.is_function();
    if (t == "sameas") {
      const value o = need();
      if (v.is_none() || v.is_bool() || o.is_none() || o.is_bool()) return v.type() == o.type() && v == o;
      return v.type() == o.type() && v == o;
    }
    if (t == "eq" || t == "equalto" || t == "==") return v == need();
    if (t == "ne" || t == "!=") return !(v == need());
    if (t == "lt" || t == "lessthan" || t == "<") return compare_values(v, need(), line) < 0;
    if (t == "le" || t == "<=") return compare_values(v, need(), line) <= 0;
    if (t == "gt" || t == "greaterthan" || t == ">") return compare_values(v, need(), line) > 0;
    if (t == "ge" || t == ">=") return compare_values(v, need(), line) >= 0;
    if (t == "in") {
      const value o = need();
      if (o.is_list()) return std::find(o.items().begin(), o.items().end(), v) != o.items().end();
      if (o.is_string()) return v.is_string() && o.str().find(v.str()) != std::string::npos;
      if (o.is_dict()) return v.is_string() && o.find(v.str()) != nullptr;
      return false;
    }
    if (t == "odd" || t == "even") {
      if (!v.is_int()) fail(line, "odd / even need an integer");
      return (v.as_int() % 2 != 0) == (t == "odd");
    }
    if (t == "divisibleby") {
      const value o = need();
      if (!v.is_int() || !o.is_int() || o.as_int() == 0) fail(line, "divisibleby needs integers");
      return v.as_int() % o.as_int() == 0;
    }
    if (t == "lower") return v.is_string() && lower(v.str()) == v.str();
    if (t == "upper") return v.is_string() && upper(v.str()) == v.str();
    if (t == "escaped") return false;
    if (t == "filter" || t == "test") return false;
    fail(line, "no test named '" + t + "'");
  }

  // ---- globals ----

  void globals() {
    globals_["raise_exception"] = value(function([](const call_args& a) -> value {
      throw error(a.pos.empty() ? std::string("raise_exception") : a.pos[0].to_str());
    }));
    const int64_t fixed = opt_.fixed_time;
    globals_["strftime_now"] = value(function([fixed](const call_args& a) -> value {
      const value* f = a.get(0, "format");
      if (!f || !f->is_string()) throw error("strftime_now needs a format string");
      const std::time_t t = fixed >= 0 ? static_cast<std::time_t>(fixed) : std::time(nullptr);
      std::tm tm{};
      if (fixed >= 0) gmtime_r(&t, &tm);
      else localtime_r(&t, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, f->str().c_str(), &tm);
      return value(std::string(buf, n));
    }));
    globals_["range"] = value(function([](const call_args& a) -> value {
      int64_t start = 0, stop = 0, st = 1;
      if (a.pos.size() == 1) {
        stop = a.pos[0].as_int();
      } else if (a.pos.size() >= 2) {
        start = a.pos[0].as_int();
        stop = a.pos[1].as_int();
        if (a.pos.size() >= 3) st = a.pos[2].as_int();
      } else {
        throw error("range expected at least 1 argument");
      }
      if (st == 0) throw error("range() arg 3 must not be zero");
      list out;
      for (int64_t i = start; st > 0 ? i < stop : i > stop; i += st) {
        out.emplace_back(i);
        if (out.size() > 100'000) throw error("range: more than 100000 items");
      }
      return value(std::move(out));
    }));
    globals_["namespace"] = value(function([](const call_args& a) -> value {
      value ns{dict{}};
      ns.set("\x01namespace", value(true));
      if (!a.pos.empty() && a.pos[0].is_dict()) {
        for (const auto& [k, v] : a.pos[0].entries()) ns.set(k, v);
      }
      for (const auto& [k, v] : a.kw) ns.set(k, v);
      return ns;
    }));
    globals_["dict"] = value(function([](const call_args& a) -> value {
      value d{dict{}};
      if (!a.pos.empty() && a.pos[0].is_dict()) {
        for (const auto& [k, v] : a.pos[0].entries()) d.set(k, v);
      }
      for (const auto& [k, v] : a.kw) d.set(k, v);
      return d;
    }));
  }

  const options& opt_;
  std::vector<scope> scopes_;
  std::map<std::string, value, std::less<>> globals_;
  uint64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

template_ template_::parse(std::string_view source, const options& opt) {
  template_ t;
  t.root_ = parse_template(source, opt);
  t.opt_ = opt;
  return t;
}

std::string template_::render(const value& context) const {
  if (!context.is_dict()) throw error("render: the context must be a mapping");
  renderer r(opt_, context);
  std::string out;
  try {
    r.run(*root_, out);
  } catch (const loop_break&) {
    throw error("break outside a loop");
  } catch (const loop_continue&) {
    throw error("continue outside a loop");
  }
  return out;
}

std::string template_::render(const nlohmann::ordered_json& context) const { return render(from_json(context)); }

static value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > 256) throw error("the template's context nests deeper than 256 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return value::none();
    case nlohmann::ordered_json::value_t::boolean: return value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      list l;
      for (const auto& x : j) l.push_back(from_json_at(x, depth + 1));
      return value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      value d{dict{}};
      for (auto it = j.begin(); it != j.end(); ++it) d.set(it.key(), from_json_at(it.value(), depth + 1));
      return d;
    }
    default: return value();
  }
}

value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

}  // namespace troupe::llm::jinja
