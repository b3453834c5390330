#include "ddp/rendezvous/diagnosis.hpp"

#include <fmt/format.h>

#include "ddp/util/rank_list.hpp"

namespace ddp::rdzv {

namespace {

std::string seconds(Millis ms) {
  return fmt::format("{:.1f} s", ms.count() / 1000.0);
}

std::string host_list(const std::vector<std::string>& hosts) {
  std::string out;
  size_t shown = std::min<size_t>(hosts.size(), 8);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + hosts[i];
  if (hosts.size() > shown) out += fmt::format(" and {} more", hosts.size() - shown);
  return out;
}

}  // namespace

std::string format_timeout_diagnosis(const TimeoutDiagnosis& d) {
  std::string expected =
      d.min_nodes == d.max_nodes
          ? fmt::format("{}", d.min_nodes)
          : fmt::format("{} (at least {}, at most {})", d.min_nodes, d.min_nodes, d.max_nodes);
  std::string out = fmt::format(
      "rendezvous timed out waiting for {}: {} of {} nodes joined run '{}' at endpoint {} "
      "(backend {}, round {}) after waiting {} (join_timeout {})",
      d.phase, d.joined_count, expected, d.run_id, d.endpoint, to_string(d.backend), d.generation,
      seconds(d.waited), seconds(d.limit));

  out += "\n  joined:";
  if (d.joined.empty()) out += " none";
  for (const auto& n : d.joined) {
    out += fmt::format("\n    node rank {}: {} ({}, {} worker{})", n.node_rank, n.host, n.addr,
                       n.local_world_size, n.local_world_size == 1 ? "" : "s");
  }
  if (static_cast<int>(d.joined.size()) < d.joined_count) {
    out += fmt::format("\n    ... and {} more", d.joined_count - static_cast<int>(d.joined.size()));
  }
  if (!d.missing_ranks.empty()) {
    out += fmt::format("\n  missing: node rank{} {}", d.missing_ranks.size() == 1 ? "" : "s",
                       format_rank_list(d.missing_ranks));
    if (is_elastic(d.backend)) {
      out += fmt::format(" ({} assigns node ranks in join order)", to_string(d.backend));
    }
  }
  for (const auto& r : d.other_runs) {
    out += fmt::format("\n  agents at this endpoint used --rdzv-id {} (from {})", r.run_id,
                       host_list(r.hosts));
  }

  std::vector<std::string> causes;
  if (!d.other_runs.empty()) {
    std::string ids;
    for (const auto& r : d.other_runs) ids += (ids.empty() ? "" : ", ") + r.run_id;
    causes.push_back(fmt::format(
        "a node was started with a different --rdzv-id ({} instead of {}): give every node the "
        "same --rdzv-id",
        ids, d.run_id));
  }
  causes.push_back(
      "the missing node's ddprun was not started (or exited): check its job step, ssh session "
      "or its own error output");
  if (d.other_runs.empty()) {
    causes.push_back(
        fmt::format("the missing node was started with a different --rdzv-id: every node must pass "
                    "--rdzv-id {}",
                    d.run_id));
  }
  if (uses_etcd(d.backend)) {
    causes.push_back(fmt::format(
        "the etcd cluster at {} is unreachable from the missing node, or refuses its TLS "
        "certificate: its ddprun then stops at once saying so (see its output)",
        d.endpoint));
  } else {
    causes.push_back(
        fmt::format("the endpoint {} is unreachable from the missing node: run `ddprun doctor "
                    "--rdzv-endpoint {}` there",
                    d.endpoint, d.endpoint));
  }
  causes.push_back(
      "a firewall blocks the port, or the endpoint name resolves to the wrong interface on "
      "that node: pass a routable address in --rdzv-endpoint (and --local-addr)");
  out += "\n  likely causes, most likely first:";
  for (size_t i = 0; i < causes.size(); ++i) out += fmt::format("\n    {}. {}", i + 1, causes[i]);
  return out;
}

}  // namespace ddp::rdzv
