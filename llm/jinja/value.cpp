#include "llm/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace troupe::llm::jinja {

const value* call_args::get(size_t i, std::string_view name) const {
  for (const auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return i < pos.size() ? &pos[i] : nullptr;
}

bool value::truthy() const {
  switch (k_) {
    case kind::undefined:
    case kind::none: return false;
    case kind::boolean:
    case kind::integer: return i_ != 0;
    case kind::real: return d_ != 0.0;
    case kind::string: return !s_->empty();
    case kind::list: return flag_ == 1 || !l_->empty();  // a generator is always true
    case kind::dict: return !d2_->empty();
    case kind::function: return true;
  }
  return false;
}

const value* value::find(std::string_view key) const {
  if (k_ != kind::dict) return nullptr;
  for (const auto& [k, v] : *d2_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void value::set(const std::string& key, value v) {
  for (auto& [k, x] : *d2_) {
    if (k == key) {
      x = std::move(v);
      return;
    }
  }
  d2_->emplace_back(key, std::move(v));
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest %.*e that reads back, then Python's choice of notation: scientific below 1e-4 or from 1e16.
  char buf[64];
  int prec = 0;
  for (prec = 0; prec < 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::snprintf(buf, sizeof buf, "%.*e", prec, d);
  std::string s = buf;
  const size_t e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  bool neg = false;
  for (size_t i = 0; i < e; ++i) {
    if (s[i] == '-') neg = true;
    else if (s[i] != '.') digits += s[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    return out;
  }
  const auto int_digits = static_cast<size_t>(exp + 1);
  if (digits.size() <= int_digits) {
    out += digits + std::string(int_digits - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
  }
  return out;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += ch;
    }
  }
  return out + q;
}

std::string value::to_str() const {
  switch (k_) {
    case kind::undefined: return "";
    case kind::none: return "None";
    case kind::boolean: return i_ ? "True" : "False";
    case kind::integer: return std::to_string(i_);
    case kind::real: return float_repr(d_);
    case kind::string: return *s_;
    default: return repr();
  }
}

std::string value::repr() const {
  switch (k_) {
    case kind::string: return flag_ == 1 ? "Markup(" + string_repr(*s_) + ")" : string_repr(*s_);
    case kind::list: {
      if (flag_ == 1) return "<generator object>";
      const bool tup = flag_ == 2;
      std::string out = tup ? "(" : "[";
      for (size_t i = 0; i < l_->size(); ++i) out += (i ? ", " : "") + (*l_)[i].repr();
      if (tup && l_->size() == 1) out += ",";
      return out + (tup ? ")" : "]");
    }
    case kind::dict: {
      std::string out = "{";
      for (size_t i = 0; i < d2_->size(); ++i) out += (i ? ", " : "") + string_repr((*d2_)[i].first) + ": " + (*d2_)[i].second.repr();
      return out + "}";
    }
    case kind::function: return "<function>";
    default: return to_str();
  }
}


std::string value::type_name() const {
  switch (k_) {
    case kind::undefined: return "Undefined";
    case kind::none: return "NoneType";
    case kind::boolean: return "bool";
    case kind::integer: return "int";
    case kind::real: return "float";
    case kind::string: return flag_ == 1 ? "Markup" : "str";
    case kind::list: return flag_ == 1 ? "generator" : flag_ == 2 ? "tuple" : "list";
    case kind::dict: return "dict";
    case kind::function: return "function";
  }
  return "object";
}

bool operator==(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) {  // Python: True == 1, 1 == 1.0
    if (a.is_real() || b.is_real()) return a.as_number() == b.as_number();
    return a.as_int() == b.as_int();
  }
  if ((a.is_bool() && b.is_number()) || (a.is_number() && b.is_bool())) return a.as_number() == b.as_number();
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case value::kind::undefined:
    case value::kind::none: return true;
    case value::kind::boolean: return a.as_bool() == b.as_bool();
    case value::kind::string: return a.str() == b.str();
    case value::kind::list: return a.items() == b.items();
    case value::kind::dict: {
      if (a.entries().size() != b.entries().size()) return false;
      for (const auto& [k, v] : a.entries()) {
        const value* o = b.find(k);
        if (o == nullptr || !(*o == v)) return false;
      }
      return true;
    }
    case value::kind::function: return a.f_ == b.f_;
    default: return false;
  }
}

namespace {

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void json_into(const value& v, int indent, int depth, const std::string& item_sep, const std::string& key_sep, bool sort_keys,
               std::string& out) {
  const auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out += std::string(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.type()) {
    case value::kind::undefined: throw error("tojson: Object of type Undefined is not JSON serializable");
    case value::kind::none: out += "null"; return;
    case value::kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case value::kind::integer: out += std::to_string(v.as_int()); return;
    case value::kind::real: {
      const double d = v.as_number();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return;
    }
    case value::kind::string: json_string(v.str(), out); return;
    case value::kind::list: {
      if (v.is_generator()) throw error("tojson: Object of type generator is not JSON serializable");
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_into(v.items()[i], indent, depth + 1, item_sep, key_sep, sort_keys, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case value::kind::dict: {
      if (v.entries().empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, value>*> order;
      for (const auto& e : v.entries()) order.push_back(&e);
      if (sort_keys) std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_string(order[i]->first, out);
        out += key_sep;
        json_into(order[i]->second, indent, depth + 1, item_sep, key_sep, sort_keys, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    case value::kind::function: throw error("tojson: a function is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const value& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys) {
  std::string out;
  json_into(v, indent, 0, item_sep, key_sep, sort_keys, out);
  return out;
}

}  // namespace troupe::llm::jinja
