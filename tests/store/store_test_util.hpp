#pragma once
// Helpers shared by the store tests: a server on a free port, raw sockets for protocol
// abuse, a capture of the store's log, and a temporary directory.

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

#include "ddp/store/protocol.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/logging.hpp"
#include "ddp/util/remove_tree.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::test {

using namespace std::chrono_literals;

// A TcpStoreServer on 127.0.0.1 and a free port (port 0), serving on a background thread.
inline std::unique_ptr<TcpStoreServer> start_server(std::optional<std::string> token = "") {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.token = std::move(token);
  auto server = std::make_unique<TcpStoreServer>(options);
  server->start();
  return server;
}

inline TcpStoreOptions client_options(uint16_t port, std::chrono::milliseconds timeout = 10s,
                                      std::optional<std::string> token = "") {
  TcpStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = timeout;
  options.token = std::move(token);
  return options;
}

// A raw connection for sending arbitrary bytes.
inline net::Socket raw_connect(uint16_t port) {
  return net::connect_tcp("127.0.0.1", port, net::Clock::now() + 10s);
}

inline void raw_send(const net::Socket& sock, const std::string& bytes) {
  net::write_all(sock.fd(), bytes.data(), bytes.size(), net::Clock::now() + 10s, "server");
}

// Reads one frame from a raw connection (throws on timeout or a closed connection).
inline store_protocol::Frame raw_read_frame(const net::Socket& sock) {
  std::string buffer(store_protocol::kHeaderBytes, '\0');
  auto deadline = net::Clock::now() + 10s;
  net::read_exact(sock.fd(), buffer.data(), buffer.size(), deadline, "server");
  auto payload = static_cast<uint8_t>(buffer[12]) | (static_cast<uint8_t>(buffer[13]) << 8) |
                 (static_cast<uint8_t>(buffer[14]) << 16) |
                 (static_cast<uint32_t>(static_cast<uint8_t>(buffer[15])) << 24);
  buffer.resize(store_protocol::kHeaderBytes + payload);
  net::read_exact(sock.fd(), buffer.data() + store_protocol::kHeaderBytes, payload, deadline,
                  "server");
  auto parsed =
      store_protocol::parse_frame(reinterpret_cast<const uint8_t*>(buffer.data()), buffer.size());
  EXPECT_EQ(parsed.status, store_protocol::ParseStatus::kComplete) << parsed.error;
  return parsed.frame;
}

inline std::string encode(store_protocol::Op op, std::vector<std::string> fields,
                          uint32_t request_id = 1) {
  store_protocol::Frame frame;
  frame.op = op;
  frame.request_id = request_id;
  frame.fields = std::move(fields);
  return store_protocol::encode_frame(frame);
}

// Captures what the store (spdlog logger "ddp.store") logs while alive.
class LogCapture {
 public:
  LogCapture() : logger_(log::get("ddp.store")) {
    sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_);
    logger_->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = logger_->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() {
    logger_->flush();
    return stream_.str();
  }

 private:
  std::shared_ptr<spdlog::logger> logger_;
  std::ostringstream stream_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ddp-store-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    ddp::remove_tree(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace ddp::test
