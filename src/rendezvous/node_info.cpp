#include "node_info.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>
#include <vector>

#include "ddp/util/error.hpp"

namespace ddp::rdzv {

std::string encode_node_info(const std::string& host, const std::string& addr, int local_world_size,
                             long pid, const std::string& standby) {
  return fmt::format("{}\t{}\t{}\t{}\t{}", host, addr, local_world_size, pid,
                     standby.empty() ? "-" : standby);
}

JoinedNode decode_node_info(const std::string& value, int node_rank, const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream in(value);
  std::string part;
  while (std::getline(in, part, '\t')) parts.push_back(part);
  JoinedNode n;
  n.node_rank = node_rank;
  char* end = nullptr;
  long lws = parts.size() == 5 ? std::strtol(parts[2].c_str(), &end, 10) : 0;
  if (parts.size() != 5 || end == parts[2].c_str() || *end != '\0' || lws < 1) {
    throw ProtocolError(fmt::format(
        "rendezvous key {} holds '{}', not a node description (host, address, workers, pid, "
        "standby store): is another program or an older ddprun using the same endpoint?",
        key, value));
  }
  n.host = parts[0];
  n.addr = parts[1];
  n.local_world_size = static_cast<int>(lws);
  if (parts[4] != "-") n.standby = parts[4];
  return n;
}

}  // namespace ddp::rdzv
