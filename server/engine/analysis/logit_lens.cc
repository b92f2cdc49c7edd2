// GetLogitLens on the IMIR block model (B.1) and the latent-task decoder
// (B.2): for each layer l (0 = the embeddings), one forward pass whose
// hooks make the later blocks write nothing, so that the model's own
// readout sees the stream as it stood after layer l.
//   IMIR: the later layers' residual blocks are zeroed at "L{k}.resid"
//     (k > l); X_L = [X_l | 0] and the logits are W_out restricted to X_l's
//     blocks, exactly (the readout is linear in the blocks). The target is
//     the query's answer.
//   Decoder: the stream after layer l replaces "L{k}.post_attn" and
//     "L{k}.post_mlp" (k > l), so it reaches the final LayerNorm (where the
//     model has one) and the unembedding unchanged. Targets: every next
//     token.
// Sequences are scored 64 at a time.
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/seeds.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/analysis/registry.h"
#include "server/engine/torch_util.h"
#include "server/engine/setup/decoder_setup.h"

namespace circuitlab::engine {
namespace {

constexpr int64_t kChunk = 64;

// Sums over the predictions scored, per layer.
struct LensSums {
  double loss = 0, correct = 0, target_prob = 0, agree = 0, kl = 0;
};

// Adds a readout's scores: logits and final [N, V], targets [N].
void Score(const torch::Tensor& logits, const torch::Tensor& final_logits, const torch::Tensor& targets, LensSums* s) {
  const torch::Tensor logp = torch::log_softmax(logits.to(torch::kDouble), -1);
  const torch::Tensor final_logp = torch::log_softmax(final_logits.to(torch::kDouble), -1);
  const torch::Tensor t = targets.to(torch::kLong).unsqueeze(-1);
  const torch::Tensor target_logp = logp.gather(-1, t).squeeze(-1);
  const torch::Tensor top = logp.argmax(-1);
  s->loss -= target_logp.sum().item<double>();
  s->target_prob += target_logp.exp().sum().item<double>();
  s->correct += top.eq(t.squeeze(-1)).sum().item<double>();
  s->agree += top.eq(final_logp.argmax(-1)).sum().item<double>();
  s->kl += (final_logp.exp() * (final_logp - logp)).sum().item<double>();
}

// The answer from per-layer sums over `n` predictions; `point(l)` names
// layer l's hook point.
v1::GetLogitLensResponse Answer(const std::vector<LensSums>& sums, int64_t n,
                                const std::function<std::string(int64_t)>& point) {
  v1::GetLogitLensResponse out;
  out.set_predictions(static_cast<uint64_t>(n));
  for (size_t l = 0; l < sums.size(); ++l) {
    v1::LogitLensLayer* row = out.add_layers();
    row->set_layer(static_cast<uint32_t>(l));
    row->set_point(point(static_cast<int64_t>(l)));
    row->set_loss(sums[l].loss / static_cast<double>(n));
    row->set_accuracy(sums[l].correct / static_cast<double>(n));
    row->set_target_prob(sums[l].target_prob / static_cast<double>(n));
    row->set_agreement(sums[l].agree / static_cast<double>(n));
    row->set_kl_to_final(std::max(0.0, sums[l].kl / static_cast<double>(n)));
  }
  return out;
}

// The layer k of a hook point "L{k}<suffix>", or 0 when it is not one.
int64_t LayerOf(std::string_view point, std::string_view suffix) {
  if (point.size() <= suffix.size() + 1 || point[0] != 'L' ||
      point.compare(point.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return 0;
  }
  return std::stoll(std::string(point.substr(1, point.size() - suffix.size() - 1)));
}

absl::StatusOr<v1::GetLogitLensResponse> ImirLens(const AnalysisInput& in, const v1::GetLogitLensRequest& r,
                                                  const AnalysisProgress& progress, const CancelToken* cancel) {
  torch::NoGradGuard no_grad;
  const v1::ExperimentSpec& spec = in.spec;
  absl::StatusOr<DenseCheckpoint> opened = OpenDense(spec, in.checkpoint());
  if (!opened.ok()) return opened.status();
  const int64_t layers = spec.model().imir().num_layers();
  const std::string set = r.eval_set().empty() ? PrimaryEvalSet(spec) : r.eval_set();
  absl::StatusOr<EvalData> d = MakeEval(*opened->task, set, r.sequences(), r.seed());
  if (!d.ok()) return d.status();
  const int64_t B = d->tokens.size(1);
  std::vector<LensSums> sums(static_cast<size_t>(layers + 1));
  for (int64_t b0 = 0; b0 < B; b0 += kChunk) {
    if (cancel != nullptr && cancel->stop_requested()) return absl::CancelledError("logit lens stopped");
    const int64_t nb = std::min(kChunk, B - b0);
    const torch::Tensor tokens = d->tokens.narrow(1, b0, nb), pids = d->pids.narrow(1, b0, nb);
    const torch::Tensor targets = d->target.narrow(0, b0, nb);
    const torch::Tensor final_logits = opened->dense->Forward(tokens, pids)[0];  // [nb, V]
    for (int64_t l = 0; l <= layers; ++l) {
      int64_t width = 0;  // of X_l
      const HookFn lens = [&](const std::string& point, const torch::Tensor& v) {
        const int64_t k = LayerOf(point, ".resid");
        if ((point == "embed" && l == 0) || (k > 0 && k == l)) width = v.size(-1);
        if (k <= l) return torch::Tensor();
        torch::Tensor kept = v.clone();
        kept.narrow(-1, width, v.size(-1) - width).zero_();
        return kept;
      };
      const torch::Tensor logits = opened->dense->Forward(tokens, pids, false, nullptr, &lens)[0];
      Score(logits, final_logits, targets, &sums[static_cast<size_t>(l)]);
    }
    if (progress) progress(static_cast<double>(b0 + nb) / static_cast<double>(B));
  }
  v1::GetLogitLensResponse out =
      Answer(sums, B, [](int64_t l) { return l == 0 ? std::string("embed") : absl::StrCat("L", l, ".resid"); });
  out.set_eval_set(set);
  return out;
}

absl::StatusOr<v1::GetLogitLensResponse> DecoderLens(const DecoderModel& model, const LatentTaskGenerator& task,
                                                     const v1::ExperimentSpec& spec, const v1::GetLogitLensRequest& r,
                                                     const AnalysisProgress& progress, const CancelToken* cancel) {
  torch::NoGradGuard no_grad;
  absl::StatusOr<LatentEvalSetDef> set = LatentEvalSetOf(spec, r.eval_set());
  if (!set.ok()) return set.status();
  const std::string& name = set->name;
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "logit_lens", static_cast<uint64_t>(set->pool)));
  const int64_t n = r.sequences();
  const torch::Tensor all =
      task.SamplePool(set->pool, torch::arange(n, torch::kLong).remainder(task.pool(set->pool).size(0)), gen).tokens;
  const int64_t layers = spec.model().decoder().num_layers();
  std::vector<LensSums> sums(static_cast<size_t>(layers + 1));
  int64_t predictions = 0;
  for (int64_t b0 = 0; b0 < n; b0 += kChunk) {
    if (cancel != nullptr && cancel->stop_requested()) return absl::CancelledError("logit lens stopped");
    const torch::Tensor tokens = all.narrow(0, b0, std::min(kChunk, n - b0)).unsqueeze(0);  // [1, nb, T]
    const int64_t V = model.config().vocab;
    const auto predicted = [&](const torch::Tensor& logits) {  // positions 0..T-2 predict 1..T-1
      return logits[0].narrow(1, 0, tokens.size(2) - 1).reshape({-1, V});
    };
    const torch::Tensor targets = tokens[0].narrow(1, 1, tokens.size(2) - 1).reshape({-1});
    const torch::Tensor final_logits = predicted(model.Forward(tokens));
    predictions += targets.size(0);
    for (int64_t l = 0; l <= layers; ++l) {
      torch::Tensor stream;  // after layer l
      const HookFn lens = [&](const std::string& point, const torch::Tensor& v) {
        if ((l == 0 && point == "embed") || (l > 0 && LayerOf(point, ".post_mlp") == l)) stream = v;
        const int64_t k = std::max(LayerOf(point, ".post_attn"), LayerOf(point, ".post_mlp"));
        return k > l ? stream : torch::Tensor();
      };
      Score(predicted(model.Forward(tokens, &lens)), final_logits, targets, &sums[static_cast<size_t>(l)]);
    }
    if (progress) progress(static_cast<double>(b0 + tokens.size(1)) / static_cast<double>(n));
  }
  v1::GetLogitLensResponse out = Answer(
      sums, predictions, [](int64_t l) { return l == 0 ? std::string("embed") : absl::StrCat("L", l, ".post_mlp"); });
  out.set_eval_set(name);
  return out;
}

}  // namespace

// The analysis table's entries (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::GetLogitLensRequest, v1::GetLogitLensResponse, ImirLens);
CIRCUITLAB_ENGINE_ANALYSIS("latent", v1::GetLogitLensRequest, v1::GetLogitLensResponse,
                           [](const AnalysisInput& in, const v1::GetLogitLensRequest& r,
                              const AnalysisProgress& progress, const CancelToken* cancel) {
                             return WithDecoder<LatentTaskGenerator>(
                                 in, [&](const DecoderModel& m, const LatentTaskGenerator& t) {
                                   return DecoderLens(m, t, in.spec, r, progress, cancel);
                                 });
                           });

}  // namespace circuitlab::engine
