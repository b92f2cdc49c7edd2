// circuitlab project RUN [--step S] [--complete] [--all] [--force]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace project_cmd {

struct Options {
  std::string run_id;
  uint64_t step = 0;
  bool complete = false, all = false, force = false;
};

int Run(Context& ctx, const Options& o) {
  v1::ProjectCheckpointRequest req;
  req.set_run_id(o.run_id);
  req.set_step(o.step);
  req.set_selection(o.complete ? v1::BASIS_SELECTION_COMPLETE : v1::BASIS_SELECTION_PAPER);
  v1::ProjectCheckpointResponse resp;
  auto call = [&](bool force) {
    req.set_force(force);
    return ctx.client.RunAnalysis<v1::ProjectCheckpointResponse>(req);
  };
  if (auto rc = RunAnalysis(ctx, "the projection", o.force, call, &resp)) return *rc;
  std::printf("%s step %llu, %s basis (%d coordinates)%s\n", resp.run_id().c_str(),
              static_cast<unsigned long long>(resp.step()), o.complete ? "complete" : "paper",
              resp.coordinates_size(), resp.from_store() ? ", stored answer" : "");
  std::printf("rho %.4f (this basis), %.4f (complete)\n", resp.rho(), resp.rho_complete());
  for (const auto& [matrix, rho] :
       std::map<std::string, double>(resp.rho_by_matrix().begin(), resp.rho_by_matrix().end())) {
    std::printf("  rho %-6s %.4f\n", matrix.c_str(), rho);
  }
  std::vector<const v1::Coordinate*> rows;
  for (const auto& c : resp.coordinates()) rows.push_back(&c);
  std::stable_sort(rows.begin(), rows.end(),
                   [](auto* a, auto* b) { return std::abs(a->magnitude()) > std::abs(b->magnitude()); });
  const size_t limit = o.all ? rows.size() : std::min<size_t>(20, rows.size());
  std::printf("%s %-6s %12s %12s\n", client::Pad("COORDINATE", 34).c_str(), "NAME", "VALUE", "MAGNITUDE");
  for (size_t i = 0; i < limit; ++i) {
    std::printf("%s %-6s %12.5f %12.5f%s\n", client::Pad(rows[i]->label(), 34).c_str(), rows[i]->canonical().c_str(),
                rows[i]->value(), rows[i]->magnitude(), rows[i]->gauge() ? "  (gauge)" : "");
  }
  return 0;
}

}  // namespace project_cmd
}  // namespace

void AddProject(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<project_cmd::Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "project",
              "Project a stored checkpoint onto the IMIR basis: coordinates and off-manifold residual rho.\n"
              "An analysis job on the server; this command waits and shows progress.\n"
              "  circuitlab project r3 --step 500 --complete",
              o, project_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_option("--step", o->step, "Checkpoint step (default: the newest)");
  sub->add_flag("--complete", o->complete, "Project onto the complete set (the commutant)");
  sub->add_flag("--force", o->force, "Recompute even if the answer is stored");
  sub->add_flag("--all", o->all, "Show every coordinate (default: the 20 largest)");
}

}  // namespace circuitlab::cli
