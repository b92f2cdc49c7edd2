// What the decoder families' analyses (task vectors, hook-point
// interventions) share: a checkpoint loaded for analysis with its task, and
// the request checks AnalyzeTaskVectors makes before it loads anything.
// Engine-private (LibTorch).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/common/seeds.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/analysis/registry.h"
#include "server/engine/api.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/setup/decoder_setup.h"

namespace circuitlab::engine {

// A decoder checkpoint loaded for analysis (one member, no gradients).
absl::StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const v1::ExperimentSpec& spec,
                                                          const std::string& checkpoint);

// A latent run's evaluation set `name` ("" = the first, "id");
// InvalidArgument listing the run's sets for another name.
absl::StatusOr<LatentEvalSetDef> LatentEvalSetOf(const v1::ExperimentSpec& spec, const std::string& name);

// The tensor at a decoder hook point `name` parsed as `hp` (decoder_model.h).
HookGeometry DecoderHookGeometry(const HookPoint& hp, const std::string& name, const DecoderConfig& cfg);

// f(model, task) on the input's checkpoint and its run's task (`Task`: the
// family's task generator, built as the trainer builds it).
template <typename Task, typename F>
auto WithDecoder(const AnalysisInput& input, F f)
    -> decltype(f(std::declval<const DecoderModel&>(), std::declval<const Task&>())) {
  absl::StatusOr<std::unique_ptr<DecoderModel>> model = LoadDecoder(input.spec, input.checkpoint());
  if (!model.ok()) return model.status();
  const Task task(input.spec.task().latent(), PoolSeedOf(input.spec.seed()));
  return f(**model, task);
}

// AnalyzeTaskVectors' hook kinds (post_mlp, post_attn or resid_pre) and
// layers against the run's decoder: InvalidArgument naming the field.
absl::Status CheckVectorRequest(const v1::ExperimentSpec& spec, const v1::AnalyzeTaskVectorsRequest& request);

// The AnalyzeTaskVectors entry of a decoder family (`Task`: its task
// generator): the request checked, then run(model, task, request, progress,
// cancel) on the input's checkpoint, on one thread.
template <typename Task, typename Run>
auto TaskVectorAnalysis(Run run) {
  return [run](const AnalysisInput& in, const v1::AnalyzeTaskVectorsRequest& r, const AnalysisProgress& progress,
               const CancelToken* cancel) -> absl::StatusOr<v1::AnalyzeTaskVectorsResponse> {
    at::set_num_threads(1);
    if (absl::Status s = CheckVectorRequest(in.spec, r); !s.ok()) return s;
    return WithDecoder<Task>(in, [&](const DecoderModel& m, const Task& t) { return run(m, t, r, progress, cancel); });
  };
}

// Where a task-vector request reads: the layers it names (all `num_layers`
// when none) and the estimation window [est_begin, est_end] over the sites
// 0..last (positions or points; default the last quarter).
struct VectorWindow {
  std::vector<int> layers;
  int64_t est_begin = 0, est_end = 0;
};
VectorWindow VectorWindowOf(const v1::AnalyzeTaskVectorsRequest& request, int num_layers, int64_t last);

}  // namespace circuitlab::engine
