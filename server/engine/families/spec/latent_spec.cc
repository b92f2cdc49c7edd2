// The latent family, torch-free: the decoder on a DICE, MARKOV or DYCK
// latent task (SCIENCE.md A.2, B.2), next-token cross-entropy.
#include <string>

#include "server/common/field_checks.h"
#include "server/common/status_macros.h"
#include "server/engine/families/spec/decoder_spec.h"
#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {
namespace {

class Latent final : public DecoderSpecFamily {
 public:
  std::string_view name() const override { return "latent"; }
  const FamilyDefaults& defaults() const override {
    static const FamilyDefaults d = [] {
      FamilyDefaults d = DecoderTrainingDefaults();
      d.batch_size = 32;
      d.loss_only = "task.latent (next-token cross-entropy on every position)";
      return d;
    }();
    return d;
  }

  absl::Status ResolveTask(v1::ExperimentSpec* spec) const override {
    auto* t = spec->mutable_task()->mutable_latent();
    const std::string p = "task.latent.";
    CL_RETURN_IF_ERROR(ResolveLatentCommon(
        t, {{"dim", t->has_dim()}, {"noise_std", t->has_noise_std()}, {"num_points", t->has_num_points()}},
        "applies only to LATENT_KIND_REGRESSION"));
    const bool dyck = t->kind() == v1::LATENT_KIND_DYCK;
    if (!t->has_num_states()) t->set_num_states(t->kind() == v1::LATENT_KIND_MARKOV ? 7 : 6);
    if (!t->has_seq_len()) t->set_seq_len(dyck ? 85 : 48);
    if (!t->has_dirichlet_alpha()) t->set_dirichlet_alpha(1.0);
    if (!t->has_dyck_length()) t->set_dyck_length(10);
    if (!t->has_repeat_prob()) t->set_repeat_prob(0.25);
    CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_states", t->num_states(), 2, 64));
    CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "seq_len", t->seq_len(), 4, 1024));
    if (!(t->dirichlet_alpha() > 0.0 && t->dirichlet_alpha() <= 100.0)) {
      return absl::InvalidArgumentError(p + "dirichlet_alpha must be in (0, 100], got " +
                                        FormatNumber(t->dirichlet_alpha()));
    }
    CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "dyck_length", t->dyck_length(), 1, 64));
    if (t->kind() == v1::LATENT_KIND_DICE) {
      if (t->major_pool() == v1::MAJOR_POOL_UNSPECIFIED) t->set_major_pool(v1::MAJOR_POOL_DIRICHLET);
      if (!v1::MajorPool_IsValid(t->major_pool())) {
        return absl::InvalidArgumentError(p + "major_pool is not a known value: " + std::to_string(t->major_pool()));
      }
      if (t->major_pool() == v1::MAJOR_POOL_DISJOINT && t->num_majors() > t->num_states()) {
        return absl::InvalidArgumentError(p + "major_pool MAJOR_POOL_DISJOINT gives each major its own faces, so " +
                                          "num_majors must be at most num_states, got " +
                                          std::to_string(t->num_majors()) + " majors and " +
                                          std::to_string(t->num_states()) + " states");
      }
    } else if (t->major_pool() != v1::MAJOR_POOL_UNSPECIFIED) {
      return absl::InvalidArgumentError(p + "major_pool applies only to LATENT_KIND_DICE, leave it unset");
    }
    if (!(t->repeat_prob() > 0.0 && t->repeat_prob() <= 1.0)) {
      return absl::InvalidArgumentError(p + "repeat_prob must be in (0, 1], got " + FormatNumber(t->repeat_prob()));
    }
    return absl::OkStatus();
  }

  // DYCK has no Bayes predictors (D.5.14): its analyses are the OOD
  // regression and its own P0.
  bool OffersTaskVectorAnalysis(const std::string& analysis, const v1::LatentTask& task) const override {
    if (task.kind() == v1::LATENT_KIND_DYCK) return analysis == "ood_r2" || analysis == "dyck_p0";
    return analysis != "dyck_p0";
  }
  // Any position that predicts a next token.
  TaskVectorSites TaskVectorSitesOf(const v1::ExperimentSpec& spec) const override {
    return {static_cast<uint32_t>(ShapeOf(spec).seq_len - 2), "positions"};
  }

 protected:
  const DecoderDefaults& decoder_defaults() const override {
    static const DecoderDefaults d{
        .activation = v1::ACTIVATION_SILU, .attention_bias = false, .final_layernorm = false};
    return d;
  }
  // Token embedding; the unembedding with its bias.
  int64_t InOutParameters(const v1::ExperimentSpec& spec, int64_t d) const override {
    const int64_t v = ShapeOf(spec).vocab;
    return v * d + d * v + v;
  }
  // Tokens (int64) and the reference predictor's log-probs (float64) for at
  // most three sets; their Bayes laws in chunks of 64.
  double EvalSetBytes(const v1::ExperimentSpec& spec) const override {
    const TaskShape s = ShapeOf(spec);
    const double t = static_cast<double>(s.seq_len);
    return 3.0 * spec.recording().eval_size() * t * 16.0 + 64.0 * t * 24.0 * static_cast<double>(s.vocab);
  }
};

}  // namespace

const SpecFamily& LatentSpecFamily() {
  static const Latent family;
  return family;
}

}  // namespace circuitlab::engine
