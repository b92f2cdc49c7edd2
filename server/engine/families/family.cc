#include "server/engine/families/family.h"

#include "absl/strings/str_cat.h"
#include "server/engine/analysis/registry.h"
#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {

absl::Status ModelFamily::Lacks(std::string_view analysis) const {
  return absl::FailedPreconditionError(absl::StrCat(std::string(analysis), " is not an analysis of the ",
                                                    std::string(name()), " model family; it has ",
                                                    AnalysesOf(name())));
}

const ModelFamily& FamilyOf(const v1::ExperimentSpec& spec) {
  if (spec.model().kind_case() != v1::ModelSpec::kDecoder || !IsLatent(spec)) return ImirFamily();
  return spec.task().latent().kind() == v1::LATENT_KIND_REGRESSION ? RegressionFamily() : LatentFamily();
}

}  // namespace circuitlab::engine
