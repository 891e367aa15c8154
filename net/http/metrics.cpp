#include "net/http/metrics.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace troupe::http {

namespace {

constexpr size_t max_durations = 1024;
constexpr auto window = std::chrono::seconds(10);

// A label value with \, " and newlines escaped (Prometheus text format).
std::string label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

}  // namespace

void daemon_metrics::request_done(const std::string& endpoint, int status, double seconds) {
  std::lock_guard l(mutex_);
  ++requests_[{endpoint, status}];
  if (endpoint == "chat" || endpoint == "completions") {
    durations_.push_back(seconds);
    if (durations_.size() > max_durations) durations_.pop_front();
  }
}

void daemon_metrics::tokens(uint64_t prompt, uint64_t cached, uint64_t generated, double gen_seconds) {
  std::lock_guard l(mutex_);
  prompt_tokens_ += prompt;
  prompt_cached_ += std::min(cached, prompt);
  generated_tokens_ += generated;
  gen_seconds_ += gen_seconds;
  const auto now = clock::now();
  recent_.emplace_back(now, generated);
  while (!recent_.empty() && recent_.front().first < now - window) recent_.pop_front();
}

uint64_t daemon_metrics::n_requests(const std::string& endpoint, int status) const {
  std::lock_guard l(mutex_);
  const auto it = requests_.find({endpoint, status});
  return it == requests_.end() ? 0 : it->second;
}

std::string daemon_metrics::render(const std::vector<model_gauges>& models, const actors::memory_breakdown& memory,
                                   const std::vector<actors::decoder_stats>& decoders) const {
  std::ostringstream os;
  std::lock_guard l(mutex_);
  os << "# HELP troupe_requests_total HTTP requests answered, by endpoint and status.\n"
     << "# TYPE troupe_requests_total counter\n";
  for (const auto& [k, n] : requests_) {
    os << "troupe_requests_total{endpoint=\"" << label(k.first) << "\",status=\"" << k.second << "\"} " << n << "\n";
  }
  os << "# HELP troupe_requests_cancelled_total Answers cut short (client disconnected, timeout, shutdown).\n"
     << "# TYPE troupe_requests_cancelled_total counter\n"
     << "troupe_requests_cancelled_total " << cancelled_.load() << "\n";
  os << "# HELP troupe_cluster_recoveries_total Models placed and loaded again after a cluster node they used went down.\n"
     << "# TYPE troupe_cluster_recoveries_total counter\n"
     << "troupe_cluster_recoveries_total " << recoveries_ << "\n"
     << "# HELP troupe_cluster_last_recovery_seconds How long the last of those took (from the loss to loaded).\n"
     << "# TYPE troupe_cluster_last_recovery_seconds gauge\n"
     << "troupe_cluster_last_recovery_seconds " << last_recovery_s_ << "\n";
  os << "# HELP troupe_prompt_tokens_total Prompt tokens of finished answers.\n"
     << "# TYPE troupe_prompt_tokens_total counter\n"
     << "troupe_prompt_tokens_total " << prompt_tokens_ << "\n";
  os << "# HELP troupe_prompt_tokens_cached_total Prompt tokens whose KV came from the cache (the session's own, another session's or a kept conversation's), not decoded.\n"
     << "# TYPE troupe_prompt_tokens_cached_total counter\n"
     << "troupe_prompt_tokens_cached_total " << prompt_cached_ << "\n"
     << "# HELP troupe_prompt_tokens_computed_total Prompt tokens decoded.\n"
     << "# TYPE troupe_prompt_tokens_computed_total counter\n"
     << "troupe_prompt_tokens_computed_total " << (prompt_tokens_ - prompt_cached_) << "\n";
  os << "# HELP troupe_generated_tokens_total Tokens generated.\n"
     << "# TYPE troupe_generated_tokens_total counter\n"
     << "troupe_generated_tokens_total " << generated_tokens_ << "\n";
  os << "# HELP troupe_generation_seconds_total Time spent generating, summed over answers.\n"
     << "# TYPE troupe_generation_seconds_total counter\n"
     << "troupe_generation_seconds_total " << num(gen_seconds_) << "\n";
  uint64_t recent = 0;
  const auto now = clock::now();
  for (const auto& [t, n] : recent_) {
    if (t >= now - window) recent += n;
  }
  os << "# HELP troupe_tokens_per_second Tokens generated over the last 10 seconds, per second.\n"
     << "# TYPE troupe_tokens_per_second gauge\n"
     << "troupe_tokens_per_second " << num(static_cast<double>(recent) / 10.0) << "\n";
  os << "# HELP troupe_request_duration_seconds Completion request latency over the last 1024 requests.\n"
     << "# TYPE troupe_request_duration_seconds summary\n";
  if (!durations_.empty()) {
    std::vector<double> d(durations_.begin(), durations_.end());
    std::sort(d.begin(), d.end());
    double sum = 0;
    for (double x : d) sum += x;
    for (double q : {0.5, 0.9, 0.99}) {
      const size_t i = std::min(d.size() - 1, static_cast<size_t>(q * static_cast<double>(d.size())));
      os << "troupe_request_duration_seconds{quantile=\"" << num(q) << "\"} " << num(d[i]) << "\n";
    }
    os << "troupe_request_duration_seconds_sum " << num(sum) << "\n"
       << "troupe_request_duration_seconds_count " << d.size() << "\n";
  }
  os << "# HELP troupe_requests_in_flight Requests being answered now.\n"
     << "# TYPE troupe_requests_in_flight gauge\n"
     << "troupe_requests_in_flight " << in_flight.load() << "\n";
  os << "# HELP troupe_queue_depth Requests waiting for a free session.\n"
     << "# TYPE troupe_queue_depth gauge\n"
     << "troupe_queue_depth " << queue_depth.load() << "\n";
  os << "# HELP troupe_http_connections HTTP connections open now.\n"
     << "# TYPE troupe_http_connections gauge\n"
     << "troupe_http_connections " << connections.open.load() << "\n"
     << "# HELP troupe_http_connections_total HTTP connections accepted.\n"
     << "# TYPE troupe_http_connections_total counter\n"
     << "troupe_http_connections_total " << connections.accepted.load() << "\n"
     << "# HELP troupe_http_connections_rejected_total Connections answered 503 over server.max_connections.\n"
     << "# TYPE troupe_http_connections_rejected_total counter\n"
     << "troupe_http_connections_rejected_total " << connections.rejected.load() << "\n"
     << "# HELP troupe_http_timeouts_total Connections closed for a header, body or write deadline.\n"
     << "# TYPE troupe_http_timeouts_total counter\n"
     << "troupe_http_timeouts_total " << connections.timed_out.load() << "\n";
  os << "# HELP troupe_model_ready Whether a configured model is loaded and serving.\n"
     << "# TYPE troupe_model_ready gauge\n";
  for (const model_gauges& m : models) os << "troupe_model_ready{model=\"" << label(m.model) << "\"} " << (m.ready ? 1 : 0) << "\n";
  os << "# HELP troupe_model_loaded Whether a model is in memory now (models load on demand and unload when idle).\n"
     << "# TYPE troupe_model_loaded gauge\n";
  for (const model_gauges& m : models) os << "troupe_model_loaded{model=\"" << label(m.model) << "\"} " << (m.state == "loaded" ? 1 : 0) << "\n";
  os << "# HELP troupe_model_loads_total Times a model was loaded (at start, on demand, or again after its placement was lost).\n"
     << "# TYPE troupe_model_loads_total counter\n";
  for (const model_gauges& m : models) os << "troupe_model_loads_total{model=\"" << label(m.model) << "\"} " << m.loads << "\n";
  os << "# HELP troupe_model_unloads_total Times a model was unloaded: idle past its keep_alive, or for another model's room.\n"
     << "# TYPE troupe_model_unloads_total counter\n";
  for (const model_gauges& m : models) os << "troupe_model_unloads_total{model=\"" << label(m.model) << "\"} " << m.unloads << "\n";
  os << "# HELP troupe_sessions Sessions (parallel slots) of a model by state.\n"
     << "# TYPE troupe_sessions gauge\n";
  for (const model_gauges& m : models) {
    os << "troupe_sessions{model=\"" << label(m.model) << "\",state=\"busy\"} " << m.busy << "\n"
       << "troupe_sessions{model=\"" << label(m.model) << "\",state=\"idle\"} " << m.idle << "\n"
       << "troupe_sessions{model=\"" << label(m.model) << "\",state=\"free\"} " << (m.slots - m.busy - m.idle) << "\n";
  }
  os << "# HELP troupe_memory_bytes Memory held, by buffer type, device and kind (model, context, compute).\n"
     << "# TYPE troupe_memory_bytes gauge\n";
  for (const actors::buft_usage& u : memory.entries) {
    const std::string lbl = "buft=\"" + label(u.buft) + "\",device=\"" + label(u.device) + "\",host=\"" +
                            (u.is_host ? "true" : "false") + "\"";
    os << "troupe_memory_bytes{" << lbl << ",kind=\"model\"} " << u.model << "\n"
       << "troupe_memory_bytes{" << lbl << ",kind=\"context\"} " << u.context << "\n"
       << "troupe_memory_bytes{" << lbl << ",kind=\"compute\"} " << u.compute << "\n";
  }
  os << "# HELP troupe_decode_steps_total Session decode steps (prompt chunks and tokens) a model's scheduler ran.\n"
     << "# TYPE troupe_decode_steps_total counter\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_decode_steps_total{model=\"" << label(s.model) << "\"} " << s.n_steps << "\n";
  os << "# HELP troupe_decode_batches_total Decodes a model's scheduler ran (steps of sessions decoding together share one).\n"
     << "# TYPE troupe_decode_batches_total counter\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_decode_batches_total{model=\"" << label(s.model) << "\"} " << s.n_batches << "\n";
  os << "# HELP troupe_decode_batch_max Most session steps decoded in one batch so far.\n"
     << "# TYPE troupe_decode_batch_max gauge\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_decode_batch_max{model=\"" << label(s.model) << "\"} " << s.max_steps << "\n";
  os << "# HELP troupe_prefix_reused_tokens_total Prompt positions a session took from another sequence's KV cells (a live session's or a kept conversation's) instead of decoding them.\n"
     << "# TYPE troupe_prefix_reused_tokens_total counter\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_prefix_reused_tokens_total{model=\"" << label(s.model) << "\"} " << s.reused_tokens << "\n";
  os << "# HELP troupe_kept_conversations Conversations kept in a model's KV cache after their session moved on.\n"
     << "# TYPE troupe_kept_conversations gauge\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_kept_conversations{model=\"" << label(s.model) << "\"} " << s.kept_now << "\n";
  os << "# HELP troupe_kept_tokens Positions those kept conversations hold (cells they may share with live sessions).\n"
     << "# TYPE troupe_kept_tokens gauge\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_kept_tokens{model=\"" << label(s.model) << "\"} " << s.kept_tokens_now << "\n";
  os << "# HELP troupe_prompt_cache_restored_tokens_total Prompt positions written back from the host-RAM prompt cache instead of decoded.\n"
     << "# TYPE troupe_prompt_cache_restored_tokens_total counter\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_prompt_cache_restored_tokens_total{model=\"" << label(s.model) << "\"} " << s.restored_tokens << "\n";
  os << "# HELP troupe_idle_evictions_total Idle sessions' sequences whose cells went to make room (no kept conversation left to evict).\n"
     << "# TYPE troupe_idle_evictions_total counter\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_idle_evictions_total{model=\"" << label(s.model) << "\"} " << s.idle_evictions << "\n";
  os << "# HELP troupe_kv_cells_used KV cells in use now (the model's one pool: sessions' sequences and kept conversations).\n"
     << "# TYPE troupe_kv_cells_used gauge\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_kv_cells_used{model=\"" << label(s.model) << "\"} " << s.kv_cells_used << "\n";
  os << "# HELP troupe_kv_cells_total KV cells of the model's pool (n_ctx).\n"
     << "# TYPE troupe_kv_cells_total gauge\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_kv_cells_total{model=\"" << label(s.model) << "\"} " << s.kv_cells << "\n";
  os << "# HELP troupe_kv_cells_shared KV cells more than one sequence holds now: prefixes shared, not copied (troupe shares cells, not blocks).\n"
     << "# TYPE troupe_kv_cells_shared gauge\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_kv_cells_shared{model=\"" << label(s.model) << "\"} " << s.kv_cells_shared << "\n";
  os << "# HELP troupe_prompt_cache_bytes Host memory the prompt cache holds (conversations evicted from the KV cache).\n"
     << "# TYPE troupe_prompt_cache_bytes gauge\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_prompt_cache_bytes{model=\"" << label(s.model) << "\"} " << s.host_bytes << "\n";
  os << "# HELP troupe_prompt_cache_entries Conversations the host-RAM prompt cache holds.\n"
     << "# TYPE troupe_prompt_cache_entries gauge\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_prompt_cache_entries{model=\"" << label(s.model) << "\"} " << s.host_entries << "\n";
  os << "# HELP troupe_kept_evictions_total Kept conversations dropped to make room in the KV cache.\n"
     << "# TYPE troupe_kept_evictions_total counter\n";
  for (const actors::decoder_stats& s : decoders) os << "troupe_kept_evictions_total{model=\"" << label(s.model) << "\"} " << s.kept_evictions << "\n";
  return os.str();
}

}  // namespace troupe::http
