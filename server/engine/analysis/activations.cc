// GetActivations: a run's model at a stored checkpoint on the caller's own
// sequences, the tensors at the hook points asked for (the names Intervene
// edits, and "logits"), batch first without the ensemble dimension. The
// IMIR block model (B.1) reads a token and a position id at every position;
// a decoder (B.2) tokens only.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/analysis/prompts.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

// The answer's values, all hooks together (16 MiB of floats).
constexpr int64_t kMaxValues = int64_t{1} << 22;
// The forward's attention probabilities, sequences x T^2 x heads x layers
// (256 MiB of floats): what bounds the job's working memory.
constexpr int64_t kMaxAttention = int64_t{1} << 26;

// The hooks asked for ("logits" when none).
std::vector<std::string> HooksOf(const v1::GetActivationsRequest& r) {
  std::vector<std::string> out(r.hooks().begin(), r.hooks().end());
  if (out.empty()) out.push_back("logits");
  return out;
}

absl::Status CheckSizes(int64_t values, int64_t attention) {
  if (values > kMaxValues) {
    return absl::InvalidArgumentError(absl::StrCat("these hooks hold ", values, " values on these sequences, more than ",
                                                   kMaxValues, "; ask fewer hooks or sequences, or shorter ones"));
  }
  if (attention > kMaxAttention) {
    return absl::InvalidArgumentError(absl::StrCat("the forward pass would hold ", attention,
                                                   " attention weights (sequences x T^2 x heads x layers), more than ",
                                                   kMaxAttention, "; send fewer or shorter sequences"));
  }
  return absl::OkStatus();
}

// Runs `forward(hook)` keeping the hooks asked for, `batch_first(point, v)`
// turning a kept tensor (its ensemble dimension gone) batch first.
template <typename Forward, typename BatchFirst>
v1::GetActivationsResponse Collect(const std::vector<std::string>& hooks, Forward forward, BatchFirst batch_first) {
  std::vector<torch::Tensor> kept(hooks.size());
  const HookFn keep = [&](const std::string& point, const torch::Tensor& v) {
    for (size_t i = 0; i < hooks.size(); ++i) {
      if (hooks[i] == point) kept[i] = batch_first(point, v[0]).to(torch::kFloat).contiguous();
    }
    return torch::Tensor();
  };
  forward(keep);
  v1::GetActivationsResponse out;
  for (size_t i = 0; i < hooks.size(); ++i) {
    v1::HookActivation* a = out.add_activations();
    a->set_hook(hooks[i]);
    for (int64_t d = 0; d < kept[i].dim(); ++d) a->add_shape(static_cast<uint32_t>(kept[i].size(d)));
    const float* p = kept[i].data_ptr<float>();
    a->mutable_values()->Add(p, p + kept[i].numel());
  }
  return out;
}

absl::StatusOr<v1::GetActivationsResponse> ImirActivations(const AnalysisInput& in,
                                                           const v1::GetActivationsRequest& r) {
  torch::NoGradGuard no_grad;
  const v1::ExperimentSpec& spec = in.spec;
  absl::StatusOr<DenseCheckpoint> opened = OpenDense(spec, in.checkpoint());
  if (!opened.ok()) return opened.status();
  const BlockTask* task = opened->task.get();
  const ImirModel* dense = opened->dense.get();
  const int64_t layers = spec.model().imir().num_layers(), heads = spec.model().imir().num_heads();
  const int64_t V = task->vocab_size(), P = task->num_positions();
  absl::StatusOr<Sequences> x = ReadSequences(r.sequences(), "sequences", V, P, 0);
  if (!x.ok()) return x.status();
  const std::vector<std::string> hooks = HooksOf(r);
  int64_t values = 0;
  for (const std::string& h : hooks) {
    if (h == "logits") {
      values += x->B * x->T * V;
      continue;
    }
    absl::StatusOr<HookGeometry> g = ImirHookGeometry(h, layers, heads, V + P);
    if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("hooks: ", g.status().message(), ", or logits"));
    values += g->pattern ? x->B * heads * x->T * x->T : x->B * x->T * g->width;
  }
  if (absl::Status s = CheckSizes(values, x->B * x->T * x->T * heads * layers); !s.ok()) return s;
  return Collect(
      hooks, [&](const HookFn& keep) { dense->Forward(x->tokens, x->pids, true, nullptr, &keep); },
      [](const std::string& point, const torch::Tensor& v) {
        // L{l}.attn is [H, B, T, T] in the model.
        return point.size() > 5 && point.compare(point.size() - 5, 5, ".attn") == 0 ? v.transpose(0, 1) : v;
      });
}

absl::StatusOr<v1::GetActivationsResponse> DecoderActivations(const AnalysisInput& in,
                                                              const v1::GetActivationsRequest& r) {
  torch::NoGradGuard no_grad;
  absl::StatusOr<std::unique_ptr<DecoderModel>> model = LoadDecoder(in.spec, in.checkpoint());
  if (!model.ok()) return model.status();
  const DecoderConfig& c = (*model)->config();
  absl::StatusOr<Sequences> x = ReadSequences(r.sequences(), "sequences", c.vocab, 0, c.max_len);
  if (!x.ok()) return x.status();
  const std::vector<std::string> hooks = HooksOf(r);
  int64_t values = 0;
  for (const std::string& h : hooks) {
    absl::StatusOr<HookPoint> p = ParseHookPoint(h, c.layers, c.final_ln);
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("hooks: ", p.status().message()));
    values += p->kind == HookPoint::Kind::kPattern  ? x->B * c.heads * x->T * x->T
              : p->kind == HookPoint::Kind::kLogits ? x->B * x->T * c.vocab
                                                    : x->B * x->T * c.d_model;
  }
  if (absl::Status s = CheckSizes(values, x->B * x->T * x->T * c.heads * c.layers); !s.ok()) return s;
  return Collect(
      hooks, [&](const HookFn& keep) { (*model)->Forward(x->tokens, &keep); },
      [](const std::string&, const torch::Tensor& v) { return v; });
}

}  // namespace

// The analysis table's entries (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::GetActivationsRequest, v1::GetActivationsResponse,
                           [](const AnalysisInput& in, const v1::GetActivationsRequest& r, const AnalysisProgress&,
                              const CancelToken*) { return ImirActivations(in, r); });
CIRCUITLAB_ENGINE_ANALYSIS("latent", v1::GetActivationsRequest, v1::GetActivationsResponse,
                           [](const AnalysisInput& in, const v1::GetActivationsRequest& r, const AnalysisProgress&,
                              const CancelToken*) { return DecoderActivations(in, r); });

}  // namespace circuitlab::engine
