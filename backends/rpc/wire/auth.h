// Shared-key authentication of the hello (challenge-response, both directions), with HMAC-SHA256.
//
//   server -> greeting: server nonce (random, per connection)
//   client -> hello:    client nonce, client_proof = HMAC(key, "troupe-rpc client" | server nonce | client nonce
//                                                        | client version)
//   server -> reply:    server_proof = HMAC(key, "troupe-rpc server" | client nonce | server nonce)
//
// The server checks the client's proof in constant time; a client that has a key checks the server's proof,
// so neither side talks to a party that does not know the key. The key never crosses the wire, and a
// recorded exchange cannot be replayed (each side's nonce is fresh). This authenticates the connection, not
// each frame: on an untrusted network use TLS as well (docs/rpc.md, security model).
#pragma once

#include <filesystem>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "backends/rpc/wire/protocol.h"

namespace troupe::rpc {

constexpr size_t min_key_bytes = 16;

// Reads a key file: its bytes, without trailing white space. Throws error when the file cannot be read or
// the key is shorter than min_key_bytes.
std::string load_key_file(const std::filesystem::path& path);

// A nonce from the operating system's random source (OpenSSL RAND_bytes). Throws error when it fails.
nonce random_nonce();

mac client_proof(std::string_view key, const nonce& server_nonce, const nonce& client_nonce, const version& client_version);
mac server_proof(std::string_view key, const nonce& client_nonce, const nonce& server_nonce);

// HMAC-SHA256 over a label (which keeps proofs of one protocol from passing for another's) and the parts, for
// other challenge-responses over the same key (net/cluster's join).
mac keyed_proof(std::string_view key, std::string_view label, std::initializer_list<std::span<const uint8_t>> parts);

// Constant-time comparison.
bool equal_macs(const mac& a, const mac& b);

}  // namespace troupe::rpc
