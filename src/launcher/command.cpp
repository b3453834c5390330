#include "ddp/launcher/command.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_executable_file(const std::string& path) {
  return ::access(path.c_str(), X_OK) == 0;
}

// The interpreter a shell would run for `python3`: the first on PATH, so that a user in an
// activated virtual environment gets that environment's Python and packages (torch included),
// as torchrun does by running sys.executable. $DDPRUN_PYTHON overrides.
std::string python_interpreter(const EnvLookup& env, const std::string& what) {
  auto chosen = env("DDPRUN_PYTHON");
  if (chosen && !chosen->empty()) return resolve_executable(*chosen, env);
  try {
    return resolve_executable("python3", env);
  } catch (const UsageError&) {
    throw UsageError(fmt::format(
        "no python3 on PATH to run {}; activate the virtual environment that has torch, or set "
        "DDPRUN_PYTHON to an interpreter's path (PATH={})",
        what, env("PATH").value_or("<unset>")));
  }
}

}  // namespace

std::string resolve_executable(const std::string& name, const EnvLookup& env) {
  if (name.empty()) throw UsageError("the program to run is an empty string");
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), F_OK) != 0) {
      throw UsageError(fmt::format("program '{}' does not exist; check the path", name));
    }
    if (!is_executable_file(name)) {
      throw UsageError(fmt::format(
          "program '{}' is not executable; chmod +x it, or run it through an interpreter", name));
    }
    return name;
  }
  std::string path = env("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    std::string dir =
        path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  throw UsageError(fmt::format(
      "program '{}' was not found on PATH; give its path (e.g. ./{}) or fix PATH", name, name));
}

std::vector<std::string> worker_command(const LaunchOptions& options, const EnvLookup& env) {
  if (options.program.empty()) {
    throw UsageError("no PROGRAM given; usage: ddprun [flags] PROGRAM [ARGS...]");
  }
  if (options.run_path) {
    // torchrun's run_script_path, in the worker's own interpreter: PROGRAM as sys.argv[0].
    std::vector<std::string> argv = {
        python_interpreter(env, options.program), "-u", "-c",
        "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
        "run_name='__main__')",
        options.program};
    argv.insert(argv.end(), options.program_args.begin(), options.program_args.end());
    return argv;
  }
  if (options.module && options.no_python) {
    throw UsageError(
        "--module and --no-python cannot be used together: -m runs 'python -m "
        "MODULE', --no-python runs PROGRAM without Python; drop one");
  }
  std::vector<std::string> argv;
  if (options.module) {
    argv = {python_interpreter(env, "-m " + options.program), "-u", "-m", options.program};
  } else if (!options.no_python && ends_with(options.program, ".py")) {
    if (::access(options.program.c_str(), R_OK) != 0) {
      throw UsageError(
          fmt::format("Python script '{}' does not exist or is not readable", options.program));
    }
    argv = {python_interpreter(env, options.program), "-u", options.program};
  } else {
    argv = {resolve_executable(options.program, env)};
  }
  argv.insert(argv.end(), options.program_args.begin(), options.program_args.end());
  return argv;
}

}  // namespace ddp::launcher
