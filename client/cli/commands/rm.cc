// circuitlab rm ID... : delete ended runs (r3) and sweeps with their members (s2)
#include <iostream>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace rm_cmd {

struct Options {
  std::vector<std::string> ids;
};

std::string Mib(uint64_t bytes) { return client::Fixed(static_cast<double>(bytes) / (1 << 20), 1) + " MiB"; }

// Deletes each id in turn; stops at the first refusal (earlier ones stay deleted).
int Run(Context& ctx, const Options& o) {
  for (const std::string& id : o.ids) {
    const bool sweep = !id.empty() && (id[0] == 's' || id[0] == 'S');
    if (sweep) {
      auto r = ctx.client.DeleteSweep(id);
      if (!r.ok()) return ReportError(r.status());
      if (ctx.g.json) {
        std::cout << client::ToJson(*r) << "\n";
      } else {
        std::cout << "deleted " << r->sweep_id() << " and its " << r->run_ids_size() << " run(s), "
                  << Mib(r->freed_bytes()) << " of checkpoints freed\n";
      }
    } else {
      auto r = ctx.client.DeleteRun(id);
      if (!r.ok()) return ReportError(r.status());
      if (ctx.g.json) {
        std::cout << client::ToJson(*r) << "\n";
      } else {
        std::cout << "deleted " << r->run_id() << ", " << Mib(r->freed_bytes()) << " of checkpoints freed\n";
      }
    }
  }
  return 0;
}

}  // namespace rm_cmd
}  // namespace

void AddRm(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<rm_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "rm",
                          "Delete ended runs and sweeps: rows, metrics, coordinates, stored analyses and checkpoint "
                          "files. A queued or running run is refused (cancel it first); a sweep's member is deleted "
                          "with its sweep. Run ids are never reused.\n"
                          "  circuitlab rm r3 r4\n  circuitlab rm s2",
                          o, rm_cmd::Run);
  sub->add_option("ID", o->ids, "Run ids (r3) and sweep ids (s2)")->required();
}

}  // namespace circuitlab::cli
