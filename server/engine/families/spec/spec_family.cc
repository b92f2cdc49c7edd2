#include "server/engine/families/spec/spec_family.h"

#include <string>

#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {
namespace {

bool IsLatentTask(const v1::ExperimentSpec& spec) { return spec.task().kind_case() == v1::TaskSpec::kLatent; }

const SpecFamily& DecoderFamilyOf(const v1::LatentTask& task) {
  return task.kind() == v1::LATENT_KIND_REGRESSION ? RegressionSpecFamily() : LatentSpecFamily();
}

}  // namespace

absl::StatusOr<const SpecFamily*> ResolveFamily(v1::ExperimentSpec* spec) {
  auto* model = spec->mutable_model();
  if (!IsLatentTask(*spec)) {
    if (model->kind_case() == v1::ModelSpec::KIND_NOT_SET) model->mutable_imir();
    if (model->kind_case() == v1::ModelSpec::kDecoder) {
      return absl::InvalidArgumentError("model.decoder is the model of task.latent; task." + TaskName(spec->task()) +
                                        " trains on model.imir");
    }
    return &ImirSpecFamily();
  }
  auto* t = spec->mutable_task()->mutable_latent();
  if (t->kind() == v1::LATENT_KIND_UNSPECIFIED) t->set_kind(v1::LATENT_KIND_DICE);
  if (!v1::LatentKind_IsValid(t->kind())) {
    return absl::InvalidArgumentError("task.latent.kind is not a known value: " + std::to_string(t->kind()) +
                                      " (LATENT_KIND_DICE, LATENT_KIND_REGRESSION, LATENT_KIND_MARKOV, "
                                      "LATENT_KIND_DYCK)");
  }
  if (model->kind_case() == v1::ModelSpec::KIND_NOT_SET) model->mutable_decoder();
  if (model->kind_case() != v1::ModelSpec::kDecoder) {
    return absl::InvalidArgumentError("model.imir needs a block-list task; task.latent trains on model.decoder");
  }
  return &DecoderFamilyOf(*t);
}

const SpecFamily& SpecFamilyOf(const v1::ExperimentSpec& spec) {
  if (spec.model().kind_case() != v1::ModelSpec::kDecoder || !IsLatentTask(spec)) return ImirSpecFamily();
  return DecoderFamilyOf(spec.task().latent());
}

}  // namespace circuitlab::engine
