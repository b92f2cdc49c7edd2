#include "server/engine/families/family.h"

#include "absl/strings/str_cat.h"
#include "server/engine/analysis/registry.h"
#include "server/engine/families/spec/spec_family.h"

namespace circuitlab::engine {

absl::Status ModelFamily::Lacks(std::string_view analysis) const {
  return absl::FailedPreconditionError(absl::StrCat(std::string(analysis), " is not an analysis of the ",
                                                    std::string(name()), " model family; it has ",
                                                    AnalysesOf(name())));
}

const ModelFamily& FamilyOf(const v1::ExperimentSpec& spec) {
  const SpecFamily& family = SpecFamilyOf(spec);  // the torch-free half, which tells the families apart
  if (&family == &LatentSpecFamily()) return LatentFamily();
  if (&family == &RegressionSpecFamily()) return RegressionFamily();
  return ImirFamily();
}

}  // namespace circuitlab::engine
