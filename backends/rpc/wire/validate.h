// Validation of everything a client sends: shapes, strides, placements and graphs. Every check is a real
// code path that throws protocol_error naming the field; nothing here trusts a pointer or a size from the wire.
//
//   auto g = decode_graph(entries, dev, [&](uint64_t h) { return table.find(h); });
//   backend.graph_compute(g.g);
//
// Graph nodes are rebuilt with the op builders of runtime/ops.h from their sources and parameters, so the
// server accepts exactly the graphs a client could build, with the shape and type checks of each op; the
// rebuilt node must then agree with the wire description (type, shape, strides, parameters, sources).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "backends/rpc/wire/protocol.h"
#include "runtime/backend.h"
#include "runtime/context.h"
#include "runtime/graph.h"

namespace troupe::rpc {

// Bytes from a tensor's first to one past its last byte (as nbytes()), every product and sum checked: empty
// when a dimension is outside [1, max_ne], a stride above max_stride, or the sum overflows.
std::optional<uint64_t> checked_span(type t, const std::array<int64_t, max_dims>& ne,
                                     const std::array<uint64_t, max_dims>& nb);

// A type id the protocol accepts (one GGUF defines, with a block layout). Throws protocol_error.
type check_type(uint32_t id, std::string_view what);
// Each ne[i] in [1, max_ne], their product at most max_ne, ne[0] a multiple of t's block size.
void check_shape(type t, const std::array<int64_t, max_dims>& ne, std::string_view what);
// [offset, offset + size) inside a buffer of buffer_size bytes (no overflow).
void check_range(uint64_t offset, uint64_t size, uint64_t buffer_size, std::string_view what);

// Looks up a buffer handle of the current connection; null when unknown.
using buffer_lookup = std::function<buffer_i*(uint64_t handle)>;

// A leaf from the wire as a tensor in ctx, placed in its buffer after every check (type, shape, strides,
// whole blocks contiguous for block types, no self-overlap, the span inside the buffer, a buffer type dev can use).
tensor* decode_leaf(context& ctx, const wire_tensor& w, device_i* dev, const buffer_lookup& find, std::string_view what);

struct decoded_graph {
  std::unique_ptr<context> ctx;
  std::unique_ptr<graph> g;
  std::vector<uint64_t> buffers;  // handles the graph uses
};

// Rebuilds a graph message (entries in dependency order: sources are earlier entries) for device dev.
decoded_graph decode_graph(std::span<const wire_tensor> entries, device_i& dev, const buffer_lookup& find);

// The node of a supports_op question, rebuilt in ctx (no_alloc): entries are the node's sources (leafs with
// no memory: type, shape and strides checked as a leaf's, no buffer) and then the node, whose sources are
// earlier entries; the node is rebuilt with its op's builder and must equal the entry (type, shape, strides,
// parameters). Nothing is placed: the result is for device_i::supports_op only. Throws protocol_error.
tensor* decode_query(context& ctx, std::span<const wire_tensor> entries, std::string_view what);

}  // namespace troupe::rpc
