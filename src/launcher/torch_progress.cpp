#include "ddp/launcher/torch_progress.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/launcher/output.hpp"
#include "ddp/launcher/process.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/remove_tree.hpp"

namespace ddp::launcher {

namespace {

// The hook (torch_progress.hpp says what it does). It must stay cheap and inert: it never
// imports torch (it waits until the program did), catches every error of its own, and runs on
// a daemon thread that sleeps between reads.
constexpr const char* kHook =
    R"PY(# Written by ddprun for --hang-timeout (docs/ddprun.md, "My job is stuck"): reports
# PyTorch's flight recorder progress to ddprun. Removed with ddprun's run folder.
import os as _ddprun_os
import sys as _ddprun_sys


def _ddprun_chain_user_sitecustomize():
    # This module shadows the user's sitecustomize: run that one too, as Python would have.
    import importlib
    import importlib.util
    here = _ddprun_os.path.dirname(_ddprun_os.path.abspath(__file__))
    saved_path = list(_ddprun_sys.path)
    mine = _ddprun_sys.modules.pop("sitecustomize", None)
    try:
        _ddprun_sys.path[:] = [
            p for p in saved_path if _ddprun_os.path.abspath(p or ".") != here]
        if importlib.util.find_spec("sitecustomize") is not None:
            importlib.import_module("sitecustomize")
    finally:
        _ddprun_sys.path[:] = saved_path
        if mine is not None:
            _ddprun_sys.modules["sitecustomize"] = mine


def _ddprun_start_progress():
    directory = _ddprun_os.environ.get("DDPRUN_PROGRESS_DIR")
    rank = _ddprun_os.environ.get("RANK")
    if not directory or not rank:
        return
    import atexit
    import json
    import socket
    import threading
    import time
    try:
        interval = float(_ddprun_os.environ.get("DDPRUN_PROGRESS_INTERVAL_S") or 1.0)
    except ValueError:
        interval = 1.0
    progress_path = _ddprun_os.path.join(directory, "progress.rank%s.json" % rank)
    request_path = _ddprun_os.path.join(directory, "torch_fr.request")
    dump_path = _ddprun_os.path.join(directory, "torch_fr.rank%s.json" % rank)

    def write(path, text):
        tmp = "%s.tmp%d" % (path, _ddprun_os.getpid())
        with open(tmp, "w") as f:
            f.write(text)
        _ddprun_os.replace(tmp, path)

    def read_recorder():
        dist = _ddprun_sys.modules.get("torch.distributed")
        if dist is None or not dist.is_initialized():
            return None
        from torch._C._distributed_c10d import _dump_fr_trace_json
        return json.loads(_dump_fr_trace_json(includeCollectives=True, onlyActive=False))

    def summarize(doc):
        completed = enqueued = 0
        first_open = {}
        for pg, status in (doc.get("pg_status") or {}).items():
            done = int(status.get("last_completed_collective", -1))
            issued = int(status.get("last_enqueued_collective", -1))
            completed += max(done, 0)
            enqueued += max(issued, 0)
            if issued > done:
                first_open[str(pg)] = max(done, 0) + 1
        record = {"rank": int(rank), "pid": _ddprun_os.getpid(), "completed": completed,
                  "enqueued": enqueued, "open_op": "", "open_seq": 0, "open_since_us": 0}
        for entry in doc.get("entries") or []:
            if entry.get("is_p2p"):
                continue
            seq = entry.get("collective_seq_id")
            if first_open.get(str(entry.get("pg_id"))) != seq:
                continue
            since = int(entry.get("time_created_ns", 0)) // 1000
            if record["open_since_us"] == 0 or since < record["open_since_us"]:
                record.update(open_op=entry.get("profiling_name", ""), open_seq=seq,
                              open_since_us=since)
        return record

    stop = threading.Event()

    def loop():
        last = None
        handled = 0.0
        while not stop.wait(interval):
            try:
                doc = read_recorder()
                if doc is None:
                    continue
                record = summarize(doc)
                if record != last:
                    write(progress_path, json.dumps(record))
                    last = record
                try:
                    requested = _ddprun_os.stat(request_path).st_mtime
                except OSError:
                    requested = 0.0
                if requested and requested != handled:
                    handled = requested
                    write(dump_path, json.dumps({
                        "format": "torch-flight-recorder", "rank": int(rank),
                        "pid": _ddprun_os.getpid(), "host": socket.gethostname(),
                        "dumped_at_us": int(time.time() * 1e6), "trace": doc}))
            except Exception:
                pass  # a reporter must never disturb the program

    reporter = threading.Thread(target=loop, name="ddprun-progress", daemon=True)
    reporter.start()

    # Stopped before the interpreter finalizes: a daemon thread still inside torch's C++ (it
    # releases the GIL) when Python exits is ended by a forced unwind, which C++ turns into
    # std::terminate ("terminate called without an active exception", SIGABRT at exit).
    def stop_reporter():
        stop.set()
        reporter.join(interval + 5.0)

    atexit.register(stop_reporter)


_ddprun_chain_user_sitecustomize()
_ddprun_start_progress()
)PY";

}  // namespace

std::string write_python_hook(const std::string& root) {
  // Every worker imports what this folder holds (it leads their PYTHONPATH): it is made anew,
  // private, with the hook alone in it, whatever an earlier run left there (issue 49, finding 1).
  const std::string dir = root + "/python_hook";
  const std::string path = dir + "/sitecustomize.py";
  std::error_code ec;
  ddp::remove_tree(dir, ec);
  UniqueFd fd;
  if (!ec && ::mkdir(dir.c_str(), 0700) == 0) {
    fd.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  }
  if (!fd.valid() || !write_fully(fd.get(), kHook, std::strlen(kHook))) {
    throw Error(fmt::format(
        "cannot write ddprun's Python progress hook {} (--hang-timeout needs it): {}; check "
        "that the log folder is writable",
        path, ec ? ec.message() : std::strerror(errno)));
  }
  return dir;
}

void add_torch_progress_env(std::vector<std::string>& env, const std::string& hook_dir,
                            const std::string& attempt_dir) {
  std::string pythonpath = hook_dir;
  bool fr_set = false;
  for (const auto& e : env) {
    if (e.rfind("PYTHONPATH=", 0) == 0 && e.size() > 11) pythonpath += ":" + e.substr(11);
    if (e.rfind("TORCH_FR_BUFFER_SIZE=", 0) == 0 ||
        e.rfind("TORCH_NCCL_TRACE_BUFFER_SIZE=", 0) == 0)
      fr_set = true;
  }
  set_env_entry(env, "PYTHONPATH", pythonpath);
  set_env_entry(env, "DDPRUN_PROGRESS_DIR", attempt_dir);
  if (!fr_set) set_env_entry(env, "TORCH_FR_BUFFER_SIZE", "2000");
}

std::optional<RankProgress> parse_progress(const std::string& json_text) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  try {
    RankProgress p;
    p.global_rank = j.at("rank").get<int>();
    p.pid = j.value("pid", int64_t{0});
    p.completed = j.value("completed", int64_t{0});
    p.enqueued = j.value("enqueued", int64_t{0});
    p.open_op = j.value("open_op", "");
    p.open_seq = j.value("open_seq", int64_t{0});
    p.open_since_us = j.value("open_since_us", int64_t{0});
    return p;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

namespace {
std::optional<RankProgress> read_progress_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_progress(ss.str());
}
}  // namespace

RankProgress merge_progress(const RankProgress& a, const RankProgress& b) {
  RankProgress m = a;
  m.completed += b.completed;
  m.enqueued += b.enqueued;
  if (b.open_since_us != 0 && (m.open_since_us == 0 || b.open_since_us < m.open_since_us)) {
    m.open_op = b.open_op;
    m.open_seq = b.open_seq;
    m.open_since_us = b.open_since_us;
  }
  return m;
}

std::optional<RankProgress> read_progress(const std::string& attempt_dir, int global_rank) {
  auto torch = read_progress_file(fmt::format("{}/progress.rank{}.json", attempt_dir, global_rank));
  auto ddp =
      read_progress_file(fmt::format("{}/progress.rank{}.ddp.json", attempt_dir, global_rank));
  if (torch && ddp) return merge_progress(*torch, *ddp);
  return torch ? torch : ddp;
}

}  // namespace ddp::launcher
