// libFuzzer target for the etcd client's reply parsers (src/rendezvous/etcd/etcd_json.cpp),
// which read what an etcd endpoint, or anything else at its address, answers. Properties
// checked on every input: parsing never crashes or reads out of bounds (ASan), and the only
// exception that leaves a parser is ddp's ProtocolError (a JSON library error escaping would
// reach the user as an unexplained message).
#include <cstddef>
#include <cstdint>
#include <string>

#include "ddp/util/error.hpp"
#include "etcd_json.hpp"

using namespace ddp::rdzv::etcd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  auto guarded = [](auto parse) {
    try {
      parse();
    } catch (const ddp::ProtocolError&) {
    }
  };
  guarded([&] {
    Json j = parse_reply(body, "fuzz");
    guarded([&] { parse_range(j, "fuzz"); });
    guarded([&] { parse_txn(j, "fuzz"); });
    guarded([&] { int_field(j, "revision", "fuzz"); });
  });
  guarded([&] { parse_watch_message(body, "fuzz"); });
  (void)parse_error(body);
  guarded([&] { base64_decode(body, "fuzz"); });
  (void)quote_start(body);
  return 0;
}
