#include "server/engine/families/decoder_family.h"

#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {

absl::StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const v1::ExperimentSpec& spec,
                                                          const std::string& checkpoint) {
  std::unique_ptr<DecoderModel> model = MakeDecoder(spec, 1, torch::kCPU);
  if (absl::Status s = LoadWeights(checkpoint, model->parameter_names(), model->parameters()); !s.ok()) return s;
  for (torch::Tensor& p : model->parameters()) p.requires_grad_(false);
  return model;
}

}  // namespace circuitlab::engine
