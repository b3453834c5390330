#include "ddp/rendezvous/etcd/etcd_doctor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>

#include "ddp/cluster/environment.hpp"
#include "ddp/util/socket.hpp"
#include "etcd_http.hpp"
#include "etcd_http_options.hpp"
#include "etcd_json.hpp"

namespace ddp::rdzv {

using namespace etcd;
using cluster::CheckResult;
using cluster::CheckStatus;
using Clock = std::chrono::steady_clock;

namespace {

HttpOptions http_options(const EtcdStoreOptions& o, std::vector<Endpoint> endpoints) {
  HttpOptions h = etcd::http_options(o);
  h.endpoints = std::move(endpoints);
  return h;
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// etcd's ids are uint64 written as decimal strings by the gateway; etcdctl shows them in hex.
std::string hex_id(const std::string& decimal) {
  char* end = nullptr;
  const unsigned long long id = std::strtoull(decimal.c_str(), &end, 10);
  if (decimal.empty() || *end != '\0') return decimal;
  return fmt::format("{:x}", id);
}

std::string size_text(int64_t bytes) {
  if (bytes < 10 * 1024) return fmt::format("{} B", bytes);
  if (bytes < 10 * 1024 * 1024) return fmt::format("{} kB", bytes / 1024);
  return fmt::format("{} MB", bytes / (1024 * 1024));
}

// What one member said about itself (maintenance/status).
struct MemberStatus {
  Endpoint address;
  std::string endpoint;  // HOST:PORT
  std::string cluster_id;
  std::string member_id;
  std::string leader;  // "0" or absent: no leader
};

CheckResult check_member(const EtcdStoreOptions& o, const Endpoint& member,
                         std::optional<MemberStatus>& status) {
  CheckResult r;
  const std::string name = net::format_endpoint(member.host, member.port);
  r.name = "etcd " + name;
  try {
    EtcdHttp http(http_options(o, {member}));
    const auto start = Clock::now();
    CallOptions how;
    how.idempotent = true;
    const Json reply = http.call("/v3/maintenance/status", Json::object(), how);
    const double took = ms_since(start);
    const std::string context = name + " POST /v3/maintenance/status";
    const Json header = reply.value("header", Json::object());
    MemberStatus s;
    s.address = member;
    s.endpoint = name;
    s.cluster_id = header.value("cluster_id", "");
    s.member_id = header.value("member_id", "");
    s.leader = reply.value("leader", "0");
    const std::string version = reply.value("version", "");
    if (version.empty() || s.member_id.empty()) {
      r.status = CheckStatus::kFail;
      r.verdict = fmt::format(
          "{} answered the status request without a version or member id: it is not an etcd "
          "member's client URL (check the port: etcd's client port is 2379 by default)",
          name);
      return r;
    }
    status = s;
    const bool is_leader = s.leader == s.member_id;
    r.verdict =
        fmt::format("etcd {}, member {} ({}), raft term {}, database {}, answered in {:.1f} ms",
                    version, hex_id(s.member_id),
                    is_leader         ? std::string("the leader")
                    : s.leader == "0" ? std::string("knows no leader")
                                      : "leader " + hex_id(s.leader),
                    int_field(reply, "raftTerm", context),
                    size_text(int_field(reply, "dbSize", context)), took);
    const Json errors = reply.value("errors", Json::array());
    if (errors.is_array() && !errors.empty()) {
      std::string list;
      for (const auto& e : errors) list += (list.empty() ? "" : "; ") + e.dump();
      r.status = CheckStatus::kWarn;
      r.verdict += "; etcd reports: " + list;
      if (list.find("NOSPACE") != std::string::npos) {
        r.verdict +=
            ". With the NOSPACE alarm etcd refuses every write (the rendezvous's too): compact "
            "and defragment it, raise --quota-backend-bytes, then `etcdctl alarm disarm`";
      }
    }
  } catch (const Error& e) {
    r.status = CheckStatus::kFail;
    r.verdict = e.what();
  }
  return r;
}

// `answered`: not empty (as for check_write).
CheckResult check_cluster(const std::vector<MemberStatus>& answered, size_t listed) {
  CheckResult r;
  r.name = "etcd-cluster";
  std::map<std::string, std::vector<std::string>> by_cluster;
  for (const auto& m : answered) by_cluster[m.cluster_id].push_back(m.endpoint);
  if (by_cluster.size() > 1) {
    std::vector<std::string> groups;
    for (const auto& [id, members] : by_cluster) {
      groups.push_back(fmt::format("cluster {}: {}", hex_id(id), fmt::join(members, ", ")));
    }
    r.status = CheckStatus::kFail;
    r.verdict = fmt::format(
        "the endpoints belong to {} different etcd clusters ({}): every node would not see the "
        "same keys. List the client URLs of one cluster in --rdzv-endpoint",
        by_cluster.size(), fmt::join(groups, "; "));
    return r;
  }
  std::vector<std::string> leaderless;
  for (const auto& m : answered) {
    if (m.leader.empty() || m.leader == "0") leaderless.push_back(m.endpoint);
  }
  if (!leaderless.empty()) {
    r.status = CheckStatus::kFail;
    r.verdict = fmt::format(
        "{} know{} no leader: the cluster has lost its quorum (more than half of its members are "
        "down or cut off) and accepts no write; start the missing members",
        fmt::join(leaderless, ", "), leaderless.size() == 1 ? "s" : "");
    return r;
  }
  r.verdict =
      fmt::format("{} of {} listed members answer, one cluster ({}), leader {}", answered.size(),
                  listed, hex_id(answered.front().cluster_id), hex_id(answered.front().leader));
  if (answered.size() < listed) {
    r.status = CheckStatus::kWarn;
    r.verdict += "; the agents go on with the members that answer, but fix the others (above)";
  }
  return r;
}

CheckResult check_write(const EtcdStoreOptions& o, const std::vector<MemberStatus>& answered) {
  CheckResult r;
  r.name = "etcd-write";
  std::vector<Endpoint> endpoints;
  for (const auto& m : answered) endpoints.push_back(m.address);
  const std::string key = fmt::format("{}doctor/{}-{}", o.prefix, cluster::local_hostname(),
                                      static_cast<long>(::getpid()));
  try {
    EtcdHttp http(http_options(o, endpoints));
    const auto start = Clock::now();
    http.call("/v3/kv/put",
              Json{{"key", base64_encode(key)}, {"value", base64_encode("ddprun doctor")}});
    const double put_ms = ms_since(start);
    CallOptions read;
    read.idempotent = true;
    const RangeReply back = parse_range(
        http.call("/v3/kv/range", Json{{"key", base64_encode(key)}}, read), "probe key read");
    http.call("/v3/kv/deleterange", Json{{"key", base64_encode(key)}});
    const double all_ms = ms_since(start);
    if (back.kvs.size() != 1 || back.kvs[0].value != "ddprun doctor") {
      r.status = CheckStatus::kFail;
      r.verdict = fmt::format(
          "the probe key {} read back {} right after it was written: the members do not agree "
          "(is a member serving stale reads?)",
          key, back.kvs.empty() ? "absent" : "with another value");
      return r;
    }
    r.verdict = fmt::format(
        "wrote, read back and deleted the probe key {} in {:.1f} ms (the write committed in "
        "{:.1f} ms)",
        key, all_ms, put_ms);
    if (put_ms > static_cast<double>(kSlowEtcdWrite.count())) {
      r.status = CheckStatus::kWarn;
      r.verdict += fmt::format(
          ": slow. Every rendezvous write waits for a raft commit on etcd's disk, and a round of "
          "N nodes makes a few writes per node; give etcd a local SSD for --data-dir (etcd "
          "wants fsync in under 10 ms)");
    }
  } catch (const Error& e) {
    r.status = CheckStatus::kFail;
    r.verdict = fmt::format("writing the probe key {} failed: {}", key, e.what());
  }
  return r;
}

}  // namespace

std::vector<CheckResult> check_etcd(const EtcdStoreOptions& options) {
  std::vector<CheckResult> out;
  std::vector<MemberStatus> answered;
  for (const Endpoint& member : options.endpoints) {
    std::optional<MemberStatus> status;
    out.push_back(check_member(options, member, status));
    if (status) answered.push_back(*status);
  }
  if (answered.empty()) {
    for (const char* name : {"etcd-cluster", "etcd-write"}) {
      out.push_back({name, CheckStatus::kSkip, "no listed member answered (see above)"});
    }
    return out;
  }
  out.push_back(check_cluster(answered, options.endpoints.size()));
  out.push_back(check_write(options, answered));
  return out;
}

}  // namespace ddp::rdzv
