#include "server/engine/analysis/family.h"

#include "absl/strings/str_cat.h"
#include "server/common/seeds.h"
#include "server/engine/analysis/decoder_interventions.h"
#include "server/engine/analysis/regression_vectors.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/train/latent_trainer.h"
#include "server/engine/train/regression_trainer.h"
#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {
namespace {

class ImirFamily final : public ModelFamily {
 public:
  std::string_view name() const override { return "imir"; }
  std::string_view offers() const override {
    return "ProjectCheckpoint, CheckInvariance, DetectCircuit, Intervene, LabelRun and CheckDataDependence";
  }
  absl::StatusOr<v1::ProjectCheckpointResponse> ProjectCheckpoint(
      const v1::ExperimentSpec& spec, const std::string& checkpoint,
      const v1::ProjectCheckpointRequest& request) const override {
    return ImirProject(spec, checkpoint, request);
  }
  absl::StatusOr<v1::CheckInvarianceResponse> CheckInvariance(const v1::ExperimentSpec& spec,
                                                              const v1::CheckInvarianceRequest& request,
                                                              const AnalysisProgress& progress,
                                                              const CancelToken* cancel) const override {
    return ImirInvariance(spec, request, progress, cancel);
  }
  absl::StatusOr<v1::DetectCircuitResponse> DetectCircuit(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                          const v1::DetectCircuitRequest& request,
                                                          const AnalysisProgress& progress,
                                                          const CancelToken* cancel) const override {
    return ImirDetectCircuit(spec, checkpoint, request, progress, cancel);
  }
  absl::StatusOr<v1::InterveneResponse> Intervene(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                  const v1::InterveneRequest& request,
                                                  const std::map<int, StoredCheckpoint>& sources) const override {
    return ImirIntervene(spec, checkpoint, request, sources);
  }
  absl::StatusOr<v1::CheckDataDependenceResponse> CheckDataDependence(const v1::ExperimentSpec& spec,
                                                                      const v1::CheckDataDependenceRequest& request,
                                                                      const AnalysisProgress& progress,
                                                                      const CancelToken* cancel) const override {
    return ImirDataDependence(spec, request, progress, cancel);
  }
  absl::StatusOr<v1::LabelRunResponse> LabelRun(const v1::ExperimentSpec& spec,
                                                const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                                const v1::LabelRunRequest& request, const AnalysisProgress& progress,
                                                const CancelToken* cancel) const override {
    return ImirLabelRun(spec, checkpoints, request, progress, cancel);
  }
};

// A decoder checkpoint loaded for analysis (one member, no gradients).
absl::StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const v1::ExperimentSpec& spec,
                                                          const std::string& checkpoint) {
  std::unique_ptr<DecoderModel> model = MakeDecoder(spec, 1, torch::kCPU);
  if (absl::Status s = LoadWeights(checkpoint, model->parameter_names(), model->parameters()); !s.ok()) return s;
  for (torch::Tensor& p : model->parameters()) p.requires_grad_(false);
  return model;
}

// The decoder families: `Task` is the run's task generator.
template <typename Task>
class DecoderFamily final : public ModelFamily {
 public:
  using Intervention = absl::StatusOr<v1::InterveneResponse> (*)(const DecoderModel&, const Task&,
                                                                 const v1::InterveneRequest&);
  using Vectors = absl::StatusOr<v1::AnalyzeTaskVectorsResponse> (*)(const DecoderModel&, const Task&,
                                                                     const v1::AnalyzeTaskVectorsRequest&,
                                                                     const std::function<void(double)>&,
                                                                     const CancelToken*);
  DecoderFamily(std::string_view name, Intervention intervene, Vectors vectors)
      : name_(name), intervene_(intervene), vectors_(vectors) {}

  std::string_view name() const override { return name_; }
  std::string_view offers() const override { return "AnalyzeTaskVectors and Intervene (hook-point ops)"; }
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
};

}  // namespace

absl::Status ModelFamily::Lacks(std::string_view analysis) const {
  return absl::FailedPreconditionError(absl::StrCat(std::string(analysis), " is not an analysis of the ",
                                                    std::string(name()), " model family; it has ",
                                                    std::string(offers())));
}

const ModelFamily& FamilyOf(const v1::ExperimentSpec& spec) {
  static const ImirFamily imir;
  static const DecoderFamily<LatentTaskGenerator> latent("latent", InterveneDecoder, RunTaskVectorAnalyses);
  static const DecoderFamily<RegressionTaskGenerator> regression("regression", InterveneRegression,
                                                                 RunRegressionAnalyses);
  if (spec.model().kind_case() != v1::ModelSpec::kDecoder || !IsLatent(spec)) return imir;
  return spec.task().latent().kind() == v1::LATENT_KIND_REGRESSION ? static_cast<const ModelFamily&>(regression)
                                                                   : latent;
}

}  // namespace circuitlab::engine
