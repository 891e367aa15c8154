// JSON grammars (grammar.h): any JSON object, and JSON Schema compiled to GBNF.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>

#include "llm/grammar.h"

namespace troupe::llm {
namespace {

using ojson = nlohmann::ordered_json;

// The shared JSON rules. Whitespace is bounded so a sampled answer cannot spend its tokens on blanks;
// numbers are bounded in length for the same reason.
constexpr std::string_view json_base = R"(ws ::= [ \t\n]{0,8}
json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
json-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-number ::= json-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
json-boolean ::= "true" | "false"
json-null ::= "null"
)";

const std::set<std::string, std::less<>> annotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "strict"};

std::string json_text(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

struct depth_guard {
  int& d;
  explicit depth_guard(int& x) : d(x) { ++d; }
  ~depth_guard() { --d; }
  depth_guard(const depth_guard&) = delete;
  depth_guard& operator=(const depth_guard&) = delete;
};

class schema_compiler {
 public:
  schema_compiler(const ojson& root, std::string name) : root_(root), name_(std::move(name)) {}

  // The rules: `name ::= ...` and its helpers (named name-...), without the shared JSON rules.
  std::string run() {
    const std::string body = expr(root_, "");
    std::string out = name_ + " ::= " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

 private:
  [[noreturn]] static void refuse(const std::string& path, const std::string& what) {
    throw grammar_error("json_schema: " + what + (path.empty() ? std::string(" (at the top level)") : " at '" + path + "'"));
  }

  static std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

  std::string new_rule(const std::string& hint, std::string body) {
    std::string base = name_ + "-s";
    for (const char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? c : '-';
    std::string name = base;
    for (int i = 2; rules_.count(name) != 0 || taken_.count(name) != 0; ++i) name = base + "-" + std::to_string(i);
    rules_.emplace(name, std::move(body));
    return name;
  }

  static void check_keywords(const ojson& s, const std::string& path, std::initializer_list<std::string_view> allowed) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (annotations.count(k) != 0) continue;
      if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
      refuse(join(path, k), "the keyword '" + k + "' is not supported");
    }
  }

  static uint32_t count_of(const ojson& s, const char* key, const std::string& path) {
    const ojson& v = s.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 10000) {
      refuse(join(path, key), "'" + std::string(key) + "' must be an integer in 0..10000");
    }
    return static_cast<uint32_t>(v.get<int64_t>());
  }

  static std::string repeat(const std::string& item, uint32_t min, std::optional<uint32_t> max) {
    std::string out = "(" + item + ")";
    if (!max) return min == 0 ? out + "*" : min == 1 ? out + "+" : out + "{" + std::to_string(min) + ",}";
    return out + "{" + std::to_string(min) + "," + std::to_string(*max) + "}";
  }

  // The GBNF expression for values of schema s (at path, for messages and rule names).
  std::string expr(const ojson& s, const std::string& path) {
    // Sub-schemas nest (properties, items, anyOf); a hostile schema must not exhaust the stack.
    const depth_guard guard(depth_);
    if (depth_ > 64) refuse(path, "the schema nests deeper than 64 levels");
    if (s.is_boolean()) {
      if (s.get<bool>()) return "json-value";
      refuse(path, "the schema 'false' matches nothing");
    }
    if (!s.is_object()) refuse(path, "a schema must be an object or a boolean");
    if (s.contains("$ref")) {
      check_keywords(s, path, {"$ref"});
      return ref(s.at("$ref"), path);
    }
    if (s.contains("const")) {
      check_keywords(s, path, {"const", "type"});
      return gbnf_literal(json_text(s.at("const")));
    }
    if (s.contains("enum")) {
      check_keywords(s, path, {"enum", "type"});
      const ojson& e = s.at("enum");
      if (!e.is_array() || e.empty()) refuse(join(path, "enum"), "'enum' must be a non-empty array");
      std::string out;
      for (const ojson& v : e) out += (out.empty() ? "" : " | ") + gbnf_literal(json_text(v));
      return "(" + out + ")";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      check_keywords(s, path, {key});
      const ojson& alts = s.at(key);
      if (!alts.is_array() || alts.empty()) refuse(join(path, key), "'" + std::string(key) + "' must be a non-empty array");
      std::string out;
      for (size_t i = 0; i < alts.size(); ++i) {
        out += (i == 0 ? "" : " | ") + expr(alts[i], join(path, std::string(key) + "." + std::to_string(i)));
      }
      return "(" + out + ")";
    }
    bool nullable = false;
    if (s.contains("nullable")) {
      if (!s.at("nullable").is_boolean()) refuse(join(path, "nullable"), "'nullable' must be a boolean");
      nullable = s.at("nullable").get<bool>();
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s.at("type");
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const ojson& x : t) {
          if (!x.is_string()) refuse(join(path, "type"), "'type' must be a name or a list of names");
          types.push_back(x.get<std::string>());
        }
      } else {
        refuse(join(path, "type"), "'type' must be a name or a list of names");
      }
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else {
      check_keywords(s, path, {"nullable"});
      return "json-value";
    }
    if (nullable) types.push_back("null");
    std::string out;
    for (const std::string& t : types) out += (out.empty() ? "" : " | ") + typed(s, t, path);
    return types.size() == 1 ? out : "(" + out + ")";
  }

  std::string typed(const ojson& s, const std::string& type, const std::string& path) {
    if (type == "string") {
      check_keywords(s, path, {"type", "minLength", "maxLength", "nullable"});
      if (!s.contains("minLength") && !s.contains("maxLength")) return "json-string";
      const uint32_t min = s.contains("minLength") ? count_of(s, "minLength", path) : 0;
      std::optional<uint32_t> max;
      if (s.contains("maxLength")) max = count_of(s, "maxLength", path);
      if (max && *max < min) refuse(join(path, "maxLength"), "'maxLength' is below 'minLength'");
      return "\"\\\"\" " + repeat("json-char", min, max) + " \"\\\"\"";
    }
    // Types without keywords of their own: a rule of json_base each.
    static const std::map<std::string, std::string, std::less<>> plain = {
        {"number", "json-number"}, {"integer", "json-int"}, {"boolean", "json-boolean"}, {"null", "json-null"}};
    if (const auto it = plain.find(type); it != plain.end()) {
      check_keywords(s, path, {"type", "nullable"});
      return it->second;
    }
    if (type == "array") return array(s, path);
    if (type == "object") return object(s, path);
    refuse(join(path, "type"), "unknown type '" + type + "'");
  }

  std::string array(const ojson& s, const std::string& path) {
    check_keywords(s, path, {"type", "items", "prefixItems", "minItems", "maxItems", "nullable"});
    const uint32_t min = s.contains("minItems") ? count_of(s, "minItems", path) : 0;
    std::optional<uint32_t> max;
    if (s.contains("maxItems")) max = count_of(s, "maxItems", path);
    if (max && *max < min) refuse(join(path, "maxItems"), "'maxItems' is below 'minItems'");
    if (s.contains("prefixItems")) {
      const ojson& p = s.at("prefixItems");
      if (!p.is_array() || p.empty()) refuse(join(path, "prefixItems"), "'prefixItems' must be a non-empty array");
      if (s.contains("items") && !(s.at("items").is_boolean() && !s.at("items").get<bool>())) {
        refuse(join(path, "items"), "'items' beside 'prefixItems' is supported only as false");
      }
      if (min > p.size() || (max && *max < p.size())) {
        refuse(join(path, "prefixItems"), "'minItems'/'maxItems' other than the tuple's length are not supported");
      }
      std::string out = "\"[\" ws";
      for (size_t i = 0; i < p.size(); ++i) {
        out += (i == 0 ? " " : " \",\" ws ") + expr(p[i], join(path, "prefixItems." + std::to_string(i))) + " ws";
      }
      return "(" + out + " \"]\")";
    }
    const std::string item = s.contains("items") ? rule_for(s.at("items"), join(path, "items")) : "json-value";
    // [ ws ( item ws ( "," ws item ws ){min-1,max-1} )? ]
    const std::string more = "\",\" ws " + item + " ws";
    std::string inner;
    if (max && *max == 0) return "(\"[\" ws \"]\")";
    const uint32_t rest_min = min > 0 ? min - 1 : 0;
    std::optional<uint32_t> rest_max;
    if (max) rest_max = *max - 1;
    inner = item + " ws " + repeat(more, rest_min, rest_max);
    if (min == 0) inner = "(" + inner + ")?";
    return "(\"[\" ws " + inner + " \"]\")";
  }

  std::string object(const ojson& s, const std::string& path) {
    check_keywords(s, path, {"type", "properties", "required", "additionalProperties", "nullable"});
    const ojson empty = ojson::object();
    const ojson& props = s.contains("properties") ? s.at("properties") : empty;
    if (!props.is_object()) refuse(join(path, "properties"), "'properties' must be an object");
    std::vector<std::string> required;
    if (s.contains("required")) {
      const ojson& r = s.at("required");
      if (!r.is_array()) refuse(join(path, "required"), "'required' must be an array of names");
      for (const ojson& x : r) {
        if (!x.is_string()) refuse(join(path, "required"), "'required' must be an array of names");
        required.push_back(x.get<std::string>());
      }
    }
    if (s.contains("additionalProperties")) {
      const ojson& a = s.at("additionalProperties");
      if (!a.is_boolean() && !a.is_object()) refuse(join(path, "additionalProperties"), "'additionalProperties' must be a boolean or a schema");
    }
    if (props.empty() && required.empty()) {
      // A map: any keys, values of additionalProperties' schema (any JSON by default).
      std::string value = "json-value";
      if (s.contains("additionalProperties")) {
        const ojson& a = s.at("additionalProperties");
        if (a.is_object()) value = rule_for(a, join(path, "additionalProperties"));
        if (a.is_boolean() && !a.get<bool>()) return "(\"{\" ws \"}\")";
      }
      const std::string kv = "json-string ws \":\" ws " + value + " ws";
      return "(\"{\" ws (" + kv + " (\",\" ws " + kv + ")*)? \"}\")";
    }
    // Properties in the schema's order, then required names the schema does not describe.
    std::vector<std::pair<std::string, std::string>> kvs;  // (name, rule of its value)
    std::vector<bool> is_required;
    for (auto it = props.begin(); it != props.end(); ++it) {
      kvs.emplace_back(it.key(), rule_for(it.value(), join(path, "properties." + it.key())));
      is_required.push_back(std::find(required.begin(), required.end(), it.key()) != required.end());
    }
    for (const std::string& r : required) {
      if (!props.contains(r)) {
        kvs.emplace_back(r, "json-value");
        is_required.push_back(true);
      }
    }
    // first_k: properties k.. with none written yet; after_k: with some written (a comma before each).
    const size_t n = kvs.size();
    std::vector<std::string> first(n + 1), after(n + 1);
    first[n] = "\"\"";
    after[n] = "\"\"";
    const std::string hint = path.empty() ? "obj" : path;
    for (size_t k = n; k-- > 0;) {
      const std::string kv = gbnf_literal(json_text(ojson(kvs[k].first))) + " ws \":\" ws " + kvs[k].second + " ws";
      const std::string after_next = k + 1 == n ? "" : " " + after[k + 1];
      std::string f = kv + after_next;
      std::string a = "\",\" ws " + kv + after_next;
      if (!is_required[k]) {
        f += " | " + (k + 1 == n ? std::string("\"\"") : first[k + 1]);
        a += " | " + (k + 1 == n ? std::string("\"\"") : after[k + 1]);
      }
      first[k] = new_rule(hint + "-first-" + std::to_string(k), f);
      after[k] = new_rule(hint + "-after-" + std::to_string(k), a);
    }
    return "(\"{\" ws " + first[0] + " \"}\")";
  }

  // A named rule for a sub-schema (keeps the grammar readable and lets $ref recurse).
  std::string rule_for(const ojson& s, const std::string& path) {
    const std::string e = expr(s, path);
    if (e.find(' ') == std::string::npos) return e;  // already a name or one literal
    return new_rule(path, e);
  }

  std::string ref(const ojson& r, const std::string& path) {
    if (!r.is_string()) refuse(join(path, "$ref"), "'$ref' must be a string");
    const std::string target = r.get<std::string>();
    const auto it = refs_.find(target);
    if (it != refs_.end()) return it->second;
    std::string_view rest;
    const ojson* defs = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (target.rfind(prefix, 0) == 0) {
        rest = std::string_view(target).substr(std::string_view(prefix).size());
        const std::string key = std::string(prefix).substr(2, std::string_view(prefix).size() - 3);
        if (root_.is_object() && root_.contains(key)) defs = &root_.at(key);
      }
    }
    if (defs == nullptr || !defs->is_object() || !defs->contains(std::string(rest))) {
      refuse(join(path, "$ref"), "'$ref' " + target + " does not name a definition of this schema (#/$defs/... or #/definitions/...)");
    }
    // Name the rule first so a recursive reference finds it.
    std::string name = name_ + "-def-";
    for (const char c : rest) name += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? c : '-';
    while (taken_.count(name) != 0 || rules_.count(name) != 0) name += "-";
    taken_.insert(name);
    refs_.emplace(target, name);
    const std::string body = expr(defs->at(std::string(rest)), target.substr(2));
    rules_.emplace(name, body);
    return name;
  }

  const ojson& root_;
  std::string name_;
  int depth_ = 0;
  std::map<std::string, std::string> rules_;
  std::set<std::string> taken_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string gbnf_literal(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char hex[] = "0123456789ABCDEF";
      out += "\\x";
      out += hex[(c >> 4) & 15];
      out += hex[c & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}


std::string_view json_object_gbnf() {
  static const std::string g = "root ::= json-object\n" + std::string(json_base);
  return g;
}

std::string_view json_gbnf_rules() { return json_base; }

std::string json_schema_gbnf_rules(std::string_view schema_json, std::string_view name) {
  ojson schema;
  try {
    schema = ojson::parse(schema_json);
  } catch (const ojson::exception& e) {
    throw grammar_error(std::string("json_schema: not valid JSON: ") + e.what());
  }
  return schema_compiler(schema, std::string(name)).run();
}

std::string json_schema_to_gbnf(std::string_view schema_json) {
  return json_schema_gbnf_rules(schema_json, "root") + std::string(json_base);
}

}  // namespace troupe::llm
