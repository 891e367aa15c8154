#include "backends/rpc/wire/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cctype>
#include <fstream>
#include <iterator>
#include <vector>

namespace troupe::rpc {
namespace {

mac hmac_sha256(std::string_view key, const std::vector<uint8_t>& msg) {
  mac out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), msg.size(), out.data(), &len) ==
          nullptr ||
      len != out.size()) {
    throw error("rpc auth: HMAC-SHA256 failed");
  }
  return out;
}

}  // namespace

std::string load_key_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error("rpc auth: cannot read key file '" + path.string() + "'");
  std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  if (key.size() < min_key_bytes) {
    throw error("rpc auth: the key in '" + path.string() + "' has " + std::to_string(key.size()) +
                " bytes; at least " + std::to_string(min_key_bytes) + " are needed");
  }
  return key;
}

nonce random_nonce() {
  nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw error("rpc auth: no random bytes for a nonce");
  return n;
}

mac client_proof(std::string_view key, const nonce& server_nonce, const nonce& client_nonce, const version& v) {
  std::vector<uint8_t> msg;
  writer w(msg);
  w.str("troupe-rpc client");
  w.bytes(server_nonce.data(), server_nonce.size());
  w.bytes(client_nonce.data(), client_nonce.size());
  w.u16(v.major);
  w.u16(v.minor);
  w.u16(v.patch);
  return hmac_sha256(key, msg);
}

mac server_proof(std::string_view key, const nonce& client_nonce, const nonce& server_nonce) {
  std::vector<uint8_t> msg;
  writer w(msg);
  w.str("troupe-rpc server");
  w.bytes(client_nonce.data(), client_nonce.size());
  w.bytes(server_nonce.data(), server_nonce.size());
  return hmac_sha256(key, msg);
}

mac keyed_proof(std::string_view key, std::string_view label, std::initializer_list<std::span<const uint8_t>> parts) {
  std::vector<uint8_t> msg;
  writer w(msg);
  w.str(std::string(label));
  for (const auto& p : parts) {
    w.u32(static_cast<uint32_t>(p.size()));  // (lengths first: no two part lists give the same message)
    w.bytes(p.data(), p.size());
  }
  return hmac_sha256(key, msg);
}

bool equal_macs(const mac& a, const mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace troupe::rpc
