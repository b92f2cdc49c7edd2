// circuitlab invariance RUN|SPEC.json [--paper] [--controls] [--sgd] [--samples N,...] [--std S] [--force]
#include <cstdio>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace invariance_cmd {

struct Options {
  std::string target;
  bool paper = false, controls = false, sgd = false, force = false;
  std::vector<uint64_t> samples;
  double std = 0;
};

void PrintChecks(const v1::CheckInvarianceResponse& resp) {
  for (const auto& check : resp.checks()) {
    std::printf("%s: %s (largest matrix plateau %.2e)\n", check.name().c_str(),
                check.name() == "in_span" ? (check.passed() ? "IN SPAN" : "NOT IN SPAN")
                                          : (check.passed() ? "fails, as a control must" : "DID NOT FAIL"),
                check.max_matrix_plateau());
    for (const auto& s : check.series()) {
      std::printf("  %-5s 1-f_N:", s.matrix().c_str());
      for (double v : s.off_fraction()) std::printf(" %.2e", v);
      std::printf("   plateau %.2e  slope %.3f\n", s.plateau(), s.slope());
    }
  }
  if (resp.sgd_size() == 0) return;
  std::printf("SGD corollary (%llu steps, lr %g; symmetrised over %llu group elements):\n",
              static_cast<unsigned long long>(resp.sgd_steps()), resp.sgd_learning_rate(),
              static_cast<unsigned long long>(resp.sgd_group_elements()));
  for (const auto& p : resp.sgd()) {
    std::printf("  batch %5llu  rho %.3e  symmetrised %.3e\n", static_cast<unsigned long long>(p.batch_size()),
                p.rho(), p.rho_symmetrised());
  }
}

int Run(Context& ctx, const Options& o) {
  v1::CheckInvarianceRequest req;
  if (absl::Status st = SetTarget(o.target, &req); !st.ok()) return ReportError(st);
  req.set_selection(o.paper ? v1::BASIS_SELECTION_PAPER : v1::BASIS_SELECTION_COMPLETE);
  for (uint64_t n : o.samples) req.add_sample_sizes(n);
  req.set_coordinate_std(o.std);
  req.set_controls(o.controls);
  req.set_sgd_corollary(o.sgd);
  v1::CheckInvarianceResponse resp;
  auto call = [&](bool force) {
    req.set_force(force);
    return ctx.client.RunAnalysis<v1::CheckInvarianceResponse>(req);
  };
  if (auto rc = RunAnalysis(ctx, "the invariance check", o.force, call, &resp)) return *rc;
  std::printf("ladder N:");
  for (uint64_t n : resp.sample_sizes()) std::printf(" %llu", static_cast<unsigned long long>(n));
  std::printf("%s\n", resp.from_store() ? "  (stored answer)" : "");
  PrintChecks(resp);
  return 0;
}

}  // namespace invariance_cmd
}  // namespace

void AddInvariance(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<invariance_cmd::Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "invariance",
              "Theorem 1 numerically (SCIENCE.md C.6): at a random point of the span, does the expected gradient stay\n"
              "in it? Off-span fraction 1-f_N over a ladder of sample sizes, per matrix, with plateau and slope.\n"
              "An analysis job on the server; this command waits and shows progress.\n"
              "  circuitlab invariance r3 --controls\n"
              "  circuitlab invariance examples/induction.json",
              o, invariance_cmd::Run);
  sub->add_option("TARGET", o->target,
                  "Run whose spec gives the task and model (r3), or a spec file (JSON) to check without a run")
      ->required();
  sub->add_flag("--paper", o->paper, "Test the paper span instead of the complete one");
  sub->add_flag("--controls", o->controls, "Also run the must-fail controls");
  sub->add_flag("--sgd", o->sgd,
                "Also the SGD corollary: rho after SGD from the point at batch 64/256/1024, plain and with "
                "symmetrised minibatch gradients");
  sub->add_option("--samples", o->samples, "Ladder of sample sizes (ascending)")->delimiter(',');
  sub->add_option("--std", o->std, "Scale s of the random point's coordinates (default 1)");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
