// ddp-detect: prints what cluster detection finds in this process's environment as one JSON
// line (or the explanation alone with --explain). Exit 2 on a detection error, with the
// error's message on stderr.
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ddp/cluster/detect.hpp"
#include "ddp/util/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"ddp-detect: show what ddprun would detect from SLURM, PBS or OpenMPI"};
  ddp::cluster::DetectOptions options;
  bool explain = false;
  app.add_option("--scheduler", options.scheduler, "auto, slurm, pbs, openmpi or none")
      ->capture_default_str();
  app.add_option("--hostname", options.hostname, "this node's name (default: gethostname)");
  app.add_flag("--explain", explain, "print only the one-line explanation");
  CLI11_PARSE(app, argc, argv);

  try {
    ddp::cluster::ClusterInfo info = ddp::cluster::detect_cluster_from_environment(options);
    if (explain) {
      std::cout << info.explanation << "\n";
      return 0;
    }
    nlohmann::json j = {{"source", info.source},       {"nnodes", info.nnodes},
                        {"node_rank", info.node_rank}, {"master_addr", info.master_addr},
                        {"run_id", info.run_id},       {"hosts", info.hosts},
                        {"warnings", info.warnings},   {"explanation", info.explanation}};
    j["nproc_per_node"] = info.nproc_per_node ? nlohmann::json(*info.nproc_per_node) : nullptr;
    j["origin"] = {{"nnodes", to_string(info.origin.nnodes)},
                   {"node_rank", to_string(info.origin.node_rank)},
                   {"master_addr", to_string(info.origin.master_addr)},
                   {"run_id", to_string(info.origin.run_id)},
                   {"nproc_per_node", to_string(info.origin.nproc_per_node)}};
    std::cout << j.dump() << std::endl;
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << "ddp-detect: " << e.what() << "\n";
    return 2;
  }
}
