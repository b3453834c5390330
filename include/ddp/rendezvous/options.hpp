#pragma once
// What a rendezvous needs to know, as named fields, and the parsers for torchrun's spellings
// of them: --nnodes N|MIN:MAX, --rdzv-endpoint HOST[:PORT], --rdzv-conf key=value,...
//
// Every parser throws UsageError naming the flag, the bad value and what would be accepted.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddp::rdzv {

using Millis = std::chrono::milliseconds;

enum class Backend {
  kC10d,    // elastic: node ranks in join order, MIN:MAX nodes, membership changes
  kStatic,  // fixed: node ranks from --node-rank, exactly nnodes nodes
  kEtcd,    // elastic like c10d, the store an etcd cluster (torchrun's name "etcd")
  kEtcdV2,  // the same protocol and store, under torchrun's other name "etcd-v2"
};
const char* to_string(Backend backend);  // "c10d", "static", "etcd", "etcd-v2"
// "c10d" (also "c10d-experimental"), "static", "etcd" or "etcd-v2"; else a UsageError.
Backend parse_backend(const std::string& text);
// Node ranks in join order and MIN:MAX nodes (every backend but static).
inline bool is_elastic(Backend b) {
  return b != Backend::kStatic;
}
// The store is an etcd cluster (no agent serves it).
inline bool uses_etcd(Backend b) {
  return b == Backend::kEtcd || b == Backend::kEtcdV2;
}
// etcd's client port, torchrun's default for the etcd backends.
constexpr uint16_t kDefaultEtcdPort = 2379;

struct NodeRange {
  int min = 1;
  int max = 1;
};
// "N" or "MIN:MAX" with 1 <= MIN <= MAX.
NodeRange parse_nnodes(const std::string& text);

struct Endpoint {
  std::string host;
  uint16_t port = 0;
};
// "HOST", "HOST:PORT", "[V6]:PORT"; default_port when the port is omitted.
Endpoint parse_endpoint(const std::string& text, uint16_t default_port);
// A comma-separated list of parse_endpoint's forms (the members of an etcd cluster).
std::vector<Endpoint> parse_endpoints(const std::string& text, uint16_t default_port);

// The --rdzv-conf keys. Durations are seconds (fractions allowed).
struct RendezvousConf {
  static constexpr Millis kDefaultJoinTimeout{600000};
  static constexpr Millis kDefaultLastCallTimeout{30000};
  static constexpr Millis kDefaultCloseTimeout{30000};
  static constexpr Millis kDefaultHeartbeat{5000};
  static constexpr Millis kDefaultConnectTimeout{5000};

  // Longest wait for a round to reach MIN nodes (and for a late node to be admitted).
  Millis join_timeout = kDefaultJoinTimeout;
  // Once MIN nodes joined, how long the round stays open for more (up to MAX).
  Millis last_call_timeout = kDefaultLastCallTimeout;
  // Once a round is closed, how long its members wait for node 0 to publish the ranks.
  Millis close_timeout = kDefaultCloseTimeout;
  // Each agent's heartbeat period; a peer silent for kMissedHeartbeats periods is dead.
  Millis heartbeat = kDefaultHeartbeat;
  // How long a node retries an endpoint that refuses connections (the host agent may still
  // be starting) before it reports the endpoint unreachable.
  Millis connect_timeout = kDefaultConnectTimeout;
  // File whose contents (trailing newline stripped) are the store token.
  std::optional<std::string> token_file;
  // c10d: how many agents keep a standby store the others move to when the agent serving the
  // store is lost (docs/rendezvous.md, "When the store's host is lost"); 0: none, the job
  // ends with its store host as torchrun's does.
  static constexpr int kDefaultStandbyStores = 2;
  int standby_stores = kDefaultStandbyStores;
  bool standby_stores_given = false;

  // The etcd backends' keys (torchrun's names where torchrun has them); validate() refuses
  // them with another backend. docs/rendezvous.md, "The etcd backends".
  static constexpr Millis kDefaultReadTimeout{60000};
  static constexpr Millis kDefaultKeyTtl{30000};
  // protocol=https: TLS to etcd, verified against cacert (else the system's CAs).
  bool https = false;
  std::optional<std::string> cacert;
  // This node's client certificate and its private key (PEM), for an etcd started with
  // --client-cert-auth. cert alone: a PEM file holding both.
  std::optional<std::string> cert;
  std::optional<std::string> key;
  // Bound of one request to a member of etcd; a read that times out goes on to the next
  // member. Lease renewals wait at most key_ttl/3 whatever this is, so it may exceed key_ttl.
  // A wait watches in steps of 10 s up to its caller's limit.
  Millis read_timeout = kDefaultReadTimeout;
  // Every key lives under this etcd prefix.
  std::string etcd_prefix = "/ddprun/";
  // A run's keys outlive its last agent by this long (an etcd lease the agents keep alive).
  Millis key_ttl = kDefaultKeyTtl;
  // torchrun's etcd "timeout" (its join timeout); applied as join_timeout when that is unset.
  std::optional<Millis> timeout;
  bool join_timeout_given = false;
  // The etcd-only keys given, in order, so another backend can name them in its refusal.
  std::vector<std::string> etcd_keys;
};
// "key=value,key=value"; unknown keys and bad numbers are UsageErrors listing the known keys.
RendezvousConf parse_rdzv_conf(const std::string& text);

// The token in `path` with trailing whitespace removed (store_auth::read_token_file: a
// UsageError when unreadable, empty, or readable or changeable by other users).
std::string read_token_file(const std::string& path);

// A run id names store keys, so it must be non-empty and use only [A-Za-z0-9_.:-].
void validate_run_id(const std::string& run_id);

// Peers silent this many heartbeat periods are declared dead (torchelastic uses 3 too).
constexpr int kMissedHeartbeats = 3;
// torchrun's default rendezvous port.
constexpr uint16_t kDefaultRendezvousPort = 29400;

struct RendezvousOptions {
  Backend backend = Backend::kC10d;
  std::string run_id = "none";
  NodeRange nodes;
  // Static backend only: this node's rank in [0, nodes.max).
  int node_rank = -1;
  // Where the store is (for messages; the store itself is passed separately).
  Endpoint endpoint;
  // Every endpoint given (etcd: the cluster's members, tried in turn); endpoint is the first.
  std::vector<Endpoint> endpoints;
  RendezvousConf conf;

  // This node as the others see it: host name for messages, address for MASTER_ADDR.
  std::string hostname;
  std::string local_addr;
  // Workers this node starts (heterogeneous across nodes is fine).
  int local_world_size = 1;
  // "HOST:PORT" of this agent's standby store (c10d): published with its node info, so the
  // round can name where everyone goes when the store's host is lost. Empty: none.
  std::string standby;

  // --recovery step: a node too late for a running round may take the place of a node the
  // round lost in place (heartbeat "lost", same local world size) instead of waiting for the
  // next round (RoundInfo::took_lost_slot).
  bool take_lost_slots = false;

  // Node 0's choice of MASTER_PORT for the workers of each round. Unset: a free port found
  // by binding port 0 on this machine.
  std::function<int()> pick_master_port;
};

// Checks consistency (ranges, run id, positive durations). UsageError naming the field.
void validate(const RendezvousOptions& options);

}  // namespace ddp::rdzv
