// The latent family: the decoder on a DICE, MARKOV or DYCK latent task
// (SCIENCE.md A.2, B.2): next-token CE, task vectors, hook-point interventions.
#include "server/engine/families/decoder_family.h"

namespace circuitlab::engine {

const ModelFamily& LatentFamily() {
  static const DecoderFamily<LatentTrainer> family(
      LatentSpecFamily(), {"loss", "accuracy", "bayes_loss"});
  return family;
}

}  // namespace circuitlab::engine
