// circuitlab data-dependence RUN|SPEC.json [--samples N] [--force]
#include <cstdio>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace data_dependence_cmd {

struct Options {
  std::string target;
  uint64_t samples = 0;
  bool force = false;
};

int Run(Context& ctx, const Options& o) {
  v1::CheckDataDependenceRequest req;
  if (absl::Status st = SetTarget(o.target, &req); !st.ok()) return ReportError(st);
  req.set_samples(o.samples);
  v1::CheckDataDependenceResponse resp;
  auto call = [&](bool force) {
    req.set_force(force);
    return ctx.client.RunAnalysis<v1::CheckDataDependenceResponse>(req);
  };
  if (auto rc = RunAnalysis(ctx, "the data-dependence check", o.force, call, &resp)) return *rc;
  std::printf("%llu sequences per point%s\n", static_cast<unsigned long long>(resp.samples()),
              resp.from_store() ? "  (stored answer)" : "");
  std::printf("%-8s %5s %5s %3s %7s %5s %11s %9s %11s %8s %8s %6s %9s\n", "MODE", "F_R", "F_V", "B", "DELTA", "ABG",
              "DL/DGAMMA", "STDERR", "CLOSED", "RATIO", "VECTOR", "PHI", "IDENTITY");
  for (const auto& r : resp.rows()) {
    const auto& p = r.point();
    std::printf("%-8s %5.2f %5.2f %3u %7.3f %5.2f %11.4e %9.2e %11.4e %8.4f %8.4f %6.3f %9.1e\n",
                p.variability_mode() == v1::VARIABILITY_MODE_REPAIR ? "repair" : "variant", p.rare_fraction(),
                p.variability(), p.burstiness(), p.delta(), p.abg(), r.grad_gamma(), r.gamma_stderr(),
                r.closed_form_gamma(), r.ratio(), r.ratio_vector(), r.phi(), r.identity_max_rel_error());
  }
  return 0;
}

}  // namespace data_dependence_cmd
}  // namespace

void AddDataDependence(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<data_dependence_cmd::Options>();
  CLI::App* sub = AddVerb(
      app, chosen, "data-dependence",
      "Theorems 2 and 3 numerically (SCIENCE.md D.4): the gradient along alpha, beta, gamma, delta at the zero\n"
      "point over E.6's grid (common tokens suppress the ICL gradient by phi = f_r + (1 - f_r) f_v) and E.7's\n"
      "burstiness (dL/dgamma = 1/V - b/T), with the count identity. An analysis job; this command waits.\n"
      "  circuitlab data-dependence r3\n  circuitlab data-dependence examples/induction.json --samples 16384",
      o, data_dependence_cmd::Run);
  sub->add_option("TARGET", o->target, "Run id, or a spec file (associative recall with common pairs)")->required();
  sub->add_option("--samples", o->samples, "Sequences per grid point (default 65536)");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
