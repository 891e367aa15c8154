// A client that stalls in the middle of an upload until it is killed: `rpc_stall_client PORT`.
// It says hello, allocates a 64 MiB buffer, announces a set_tensor of 64 MiB, sends 1 MiB of it, prints
// "ready" and sleeps. tests/net/test_rpc_loopback.cpp kills it and checks that the server frees the buffer.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "tests/net/raw_socket.h"

int main(int argc, char** argv) {
  using namespace troupe::rpc;
  if (argc != 2) return 2;
  testing::raw_conn c(static_cast<uint16_t>(std::atoi(argv[1])));
  if (!c.connected() || c.hello() != status::ok) return 1;
  const uint64_t size = 64u << 20;
  const auto a = c.call(testing::alloc(0, size));
  if (!a || a->code != 0 || a->payload.size() != 16) return 1;
  reader r(a->payload);
  const uint64_t h = r.u64();
  std::vector<uint8_t> prefix;
  writer w(prefix);
  w.u64(h);
  w.u64(0);
  w.u32(0);
  if (!c.send_header(static_cast<uint8_t>(command::set_tensor), set_tensor_prefix + size) || !c.send_bytes(prefix)) return 1;
  std::vector<uint8_t> part(1u << 20, 0x5a);
  if (!c.send_bytes(part)) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) ::pause();
}
