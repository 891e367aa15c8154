// The typed handles of troupe's actors: each actor's message interface, with a line per handler, and the
// handles of the actors that receive streams (load progress, tokens, memory and peer updates). They come
// before the message structs (actors/messages.h), so that messages carry typed handles, never caf::actor:
// the compiler checks what is sent to a handle taken from a message.
//
// Order: atoms (actors/atoms.h), these handles over forward-declared message types, then the messages;
// each actor's header (actors/<name>_actor.h) adds its parameters and spawn function. A handle converts
// to any handle whose interface is a subset of its own (a supervisor_actor is a peer_subscriber).
#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/atoms.h"

namespace troupe::actors {

struct memory_event;
struct device_status;
struct memory_breakdown;
struct alloc_request;
struct buffer_info;
struct tensor_range;
struct range_upload;
struct upload_job;
struct upload_result;
struct decode_split;
struct split_result;
struct compute_reservation;
struct graph_plan;
struct allocator_usage;
struct load_request;
struct load_progress;
struct model_info;
struct generate_request;
struct token_event;
struct generate_reply;
struct session_request;
struct session_prefix;
struct embed_request;
struct embed_reply;
struct decode_step;
struct step_logits;
struct decoder_stats;
struct peer_status;
struct peer_memory;
struct engine_status;
struct actor_directory;

// ---- receivers of streams ----

// Progress of a load (load_request::progress).
using progress_listener = caf::typed_actor<caf::reacts_to<progress_atom, load_progress>>;
// Pieces of an answer as they are generated (generate_request::subscriber).
using token_subscriber = caf::typed_actor<caf::reacts_to<token_atom, token_event>>;
// The memory breakdown after every change (memory accountant subscriptions).
using breakdown_subscriber = caf::typed_actor<caf::reacts_to<update_atom, memory_breakdown>>;
// A remote peer's state after every change (peer actor subscriptions).
using peer_subscriber = caf::typed_actor<caf::reacts_to<update_atom, peer_status>>;

// ---- actors (actors/<name>_actor.h) ----

using memory_accountant_actor = caf::typed_actor<
    // Records an allocation (bytes > 0) or a release (bytes < 0).
    caf::reacts_to<record_atom, memory_event>,
    // A device's current memory (total, free): the device rows of the table.
    caf::reacts_to<device_atom, device_status>,
    // The breakdown now.
    caf::replies_to<get_atom, breakdown_atom>::with<memory_breakdown>,
    // The subscriber gets (update_atom, memory_breakdown) now and after every change, until it unsubscribes
    // or terminates; false when max_subscribers are subscribed already.
    caf::replies_to<subscribe_atom, breakdown_subscriber>::with<bool>,
    // Stops updates to a subscriber.
    caf::reacts_to<unsubscribe_atom, breakdown_subscriber>>;

using device_actor = caf::typed_actor<
    // Allocates a buffer of the device's default buffer type, accounted as the request's kind and owner.
    caf::replies_to<alloc_atom, alloc_request>::with<buffer_info>,
    // Frees a buffer this actor allocated; replies its size.
    caf::replies_to<free_atom, uint64_t>::with<uint64_t>,
    // Frees every buffer this actor allocated; replies their bytes.
    caf::replies_to<free_atom, all_atom>::with<uint64_t>,
    // Writes bytes into a buffer this actor allocated; replies the bytes written.
    caf::replies_to<upload_atom, range_upload>::with<uint64_t>,
    // Loads this device's part of a staged model load (range-mapped reads and uploads).
    caf::replies_to<upload_atom, upload_job>::with<upload_result>,
    // Returns bytes of a buffer this actor allocated.
    caf::replies_to<get_atom, tensor_range>::with<std::vector<char>>,
    // Computes one split of a model context's decode graph (a split task its scheduler registered).
    caf::replies_to<compute_atom, decode_split>::with<split_result>,
    // The device's memory now.
    caf::replies_to<memory_atom>::with<device_status>>;

using allocator_actor = caf::typed_actor<
    // The owner's externally held compute memory of this buffer type is now `bytes`; replies the change.
    caf::replies_to<reserve_atom, compute_reservation>::with<int64_t>,
    // Places an in-process graph (local_registry id) in this owner's buffers, growing them if needed;
    // replies the bytes the owner's buffers now hold.
    caf::replies_to<plan_atom, graph_plan>::with<uint64_t>,
    // Releases every reservation and buffer of an owner; replies the bytes released.
    caf::replies_to<release_atom, std::string>::with<uint64_t>,
    // Releases every owner's reservations and buffers; replies the bytes released.
    caf::replies_to<release_atom, all_atom>::with<uint64_t>,
    // Bytes per owner.
    caf::replies_to<get_atom, usage_atom>::with<allocator_usage>>;

using loader_actor = caf::typed_actor<
    // Loads a model; progress goes to request.progress as (progress_atom, load_progress).
    caf::replies_to<load_atom, load_request>::with<model_info>,
    // Releases a loaded model's weights (the caller has stopped its users); replies whether it existed.
    caf::replies_to<unload_atom, std::string>::with<bool>,
    // Cancels a running load of that name (its requester gets errc::cancelled).
    caf::reacts_to<cancel_atom, std::string>,
    // The device actor serving a device (again, after a restart).
    caf::reacts_to<device_atom, std::string, device_actor>>;

using session_actor = caf::typed_actor<
    // One answer; pieces of text go to request.subscriber as (token_atom, token_event).
    caf::replies_to<generate_atom, generate_request>::with<generate_reply>,
    // Ends the current answer now (its requester gets errc::cancelled).
    caf::reacts_to<cancel_atom>,
    // Forgets the conversation (its cached tokens).
    caf::replies_to<reset_atom>::with<bool>,
    // Leaves the model and terminates.
    caf::replies_to<close_atom>::with<bool>,
    // The session's sequence on the model's scheduler (from the supervisor, before the handle is handed out).
    caf::reacts_to<attach_atom, int32_t>,
    // What the session holds in the cache (its sequence and tokens).
    caf::replies_to<get_atom, prefix_atom>::with<session_prefix>,
    // Takes another session's cached tokens as its own (shared cells, no decode).
    caf::replies_to<share_atom, session_prefix>::with<bool>,
    // The embedding of token ids (llm/embedding.h: pooled as the model declares, length 1), computed by the
    // model's decoder actor, which answers the requester; the conversation's cache is untouched.
    caf::replies_to<embed_atom, embed_request>::with<embed_reply>>;

using decoder_actor = caf::typed_actor<
    // A session joins the model: its sequence id (the context is created on the first attach).
    caf::replies_to<attach_atom, session_actor>::with<int32_t>,
    // A session leaves: its sequence's cache is cleared and the id freed.
    caf::replies_to<detach_atom, int32_t>::with<bool>,
    // The sender's sequence (dst) shares positions [0, n) of sequence src instead of what it held (in
    // order with the decodes before it).
    caf::replies_to<share_atom, int32_t, int32_t, int32_t>::with<bool>,
    // Decodes a step, batched with the other waiting steps; replies the logits of its last token.
    caf::replies_to<step_atom, decode_step>::with<step_logits>,
    // An embedding on the model's embeddings context (made on the first one: n_ctx_seq cells, its memory
    // on record as "embeddings:MODEL", freed with the context), one at a time on this actor's thread;
    // errc::down once the context is released.
    caf::replies_to<embed_atom, embed_request>::with<embed_reply>,
    // The session on this sequence has no further step for now (its answer ended or was cancelled).
    caf::reacts_to<end_atom, int32_t>,
    // Decodes the waiting steps now (sent to itself after flush_delay).
    caf::reacts_to<flush_atom>,
    // Batching and memory figures.
    caf::replies_to<get_atom, stats_atom>::with<decoder_stats>,
    // Frees the context (KV cache, compute memory) and reports the release; attached sessions are dropped.
    caf::replies_to<release_atom>::with<bool>,
    // The device actor serving a device (for decode splits).
    caf::reacts_to<device_atom, std::string, device_actor>,
    // Internal: a split of the context's decode, from its pipeline thread, to hand on to its device's actor.
    caf::reacts_to<compute_atom, decode_split>,
    // Internal: a decode submitted to the context's pipeline is done (its outcome is in the state).
    caf::reacts_to<decoded_atom, uint64_t>>;

using peer_actor = caf::typed_actor<
    // The peer's state, epoch, last error, devices and the models that use it.
    caf::replies_to<get_atom, status_atom>::with<peer_status>,
    // A health check now (when up) or a connection attempt now (when down); replies the state after it.
    caf::replies_to<check_atom>::with<peer_status>,
    // Every device's memory on the peer, asked over the connection. errc::down at once when the peer is
    // down; a request in flight when it drops fails (never waits for the I/O timeout).
    caf::replies_to<memory_atom>::with<peer_memory>,
    // A model placed weights on the peer's devices / no longer does (the supervisor sends these).
    caf::reacts_to<attach_atom, std::string>,
    caf::reacts_to<detach_atom, std::string>,
    // Stop trying to reach it (a cluster node that went away, or moved to another address): the state is
    // "parked" (the client marked down, no retries, no health checks) until a check asks to connect now.
    caf::reacts_to<park_atom, std::string>,
    // Subscribers receive (update_atom, peer_status) whenever the state, epoch or models change.
    caf::replies_to<subscribe_atom, peer_subscriber>::with<bool>,
    caf::reacts_to<unsubscribe_atom, peer_subscriber>,
    // Internal: a scheduled attempt or health check (stale generations are ignored), and the client's
    // report of a lost connection (epoch, why).
    caf::reacts_to<retry_atom, uint64_t>,
    caf::reacts_to<check_atom, uint64_t>,
    caf::reacts_to<lost_atom, uint64_t, std::string>>;

using supervisor_actor = caf::typed_actor<
    // Loads a model (loader actor), then starts its scheduler.
    caf::replies_to<load_atom, load_request>::with<model_info>,
    // Stops a model's scheduler and sessions and releases its memory; replies whether it was loaded.
    caf::replies_to<unload_atom, std::string>::with<bool>,
    // A new session on a loaded model.
    caf::replies_to<open_atom, session_request>::with<session_actor>,
    // The memory breakdown.
    caf::replies_to<get_atom, breakdown_atom>::with<memory_breakdown>,
    // Every supervised actor and whether it is up.
    caf::replies_to<get_atom, status_atom>::with<engine_status>,
    // The handles of the runtime's actors.
    caf::replies_to<get_atom, directory_atom>::with<actor_directory>,
    // Cancels a running load.
    caf::reacts_to<cancel_atom, std::string>,
    // A peer actor's new state (the supervisor subscribes to every peer it is given).
    caf::reacts_to<update_atom, peer_status>,
    // A peer to watch from now on, as those it was given (a cluster's node that joined); its devices get
    // actors when it is up. Replies true (false: it watches that peer already).
    caf::replies_to<connect_atom, peer_actor>::with<bool>,
    // Stops every session, scheduler and model, frees every buffer, and replies the final breakdown
    // (all zero); the supervisor and its actors then terminate.
    caf::replies_to<shutdown_atom>::with<memory_breakdown>>;

}  // namespace troupe::actors
