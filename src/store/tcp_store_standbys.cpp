// TcpStore's standbys: steering a client to an endpoint, promoting a standby, forwarding
// writes to one, and the DDP_STORE_STANDBYS list.
#include "ddp/store/tcp_store.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>
#include <tuple>

#include "ddp/util/error.hpp"

namespace ddp {

using store_protocol::encode_i64;
using Ms = std::chrono::milliseconds;

void TcpStore::prefer_endpoint(const std::string& endpoint) {
  const auto wanted = net::parse_endpoint(endpoint);
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (endpoints_[i] != wanted) continue;
    sock_.close();
    current_endpoint_ = i;
    options_.host = wanted.first;
    options_.port = wanted.second;
    return;
  }
  throw UsageError(
      fmt::format("TcpStore::prefer_endpoint: {} is neither the store nor one of "
                  "its standbys",
                  endpoint));
}

void TcpStore::promote(const std::vector<std::string>& next_standbys) {
  call(Op::kPromote, next_standbys, timeout_, {});
}

std::vector<std::string> TcpStore::replicate(const std::string& client_id, uint32_t request_id,
                                             Op op, std::vector<std::string> fields) {
  fields.insert(fields.begin(),
                {client_id, encode_i64(request_id), std::string(1, static_cast<char>(op))});
  return call(Op::kReplicate, std::move(fields), timeout_, {});
}

std::vector<std::string> split_endpoints(const std::string& text, const std::string& source) {
  std::vector<std::string> out;
  std::stringstream in{text};
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    try {
      net::parse_endpoint(item);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("{}={}: {}", source, text, e.what()));
    }
    out.push_back(item);
  }
  return out;
}

std::vector<std::string> standbys_from_env() {
  const char* value = std::getenv(kStandbysEnvVar);
  return value == nullptr ? std::vector<std::string>() : split_endpoints(value, kStandbysEnvVar);
}

std::string promote_first_standby(const std::vector<std::string>& standbys,
                                  const std::optional<std::string>& token, Ms per_attempt) {
  std::string tried;
  for (size_t i = 0; i < standbys.size(); ++i) {
    try {
      TcpStoreOptions o;
      std::tie(o.host, o.port) = net::parse_endpoint(standbys[i]);
      o.token = token;
      o.role = store_protocol::kAdminRole;
      o.timeout = per_attempt;
      o.connect_retry = per_attempt;
      TcpStore admin(o);
      admin.promote(std::vector<std::string>(standbys.begin() + i + 1, standbys.end()));
      return standbys[i];
    } catch (const Error& e) {
      tried += fmt::format("; {}: {}", standbys[i], e.what());
    }
  }
  throw NetworkError(fmt::format("no standby store could be promoted{}",
                                 tried.empty() ? " (none was named)" : tried));
}

}  // namespace ddp
