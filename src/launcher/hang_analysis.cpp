// The hang report's analysis (analyze_hang, hang_report.hpp): per process group, which rank is
// behind, which called a different collective, which left no record, which send/recv is still
// open; the most likely cause first.
#include "ddp/launcher/hang_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "ddp/launcher/kill_cause.hpp"

namespace ddp::launcher {

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

// "float32 x 256, sum" / "float32 x 256, root 0"
std::string shape(const FlightEntry& e) {
  if (e.op == "barrier") return "";
  std::string s = fmt::format("{} x {}", e.dtype, e.count);
  if (!e.reduce_op.empty()) s += ", " + e.reduce_op;
  if (e.root >= 0) s += fmt::format(", root {}", e.root);
  return s;
}

// "all_reduce #12 (float32 x 256, sum, completed; DDP bucket 2, iteration 7)": the caller tag
// last.
std::string describe(const FlightEntry& e) {
  std::string inner = shape(e);
  inner += (inner.empty() ? "" : ", ") + e.state;
  if (!e.tag.empty()) inner += "; " + e.tag;
  return fmt::format("{} #{} ({})", e.op, e.seq, inner);
}

// "all_reduce #13 (DDP bucket 2, iteration 7)", or "all_reduce #13" without a tag.
std::string short_name(const FlightEntry& e) {
  return e.tag.empty() ? fmt::format("{} #{}", e.op, e.seq)
                       : fmt::format("{} #{} ({})", e.op, e.seq, e.tag);
}

// "all_reduce (float32 x 256, sum)": what a mismatch compares.
std::string signature(const FlightEntry& e) {
  const std::string s = shape(e);
  return s.empty() ? e.op : fmt::format("{} ({})", e.op, s);
}

bool same_call(const FlightEntry& a, const FlightEntry& b) {
  const bool count_ok = a.op == "all_gather_v" || a.count == b.count;
  return a.op == b.op && a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.root == b.root &&
         count_ok;
}

std::string seconds(int64_t us) {
  return fmt::format("{:.1f} s", static_cast<double>(std::max<int64_t>(us, 0)) / 1e6);
}

// Point-to-point entries carry no sequence number (sends and receives are not matched by
// issue order): they are kept out of the collectives' analysis and reported on their own.
bool is_p2p(const FlightEntry& e) {
  return e.op == "send" || e.op == "recv";
}

struct RankView {
  const FlightDump* dump = nullptr;
  int rank = 0;                              // global rank
  const FlightEntry* last = nullptr;         // highest sequence number
  const FlightEntry* pending = nullptr;      // oldest entry not completed
  const FlightEntry* pending_p2p = nullptr;  // oldest send/recv not completed
  uint64_t progress() const { return last ? last->seq : 0; }
  // How long before the dump the pending entry started (or was queued).
  int64_t pending_for_us() const {
    if (!pending) return 0;
    const int64_t since = pending->started_us ? pending->started_us : pending->queued_us;
    return dump->dumped_at_us - since;
  }
  int64_t last_activity_us() const {
    if (!last) return 0;
    return std::max({last->queued_us, last->started_us, last->ended_us});
  }
};

const RankProcess* find_process(const std::vector<RankProcess>& processes, int rank) {
  for (const auto& p : processes) {
    if (p.global_rank == rank) return &p;
  }
  return nullptr;
}

// Why a rank of the group left no record: the launcher's view of its process when it knows it.
// `first_dump_us`: when the earliest record was written (0: none).
std::string missing_text(int rank, const RankProcess* p, int64_t first_dump_us) {
  if (p == nullptr) {
    return fmt::format("rank {} wrote no record (died, or could not reach the store)", rank);
  }
  const std::string process = p->host.empty()
                                  ? fmt::format("its process (pid {})", p->pid)
                                  : fmt::format("its process (pid {} on {})", p->pid, p->host);
  switch (p->state) {
    case RankProcess::State::kExited: {
      std::string when;
      if (first_dump_us > 0 && p->at_us > 0 && p->at_us <= first_dump_us) {
        when = fmt::format(" {} before the first record was written",
                           seconds(first_dump_us - p->at_us));
      }
      return fmt::format("rank {} died: {} {}{} and wrote no record", rank, process, p->exit, when);
    }
    case RankProcess::State::kStopped:
      return fmt::format(
          "rank {} is frozen: {} is alive but stopped (SIGSTOP, job control or a debugger), so "
          "it could not write its record",
          rank, process);
    case RankProcess::State::kUninterruptible:
      return fmt::format("rank {} is frozen: {} {}, so it could not write its record", rank,
                         process, uninterruptible_text(p->wchan));
    case RankProcess::State::kRunning:
      break;
  }
  return fmt::format(
      "rank {} is frozen: {} is alive but made no progress and wrote no record (its watcher did "
      "not answer the dump request)",
      rank, process);
}

struct GroupResult {
  int severity = 0;  // 4 mismatch, 3 missing ranks, 2 behind, 1 stalled, 0 nothing found
  std::string summary;
  std::vector<std::string> details;
};

GroupResult analyze_group(const std::string& group, const std::vector<const FlightDump*>& dumps,
                          const std::vector<RankProcess>& processes) {
  GroupResult out;
  int size = 0;
  std::vector<int> global_ranks;
  for (const auto* d : dumps) {
    size = std::max(size, d->group_size);
    if (global_ranks.empty()) global_ranks = d->global_ranks;
  }
  auto global = [&](int group_rank) {
    return group_rank < static_cast<int>(global_ranks.size()) ? global_ranks[group_rank]
                                                              : group_rank;
  };
  std::vector<RankView> views;
  std::set<int> present;
  for (const auto* d : dumps) {
    RankView v;
    v.dump = d;
    v.rank = d->global_rank;
    for (const auto& e : d->entries) {
      if (is_p2p(e)) {
        if (e.state != "completed" && !v.pending_p2p) v.pending_p2p = &e;
        continue;
      }
      if (!v.last || e.seq >= v.last->seq) v.last = &e;
      if (e.state != "completed" && (!v.pending || e.seq < v.pending->seq)) v.pending = &e;
    }
    present.insert(v.rank);
    views.push_back(v);
  }
  std::sort(views.begin(), views.end(),
            [](const RankView& a, const RankView& b) { return a.rank < b.rank; });
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (!present.count(global(r))) missing.push_back(global(r));
  }
  int64_t first_dump_us = 0;
  for (const auto* d : dumps) {
    if (d->dumped_at_us > 0 && (first_dump_us == 0 || d->dumped_at_us < first_dump_us))
      first_dump_us = d->dumped_at_us;
  }
  // Without the launcher's view the missing ranks share one phrase; with it, one each.
  std::string missing_summary;
  if (!missing.empty()) {
    if (processes.empty()) {
      missing_summary = fmt::format("{} wrote no record (died, or could not reach the store)",
                                    ranks_text(missing));
    } else {
      for (int r : missing) {
        missing_summary += (missing_summary.empty() ? "" : "; ") +
                           missing_text(r, find_process(processes, r), first_dump_us);
      }
    }
  }

  // The first sequence number at which ranks issued different collectives.
  std::string mismatch;
  std::map<uint64_t, std::vector<std::pair<int, const FlightEntry*>>> by_seq;
  for (const auto& v : views) {
    for (const auto& e : v.dump->entries) {
      if (!is_p2p(e)) by_seq[e.seq].emplace_back(v.rank, &e);
    }
  }
  for (const auto& [seq, calls] : by_seq) {
    std::vector<std::pair<const FlightEntry*, std::vector<int>>> kinds;
    for (const auto& [rank, e] : calls) {
      const FlightEntry* entry = e;  // C++17 lambdas cannot capture a structured binding
      auto it = std::find_if(kinds.begin(), kinds.end(),
                             [&](const auto& k) { return same_call(*k.first, *entry); });
      if (it == kinds.end()) {
        kinds.push_back({e, {rank}});
      } else {
        it->second.push_back(rank);
      }
    }
    if (kinds.size() < 2) continue;
    std::sort(kinds.begin(), kinds.end(),
              [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
    mismatch = fmt::format("mismatch at collective #{}:", seq);
    for (size_t i = 0; i < kinds.size(); ++i) {
      mismatch += fmt::format("{} {} called {}", i ? " but" : "", ranks_text(kinds[i].second),
                              signature(*kinds[i].first));
    }
    mismatch += "; every rank must issue the same collectives in the same order";
    break;
  }

  // Who is ahead, who is behind.
  uint64_t max_progress = 0;
  for (const auto& v : views) max_progress = std::max(max_progress, v.progress());
  std::vector<const RankView*> leaders, laggards;
  for (const auto& v : views) (v.progress() == max_progress ? leaders : laggards).push_back(&v);

  // "ranks 0,2 wait in all_reduce #13 since 6.0 s"; ranks in different collectives are named
  // separately ("...; rank 2 waits in broadcast #13 since 6.0 s").
  auto waiting_text = [&](const std::vector<const RankView*>& group_views) -> std::string {
    struct Waiting {
      const FlightEntry* entry;
      std::vector<int> ranks;
      int64_t for_us = 0;
      bool failed = false;
    };
    std::vector<Waiting> waits;
    for (const auto* v : group_views) {
      if (!v->pending) continue;
      auto it = std::find_if(waits.begin(), waits.end(), [&](const Waiting& w) {
        return w.entry->seq == v->pending->seq && same_call(*w.entry, *v->pending);
      });
      if (it == waits.end()) it = waits.insert(waits.end(), Waiting{v->pending, {}, 0, false});
      it->ranks.push_back(v->rank);
      it->for_us = std::max(it->for_us, v->pending_for_us());
      it->failed = it->failed || v->pending->state == "failed";
    }
    std::string text;
    for (const auto& w : waits) {
      text += fmt::format("{}{} {} in {} since {}{}", text.empty() ? "" : "; ", ranks_text(w.ranks),
                          w.ranks.size() == 1 ? "waits" : "wait", short_name(*w.entry),
                          seconds(w.for_us), w.failed ? " (then failed)" : "");
    }
    return text;
  };

  std::vector<std::string> behind_lines;
  for (const auto* v : laggards) {
    std::string line;
    if (!v->last) {
      line =
          fmt::format("rank {} is behind: it has not issued any collective in this group", v->rank);
    } else if (v->last->state == "completed") {
      line = fmt::format(
          "rank {} is behind: its last collective was {}; it has not been in a collective of "
          "this group for {} before its dump (alive: it wrote its record, so it is busy or "
          "frozen outside this group's collectives)",
          v->rank, describe(*v->last), seconds(v->dump->dumped_at_us - v->last_activity_us()));
    } else {
      line =
          fmt::format("rank {} is behind and frozen in {} for {} before its dump", v->rank,
                      describe(v->pending ? *v->pending : *v->last), seconds(v->pending_for_us()));
    }
    const RankProcess* p = find_process(processes, v->rank);
    if (p && p->state == RankProcess::State::kStopped) {
      line += "; its process is stopped now (SIGSTOP, job control or a debugger): frozen";
    } else if (p && p->state == RankProcess::State::kUninterruptible) {
      line += "; frozen: its process " + uninterruptible_text(p->wchan);
    } else if (p && p->state == RankProcess::State::kExited) {
      line += fmt::format("; its process {} after that", p->exit);
    }
    behind_lines.push_back(line);
  }
  const std::string leaders_wait = waiting_text(leaders);

  if (!mismatch.empty()) {
    out.severity = 4;
    out.summary = mismatch;
  } else if (!missing.empty()) {
    out.severity = 3;
    out.summary = missing_summary;
    if (!leaders_wait.empty()) out.summary += "; " + leaders_wait;
  } else if (!laggards.empty()) {
    out.severity = 2;
    // The headline keeps the first laggard's short form; the full lines follow.
    const RankView* v = laggards.front();
    std::vector<int> lag_ranks;
    for (const auto* l : laggards) lag_ranks.push_back(l->rank);
    if (v->last) {
      out.summary =
          fmt::format("{} {} behind: {} last collective was {}", ranks_text(lag_ranks),
                      lag_ranks.size() == 1 ? "is" : "are",
                      lag_ranks.size() == 1 ? "its" : "the first one's", describe(*v->last));
    } else {
      out.summary = fmt::format("{} {} behind: no collective issued in this group",
                                ranks_text(lag_ranks), lag_ranks.size() == 1 ? "is" : "are");
    }
    if (!leaders_wait.empty()) out.summary += "; " + leaders_wait;
  } else if (!leaders_wait.empty()) {
    out.severity = 1;
    std::string error;
    for (const auto* v : leaders) {
      if (v->pending && !v->pending->error.empty()) {
        error = fmt::format(" (rank {}: {})", v->rank, v->pending->error);
        break;
      }
    }
    out.summary = fmt::format(
        "no rank is behind and all called the same collectives: {}; the collective itself "
        "stalled or failed (network, a peer process outside this group, or a too short "
        "timeout){}",
        leaders_wait, error);
  } else if (max_progress == 0) {
    out.summary = "no collective recorded";
  } else {
    out.summary = fmt::format("no hang found: every rank completed collective #{}", max_progress);
  }
  if (!mismatch.empty() && !leaders_wait.empty()) out.details.push_back(leaders_wait);
  if (!mismatch.empty() || !missing.empty()) {
    for (const auto& l : behind_lines) out.details.push_back(l);
  } else if (laggards.size() > 0) {
    for (const auto& l : behind_lines) out.details.push_back(l);
  }
  if (!missing.empty() && out.severity != 3) out.details.push_back(missing_summary);
  // "rank 1 waits in recv from rank 0 (float32 x 4) since 6.0 s": a send or receive whose peer
  // never came shows here, also when every collective completed. A recv from any source has
  // the peer -1: "recv from any rank".
  for (const auto& v : views) {
    if (!v.pending_p2p) continue;
    const FlightEntry& e = *v.pending_p2p;
    const int64_t since = e.started_us ? e.started_us : e.queued_us;
    const std::string peer =
        e.root < 0 ? std::string("any rank") : fmt::format("rank {}", global(e.root));
    out.details.push_back(fmt::format(
        "rank {} waits in {} {} {} ({} x {}{}) since {}{}", v.rank, e.op,
        e.op == "send" ? "to" : "from", peer, e.dtype, e.count, e.tag.empty() ? "" : "; " + e.tag,
        seconds(v.dump->dumped_at_us - since), e.state == "failed" ? " (then failed)" : ""));
    if (out.severity == 0) {  // no collective explains the hang: this does
      out.summary = out.details.back();
      out.severity = 1;
    }
  }
  for (const auto& v : views) {
    std::string line = fmt::format("  rank {} (pid {} on {}): {} collectives", v.rank, v.dump->pid,
                                   v.dump->host, v.dump->recorded);
    if (v.last) line += fmt::format(", last {}", describe(*v.last));
    if (v.pending && v.pending != v.last)
      line += fmt::format(", oldest open {}", describe(*v.pending));
    if (!v.dump->path.empty()) line += ", " + v.dump->path;
    out.details.push_back(line);
  }
  (void)group;
  return out;
}

}  // namespace

std::vector<std::string> analyze_hang(const std::vector<FlightDump>& dumps,
                                      const std::vector<RankProcess>& processes) {
  std::map<std::string, std::vector<const FlightDump*>> groups;
  for (const auto& d : dumps) groups[d.group].push_back(&d);
  std::vector<std::pair<std::string, GroupResult>> results;
  for (const auto& [name, members] : groups)
    results.emplace_back(name, analyze_group(name, members, processes));
  std::stable_sort(results.begin(), results.end(), [](const auto& a, const auto& b) {
    return a.second.severity > b.second.severity;
  });
  std::vector<std::string> lines;
  const bool several = results.size() > 1;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& [name, r] = results[i];
    const std::string where = several ? fmt::format(" (group {})", name) : "";
    lines.push_back(i == 0 ? "hang report: " + r.summary + where
                           : fmt::format("group {}: {}", name, r.summary));
    for (const auto& d : r.details) lines.push_back(d);
  }
  if (lines.empty()) lines.push_back("hang report: no flight recorder dumps to analyse");
  return lines;
}

}  // namespace ddp::launcher
