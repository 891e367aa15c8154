// A self-signed certificate for tests: P-256, valid an hour for IP 127.0.0.1 and localhost, CA:TRUE (so it
// is its own CA: a TLS client or a mutual-TLS peer trusts it by loading the same file as its CA).
//
//   test::make_certificate(dir, "cluster");   // dir/cluster.pem, dir/cluster.key
#pragma once

#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

namespace troupe::test {

inline void make_certificate(const std::filesystem::path& dir, const std::string& stem, const std::string& cn = "localhost") {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  REQUIRE(key != nullptr);
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost"},
                            std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    REQUIRE(ext != nullptr);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  REQUIRE(X509_sign(x, key, EVP_sha256()) > 0);
  FILE* f = std::fopen((dir / (stem + ".pem")).c_str(), "w");
  REQUIRE(f != nullptr);
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen((dir / (stem + ".key")).c_str(), "w");
  REQUIRE(f != nullptr);
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
}

}  // namespace troupe::test
