// The IMIR family: the block model of SCIENCE.md B.1 on its synthetic tasks.
#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/common/seeds.h"
#include "server/engine/families/family.h"
#include "server/engine/families/spec/spec_family.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/train/trainer.h"

namespace circuitlab::engine {
namespace {

// Projects the weights onto the paper and complete bases at recording steps:
// paper coordinates (and complete ones on request) go to OnCoordinates, the
// residuals rho to the metrics of the step. Each member on the bases of its
// own task's symmetry: associative recall draws its common pairs (the C
// relation) from the seed, so a pack's members may each have their own.
class ManifoldRecorder final : public StepRecorder {
 public:
  ManifoldRecorder(const EnsembleTrainer& trainer, bool store_complete, int64_t every)
      : trainer_(trainer), store_complete_(store_complete), every_(every) {
    const ImirModelConfig& cfg = trainer.model().config();
    for (int64_t e = 0; e < trainer.ensemble(); ++e) {
      TaskSymmetry symmetry = trainer.task(e).Symmetry();
      auto same = std::find_if(bases_.begin(), bases_.end(), [&](const auto& b) { return b->symmetry == symmetry; });
      if (same == bases_.end()) {
        Projector paper(BuildBasis(symmetry, cfg.layers, cfg.heads, Selection::kPaper));
        Projector complete(BuildBasis(symmetry, cfg.layers, cfg.heads, Selection::kComplete));
        bases_.push_back(std::make_unique<Bases>(Bases{std::move(symmetry), std::move(paper), std::move(complete)}));
        same = std::prev(bases_.end());
      }
      of_member_.push_back(same->get());
    }
  }

  absl::Status Announce(int64_t member, TrainObserver& observer) const override {
    const Bases& b = *of_member_[static_cast<size_t>(member)];
    if (absl::Status s = observer.OnBasis(b.paper.basis()); !s.ok()) return s;
    return store_complete_ ? observer.OnBasis(b.complete.basis()) : absl::OkStatus();
  }

  bool Due(int64_t step) const override { return step % every_ == 0; }
  // Appends member `member`'s rho metrics of the step to `metrics`.
  void Record(int64_t step, int64_t member, TrainObserver& observer, std::vector<Metric>& metrics) const override {
    const ImirModel& model = trainer_.model();
    const Bases& b = *of_member_[static_cast<size_t>(member)];
    const Projection paper = Project(b.paper, model, member);
    const Projection complete = Project(b.complete, model, member);
    observer.OnCoordinates(step, Selection::kPaper, paper.values);
    if (store_complete_) observer.OnCoordinates(step, Selection::kComplete, complete.values);
    metrics.push_back({"manifold/rho", complete.rho()});
    metrics.push_back({"manifold/rho_paper", paper.rho()});
    for (const MatrixNorms& m : complete.matrices) metrics.push_back({"manifold/rho/" + m.matrix, m.rho()});
  }

 private:
  struct Bases {
    TaskSymmetry symmetry;
    Projector paper, complete;
  };
  const EnsembleTrainer& trainer_;
  std::vector<std::unique_ptr<Bases>> bases_;  // one per distinct symmetry among the members
  std::vector<const Bases*> of_member_;
  bool store_complete_;
  int64_t every_;
};

class Imir final : public ModelFamily {
 public:
  std::string_view name() const override { return ImirSpecFamily().name(); }
  std::unique_ptr<TrainerBase> MakeTrainer(std::vector<v1::ExperimentSpec> members,
                                           torch::Device device) const override {
    return std::make_unique<EnsembleTrainer>(std::move(members), device);
  }
  std::unique_ptr<StepRecorder> MakeRecorder(const v1::ExperimentSpec& resolved,
                                             const TrainerBase& trainer) const override {
    const auto& rec = resolved.recording();
    if (rec.coordinates_every() == 0) return nullptr;
    return std::make_unique<ManifoldRecorder>(dynamic_cast<const EnsembleTrainer&>(trainer), rec.complete_coordinates(),
                                              rec.coordinates_every());
  }
  std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) const override {
    std::vector<std::string> out;
    auto add = [&out](const std::string& set, std::initializer_list<const char*> names) {
      for (const char* n : names) out.push_back("eval/" + set + "/" + n);
    };
    const std::unique_ptr<BlockTask> task = MakeBlockTask(resolved, PoolSeedOf(resolved.seed()));
    for (const EvalSetInfo& info : task->EvalSets()) {
      add(info.name, {"accuracy", "loss", "p_target", "bayes_loss", "bayes_accuracy"});
      if (info.mode == SampleMode::kConflict) add(info.name, {"p_icl", "p_iwl", "logit_diff"});
      if (!info.alt_name.empty()) out.push_back("eval/" + info.name + "/" + info.alt_name + "_accuracy");
    }
    return out;
  }
};

}  // namespace

const ModelFamily& ImirFamily() {
  static const Imir family;
  return family;
}

}  // namespace circuitlab::engine
