#include "llm/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "runtime/error.h"

namespace troupe::llm {

kv_cache::kv_cache(const model& m, const kv_cache_params& p)
    : n_ctx_(p.n_ctx), n_seq_max_(p.n_seq_max), type_k_(p.type_k), type_v_(p.type_v) {
  auto allowed = [](type t) { return kv_cache_type_named(type_name(t)).has_value(); };
  if (!allowed(type_k_) || !allowed(type_v_)) {
    throw error("kv cache: type " + std::string(type_name(allowed(type_k_) ? type_v_ : type_k_)) +
                " is not supported (" + kv_cache_type_names() + ")");
  }
  if (n_ctx_ == 0) throw error("kv cache: n_ctx must be positive");
  if (n_seq_max_ == 0 || n_seq_max_ > max_seq) {
    throw error("kv cache: n_seq_max " + std::to_string(n_seq_max_) + " outside 1.." + std::to_string(max_seq));
  }
  const hparams& hp = m.hp();
  // Attention reads the cache one head at a time: a head must be whole blocks of the cache's type.
  if (hp.n_embd_head_k % block_size(type_k_) != 0) {
    throw error("kv cache: a " + std::string(type_name(type_k_)) + " K cache needs a head size that is a multiple of " +
                std::to_string(block_size(type_k_)) + "; this model's is " + std::to_string(hp.n_embd_head_k));
  }
  if (hp.n_embd_head_v % block_size(type_v_) != 0) {
    throw error("kv cache: a " + std::string(type_name(type_v_)) + " V cache needs a head size that is a multiple of " +
                std::to_string(block_size(type_v_)) + "; this model's is " + std::to_string(hp.n_embd_head_v));
  }
  // Round the cell count up to the padding so n_kv never exceeds it.
  n_ctx_ = (n_ctx_ + pad - 1) / pad * pad;
  cells_.assign(n_ctx_, cell{});

  ctx_ = std::make_unique<context>(context_params{.max_tensors = 2 * hp.n_layer + 2, .no_alloc = true});
  std::map<buffer_type_i*, std::vector<tensor*>> by_buft;
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    buffer_type_i* bt = m.layers()[il].buft;
    // A row per cell wherever troupe's CPU kernels compute the layer: host memory, CPU devices of their own
    // buffer type (CPU1...) and a remote peer's CPU. Their product walks V's rows in cell order, so a
    // sequence's sums do not depend on which cells it got; a dot product over a transposed row would group
    // the cells into SIMD lanes by their index, and the same sequence decoded beside others would get
    // different bits. A remote CPU keeps the local layout so that it gives the local CPU's bits.
    const bool cpu_layer = bt != nullptr && (bt->is_host() || bt->device().cpu_kernels());
    const bool trans = (type_v_ == type::f16 || type_v_ == type::f32) && !cpu_layer;
    v_trans_.push_back(trans);
    cpu_layer_.push_back(cpu_layer);
    tensor* k = ctx_->new_tensor_2d(type_k_, hp.n_embd_k_gqa(), n_ctx_);
    tensor* v = trans ? ctx_->new_tensor_2d(type_v_, n_ctx_, hp.n_embd_v_gqa())
                      : ctx_->new_tensor_2d(type_v_, hp.n_embd_v_gqa(), n_ctx_);
    k->set_name("cache_k_l" + std::to_string(il));
    v->set_name("cache_v_l" + std::to_string(il));
    k_.push_back(k);
    v_.push_back(v);
    by_buft[bt].push_back(k);
    by_buft[bt].push_back(v);
  }
  for (auto& [bt, ts] : by_buft) {
    const size_t align = bt->alignment();
    size_t total = 0;
    for (tensor* t : ts) total += (bt->alloc_size(*t) + align - 1) / align * align;
    buffer_ptr buf = bt->alloc_buffer(total);
    buf->set_usage(buffer_usage::any);
    buf->clear(0);
    auto* base = static_cast<char*>(buf->base());
    size_t offs = 0;
    for (tensor* t : ts) {
      tensor_alloc(*buf, *t, base + offs);
      offs += (bt->alloc_size(*t) + align - 1) / align * align;
    }
    buffers_.push_back(std::move(buf));
  }
}

kv_cache::~kv_cache() = default;

std::optional<type> kv_cache_type_named(std::string_view name) {
  for (const type t : {type::f32, type::f16, type::bf16, type::q8_0, type::q4_0, type::q4_1, type::q5_0, type::q5_1,
                       type::iq4_nl}) {
    if (name == type_name(t)) return t;
  }
  return std::nullopt;
}

const char* kv_cache_type_names() { return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"; }

void kv_cache::check_seq(int32_t seq, const char* what) const {
  if (seq < 0 || static_cast<uint32_t>(seq) >= n_seq_max_) {
    throw error(std::string("kv cache: ") + what + ": sequence id " + std::to_string(seq) + " outside 0.." +
                std::to_string(n_seq_max_ - 1));
  }
}

bool kv_cache::any_v_trans() const {
  return std::find(v_trans_.begin(), v_trans_.end(), true) != v_trans_.end();
}

std::vector<uint32_t> kv_cache::find_slots(uint32_t n, std::span<const int32_t> seqs) const {
  uint64_t mask = 0;
  for (int32_t s : seqs) {
    if (s >= 0 && static_cast<uint32_t>(s) < max_seq) mask |= uint64_t{1} << s;
  }
  uint32_t floor = 0;  // above the highest cell the sequences hold
  for (uint32_t c = n_ctx_; mask != 0 && c-- > 0;) {
    if (cells_[c].seqs & mask) {
      floor = c + 1;
      break;
    }
  }
  std::vector<uint32_t> out;
  out.reserve(n);
  for (uint32_t c = floor; c < n_ctx_ && out.size() < n; ++c) {
    if (cells_[c].seqs == 0) out.push_back(c);
  }
  if (out.size() < n) {
    out.clear();
    for (uint32_t c = 0; c < n_ctx_ && out.size() < n; ++c) {
      if (cells_[c].seqs == 0) out.push_back(c);
    }
  }
  if (out.size() < n) {
    throw capacity_error("kv cache: no room for " + std::to_string(n) + " more tokens (" + std::to_string(used_cells()) +
                         " of " + std::to_string(n_ctx_) + " cells in use)");
  }
  return out;
}

void kv_cache::commit(const std::vector<uint32_t>& cells, const std::vector<int32_t>& pos, const std::vector<int32_t>& seq) {
  for (size_t i = 0; i < cells.size(); ++i) {
    check_seq(seq[i], "commit");
    cell& c = cells_.at(cells[i]);
    c.pos = pos[i];
    c.seqs = uint64_t{1} << seq[i];
  }
  recount();
}

void kv_cache::recount() {
  uint32_t used = 0, shared = 0;
  for (const cell& c : cells_) {
    used += c.seqs != 0;
    shared += (c.seqs & (c.seqs - 1)) != 0;  // two bits or more
  }
  used_now_.store(used);
  shared_now_.store(shared);
}

uint32_t kv_cache::n_kv(const std::vector<uint32_t>& extra) const {
  uint32_t top = 0;
  for (uint32_t c = n_ctx_; c-- > 0;) {
    if (cells_[c].seqs != 0) {
      top = c + 1;
      break;
    }
  }
  for (uint32_t c : extra) top = std::max(top, c + 1);
  top = std::max<uint32_t>(top, 1);
  return std::min(n_ctx_, (top + pad - 1) / pad * pad);
}

void kv_cache::release(const std::vector<uint32_t>& cells) {
  for (uint32_t c : cells) {
    cell& x = cells_.at(c);
    x.seqs = 0;
    x.pos = -1;
  }
  recount();
}

void kv_cache::seq_rm(int32_t seq, int32_t p0, int32_t p1) {
  if (seq >= 0) check_seq(seq, "seq_rm");
  if (p0 < 0) p0 = 0;
  if (p1 < 0) p1 = INT32_MAX;
  for (cell& c : cells_) {
    if (c.seqs == 0 || c.pos < p0 || c.pos >= p1) continue;
    if (seq < 0) c.seqs = 0;
    else c.seqs &= ~(uint64_t{1} << seq);
    if (c.seqs == 0) c.pos = -1;
  }
  recount();
}

void kv_cache::seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1) {
  check_seq(src, "seq_cp");
  check_seq(dst, "seq_cp");
  if (p0 < 0) p0 = 0;
  if (p1 < 0) p1 = INT32_MAX;
  for (cell& c : cells_) {
    if ((c.seqs >> src & 1) && c.pos >= p0 && c.pos < p1) c.seqs |= uint64_t{1} << dst;
  }
  recount();
}

void kv_cache::clear() {
  for (cell& c : cells_) c = cell{};
  recount();
}

size_t kv_cache::bytes_per_token() const {
  size_t n = 0;
  for (size_t il = 0; il < k_.size(); ++il) n += row_size(k_[il]->type, k_[il]->ne[0]) + row_size(v_[il]->type, v_trans_[il] ? v_[il]->ne[1] : v_[il]->ne[0]);
  return n;
}

namespace {

// Calls f(first_index, cell, run) for each run of consecutive cells in `cells` (index i of cells[i]).
template <class F>
void for_runs(const std::vector<uint32_t>& cells, F f) {
  size_t i = 0;
  while (i < cells.size()) {
    size_t j = i + 1;
    while (j < cells.size() && cells[j] == cells[j - 1] + 1) ++j;
    f(i, cells[i], j - i);
    i = j;
  }
}

}  // namespace

void kv_cache::move_rows(const std::vector<uint32_t>& cells, uint8_t* host, size_t n_host, bool to_host) const {
  // Position i's row of a layer's K (then V) is at host + i * row within that layer's block of n_host rows.
  const auto rows = [&](tensor& t, size_t row) {
    for_runs(cells, [&](size_t i, uint32_t c, size_t run) {
      if (to_host) {
        tensor_get(t, host + i * row, c * row, run * row);
      } else {
        tensor_set(t, host + i * row, c * row, run * row);
      }
    });
    host += n_host * row;
  };
  for (size_t il = 0; il < k_.size(); ++il) {
    tensor& k = *k_[il];
    tensor& v = *v_[il];
    rows(k, row_size(k.type, k.ne[0]));
    if (!v_trans_[il]) {
      rows(v, row_size(v.type, v.ne[0]));
      continue;
    }
    // V is [n_ctx, n_embd_v]: element (cell, d) at d * n_ctx + cell, gathered into (or scattered from) a row
    // per position.
    const size_t esz = type_size(v.type);
    const auto n_embd = static_cast<size_t>(v.ne[1]);
    const size_t vr = n_embd * esz;
    std::vector<uint8_t> tmp;
    for (size_t d = 0; d < n_embd; ++d) {
      for_runs(cells, [&](size_t i, uint32_t c, size_t run) {
        tmp.resize(run * esz);
        const size_t at = (d * n_ctx_ + c) * esz;
        if (to_host) {
          tensor_get(v, tmp.data(), at, run * esz);
          for (size_t r = 0; r < run; ++r) std::memcpy(host + (i + r) * vr + d * esz, tmp.data() + r * esz, esz);
        } else {
          for (size_t r = 0; r < run; ++r) std::memcpy(tmp.data() + r * esz, host + (i + r) * vr + d * esz, esz);
          tensor_set(v, tmp.data(), at, run * esz);
        }
      });
    }
    host += n_host * vr;
  }
}

std::vector<uint8_t> kv_cache::save(int32_t seq, int32_t n) const {
  check_seq(seq, "save");
  std::vector<uint32_t> at(static_cast<size_t>(std::max(n, 0)), UINT32_MAX);
  for (uint32_t c = 0; c < n_ctx_; ++c) {
    if ((cells_[c].seqs >> seq & 1) && cells_[c].pos >= 0 && cells_[c].pos < n) at[static_cast<size_t>(cells_[c].pos)] = c;
  }
  for (size_t p = 0; p < at.size(); ++p) {
    if (at[p] == UINT32_MAX) throw error("kv cache: save: sequence " + std::to_string(seq) + " lacks position " + std::to_string(p));
  }
  std::vector<uint8_t> out(at.size() * bytes_per_token());
  move_rows(at, out.data(), at.size(), true);
  return out;
}

std::vector<uint8_t> kv_cache::shifted(int32_t seq, int32_t p0, int32_t n, const turn_fn& turn) const {
  const int32_t held = seq_pos_max(seq) + 1;
  if (p0 < 0 || n <= 0 || p0 + n > held) {
    throw error("kv cache: shift of sequence " + std::to_string(seq) + ": positions [" + std::to_string(p0) + ", " +
                std::to_string(p0 + n) + ") of " + std::to_string(held));
  }
  const std::vector<uint8_t> old = save(seq, held);
  const auto kept = static_cast<size_t>(p0), moved = static_cast<size_t>(held - p0 - n), m = kept + moved;
  std::vector<uint8_t> out(m * bytes_per_token());
  const uint8_t* src = old.data();
  uint8_t* dst = out.data();
  std::vector<float> f;
  for (size_t il = 0; il < k_.size(); ++il) {
    for (const bool is_k : {true, false}) {
      const tensor& t = is_k ? *k_[il] : *v_[il];
      // save()'s rows: K's and (untransposed) V's as stored, a transposed V's gathered per position.
      const bool trans = !is_k && v_trans_[il];
      const int64_t n_embd = trans ? t.ne[1] : t.ne[0];
      const size_t row = trans ? static_cast<size_t>(n_embd) * type_size(t.type) : row_size(t.type, n_embd);
      std::memcpy(dst, src, kept * row);
      std::memcpy(dst + kept * row, src + (kept + static_cast<size_t>(n)) * row, moved * row);
      if (is_k && moved > 0) {
        const type_traits& tt = traits(t.type);
        if (tt.to_float == nullptr || tt.from_float_ref == nullptr) {
          throw error(std::string("kv cache: shift: K of type ") + std::string(tt.name) + " cannot be converted");
        }
        f.resize(moved * static_cast<size_t>(n_embd));
        for (size_t r = 0; r < moved; ++r) tt.to_float(dst + (kept + r) * row, f.data() + r * static_cast<size_t>(n_embd), n_embd);
        turn(static_cast<uint32_t>(il), f.data(), static_cast<int64_t>(moved));
        for (size_t r = 0; r < moved; ++r) tt.from_float_ref(f.data() + r * static_cast<size_t>(n_embd), dst + (kept + r) * row, n_embd);
      }
      src += static_cast<size_t>(held) * row;
      dst += m * row;
    }
  }
  return out;
}

void kv_cache::restore(int32_t seq, std::span<const uint8_t> saved, int32_t n_saved, int32_t n) {
  check_seq(seq, "restore");
  if (n < 0 || n > n_saved || saved.size() != static_cast<size_t>(n_saved) * bytes_per_token()) {
    throw error("kv cache: restore: " + std::to_string(n) + " of " + std::to_string(n_saved) + " saved positions in " +
                std::to_string(saved.size()) + " bytes");
  }
  const std::vector<uint32_t> cells = find_slots(static_cast<uint32_t>(n), std::span<const int32_t>(&seq, 1));
  // The bytes are only read (to_host is false): move_rows takes one pointer for both directions.
  move_rows(cells, const_cast<uint8_t*>(saved.data()), static_cast<size_t>(n_saved), false);
  std::vector<int32_t> pos(cells.size()), seqs(cells.size(), seq);
  for (size_t i = 0; i < cells.size(); ++i) pos[i] = static_cast<int32_t>(i);
  commit(cells, pos, seqs);
}

int32_t kv_cache::seq_pos_max(int32_t seq) const {
  check_seq(seq, "seq_pos_max");
  int32_t m = -1;
  for (const cell& c : cells_) {
    if (c.seqs >> seq & 1) m = std::max(m, c.pos);
  }
  return m;
}

uint32_t kv_cache::used_cells() const {
  uint32_t n = 0;
  for (const cell& c : cells_) n += c.seqs != 0;
  return n;
}

void kv_cache::fill_mask(float* dst, uint32_t n_kv, uint32_t n_rows, const std::vector<int32_t>& pos,
                         const std::vector<int32_t>& seq, const std::vector<uint32_t>& cells, uint32_t window) const {
  // The cells of the ubatch itself are not committed yet: treat them as holding their tokens.
  std::vector<cell> view(cells_.begin(), cells_.begin() + n_kv);
  for (size_t i = 0; i < cells.size(); ++i) {
    if (cells[i] < n_kv) view[cells[i]] = cell{pos[i], uint64_t{1} << seq[i]};
  }
  for (uint32_t t = 0; t < n_rows; ++t) {
    float* row = dst + static_cast<size_t>(t) * n_kv;
    if (t >= pos.size()) {
      std::fill(row, row + n_kv, -INFINITY);
      continue;
    }
    const uint64_t bit = uint64_t{1} << seq[t];
    for (uint32_t c = 0; c < n_kv; ++c) {
      const cell& k = view[c];
      bool visible = (k.seqs & bit) != 0 && k.pos <= pos[t];
      if (visible && window > 0 && pos[t] - k.pos >= static_cast<int32_t>(window)) visible = false;
      row[c] = visible ? 0.0f : -INFINITY;
    }
  }
}

std::map<buffer_type_i*, size_t> kv_cache::bytes_by_buft() const {
  std::map<buffer_type_i*, size_t> out;
  for (const auto& b : buffers_) out[&b->type()] += b->size();
  return out;
}

size_t kv_cache::bytes() const {
  size_t n = 0;
  for (const auto& b : buffers_) n += b->size();
  return n;
}

}  // namespace troupe::llm
