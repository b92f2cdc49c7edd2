// What the two decoder families (latent, regression) share, torch-free:
// model.decoder's defaults and checks, its sizes, the latent task's common
// fields. Each family says what differs: its task fields, its read-in and
// read-out, its evaluation sets, its task-vector analyses.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "server/engine/families/spec/spec_family.h"

namespace circuitlab::engine {

// model.decoder's defaults that differ by family.
struct DecoderDefaults {
  v1::Activation activation = v1::ACTIVATION_SILU;
  bool attention_bias = false;
  bool final_layernorm = false;
};

class DecoderSpecFamily : public SpecFamily {
 public:
  absl::Status ResolveModel(v1::ExperimentSpec* spec) const override;
  absl::Status ResolveCoordinateRecording(v1::ExperimentSpec* spec, bool given) const override;
  int64_t ResidualWidth(const v1::ExperimentSpec& spec) const override;
  int64_t ParameterCount(const v1::ExperimentSpec& spec) const override;
  uint64_t EstimateRunMemoryBytes(const v1::ExperimentSpec& spec) const override;
  int64_t NumHeads(const v1::ExperimentSpec& spec) const override;
  bool has_task_vectors() const override { return true; }
  // kappa (task.latent.diversity, as long as every member has minor tasks
  // or none does: the evaluation sets follow it) and p_minor: each member
  // draws its own task pools and batches.
  void ClearMemberSettings(v1::ExperimentSpec* key) const override {
    SpecFamily::ClearMemberSettings(key);
    v1::LatentTask* t = key->mutable_task()->mutable_latent();
    t->set_diversity(t->diversity() < 0 ? -1 : 0);
    t->clear_p_minor();
  }

 protected:
  virtual const DecoderDefaults& decoder_defaults() const = 0;
  // Parameters outside the blocks and the final LayerNorm: read-in and
  // read-out, for residual width `d`.
  virtual int64_t InOutParameters(const v1::ExperimentSpec& spec, int64_t d) const = 0;
  // Bytes of the evaluation sets a run keeps, and their reference laws.
  virtual double EvalSetBytes(const v1::ExperimentSpec& spec) const = 0;
  // The training defaults both decoder families start from: AdamW, the
  // triangle schedule, 512 evaluation sequences per set.
  static FamilyDefaults DecoderTrainingDefaults();
  // task.latent's fields every kind has (diversity, p_minor, num_majors,
  // num_ood), defaulted and checked; then the fields of the other family,
  // each of which must be unset (`why`: what to set instead).
  static absl::Status ResolveLatentCommon(v1::LatentTask* t,
                                          std::initializer_list<std::pair<const char*, bool>> foreign,
                                          const std::string& why);
};

}  // namespace circuitlab::engine
