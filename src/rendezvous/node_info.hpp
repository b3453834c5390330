#pragma once
// The value each node publishes under rdzv/<run_id>/<g>/node/<slot>:
// "host \t addr \t local_world_size \t pid \t standby" (standby: HOST:PORT of the node's
// standby store, "-" for none). Internal to src/rendezvous.

#include <string>

#include "ddp/rendezvous/diagnosis.hpp"

namespace ddp::rdzv {

std::string encode_node_info(const std::string& host, const std::string& addr, int local_world_size,
                             long pid, const std::string& standby);

// Throws ProtocolError naming the key when the value is malformed.
JoinedNode decode_node_info(const std::string& value, int node_rank, const std::string& key);

}  // namespace ddp::rdzv
