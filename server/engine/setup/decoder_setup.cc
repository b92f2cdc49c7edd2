#include "server/engine/setup/decoder_setup.h"

#include <memory>
#include <vector>

#include "server/common/seeds.h"
#include "server/engine/models/decoder_kernels.h"
#include "server/engine/setup/checkpoint_io.h"

namespace circuitlab::engine {

std::vector<LatentEvalSetDef> LatentEvalSets(bool has_minors) {
  std::vector<LatentEvalSetDef> defs = {{"id", LatentPool::kMajor}, {"ood", LatentPool::kOod}};
  if (has_minors) defs.push_back({"minor", LatentPool::kMinor});
  return defs;
}

uint64_t LatentEvalSeed(uint64_t member_seed, int index) {
  return DeriveSeed63(member_seed, "latent_eval", static_cast<uint64_t>(index));
}

std::unique_ptr<DecoderModel> MakeDecoder(const v1::ExperimentSpec& spec, int64_t ensemble, torch::Device device) {
  return std::make_unique<DecoderModel>(DecoderConfigOf(spec), ensemble, device);
}

void InitializeDecoder(const std::vector<uint64_t>& member_seeds, DecoderModel& model) {
  std::vector<uint64_t> init;
  for (uint64_t s : member_seeds) init.push_back(InitSeedOf(s));
  model.Initialize(init);
}

torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& tokens) {
  if (FusedKernelsApply(logits) && tokens.scalar_type() == torch::kLong && tokens.device().is_cpu()) {
    return NextTokenCrossEntropy(logits, tokens);  // decoder_kernels.h: the same mean, one pass each way
  }
  const int64_t T = tokens.size(-1);
  torch::Tensor logp = torch::log_softmax(logits.narrow(-2, 0, T - 1), -1);
  torch::Tensor next = tokens.narrow(-1, 1, T - 1).unsqueeze(-1);
  return -logp.gather(-1, next).squeeze(-1).mean(-1);
}

torch::Tensor PredictRegression(const DecoderModel& model, const torch::Tensor& x, const torch::Tensor& y,
                                const HookFn* hook) {
  return DecoderModel::Predictions(model.Forward(model.MapstoInputs(x, y), hook));
}

torch::Tensor MemberInputs(const DecoderModel& model, const torch::Tensor& x, const torch::Tensor& y) {
  return model.MapstoInputs(x.to(torch::kFloat).unsqueeze(0), y.to(torch::kFloat).unsqueeze(0)).squeeze(0);
}

}  // namespace circuitlab::engine
