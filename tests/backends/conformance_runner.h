// The op conformance suite's runner: runs a case of the table (conformance_cases.h) on a backend and
// compares it with the CPU reference path. test_conformance.cpp runs it on every registered device; other
// suites (remote peers: tests/backends/rpc) run it on the devices they set up.
//
//   auto ref = run_case(c, ci, *reference, nullptr);                  // the CPU reference path
//   check_case(c, ci, *ref, *backend, "RPC[...]#0", true);             // Catch2 checks against it
//
// A result is checked twice against the reference: its normalised mean squared error (op_case::max_nmse),
// and every element within its own bound (element_bounds: derived from the op and the input values, so a
// single wrong element or a column a few percent off fails even where the NMSE of the whole is small).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "tests/backends/conformance_cases.h"

namespace troupe::testing {

// Bytes of one input, generated from (case, input) so every backend sees the same data.
std::vector<uint8_t> make_input_bytes(const case_input& in, uint32_t seed);
// The seed of input i of case ci (what run_case and element_bounds fill it from).
uint32_t input_seed(size_t case_index, size_t input);
std::vector<float> to_f32(const tensor& t, const std::vector<uint8_t>& bytes);
// Runs one case on one backend; empty when the device does not support one of the case's nodes (then
// *unsupported names it).
std::optional<std::vector<float>> run_case(const op_case& c, size_t case_index, backend_i& be, std::string* unsupported);
double nmse(const std::vector<float>& x, const std::vector<float>& ref);
bool all_finite(const std::vector<float>& v);

// |values| of one row of a matrix product's operand, with their sum and largest.
struct abs_row {
  std::vector<double> v;
  double sum = 0;
  double max = 0;
};
abs_row abs_row_of(const std::vector<double>& values);
// The largest |difference| two backends' dot products of a weight row x (of weight_type, dequantized) and an
// activation row y may show, whichever paths they take (conformance_runner.cpp derives it): what
// element_bounds gives a matrix product's element.
double dot_bound(type weight_type, const abs_row& x, const abs_row& y);
// Per-element bounds on |result - ref| for case ci, ref the reference path's result: derived from the inputs
// for a case whose output is a matrix product (mul_mat, mul_mat_id) or flash_attn of inputs; otherwise
// 16 sqrt(max_nmse) (rms(ref) + |ref[i]|), a single element 16 times the NMSE's root-mean-square budget.
std::vector<double> element_bounds(const op_case& c, size_t ci, const std::vector<float>& ref);
// How many elements of got are farther from ref than their bound (the first few are UNSCOPED_INFOed).
size_t elements_outside(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& bound);
// CHECKs got against ref: sizes, finite values, the case's NMSE bound and every element's bound.
void check_result(const op_case& c, const std::vector<float>& got, const std::vector<float>& ref,
                  const std::vector<double>& bound);

// Runs case ci on be and CHECKs it against ref (the reference path's result) and bound (element_bounds;
// computed here when not given). Returns whether it was compared: false when be's device does not support
// it, which FAILs when must_support and is otherwise only written to *unsupported: the caller accounts for
// what its target does not compute (test_conformance.cpp: every target meets its own floor).
bool check_case(const op_case& c, size_t ci, const std::vector<float>& ref, const std::vector<double>& bound,
                backend_i& be, const std::string& label, bool must_support, std::string* unsupported = nullptr);
bool check_case(const op_case& c, size_t ci, const std::vector<float>& ref, backend_i& be, const std::string& label,
                bool must_support, std::string* unsupported = nullptr);
// Runs every case of the table that be's device computes (supports_op) on be and on the CPU reference path,
// CHECKing each within its bounds (NMSE and per element); returns how many were compared per op (the first word of a case's name).
std::map<std::string, int> compare_supported_cases(backend_i& be);
// A "mul_mat <type> ..." case whose weight type the GPU backends compute (is_gpu_weight_type). The
// i-quants, ternary and MXFP4 types are computed on the CPU only.
bool is_gpu_mul_mat_case(const op_case& c);
// CHECKs that a GPU backend's run of the table (Vulkan, CUDA) covered every op the GPU backends compute:
// every case of each with its broadcasts, masks, types and indices, and every matrix product case.
void check_gpu_coverage(std::map<std::string, int>& compared);

}  // namespace troupe::testing
