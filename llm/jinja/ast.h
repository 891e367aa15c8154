// The parsed form of a Jinja template (internal to llm/jinja): statements (node) over expressions (expr).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llm/jinja/jinja.h"
#include "llm/jinja/value.h"

namespace troupe::llm::jinja {

struct expr;
using expr_ptr = std::shared_ptr<const expr>;

struct expr {
  enum kind { literal, variable, list_lit, dict_lit, attr, item, slice, call, filter, test, unary, binary, logic_and,
              logic_or, logic_not, cond } k = literal;
  int line = 0;
  value lit;            // literal
  std::string name;     // variable, attribute, filter, test, operator
  expr_ptr a, b, c, d;  // operands (cond: a if b else c; slice: a[b:c:d])
  std::vector<expr_ptr> args;  // list / dict (key, value, ...) literals, call / filter / test arguments
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  bool negated = false;  // test: is not
  bool tuple = false;    // list_lit: written as a tuple, (a, b) or a, b
};

struct node;
using node_ptr = std::shared_ptr<const node>;

struct node {
  enum kind { sequence, text_piece, output, if_, for_, set, set_attr, set_block, macro, call_block, filter_block, break_,
              continue_ } k = sequence;
  int line = 0;
  std::string text;
  expr_ptr e;       // output, if's first condition, for's iterable, set's value, call_block's call, filter chain
  expr_ptr filter;  // for x in xs if filter
  std::vector<std::string> names;  // for / set targets, set_attr (namespace, attribute), macro name
  std::vector<std::pair<std::string, expr_ptr>> params;  // macro / caller parameters with defaults
  std::vector<std::pair<expr_ptr, node_ptr>> branches;   // if: (condition or null for else, body); for: body, else
  std::vector<node_ptr> body;                            // sequence
  bool discard = false;  // {% do %}: evaluated, not printed
};

node_ptr parse_template(std::string_view source, const options& opt);

}  // namespace troupe::llm::jinja
