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
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

// The answer's values, all hooks together (16 MiB of floats).
constexpr int64_t kMaxValues = int64_t{1} << 22;
// The forward's attention probabilities, sequences x T^2 x heads x layers
// (256 MiB of floats): what bounds the job's working memory.
constexpr int64_t kMaxAttention = int64_t{1} << 26;

// The request's sequences as [1, B, T] token ids, and position ids when
// `positions` > 0 (IMIR) or none (a decoder: InvalidArgument when given).
struct Inputs {
  torch::Tensor tokens, pids;
  int64_t B = 0, T = 0;
};
absl::StatusOr<Inputs> ReadInputs(const v1::GetActivationsRequest& r, int64_t vocab, int64_t positions,
                                  int64_t max_len) {
  Inputs in;
  in.B = r.sequences_size();
  in.T = in.B == 0 ? 0 : r.sequences(0).tokens_size();
  if (max_len > 0 && in.T > max_len) {
    return absl::InvalidArgumentError(absl::StrCat("sequences have ", in.T, " tokens; this model reads at most ",
                                                   max_len, " (its context length)"));
  }
  std::vector<int64_t> tokens, pids;
  for (int b = 0; b < r.sequences_size(); ++b) {
    const v1::InputSequence& s = r.sequences(b);
    for (int t = 0; t < s.tokens_size(); ++t) {
      if (s.tokens(t) < 0 || s.tokens(t) >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("sequences[", b, "].tokens[", t, "] must be in [0, ", vocab - 1,
                                                       "] (this model's vocabulary), got ", s.tokens(t)));
      }
      tokens.push_back(s.tokens(t));
    }
    if (positions == 0) {
      if (s.positions_size() > 0) {
        return absl::InvalidArgumentError(absl::StrCat("sequences[", b,
                                                       "].positions: a decoder's positions are implicit (RoPE); "
                                                       "send tokens only"));
      }
      continue;
    }
    if (s.positions_size() != s.tokens_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequences[", b, "].positions must have one position id per token (", s.tokens_size(), "), got ",
          s.positions_size(), ": the IMIR model reads a token and a position id at every position"));
    }
    for (int t = 0; t < s.positions_size(); ++t) {
      if (s.positions(t) < 0 || s.positions(t) >= positions) {
        return absl::InvalidArgumentError(absl::StrCat("sequences[", b, "].positions[", t, "] must be in [0, ",
                                                       positions - 1, "] (this model's position ids), got ",
                                                       s.positions(t)));
      }
      pids.push_back(s.positions(t));
    }
  }
  in.tokens = torch::tensor(tokens, torch::kLong).view({1, in.B, in.T});
  if (positions > 0) in.pids = torch::tensor(pids, torch::kLong).view({1, in.B, in.T});
  return in;
}

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
  absl::StatusOr<Inputs> x = ReadInputs(r, V, P, 0);
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
  absl::StatusOr<Inputs> x = ReadInputs(r, c.vocab, 0, c.max_len);
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
