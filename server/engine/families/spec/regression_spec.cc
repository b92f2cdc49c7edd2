// The regression family, torch-free: the decoder on continuous-token
// regression (E2, SCIENCE.md B.4): x, |-, y per point, squared error on the
// y positions.
#include <string>

#include "server/common/field_checks.h"
#include "server/common/status_macros.h"
#include "server/engine/families/spec/decoder_spec.h"
#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {
namespace {

class Regression final : public DecoderSpecFamily {
 public:
  std::string_view name() const override { return "regression"; }
  // SCIENCE.md B.4 (TV-small-E2): AdamW 5e-4, batch 64, clipping 1.0.
  const FamilyDefaults& defaults() const override {
    static const FamilyDefaults d = [] {
      FamilyDefaults d = DecoderTrainingDefaults();
      d.adam_learning_rate = 5e-4;
      d.batch_size = 64;
      d.grad_clip = 1.0;
      d.loss = v1::LOSS_KIND_MSE;
      d.loss_only = "LATENT_KIND_REGRESSION (squared error of the prediction of every y_i)";
      return d;
    }();
    return d;
  }

  // E2 has its own fields; the token kinds' fields do not apply to it.
  absl::Status ResolveTask(v1::ExperimentSpec* spec) const override {
    auto* t = spec->mutable_task()->mutable_latent();
    const std::string p = "task.latent.";
    CL_RETURN_IF_ERROR(ResolveLatentCommon(t,
                                           {{"num_states", t->has_num_states()},
                                            {"dirichlet_alpha", t->has_dirichlet_alpha()},
                                            {"dyck_length", t->has_dyck_length()},
                                            {"repeat_prob", t->has_repeat_prob()},
                                            {"major_pool", t->major_pool() != v1::MAJOR_POOL_UNSPECIFIED}},
                                           "does not apply to LATENT_KIND_REGRESSION (continuous tokens; set dim, "
                                           "noise_std and num_points)"));
    if (!t->has_dim()) t->set_dim(6);
    if (!t->has_noise_std()) t->set_noise_std(0.5);
    if (!t->has_num_points()) t->set_num_points(16);
    CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "dim", t->dim(), 1, 64));
    if (!(t->noise_std() > 0.0 && t->noise_std() <= 10.0)) {
      return absl::InvalidArgumentError(p + "noise_std must be in (0, 10], got " + FormatNumber(t->noise_std()));
    }
    CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_points", t->num_points(), 1, 256));
    if (t->has_seq_len() && t->seq_len() != 3 * t->num_points()) {
      return absl::InvalidArgumentError(
          p + "seq_len of LATENT_KIND_REGRESSION is 3 * num_points = " + std::to_string(3 * t->num_points()) +
          " (x, |-, y per point), got " + std::to_string(t->seq_len()) + "; leave it unset");
    }
    t->set_seq_len(3 * t->num_points());
    return absl::OkStatus();
  }

  // x (dim floats) and the flag that marks a y.
  int64_t ContinuousInputWidth(const v1::ExperimentSpec& spec) const override {
    return int64_t{spec.task().latent().dim()} + 1;
  }

  // The continuous-token forms of P0, P2, P3, steering, OOD R^2 and the mode
  // transition.
  bool OffersTaskVectorAnalysis(const std::string& analysis, const v1::LatentTask&) const override {
    return analysis == "p0" || analysis == "p2" || analysis == "p3" || analysis == "steering" || analysis == "ood_r2" ||
           analysis == "kl";
  }
  // Points: the state at the |- before y_i.
  TaskVectorSites TaskVectorSitesOf(const v1::ExperimentSpec& spec) const override {
    return {spec.task().latent().num_points() - 1, "points"};
  }

 protected:
  const DecoderDefaults& decoder_defaults() const override {
    static const DecoderDefaults d{.activation = v1::ACTIVATION_GELU, .attention_bias = true, .final_layernorm = true};
    return d;
  }
  // Read-in (dim + 1 -> d) and the pad vector; a bias-free scalar head.
  int64_t InOutParameters(const v1::ExperimentSpec& spec, int64_t d) const override {
    const int64_t in = ContinuousInputWidth(spec);
    return in * d + in + d;
  }
  // x and y (float32) and two reference predictions (float64) per point; the
  // known-pool posterior per point and task, 64 sequences at a time.
  double EvalSetBytes(const v1::ExperimentSpec& spec) const override {
    const auto& lt = spec.task().latent();
    const double points = lt.num_points(), tasks = lt.num_majors() + (lt.diversity() >= 0 ? 1u << lt.diversity() : 0);
    return 3.0 * spec.recording().eval_size() * points * (4.0 * (lt.dim() + 1) + 16.0) + 64.0 * points * tasks * 24.0;
  }
};

}  // namespace

const SpecFamily& RegressionSpecFamily() {
  static const Regression family;
  return family;
}

}  // namespace circuitlab::engine
