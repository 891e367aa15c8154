// The op conformance table: every op over shapes and types. Each case builds one small graph from inputs it
// declares; the suite runs it on every compiled backend and on the CPU reference path and compares.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/context.h"
#include "runtime/tensor.h"

namespace troupe::testing {

// How an input is filled (deterministically, from a seed).
enum class fill : uint8_t {
  uniform,       // floats in [-1, 1] (quantized types: quantized from such floats)
  positive,      // floats in [0.1, 2]
  indices,       // integers in [0, range)
  unique_rows,   // integers in [0, range), distinct along dim 0 (set_rows targets)
  causal_mask,   // 0 where column <= row + (ne0 - ne1), -inf elsewhere
  shared_mask,   // two sequences in one cache: column c is sequence (c / 5) % 2's, row r sequence r % 2's;
                 // 0 where they match and c <= r + (ne0 - ne1) / 2, -inf elsewhere
};

struct case_input {
  tensor* t;
  fill how;
  int64_t range;
};

class case_builder {
 public:
  explicit case_builder(context& ctx) : ctx_(ctx) {}
  context& ctx() { return ctx_; }
  tensor* input(type t, std::array<int64_t, 4> ne, fill how = fill::uniform, int64_t range = 0);
  const std::vector<case_input>& inputs() const { return inputs_; }

 private:
  context& ctx_;
  std::vector<case_input> inputs_;
};

struct op_case {
  std::string name;
  double max_nmse;  // normalized mean squared error allowed against the CPU reference (each element is also
                    // held to a bound of its own: conformance_runner.h, element_bounds)
  std::function<tensor*(case_builder&)> build;
};

// The whole table.
std::vector<op_case> conformance_cases();

}  // namespace troupe::testing
