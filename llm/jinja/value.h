// The values of the Jinja engine (llm/jinja/jinja.h), with Python's semantics where chat templates rely on
// them: truthiness, None, integers apart from floats (and their printing), strings, lists, dicts in insertion
// order, undefined values; plus callables (builtins, macros, bound methods).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/error.h"

namespace troupe::llm::jinja {

// A template refuses (raise_exception, an undefined name used, a type error, a limit reached): its message
// is what the reference renderer would say in spirit, with the template's line.
class error : public troupe::error {
 public:
  using troupe::error::error;
};

class value;
using list = std::vector<value>;
using dict = std::vector<std::pair<std::string, value>>;  // insertion order, unique keys

// Positional and keyword arguments of a call.
struct call_args {
  std::vector<value> pos;
  std::vector<std::pair<std::string, value>> kw;
  const value* get(size_t i, std::string_view name) const;  // the i-th positional or the keyword name; null
};

using function = std::function<value(const call_args&)>;

class value {
 public:
  enum class kind { undefined, none, boolean, integer, real, string, list, dict, function };

  value() = default;  // undefined
  static value none() { value v; v.k_ = kind::none; return v; }
  value(bool b) : k_(kind::boolean), i_(b ? 1 : 0) {}
  value(int v) : k_(kind::integer), i_(v) {}
  value(int64_t v) : k_(kind::integer), i_(v) {}
  value(double v) : k_(kind::real), d_(v) {}
  value(std::string s) : k_(kind::string), s_(std::make_shared<std::string>(std::move(s))) {}
  value(const char* s) : value(std::string(s)) {}
  value(list l) : k_(kind::list), l_(std::make_shared<list>(std::move(l))) {}
  value(dict d) : k_(kind::dict), d2_(std::make_shared<dict>(std::move(d))) {}
  value(function f) : k_(kind::function), f_(std::make_shared<function>(std::move(f))) {}
  static value undefined_named(std::string name) { value v; v.s_ = std::make_shared<std::string>(std::move(name)); return v; }
  // A string marked safe (Python's markupsafe.Markup: `|safe`, `|escape`): a plain string added to it is
  // HTML-escaped first.
  static value markup(std::string s) { value v(std::move(s)); v.flag_ = 1; return v; }
  // The generator Jinja2's map / select / reject / selectattr / rejectattr give: iterable once, always true,
  // without a length, not JSON serializable.
  static value generator(list l) { value v(std::move(l)); v.flag_ = 1; return v; }
  // A tuple (a list that prints as Python's tuple: dict items, (a, b) literals, varargs).
  static value tuple(list l) { value v(std::move(l)); v.flag_ = 2; return v; }
  bool is_markup() const { return k_ == kind::string && flag_ == 1; }
  bool is_generator() const { return k_ == kind::list && flag_ == 1; }
  bool is_tuple() const { return k_ == kind::list && flag_ == 2; }

  kind type() const { return k_; }
  bool is_undefined() const { return k_ == kind::undefined; }
  bool is_none() const { return k_ == kind::none; }
  bool is_bool() const { return k_ == kind::boolean; }
  bool is_int() const { return k_ == kind::integer; }
  bool is_real() const { return k_ == kind::real; }
  bool is_number() const { return k_ == kind::integer || k_ == kind::real; }
  bool is_string() const { return k_ == kind::string; }
  bool is_list() const { return k_ == kind::list; }
  bool is_dict() const { return k_ == kind::dict; }
  bool is_function() const { return k_ == kind::function; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }
  double as_number() const { return k_ == kind::real ? d_ : static_cast<double>(i_); }
  const std::string& str() const { return *s_; }
  const list& items() const { return *l_; }
  list& items() { return *l_; }
  const dict& entries() const { return *d2_; }
  dict& entries() { return *d2_; }
  const function& fn() const { return *f_; }
  // The name an undefined value was looked up by ("" when unknown), for messages.
  std::string undefined_name() const { return s_ ? *s_ : std::string(); }

  // Python's truth: False, None, undefined, 0, 0.0, "", [] and {} are false.
  bool truthy() const;
  // dict lookup; null when absent (or not a dict).
  const value* find(std::string_view key) const;
  void set(const std::string& key, value v);  // a dict's key, added at the end or replaced in place

  // Python's str() and repr() of the value (undefined: "").
  std::string to_str() const;
  std::string repr() const;
  // Python's type name (errors): "str", "int", "list", "dict", "NoneType", ...
  std::string type_name() const;

  friend bool operator==(const value& a, const value& b);

 private:
  kind k_ = kind::undefined;
  uint8_t flag_ = 0;  // a string: 1 markup; a list: 1 a generator, 2 a tuple
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<list> l_;
  std::shared_ptr<dict> d2_;
  std::shared_ptr<function> f_;
};

// Python's repr of a float (the shortest digits that read back, "1.0", "1e-05", "1e+20").
std::string float_repr(double d);
// Python's repr of a string (quotes chosen as Python does).
std::string string_repr(const std::string& s);
// json.dumps(v, ensure_ascii=False, indent=indent (< 0: None), separators, sort_keys), as the reference's tojson.
std::string to_json(const value& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys);

}  // namespace troupe::llm::jinja
