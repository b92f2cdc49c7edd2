// GetAttentionPatterns on the IMIR block model (B.1) and the latent-task
// decoder (B.2): a forward pass over a few evaluation sequences with a hook
// that keeps each layer's attention probabilities, then the heads asked for.
// Layers and heads count from 1 on the wire, as everywhere (the first
// block's first head is L1H1 on both models); the engine's tensors index
// them from 0 here.
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/seeds.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/analysis/registry.h"
#include "server/engine/models/imir_factory.h"
#include "server/engine/torch_util.h"
#include "server/engine/setup/decoder_setup.h"
#include "server/engine/setup/imir_setup.h"

namespace circuitlab::engine {
namespace {

// The largest answer: layers x heads x sequences x T^2 weights.
constexpr int64_t kMaxWeights = int64_t{1} << 22;

// The 0-based indices of those asked for (layers and heads count from 1 on
// the wire; all of them when none), InvalidArgument naming `field` for one
// out of range.
absl::StatusOr<std::vector<int64_t>> Chosen(const google::protobuf::RepeatedField<uint32_t>& asked, int64_t n,
                                            const std::string& field) {
  std::vector<int64_t> out;
  for (uint32_t i : asked) {
    if (i < 1 || i > n) {
      return absl::InvalidArgumentError(field + " must be in [1, " + std::to_string(n) +
                                        "] for this model (counted from 1), got " + std::to_string(i));
    }
    out.push_back(i - 1);
  }
  if (out.empty()) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
  }
  return out;
}

// Patterns [L][B, H, T, T] (float32, CPU) of the chosen heads into the
// response; names from `name(layer, head)`.
template <typename Name>
absl::Status Fill(const std::vector<torch::Tensor>& by_layer, const torch::Tensor& tokens,
                  const v1::GetAttentionPatternsRequest& r, int64_t heads, Name name,
                  v1::GetAttentionPatternsResponse* out) {
  const int64_t L = static_cast<int64_t>(by_layer.size());
  absl::StatusOr<std::vector<int64_t>> layers = Chosen(r.layers(), L, "layers");
  if (!layers.ok()) return layers.status();
  absl::StatusOr<std::vector<int64_t>> hs = Chosen(r.heads(), heads, "heads");
  if (!hs.ok()) return hs.status();
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const int64_t total = static_cast<int64_t>(layers->size() * hs->size()) * B * T * T;
  if (total > kMaxWeights) {
    return absl::InvalidArgumentError("this answer would hold " + std::to_string(total) + " weights, more than " +
                                      std::to_string(kMaxWeights) + "; ask fewer sequences, layers or heads");
  }
  const torch::Tensor ids = tokens.to(torch::kLong).contiguous();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* p = ids[b].data_ptr<int64_t>();
    out->add_sequences()->mutable_tokens()->Add(p, p + T);
  }
  for (int64_t l : *layers) {
    const torch::Tensor a = by_layer[static_cast<size_t>(l)].to(torch::kFloat).contiguous();  // [B, H, T, T]
    for (int64_t h : *hs) {
      for (int64_t b = 0; b < B; ++b) {
        v1::AttentionPattern* pat = out->add_patterns();
        pat->set_layer(static_cast<uint32_t>(l + 1));
        pat->set_head(static_cast<uint32_t>(h + 1));
        pat->set_name(name(l, h));
        pat->set_sequence(static_cast<uint32_t>(b));
        pat->set_size(static_cast<uint32_t>(T));
        const torch::Tensor m = a[b][h].contiguous();
        const float* w = m.data_ptr<float>();
        pat->mutable_weights()->Add(w, w + T * T);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::GetAttentionPatternsResponse> ImirAttention(const AnalysisInput& in,
                                                               const v1::GetAttentionPatternsRequest& r) {
  torch::NoGradGuard no_grad;
  const v1::ExperimentSpec& spec = in.spec;
  absl::StatusOr<DenseCheckpoint> opened = OpenDense(spec, in.checkpoint());
  if (!opened.ok()) return opened.status();
  const BlockTask* task = opened->task.get();
  const ImirModel* dense = opened->dense.get();
  const int64_t layers = spec.model().imir().num_layers(), heads = spec.model().imir().num_heads();
  const std::string set = r.eval_set().empty() ? PrimaryEvalSet(spec) : r.eval_set();
  absl::StatusOr<EvalData> d = MakeEval(*task, set, r.sequences(), r.seed());
  if (!d.ok()) return d.status();
  std::vector<torch::Tensor> by_layer(static_cast<size_t>(layers));
  const HookFn keep = [&](const std::string& point, const torch::Tensor& v) {
    // "L{l}.attn": [1, H, B, T, T] -> [B, H, T, T]
    if (point.size() > 5 && point.compare(point.size() - 5, 5, ".attn") == 0) {
      const int64_t l = std::stoll(point.substr(1, point.size() - 6)) - 1;
      by_layer[static_cast<size_t>(l)] = v[0].transpose(0, 1).clone();
    }
    return torch::Tensor();
  };
  dense->Forward(d->tokens, d->pids, true, nullptr, &keep);
  v1::GetAttentionPatternsResponse out;
  out.set_eval_set(set);
  const auto name = [](int64_t l, int64_t h) { return absl::StrCat("L", l + 1, "H", h + 1); };
  if (absl::Status s = Fill(by_layer, d->tokens[0], r, heads, name, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<v1::GetAttentionPatternsResponse> DecoderAttention(const DecoderModel& model,
                                                                  const LatentTaskGenerator& task,
                                                                  const v1::ExperimentSpec& spec,
                                                                  const v1::GetAttentionPatternsRequest& r) {
  torch::NoGradGuard no_grad;
  absl::StatusOr<LatentEvalSetDef> set = LatentEvalSetOf(spec, r.eval_set());
  if (!set.ok()) return set.status();
  const std::string& name = set->name;
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "attention", static_cast<uint64_t>(set->pool)));
  const int64_t n = r.sequences();
  const torch::Tensor tokens =
      task.SamplePool(set->pool, torch::arange(n, torch::kLong).remainder(task.pool(set->pool).size(0)), gen).tokens;
  const int64_t layers = spec.model().decoder().num_layers();
  std::vector<torch::Tensor> by_layer(static_cast<size_t>(layers));
  const HookFn keep = [&](const std::string& point, const torch::Tensor& v) {
    // "L{l}.attn.pattern": [1, B, H, T, T] -> [B, H, T, T]
    constexpr std::string_view kSuffix = ".attn.pattern";
    if (point.size() > kSuffix.size() && point.compare(point.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
      const int64_t l = std::stoll(point.substr(1, point.size() - kSuffix.size() - 1)) - 1;
      by_layer[static_cast<size_t>(l)] = v[0].clone();
    }
    return torch::Tensor();
  };
  model.Forward(tokens.unsqueeze(0), &keep);
  v1::GetAttentionPatternsResponse out;
  out.set_eval_set(name);
  const auto head_name = [](int64_t l, int64_t h) { return absl::StrCat("L", l + 1, "H", h + 1); };
  if (absl::Status s = Fill(by_layer, tokens, r, spec.model().decoder().num_heads(), head_name, &out); !s.ok()) {
    return s;
  }
  return out;
}

}  // namespace

// The analysis table's entries (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::GetAttentionPatternsRequest, v1::GetAttentionPatternsResponse,
                           [](const AnalysisInput& in, const v1::GetAttentionPatternsRequest& r,
                              const AnalysisProgress&, const CancelToken*) { return ImirAttention(in, r); });
CIRCUITLAB_ENGINE_ANALYSIS("latent", v1::GetAttentionPatternsRequest, v1::GetAttentionPatternsResponse,
                           [](const AnalysisInput& in, const v1::GetAttentionPatternsRequest& r,
                              const AnalysisProgress&, const CancelToken*) {
                             return WithDecoder<LatentTaskGenerator>(
                                 in, [&](const DecoderModel& m, const LatentTaskGenerator& t) {
                                   return DecoderAttention(m, t, in.spec, r);
                                 });
                           });

}  // namespace circuitlab::engine
