// What the two decoder families (SCIENCE.md B.2: `latent` and `regression`)
// share: the decoder trained by a DecoderTrainer, its evaluation sets
// (id/ood/minor). Their analyses (task vectors, hook-point interventions)
// register themselves in analysis/ (decoder_analysis.h).
// Engine-private (includes LibTorch).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/engine/families/family.h"
#include "server/engine/families/spec/spec_family.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/train/latent_trainer.h"

namespace circuitlab::engine {

// The decoder families: `Trainer` is the run's trainer (a DecoderTrainer),
// `spec` the family's torch-free half (its name, its rules).
template <typename Trainer>
class DecoderFamily final : public ModelFamily {
 public:
  // `metrics`: the names each evaluation set reports.
  DecoderFamily(const SpecFamily& spec, std::vector<std::string> metrics) : spec_(spec), metrics_(std::move(metrics)) {}

  std::string_view name() const override { return spec_.name(); }
  std::unique_ptr<TrainerBase> MakeTrainer(std::vector<v1::ExperimentSpec> members,
                                           torch::Device device) const override {
    return std::make_unique<Trainer>(std::move(members), device);
  }
  std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) const override {
    std::vector<std::string> out;
    for (const LatentEvalSetDef& set : LatentEvalSets(resolved.task().latent().diversity() >= 0)) {
      for (const std::string& m : metrics_) out.push_back("eval/" + set.name + "/" + m);
    }
    return out;
  }

 private:
  const SpecFamily& spec_;
  std::vector<std::string> metrics_;
};

}  // namespace circuitlab::engine
