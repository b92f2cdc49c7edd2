// The regression family: the decoder on continuous-token linear regression
// (SCIENCE.md E2): squared error against the Bayes, retrieval and ridge
// predictors, task vectors, hook-point interventions.
#include "server/engine/families/decoder_family.h"
#include "server/engine/train/regression_trainer.h"

namespace circuitlab::engine {

const ModelFamily& RegressionFamily() {
  static const DecoderFamily<RegressionTrainer> family(
      RegressionSpecFamily(), {"loss", "bayes_loss", "retrieval_loss", "ridge_loss", "to_retrieval", "to_ridge"});
  return family;
}

}  // namespace circuitlab::engine
