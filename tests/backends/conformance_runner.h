// The op conformance suite's runner: runs a case of the table (conformance_cases.h) on a backend and
// compares it with the CPU reference path. test_conformance.cpp runs it on every registered device; other
// suites (remote peers: tests/backends/rpc) run it on the devices they set up.
//
//   auto ref = run_case(c, ci, *reference, nullptr);                  // the CPU reference path
//   check_case(c, ci, *ref, *backend, "RPC[...]#0", true);             // Catch2 checks against it
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
std::vector<float> to_f32(const tensor& t, const std::vector<uint8_t>& bytes);
// Runs one case on one backend; empty when the device does not support one of the case's nodes (then
// *unsupported names it).
std::optional<std::vector<float>> run_case(const op_case& c, size_t case_index, backend_i& be, std::string* unsupported);
double nmse(const std::vector<float>& x, const std::vector<float>& ref);
bool all_finite(const std::vector<float>& v);
// Runs case ci on be and CHECKs it against ref (the reference path's result). Returns whether it was
// compared: false when be's device does not support it (a FAIL when must_support, else a WARN).
bool check_case(const op_case& c, size_t ci, const std::vector<float>& ref, backend_i& be, const std::string& label,
                bool must_support);
// Runs every case of the table that be's device computes (supports_op) on be and on the CPU reference path,
// CHECKing each within its bound; returns how many were compared per op (the first word of a case's name).
std::map<std::string, int> compare_supported_cases(backend_i& be);
// A "mul_mat <type> ..." case whose weight type the GPU backends compute (is_gpu_weight_type). The
// i-quants, ternary and MXFP4 types are computed on the CPU only.
bool is_gpu_mul_mat_case(const op_case& c);
// CHECKs that a GPU backend's run of the table (Vulkan, CUDA) covered every op the GPU backends compute:
// every case of each with its broadcasts, masks, types and indices, and every matrix product case.
void check_gpu_coverage(std::map<std::string, int>& compared);

}  // namespace troupe::testing
