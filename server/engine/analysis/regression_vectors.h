// Task-vector geometry of the GPT-2-style regression decoder on E2
// (SCIENCE.md A.2, B.3, D.5), the continuous-token forms of the token
// analyses of task_vectors.h. A "position" here is a point i: the state at
// the |- before y_i (sequence position 3i + 1), where y_i is predicted.
//   p0        ANCOVA residual ratio: within each major, h regressed on
//             [1, x_i] (task-specific slopes replace the token cells)
//   p2        natural states; the token effect is an OLS fit on [1, x_i]
//             per point (D.5.5's E2 form), then the affine simplex fit on
//             the task vectors of the estimation window
//   p3        natural states of each major against the exact posterior over
//             the majors from the Gaussian likelihood (D.5.6)
//   steering  h <- h - theta_true(i) + sum_j alpha_j theta_j(i) at the |-
//             of point i; RMSE of the scalar prediction against
//             sum_j alpha_j x_i.w_j, clean / injected / the corner
//   ood_r2    as for tokens, over points 0..n-2
//   kl        the mode transition with squared distances in place of KL:
//             the model's predictions against the exact Bayes predictor of
//             the training mixture and the hybrid (majors + ridge)
// Engine-private (includes LibTorch).
#pragma once

#include <torch/torch.h>

#include <functional>

#include "absl/status/statusor.h"
#include "server/common/cancel.h"
#include "server/engine/api.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/tasks/regression_task.h"

namespace circuitlab::engine {

// Hidden states [N, n, D] (float64) at the prediction positions, hook `kind`
// of each layer in `layers`, for the sequences (x [N, n, d], y [N, n]).
std::vector<torch::Tensor> RegressionStates(const DecoderModel& model, const torch::Tensor& x, const torch::Tensor& y,
                                            const std::vector<int>& layers, const std::string& kind);

absl::StatusOr<v1::AnalyzeTaskVectorsResponse> RunRegressionAnalyses(const DecoderModel& model,
                                                                     const RegressionTaskGenerator& task,
                                                                     const v1::AnalyzeTaskVectorsRequest& request,
                                                                     const std::function<void(double)>& progress,
                                                                     const CancelToken* cancel);

}  // namespace circuitlab::engine
