// Starting an attempt's workers: each one's output routes, environment and flight recorder
// folder; and, with --recovery step, starting a failed rank again in its slot.
#include "attempt_runner.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ddp/launcher/run_directory.hpp"
#include "ddp/launcher/stack_service.hpp"
#include "ddp/launcher/stack_tracer.hpp"
#include "ddp/launcher/torch_progress.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher::detail {

namespace {

// Removes flight_recorder.*.rank<R>.json of this node's ranks R from an attempt folder (other
// nodes may share it). Best effort.
void remove_flight_dumps(const std::string& attempt_dir, const WorldAssignment& world) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& e : std::filesystem::directory_iterator(attempt_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("flight_recorder.", 0) != 0) continue;
    for (const auto& id : world.workers) {
      const std::string suffix = fmt::format(".rank{}.json", id.global_rank);
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        stale.push_back(e.path());
      }
    }
  }
  for (const auto& p : stale) std::filesystem::remove(p, ec);
}

// Removes the progress records, PyTorch recorder dumps and the dump request that an earlier run
// with the same run id left in the attempt folder (torch_progress.hpp). Best effort.
void remove_torch_progress(const std::string& attempt_dir, const WorldAssignment& world) {
  std::error_code ec;
  for (const auto& id : world.workers) {
    std::filesystem::remove(fmt::format("{}/progress.rank{}.json", attempt_dir, id.global_rank),
                            ec);
    std::filesystem::remove(fmt::format("{}/progress.rank{}.ddp.json", attempt_dir, id.global_rank),
                            ec);
    std::filesystem::remove(fmt::format("{}/torch_fr.rank{}.json", attempt_dir, id.global_rank),
                            ec);
  }
  std::filesystem::remove(attempt_dir + "/torch_fr.request", ec);
}

}  // namespace

StreamRoute AttemptRunner::route_for(const WorkerIdentity& id, const std::string& dir,
                                     int stream) const {
  Std red = spec_.redirects.for_local_rank(id.local_rank);
  Std tee = spec_.tee.for_local_rank(id.local_rank);
  bool is_out = stream == 0;
  bool teed = is_out ? includes_stdout(tee) : includes_stderr(tee);
  bool redirected = is_out ? includes_stdout(red) : includes_stderr(red);
  bool shown =
      !spec_.local_ranks_filter || std::count(spec_.local_ranks_filter->begin(),
                                              spec_.local_ranks_filter->end(), id.local_rank) > 0;
  StreamRoute route;
  route.console_fd =
      shown && (teed || !redirected) ? (is_out ? spec_.console_out : spec_.console_err) : -1;
  if (teed) route.prefix = fmt::format("[{}{}]:", spec_.role, id.global_rank);
  if (spec_.write_logs || teed || redirected) {
    route.log_path = dir + (is_out ? "/stdout.log" : "/stderr.log");
  }
  route.tail_lines = is_out ? 0 : spec_.stderr_tail_lines;
  // torchrun duplicates only the tee'd streams' lines.
  if (teed && filtered_[stream].valid()) {
    route.filtered_fd = filtered_[stream].get();
    route.filters = is_out ? spec_.duplicate_stdout_filters : spec_.duplicate_stderr_filters;
  }
  return route;
}

void AttemptRunner::open_filtered_logs() {
  const std::vector<std::string>* filters[2] = {&spec_.duplicate_stdout_filters,
                                                &spec_.duplicate_stderr_filters};
  for (int s = 0; s < 2; ++s) {
    if (filters[s]->empty()) continue;
    const std::string path =
        attempt_dir_ + (s == 0 ? "/filtered_stdout.log" : "/filtered_stderr.log");
    // Never through a link someone placed under the name (issue 49, finding 1).
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw Error(fmt::format("cannot create {} (--duplicate-{}-filters): {}", path,
                              s == 0 ? "stdout" : "stderr", std::strerror(errno)));
    }
    filtered_[s].reset(fd);
  }
}

void AttemptRunner::start_workers() {
  const WorldAssignment& world = *spec_.world;
  workers_.reserve(world.workers.size());
  kernel_log_ = KernelLog::open_at_end();  // before any worker can be killed
  bool first = true;
  for (const auto& id : world.workers) {
    std::string dir = spec_.run_dir->rank_dir(spec_.attempt, id.global_rank);
    if (first) {
      attempt_dir_ = dir.substr(0, dir.rfind('/'));
      // Stale dumps of a reused run id must not be reported as this attempt's hang.
      remove_flight_dumps(attempt_dir_, world);
      remove_torch_progress(attempt_dir_, world);
      open_filtered_logs();
    }
    first = false;
    workers_.push_back(spawn_worker(id, spec_.restart_count, /*in_place=*/false));
  }
  publish_workers();
  start_spare();
  next_watch_ = Clock::now() + kWatchdogPeriod;
}

SpawnOptions AttemptRunner::worker_spawn_options(const WorkerIdentity& id, int restart_count,
                                                 const std::string& error_file) {
  const WorldAssignment& world = *spec_.world;
  std::string dir = spec_.run_dir->rank_dir(spec_.attempt, id.global_rank);
  WorkerEnvInputs env;
  env.world = &world;
  env.worker = id;
  env.role = spec_.role;
  env.run_id = spec_.run_id;
  env.restart_count = restart_count;
  env.max_restarts = spec_.max_restarts;
  env.error_file = error_file;
  env.set_omp_threads = spec_.set_omp_threads;
  env.virtual_local_rank = spec_.placement.virtual_local_rank;
  SpawnOptions so;
  so.argv = spec_.command;
  so.env = build_worker_env(spec_.base_env, env);
  if (static_cast<size_t>(id.local_rank) < spec_.worker_cpus.size()) {
    so.cpu_affinity = spec_.worker_cpus[id.local_rank];
  }
  // Flight recorder dumps go beside the rank folders of this attempt, where the hang
  // report and `ddprun trace` find them (without --log-dir that is ddprun's temporary
  // ROOT, removed at exit), unless the user chose a directory.
  if (std::none_of(so.env.begin(), so.env.end(), [](const std::string& e) {
        return e.rfind("DDP_FLIGHT_RECORDER_DIR=", 0) == 0;
      })) {
    dump_dir_ = dir.substr(0, dir.rfind('/'));
    set_env_entry(so.env, "DDP_FLIGHT_RECORDER_DIR", dump_dir_);
  }
  if (!spec_.python_hook_dir.empty()) {
    add_torch_progress_env(so.env, spec_.python_hook_dir, attempt_dir_);
  }
  // Only the stack tracer's tools may ptrace the worker (the agent when it could not start
  // one; nobody when there is no tool to run).
  if (spec_.stack_tools.tracer) {
    so.ptracer = spec_.stack_tools.tracer->pid();
  } else if (spec_.stack_tools.py_spy.empty() && spec_.stack_tools.eu_stack.empty()) {
    so.ptracer = -1;
  }
  return so;
}

std::unique_ptr<Worker> AttemptRunner::spawn_worker(const WorkerIdentity& id, int restart_count,
                                                    bool in_place) {
  std::string dir = spec_.run_dir->rank_dir(spec_.attempt, id.global_rank);
  auto w = std::make_unique<Worker>();
  w->id = id;
  w->error_file = dir + "/error.json";
  ::unlink(w->error_file.c_str());  // a stale file must not be reported as this failure
  for (int s = 0; s < 2; ++s) {
    StreamRoute route = route_for(id, dir, s);
    route.append = in_place;  // a rank restarted in place appends to its logs
    w->streams[s] = std::make_unique<StreamForwarder>(std::move(route));
  }
  const SpawnOptions so = worker_spawn_options(id, restart_count, w->error_file);
  SpawnedProcess p = in_place ? spawn_in_place(id, so) : spawn_process(so);
  w->pid = p.pid;
  note_memory_cgroup(*w);
  w->fds[0] = std::move(p.stdout_read);
  w->fds[1] = std::move(p.stderr_read);
  return w;
}

SpawnedProcess AttemptRunner::spawn_in_place(const WorkerIdentity& id, const SpawnOptions& so) {
  if (!spare_) return spawn_process(so);
  const pid_t spare_pid = spare_->pid();
  const bool warm = spare_->warm();
  std::string why;
  std::optional<SpawnedProcess> p = spare_->take(so, why);
  spare_.reset();
  if (!p) {
    // Whatever broke it would break the next one too: none again in this attempt.
    notice(fmt::format("the warm spare (pid {}) {}; rank {} starts in a new process", spare_pid,
                       why, id.global_rank));
    spare_failed_ = true;
    return spawn_process(so);
  }
  notice(fmt::format("rank {} runs in the warm spare (pid {}, --warm-spare), {}", id.global_rank,
                     spare_pid,
                     warm ? "which had imported torch and ddp"
                          : "which had not finished importing torch and ddp yet"));
  start_spare();  // for the next failure
  return std::move(*p);
}

void AttemptRunner::start_spare() {
  if (spare_ || spare_failed_ || spec_.warm_spare_command.empty() || !spec_.replace_failed ||
      stopping() || spec_.world->workers.empty()) {
    return;
  }
  // The job's environment at interpreter start, without a rank: the variables a worker's
  // imports read are the same on every rank (OMP_NUM_THREADS, PYTHONPATH and ddprun's hook,
  // DDP_RECOVERY); the rank's own arrive with its orders (python/ddp/warm_spare.py).
  SpawnOptions so = worker_spawn_options(spec_.world->workers.front(), spec_.restart_count, "");
  for (const char* key :
       {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_ERROR_FILE", "CUDA_VISIBLE_DEVICES"}) {
    if (std::string(key) == "CUDA_VISIBLE_DEVICES" && !spec_.placement.virtual_local_rank) continue;
    const std::string prefix = std::string(key) + "=";
    so.env.erase(std::remove_if(so.env.begin(), so.env.end(),
                                [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }),
                 so.env.end());
  }
  so.argv = spec_.warm_spare_command;
  so.cpu_affinity.clear();
  so.idle_class = can_leave_idle_class();  // its imports on CPU the workers leave idle
  try {
    spare_ = WarmSpare::start(std::move(so));
  } catch (const Error& e) {
    notice(
        fmt::format("cannot start the warm spare: {}; a rank restarted in place starts in a "
                    "new process",
                    e.what()));
    spare_failed_ = true;
  }
}

void AttemptRunner::retire_spare() {
  if (!spare_) return;
  spare_->kill();
  spare_.reset();
}

bool AttemptRunner::replace_in_place(Worker& w) {
  if (!spec_.replace_failed || phase_ != Phase::kRunning || root_cause_ != nullptr) return false;
  // A peer that already finished cannot heal a replacement; replace_failed is asked all the
  // same: a job without a StepManager then gets its group restart, as with --recovery group.
  bool a_peer_finished = false;
  for (const auto& other : workers_) a_peer_finished |= other.get() != &w && other->exited;
  std::optional<int> restart_count = spec_.replace_failed(failure_of(w), a_peer_finished);
  if (!restart_count || a_peer_finished) return false;
  for (int s = 0; s < 2; ++s) {
    while (w.fds[s].valid() && read_stream(w, s)) {
    }
    w.fds[s].reset();
    w.streams[s]->finish();
  }
  std::unique_ptr<Worker> fresh;
  try {
    fresh = spawn_worker(w.id, *restart_count, /*in_place=*/true);
  } catch (const Error& e) {
    notice(fmt::format("cannot restart rank {}: {}", w.id.global_rank, e.what()));
    return false;  // the attempt fails as with --recovery group
  }
  for (auto& slot : workers_) {
    if (slot.get() == &w) slot = std::move(fresh);
  }
  publish_workers();
  return true;
}

void AttemptRunner::publish_workers() {
  if (spec_.stack_service == nullptr) return;
  std::vector<StackTarget> live;
  for (const auto& w : workers_) {
    if (!w->exited) live.push_back({w->id.global_rank, w->pid});
  }
  spec_.stack_service->set_workers(std::move(live));
}

}  // namespace ddp::launcher::detail
