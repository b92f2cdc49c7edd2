#include "server/engine/analysis/decoder_analysis.h"

#include <algorithm>

#include "server/engine/setup/checkpoint_io.h"
#include "server/engine/setup/decoder_setup.h"

namespace circuitlab::engine {

absl::StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const v1::ExperimentSpec& spec,
                                                          const std::string& checkpoint) {
  std::unique_ptr<DecoderModel> model = MakeDecoder(spec, 1, torch::kCPU);
  if (absl::Status s = LoadWeights(checkpoint, model->parameter_names(), model->parameters()); !s.ok()) return s;
  for (torch::Tensor& p : model->parameters()) p.requires_grad_(false);
  return model;
}

HookGeometry DecoderHookGeometry(const HookPoint& hp, const std::string& name, const DecoderConfig& cfg) {
  HookGeometry g;
  g.name = name;
  g.width = cfg.d_model;
  if (hp.kind == HookPoint::Kind::kPattern) {  // [E, B, H, T, T]
    g.pos_axis = 3;
    g.head_axis = 2;
    g.heads = cfg.heads;
    g.pattern = true;
    g.width = 0;
  } else if (hp.kind == HookPoint::Kind::kHead) {  // [E, B, T, H, d_head]
    g.head_axis = 3;
    g.heads = cfg.heads;
    g.width = cfg.d_model / cfg.heads;
  }
  return g;
}

absl::Status CheckVectorRequest(const v1::ExperimentSpec& spec, const v1::AnalyzeTaskVectorsRequest& request) {
  const int64_t layers = spec.model().decoder().num_layers();
  for (const std::string& kind :
       {request.hook(), request.estimation_hook(), request.injection_hook(), request.dissociation_hook()}) {
    if (absl::StatusOr<HookPoint> p = ParseHookPoint("L1." + kind, layers);
        !p.ok() || p->kind == HookPoint::Kind::kPattern || p->kind == HookPoint::Kind::kHead) {
      return absl::InvalidArgumentError("hook '" + kind + "' must be post_mlp, post_attn or resid_pre");
    }
  }
  for (uint32_t l : request.layers()) {
    if (l < 1 || l > layers) {
      return absl::InvalidArgumentError("layers must be in [1, " + std::to_string(layers) +
                                        "] (layers count from 1), got " + std::to_string(l));
    }
  }
  return absl::OkStatus();
}

VectorWindow VectorWindowOf(const v1::AnalyzeTaskVectorsRequest& r, int num_layers, int64_t last) {
  VectorWindow w;
  for (uint32_t l : r.layers()) w.layers.push_back(static_cast<int>(l) - 1);  // from 1 on the wire
  if (w.layers.empty()) {
    for (int l = 0; l < num_layers; ++l) w.layers.push_back(l);
  }
  w.est_end = r.has_est_end() ? std::min<int64_t>(r.est_end(), last) : last;
  w.est_begin = r.has_est_begin() ? std::min<int64_t>(r.est_begin(), w.est_end) : std::max<int64_t>(0, (3 * last) / 4);
  return w;
}

absl::StatusOr<LatentEvalSetDef> LatentEvalSetOf(const v1::ExperimentSpec& spec, const std::string& name) {
  const std::vector<LatentEvalSetDef> sets = LatentEvalSets(spec.task().latent().diversity() >= 0);
  std::string have;
  for (const LatentEvalSetDef& s : sets) {
    if (s.name == name || (name.empty() && &s == &sets.front())) return s;
    have += (have.empty() ? "" : ", ") + s.name;
  }
  return absl::InvalidArgumentError("eval_set '" + name + "' is not one of this run's (" + have + ")");
}

}  // namespace circuitlab::engine
