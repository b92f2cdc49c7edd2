// What the two decoder families (SCIENCE.md B.2: `latent` and `regression`)
// share: the decoder trained by a DecoderTrainer<Task>, its evaluation sets
// (id/ood/minor), task-vector analyses and hook-point interventions.
// Engine-private (includes LibTorch).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/common/seeds.h"
#include "server/engine/families/family.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/train/latent_trainer.h"

namespace circuitlab::engine {

// A decoder checkpoint loaded for analysis (one member, no gradients).
absl::StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const v1::ExperimentSpec& spec,
                                                          const std::string& checkpoint);

// The decoder families: `Task` is the run's task generator, `Trainer` its
// trainer (a DecoderTrainer<Task>).
template <typename Task, typename Trainer>
class DecoderFamily final : public ModelFamily {
 public:
  using Intervention = absl::StatusOr<v1::InterveneResponse> (*)(const DecoderModel&, const Task&,
                                                                 const v1::InterveneRequest&);
  using Vectors = absl::StatusOr<v1::AnalyzeTaskVectorsResponse> (*)(const DecoderModel&, const Task&,
                                                                     const v1::AnalyzeTaskVectorsRequest&,
                                                                     const std::function<void(double)>&,
                                                                     const CancelToken*);
  // `metrics`: the names each evaluation set reports.
  DecoderFamily(std::string_view name, Intervention intervene, Vectors vectors, std::vector<std::string> metrics)
      : name_(name), intervene_(intervene), vectors_(vectors), metrics_(std::move(metrics)) {}

  std::string_view name() const override { return name_; }
  std::string_view offers() const override { return "AnalyzeTaskVectors and Intervene (hook-point ops)"; }
  std::unique_ptr<TrainerBase> MakeTrainer(const v1::ExperimentSpec& resolved, const std::vector<uint64_t>& seeds,
                                           torch::Device device) const override {
    return std::make_unique<Trainer>(resolved, seeds, device);
  }
  std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) const override {
    std::vector<std::string> out;
    for (const LatentEvalSetDef& set : LatentEvalSets(resolved.task().latent().diversity() >= 0)) {
      for (const std::string& m : metrics_) out.push_back("eval/" + set.name + "/" + m);
    }
    return out;
  }
  absl::StatusOr<v1::InterveneResponse> Intervene(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                  const v1::InterveneRequest& request,
                                                  const std::map<int, StoredCheckpoint>&) const override {
    absl::StatusOr<std::unique_ptr<DecoderModel>> model = LoadDecoder(spec, checkpoint);
    if (!model.ok()) return model.status();
    const Task task(spec.task().latent(), PoolSeedOf(spec.seed()));
    return intervene_(**model, task, request);
  }
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> AnalyzeTaskVectors(const v1::ExperimentSpec& spec,
                                                                    const std::string& checkpoint,
                                                                    const v1::AnalyzeTaskVectorsRequest& request,
                                                                    const AnalysisProgress& progress,
                                                                    const CancelToken* cancel) const override {
    at::set_num_threads(1);
    const int64_t layers = spec.model().decoder().num_layers();
    for (const std::string& kind :
         {request.hook(), request.estimation_hook(), request.injection_hook(), request.dissociation_hook()}) {
      if (absl::StatusOr<HookPoint> p = ParseHookPoint("L0." + kind, layers);
          !p.ok() || p->kind == HookPoint::Kind::kPattern || p->kind == HookPoint::Kind::kHead) {
        return absl::InvalidArgumentError("hook '" + kind + "' must be post_mlp, post_attn or resid_pre");
      }
    }
    for (uint32_t l : request.layers()) {
      if (l >= layers) {
        return absl::InvalidArgumentError("layers must be in [0, " + std::to_string(layers - 1) + "], got " +
                                          std::to_string(l));
      }
    }
    absl::StatusOr<std::unique_ptr<DecoderModel>> model = LoadDecoder(spec, checkpoint);
    if (!model.ok()) return model.status();
    const Task task(spec.task().latent(), PoolSeedOf(spec.seed()));
    return vectors_(**model, task, request, progress, cancel);
  }

 private:
  std::string_view name_;
  Intervention intervene_;
  Vectors vectors_;
  std::vector<std::string> metrics_;
};

}  // namespace circuitlab::engine
