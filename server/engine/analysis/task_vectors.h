// Task-vector geometry of a decoder model on a latent task (SCIENCE.md D.5):
// hidden states (natural and token-conditioned designs), the task-vector
// estimator, P0-P3, steering along the task simplex, OOD projection R^2 and
// the two-Bayes mode transition. Engine-private (includes LibTorch).
//
// Everything here is a pure function of (model, task generator, request);
// statistics are computed in float64 (SCIENCE.md 0.3).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/common/cancel.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/api.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/tasks/latent_task.h"

namespace circuitlab::engine {

// Euclidean projection of each row of v [N, K] onto the probability simplex.
torch::Tensor ProjectToSimplex(const torch::Tensor& v);

// argmin_b ||y - b^T theta||^2 subject to sum(b) = 1, for every row of y
// [N, D] with theta [K, D]: [N, K].
torch::Tensor AffineWeights(const torch::Tensor& y, const torch::Tensor& theta);

// Hidden states [N, T', D] (float64) at hook `kind` ("post_mlp", "post_attn",
// "resid_pre") of each layer in `layers`, for tokens [N, T'], computed in
// chunks; with `at` >= 0 only position `at`, [N, D]. One tensor per entry of
// `layers`.
std::vector<torch::Tensor> HiddenStates(const DecoderModel& model, const torch::Tensor& tokens,
                                        const std::vector<int>& layers, const std::string& kind, int64_t at = -1);

// "L{layer}.{kind}", the decoder hook name of a stream point.
std::string HookName(int layer, const std::string& kind);

// Repeats each of `n` ids `times` times: [0,0,..,1,1,..] (sequences of task
// k at rows k*times..).
torch::Tensor Repeat(int64_t n, int64_t times);

// E3's steering edit of the states at position `pos` of hook `point`, for a
// chunk of n sequences (both decoder families): adds `delta` [n, D], or with
// `projection` replaces the task component, h <- h - (h - mu) P + goal
// (`goal` [n, D], `mu` [D], `projector` P [D, D], all float).
struct SteeringEdit {
  torch::Tensor delta, goal, mu, projector;
  bool projection = false;
};
HookFn SteeringHook(std::string point, int64_t pos, SteeringEdit edit);

// Orthonormal columns spanning the columns of m [D, n] (singular values above
// 1e-6 of the largest; at least one column).
torch::Tensor OrthonormalColumns(const torch::Tensor& m);

// D.5.8 on per-task mean states: majors m [K, P, D] and OOD tasks o
// [O, P, D] over P positions. The task subspace is spanned by K-1 of the
// majors' centred vectors at the last position; each OOD task's R^2 is
// averaged over positions 0..P-2: "code" (1 - residual / centred total,
// clipped to [0, 1]) and "norm" (|fit|^2 / |y|^2), with the code IQR.
struct OodR2 {
  double code = 0, norm = 0, code_q25 = 0, code_q75 = 0;
};
OodR2 OodProjectionR2(const torch::Tensor& m, const torch::Tensor& o);

// A result row: name, layer (-1 none), position (-1 none), value.
using RowFn = std::function<void(const std::string&, int, int64_t, double)>;

// D.5.6 at one layer: natural states h [K, B, P, D] of each major's B
// sequences at P positions and the exact posterior over the majors alpha
// [K, B, P, K]; task vectors from positions est_begin..est_end; rows
// p3/r_mean, r_std, l1, kl per task, r_mean_min, and the beta / alpha
// trajectories.
void P3Rows(const torch::Tensor& h, const torch::Tensor& alpha, int64_t est_begin, int64_t est_end, int layer,
            const RowFn& row);

// P0/P1 statistics of token-conditioned states h [S, K, B, D] at one
// (layer, position): residual ratio, eta^2 of task / token / interaction,
// separability R^2 and the within-cell noise floor.
struct CellStats {
  double resid_ratio = 0, eta2_task = 0, eta2_token = 0, eta2_int = 0, sep_r2 = 0, mse_within = 0;
};
CellStats TokenConditionedStats(const torch::Tensor& h);

// The analyses of `request` on `model` (one member) and `task`. `progress`
// gets the fraction done; Cancelled when `cancel` stops it.
absl::StatusOr<v1::AnalyzeTaskVectorsResponse> RunTaskVectorAnalyses(const DecoderModel& model,
                                                                     const LatentTaskGenerator& task,
                                                                     const v1::AnalyzeTaskVectorsRequest& request,
                                                                     const std::function<void(double)>& progress,
                                                                     const CancelToken* cancel);

// Whether the request asks `analysis` ("p0", ..., "dyck_p0").
bool Asked(const v1::AnalyzeTaskVectorsRequest& request, std::string_view analysis);

// ---- What the analyses of one checkpoint share (task_vectors.cc runs them;
// tv_dissociation.cc holds E.18-E.20's): progress with cancellation, the
// run's model, task, request, layers, positions and estimation window.
// Sequences per forward pass of the analyses (bounds activation memory).
constexpr int64_t kTvChunk = 1024;
// Sequences per chunk of the known-pool Bayes predictor ([chunk, T, tasks]).
constexpr int64_t kTvBayesChunk = 64;

double Pearson(const torch::Tensor& a, const torch::Tensor& b);

class Reporter {
 public:
  Reporter(const std::function<void(double)>& progress, const CancelToken* cancel, int stages)
      : progress_(progress), cancel_(cancel), stages_(std::max(1, stages)) {}
  // Marks `fraction` of the current stage done; false when cancelled.
  bool At(double fraction) {
    if (progress_) progress_((static_cast<double>(stage_) + std::clamp(fraction, 0.0, 1.0)) / stages_);
    return cancel_ == nullptr || !cancel_->stop_requested();
  }
  bool NextStage() {
    ++stage_;
    return At(0.0);
  }

 private:
  const std::function<void(double)>& progress_;
  const CancelToken* cancel_;
  int stages_;
  int stage_ = 0;
};

absl::Status Stopped();

// What the analyses of one checkpoint share: the model, its task, the
// request, the layers and positions it asks (defaults filled in), the
// estimation window of the task vectors, progress and the rows written.
struct TvRun {
  TvRun(const DecoderModel& m, const LatentTaskGenerator& t, const v1::AnalyzeTaskVectorsRequest& request,
        Reporter& reporter, RowFn rows)
      : model(m),
        task(t),
        r(request),
        rep(reporter),
        row(std::move(rows)),
        T(t.seq_len()),
        K(t.num_majors()),
        V(t.vocab_size()),
        last(T - 2),
        L(static_cast<int>(m.config().layers)) {
    VectorWindow w = VectorWindowOf(r, L, last);  // the estimation window over positions
    layers = std::move(w.layers);
    est_begin = w.est_begin;
    est_end = w.est_end;
    positions.assign(r.positions().begin(), r.positions().end());
    if (positions.empty()) {
      for (int64_t p : {2, 4, 8, 16, 32}) {
        if (p < last) positions.push_back(p);
      }
      positions.push_back(last);
    }
    for (int64_t& p : positions) p = std::min(p, last);
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  }

  const DecoderModel& model;
  const LatentTaskGenerator& task;
  const v1::AnalyzeTaskVectorsRequest& r;
  Reporter& rep;
  const RowFn row;
  const int64_t T, K, V;
  const int64_t last;  // the last state that predicts a token
  const int L;
  std::vector<int> layers;
  std::vector<int64_t> positions;
  int64_t est_begin = 0, est_end = 0;
};

// The token-conditioned design at position t (D.5.1): for every token value
// a and major k, B sequences of task k cut after t with x_t overwritten by
// a. Each (a, k) cell draws its own sequences, as the authors' sampler does
// (SCIENCE.md G.9 (6)). [V, K * B, t + 1], rows ordered by task then draw.
torch::Tensor ConditionedTokens(const LatentTaskGenerator& task, int64_t t, int64_t B, torch::Generator& gen);
// Their states at position t: one [V, K, B, D] tensor per layer.
std::vector<torch::Tensor> ConditionedAt(const DecoderModel& model, const LatentTaskGenerator& task, int64_t t,
                                         int64_t B, const std::vector<int>& layers, const std::string& kind,
                                         torch::Generator& gen);
// KL(p || q) summed over the last dim, from log p and q.
torch::Tensor KlFromLogP(const torch::Tensor& logp, const torch::Tensor& q);
// Mean next-token cross-entropy over every position of `tokens` [N, T], with
// `edit` applied to the stream at hook `point` (none when `edit` is empty).
// Differentiable when autograd is on.
torch::Tensor MeanCe(const DecoderModel& model, const torch::Tensor& tokens, const std::string& point,
                     const std::function<torch::Tensor(const torch::Tensor&)>& edit);

// D.5.10-D.5.13 and E.20 at one layer (tv_dissociation.cc).
absl::Status Dissociation(TvRun& run);

}  // namespace circuitlab::engine
