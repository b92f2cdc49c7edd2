// A decoder run's model and data as training and analysis both set them up
// (the latent tasks' token decoder, B.2, and the regression decoder, B.3):
// the model from the spec, its initialisation, the evaluation sets and
// their seeds, the next-token loss, the regression model's inputs and
// predictions. Engine-private (LibTorch).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "circuitlab/v1/spec.pb.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/setup/checkpoint_io.h"
#include "server/engine/tasks/latent_task.h"

namespace circuitlab::engine {

// The spec's decoder model, not initialised / initialised from the members'
// init seeds.
std::unique_ptr<DecoderModel> MakeDecoder(const v1::ExperimentSpec& resolved, int64_t ensemble,
                                          torch::Device device);
void InitializeDecoder(const std::vector<uint64_t>& member_seeds, DecoderModel& model);

// The evaluation sets of a latent run (token and regression kinds alike):
// "id" (the majors), "ood" and, when the run has minors, "minor"; and the
// seed of set `index`'s sequences for a member.
struct LatentEvalSetDef {
  std::string name;
  LatentPool pool;
};
std::vector<LatentEvalSetDef> LatentEvalSets(bool has_minors);
uint64_t LatentEvalSeed(uint64_t member_seed, int index);

// Per-sequence mean next-token cross-entropy of logits [..., T, V] against
// tokens [..., T] (positions 0..T-2 predict 1..T-1), shape [...].
torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& tokens);

// The model's predictions of every y_i for x [E, B, n, d], y [E, B, n]:
// [E, B, n] (one forward; callers chunk).
torch::Tensor PredictRegression(const DecoderModel& model, const torch::Tensor& x, const torch::Tensor& y,
                                const HookFn* hook = nullptr);

// One member's model inputs [N, 3n, d + 1] (float32) for sequences x
// [N, n, d], y [N, n] of any floating type.
torch::Tensor MemberInputs(const DecoderModel& model, const torch::Tensor& x, const torch::Tensor& y);

}  // namespace circuitlab::engine
