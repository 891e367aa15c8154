#include "backends/rpc/wire/validate.h"

#include <bit>
#include <cstring>
#include <string>
#include <unordered_map>

#include "runtime/ops.h"

namespace troupe::rpc {
namespace {

[[noreturn]] void bad(std::string_view what, const std::string& why) {
  throw protocol_error(std::string(what) + ": " + why);
}

std::string shape_str(const std::array<int64_t, max_dims>& ne) {
  return "[" + std::to_string(ne[0]) + ", " + std::to_string(ne[1]) + ", " + std::to_string(ne[2]) + ", " +
         std::to_string(ne[3]) + "]";
}

float param_f32(const wire_tensor& w, int i) { return std::bit_cast<float>(w.op_params[static_cast<size_t>(i)]); }
int32_t param_i32(const wire_tensor& w, int i) { return w.op_params[static_cast<size_t>(i)]; }

// Bytes one block-row of the tensor would take if dense: what it reads at least once.
uint64_t dense_bytes(type t, const std::array<int64_t, max_dims>& ne) {
  uint64_t n = static_cast<uint64_t>(ne[0] / block_size(t)) * type_size(t);
  for (int i = 1; i < max_dims; ++i) n *= static_cast<uint64_t>(ne[static_cast<size_t>(i)]);
  return n;
}

// The node of entry w rebuilt from its sources with the builder of its op.
tensor* rebuild(context& ctx, const wire_tensor& w, const std::array<tensor*, max_src>& s, std::string_view what) {
  tensor* a = s[0];
  tensor* b = s[1];
  tensor* c = s[2];
  const auto& ne = w.ne;
  switch (static_cast<op>(w.op)) {
    case op::add: return add(ctx, a, b);
    case op::sub: return sub(ctx, a, b);
    case op::mul: return mul(ctx, a, b);
    case op::div: return div(ctx, a, b);
    case op::scale: return scale(ctx, a, param_f32(w, 0), param_f32(w, 1));
    case op::rms_norm: return rms_norm(ctx, a, param_f32(w, 0));
    case op::norm: return norm(ctx, a, param_f32(w, 0));
    case op::silu: return silu(ctx, a);
    case op::gelu: return gelu(ctx, a);
    case op::sigmoid: return sigmoid(ctx, a);
    case op::mul_mat_id: return mul_mat_id(ctx, a, b, c);
    case op::top_k:
      if (ne[0] < 1 || ne[0] > INT32_MAX) bad(what, "top_k with k = " + std::to_string(ne[0]));
      return top_k(ctx, a, static_cast<int>(ne[0]));
    case op::glu: {
      const int32_t kind = param_i32(w, 0);
      return glu(ctx, a, b, static_cast<glu_kind>(kind), param_i32(w, 1) != 0);
    }
    case op::rope: {
      tensor probe;
      probe.op_params = w.op_params;
      return rope(ctx, a, b, c, rope_params_of(probe));
    }
    case op::soft_max: return soft_max(ctx, a, b, param_f32(w, 0), param_f32(w, 1));
    case op::cpy: return cpy(ctx, a, b);
    case op::cont: return cont(ctx, a, ne[0], ne[1], ne[2], ne[3]);
    case op::set_rows: return set_rows(ctx, a, b, c);
    case op::get_rows: return get_rows(ctx, a, b);
    case op::mul_mat: return c != nullptr ? mul_mat_masked(ctx, a, b, c) : mul_mat(ctx, a, b);
    case op::view: {
      if (a == nullptr) bad(what, "view without a source");
      const uint64_t offset = static_cast<uint64_t>(static_cast<uint32_t>(param_i32(w, 0))) |
                              (static_cast<uint64_t>(static_cast<uint32_t>(param_i32(w, 1))) << 32);
      // The builder computes the view's span itself: make sure its products cannot overflow first.
      check_shape(a->type, ne, what);
      if (!checked_span(a->type, ne, {type_size(a->type), w.nb[1], w.nb[2], w.nb[3]})) {
        bad(what, "view strides out of range");
      }
      return view_4d(ctx, a, ne[0], ne[1], ne[2], ne[3], w.nb[1], w.nb[2], w.nb[3], offset);
    }
    case op::reshape: return reshape(ctx, a, ne[0], ne[1], ne[2], ne[3]);
    case op::permute:
      return permute(ctx, a, param_i32(w, 0), param_i32(w, 1), param_i32(w, 2), param_i32(w, 3));
    case op::transpose: return transpose(ctx, a);
    case op::concat: return concat(ctx, a, b, param_i32(w, 0));
    case op::pad: return pad(ctx, a, param_i32(w, 0), param_i32(w, 1), param_i32(w, 2), param_i32(w, 3));
    case op::mean: return mean(ctx, a);
    case op::sum_rows: return sum_rows(ctx, a);
    case op::argmax: return argmax(ctx, a);
    case op::flash_attn: return flash_attn(ctx, a, b, c, s[3], param_f32(w, 0));
    case op::none:
    case op::count: break;
  }
  bad(what, "node with op id " + std::to_string(w.op) + ", which is not a computable op");
}

}  // namespace

std::optional<uint64_t> checked_span(type t, const std::array<int64_t, max_dims>& ne,
                                     const std::array<uint64_t, max_dims>& nb) {
  const int64_t bs = block_size(t);
  if (bs <= 0 || type_size(t) == 0 || ne[0] % bs != 0) return std::nullopt;
  uint64_t span = 0;
  for (int i = 0; i < max_dims; ++i) {
    const auto k = static_cast<size_t>(i);
    if (ne[k] < 1 || ne[k] > max_ne || nb[k] > max_stride) return std::nullopt;
    uint64_t term;
    const uint64_t steps = i == 0 && bs > 1 ? static_cast<uint64_t>(ne[k] / bs) - 1 : static_cast<uint64_t>(ne[k] - 1);
    if (__builtin_mul_overflow(steps, nb[k], &term) || __builtin_add_overflow(span, term, &span)) return std::nullopt;
  }
  // nbytes: the last block itself (the formula of tensor.cpp: plain types add one element, block types count
  // ne[0] / bs blocks of nb[0]).
  const uint64_t last = bs > 1 ? nb[0] : type_size(t);
  if (__builtin_add_overflow(span, last, &span)) return std::nullopt;
  return span;
}

type check_type(uint32_t id, std::string_view what) {
  const auto t = type_from_id(id);
  if (!t || !traits(*t).known || block_size(*t) <= 0 || type_size(*t) == 0) {
    bad(what, "unknown tensor type id " + std::to_string(id));
  }
  return *t;
}

void check_shape(type t, const std::array<int64_t, max_dims>& ne, std::string_view what) {
  uint64_t n = 1;
  for (int64_t v : ne) {
    if (v < 1 || v > max_ne) bad(what, "shape " + shape_str(ne) + " has a dimension outside [1, 2^40]");
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(v), &n) || n > static_cast<uint64_t>(max_ne)) {
      bad(what, "shape " + shape_str(ne) + " has more than 2^40 elements");
    }
  }
  if (ne[0] % block_size(t) != 0) {
    bad(what, "ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the block size " +
                  std::to_string(block_size(t)) + " of " + std::string(type_name(t)));
  }
}

void check_range(uint64_t offset, uint64_t size, uint64_t buffer_size, std::string_view what) {
  if (offset > buffer_size || size > buffer_size - offset) {
    bad(what, "bytes [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " + std::to_string(size) +
                  ") are outside the buffer (" + std::to_string(buffer_size) + " bytes)");
  }
}

namespace {

buffer_i& find_placed(const wire_tensor& w, device_i* dev, const buffer_lookup& find, uint64_t span,
                      std::string_view what) {
  if (w.buffer == 0) bad(what, "tensor without a buffer");
  buffer_i* buf = find(w.buffer);
  if (buf == nullptr) bad(what, "unknown buffer handle " + std::to_string(w.buffer));
  check_range(w.offset, span, buf->size(), what);
  if (dev != nullptr && !dev->supports_buft(buf->type())) {
    bad(what, "device " + std::string(dev->name()) + " cannot use buffer type " + std::string(buf->type().name()));
  }
  return *buf;
}

}  // namespace

tensor* decode_leaf(context& ctx, const wire_tensor& w, device_i* dev, const buffer_lookup& find, std::string_view what) {
  const type t = check_type(w.type, what);
  check_shape(t, w.ne, what);
  if (block_size(t) > 1 && w.nb[0] != type_size(t)) {
    bad(what, "nb[0] = " + std::to_string(w.nb[0]) + " must be the block size in bytes (" +
                  std::to_string(type_size(t)) + ") for a block type");
  }
  const auto span = checked_span(t, w.ne, w.nb);
  if (!span) bad(what, "strides out of range");
  if (dense_bytes(t, w.ne) > *span) bad(what, "strides make the tensor overlap itself");
  buffer_i& buf = find_placed(w, dev, find, *span, what);
  tensor* x = ctx.new_tensor(t, max_dims, w.ne.data());
  x->nb = {w.nb[0], w.nb[1], w.nb[2], w.nb[3]};
  x->flags = w.flags & (flag_input | flag_output | flag_weight);
  x->buffer = &buf;
  x->data = static_cast<char*>(buf.base()) + w.offset;
  return x;
}

decoded_graph decode_graph(std::span<const wire_tensor> entries, device_i& dev, const buffer_lookup& find) {
  if (entries.size() > max_graph_entries) bad("graph", "more than " + std::to_string(max_graph_entries) + " entries");
  decoded_graph out;
  out.ctx = std::make_unique<context>(context_params{.max_tensors = entries.size() + 1, .no_alloc = true});
  size_t n_nodes = 0;
  for (const auto& w : entries) n_nodes += w.k == wire_tensor::kind::node;
  out.g = std::make_unique<graph>(n_nodes + 1);
  std::vector<tensor*> made(entries.size(), nullptr);
  std::unordered_map<const tensor*, uint64_t> handle_of;

  for (size_t i = 0; i < entries.size(); ++i) {
    const wire_tensor& w = entries[i];
    const std::string what = "graph entry " + std::to_string(i) + " (op id " + std::to_string(w.op) + ")";
    for (int32_t s : w.src) {
      if (s < -1 || s >= static_cast<int64_t>(i)) {
        bad(what, "source index " + std::to_string(s) + " does not name an earlier entry");
      }
    }
    if (w.k == wire_tensor::kind::leaf) {
      if (w.op != static_cast<uint8_t>(op::none)) bad(what, "a leaf must have op none");
      for (int32_t s : w.src) {
        if (s != -1) bad(what, "a leaf has no sources");
      }
      made[i] = decode_leaf(*out.ctx, w, &dev, find, what);
      handle_of[made[i]] = w.buffer;
      continue;
    }
    if (w.op == static_cast<uint8_t>(op::none) || w.op >= static_cast<uint8_t>(op::count)) {
      bad(what, "a node needs a computable op");
    }
    const type t = check_type(w.type, what);
    check_shape(t, w.ne, what);
    std::array<tensor*, max_src> srcs{};
    for (size_t k = 0; k < max_src; ++k) srcs[k] = w.src[k] >= 0 ? made[static_cast<size_t>(w.src[k])] : nullptr;

    tensor* x;
    try {
      x = rebuild(*out.ctx, w, srcs, what);
    } catch (const protocol_error&) {
      throw;
    } catch (const error& e) {
      bad(what, e.what());
    }
    // The rebuilt node must be the one the client described.
    if (static_cast<uint8_t>(x->op) != w.op || static_cast<uint32_t>(x->type) != w.type || x->ne != w.ne) {
      bad(what, "the node rebuilt from its sources is " + describe(*x) + ", not " + shape_str(w.ne) + " " +
                    std::string(type_name(t)));
    }
    for (int k = 0; k < max_dims; ++k) {
      if (x->nb[static_cast<size_t>(k)] != w.nb[static_cast<size_t>(k)]) bad(what, "strides differ from the rebuilt node's");
    }
    if (x->op_params != w.op_params) bad(what, "op parameters differ from the rebuilt node's");
    if (x->src != srcs) bad(what, "sources do not match the op's");
    const auto span = checked_span(x->type, x->ne, {x->nb[0], x->nb[1], x->nb[2], x->nb[3]});
    if (!span) bad(what, "the result's shape or strides are out of range");
    x->flags = w.flags & (flag_input | flag_output | flag_weight);

    if (x->view_src != nullptr) {
      // A view: its memory is its root's, at the view offset, and must stay inside the root's buffer.
      const tensor& root = *x->view_src;
      if (root.buffer == nullptr || root.data == nullptr) bad(what, "view of a tensor without memory");
      const uint64_t root_off = static_cast<uint64_t>(static_cast<const char*>(root.data) -
                                                      static_cast<const char*>(root.buffer->base()));
      uint64_t off;
      if (__builtin_add_overflow(root_off, static_cast<uint64_t>(x->view_offs), &off)) bad(what, "view offset overflows");
      check_range(off, *span, root.buffer->size(), what);
      const auto hit = handle_of.find(&root);
      if (hit == handle_of.end()) bad(what, "view of a tensor that is not in the message");
      const uint64_t h = hit->second;
      if (w.buffer != h || w.offset != off) {
        bad(what, "placement (buffer " + std::to_string(w.buffer) + ", offset " + std::to_string(w.offset) +
                      ") differs from the view's (buffer " + std::to_string(h) + ", offset " + std::to_string(off) + ")");
      }
      x->buffer = root.buffer;
      x->data = static_cast<char*>(root.buffer->base()) + off;
    } else {
      buffer_i& buf = find_placed(w, &dev, find, *span, what);
      x->buffer = &buf;
      x->data = static_cast<char*>(buf.base()) + w.offset;
      handle_of[x] = w.buffer;
    }
    if (!dev.supports_op(*x)) {
      bad(what, "device " + std::string(dev.name()) + " cannot compute " + describe(*x) + " (" +
                    std::string(op_name(x->op)) + ")");
    }
    made[i] = x;
    out.g->append(x);
  }
  for (const auto& [t, h] : handle_of) out.buffers.push_back(h);
  return out;
}

tensor* decode_query(context& ctx, std::span<const wire_tensor> entries, std::string_view what) {
  if (entries.empty() || entries.size() > max_query_entries) {
    bad(what, std::to_string(entries.size()) + " entries (1 to " + std::to_string(max_query_entries) + ": the sources, then the node)");
  }
  std::vector<tensor*> made(entries.size(), nullptr);
  for (size_t i = 0; i + 1 < entries.size(); ++i) {
    const wire_tensor& w = entries[i];
    const std::string where = std::string(what) + ": source entry " + std::to_string(i);
    if (w.k != wire_tensor::kind::leaf || w.op != static_cast<uint8_t>(op::none)) bad(where, "a source must be a leaf with op none");
    for (int32_t s : w.src) {
      if (s != -1) bad(where, "a leaf has no sources");
    }
    if (w.buffer != 0 || w.offset != 0) bad(where, "a question places nothing: buffer and offset must be 0");
    const type t = check_type(w.type, where);
    check_shape(t, w.ne, where);
    if (block_size(t) > 1 && w.nb[0] != type_size(t)) {
      bad(where, "nb[0] = " + std::to_string(w.nb[0]) + " must be the block size in bytes (" + std::to_string(type_size(t)) +
                     ") for a block type");
    }
    if (!checked_span(t, w.ne, w.nb)) bad(where, "strides out of range");
    tensor* x = ctx.new_tensor(t, max_dims, w.ne.data());
    x->nb = {w.nb[0], w.nb[1], w.nb[2], w.nb[3]};
    made[i] = x;
  }
  const wire_tensor& w = entries.back();
  const std::string where = std::string(what) + ": node (op id " + std::to_string(w.op) + ")";
  if (w.k != wire_tensor::kind::node || w.op == static_cast<uint8_t>(op::none) || w.op >= static_cast<uint8_t>(op::count)) {
    bad(where, "the last entry must be a node with a computable op");
  }
  if (w.buffer != 0 || w.offset != 0) bad(where, "a question places nothing: buffer and offset must be 0");
  const type t = check_type(w.type, where);
  check_shape(t, w.ne, where);
  std::array<tensor*, max_src> srcs{};
  for (size_t k = 0; k < max_src; ++k) {
    const int32_t s = w.src[k];
    if (s < -1 || s >= static_cast<int64_t>(entries.size()) - 1) {
      bad(where, "source index " + std::to_string(s) + " does not name a source entry");
    }
    srcs[k] = s >= 0 ? made[static_cast<size_t>(s)] : nullptr;
  }
  tensor* x;
  try {
    x = rebuild(ctx, w, srcs, where);
  } catch (const protocol_error&) {
    throw;
  } catch (const error& e) {
    bad(where, e.what());
  }
  if (static_cast<uint8_t>(x->op) != w.op || static_cast<uint32_t>(x->type) != w.type || x->ne != w.ne) {
    bad(where, "the node rebuilt from its sources is " + describe(*x) + ", not " + shape_str(w.ne) + " " +
                   std::string(type_name(t)));
  }
  for (int k = 0; k < max_dims; ++k) {
    if (x->nb[static_cast<size_t>(k)] != w.nb[static_cast<size_t>(k)]) bad(where, "strides differ from the rebuilt node's");
  }
  if (x->op_params != w.op_params) bad(where, "op parameters differ from the rebuilt node's");
  if (x->src != srcs) bad(where, "sources do not match the op's");
  if (!checked_span(x->type, x->ne, {x->nb[0], x->nb[1], x->nb[2], x->nb[3]})) bad(where, "the result's shape or strides are out of range");
  return x;
}

}  // namespace troupe::rpc
