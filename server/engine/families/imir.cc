// The IMIR family: the block model of SCIENCE.md B.1 on its synthetic tasks.
#include <memory>
#include <string>
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
// residuals rho to the metrics of the step.
class ManifoldRecorder final : public StepRecorder {
 public:
  ManifoldRecorder(const EnsembleTrainer& trainer, bool store_complete, int64_t every)
      : trainer_(trainer),
        paper_(BuildBasis(trainer.task(0).Symmetry(), trainer.model().config().layers, trainer.model().config().heads,
                          Selection::kPaper)),
        complete_(BuildBasis(trainer.task(0).Symmetry(), trainer.model().config().layers,
                             trainer.model().config().heads, Selection::kComplete)),
        store_complete_(store_complete),
        every_(every) {}

  absl::Status Announce(TrainObserver& observer) const override {
    if (absl::Status s = observer.OnBasis(paper_.basis()); !s.ok()) return s;
    return store_complete_ ? observer.OnBasis(complete_.basis()) : absl::OkStatus();
  }

  bool Due(int64_t step) const override { return step % every_ == 0; }
  // Appends member `member`'s rho metrics of the step to `metrics`.
  void Record(int64_t step, int64_t member, TrainObserver& observer, std::vector<Metric>& metrics) const override {
    const ImirModel& model = trainer_.model();
    const Projection paper = Project(paper_, model, member);
    const Projection complete = Project(complete_, model, member);
    observer.OnCoordinates(step, Selection::kPaper, paper.values);
    if (store_complete_) observer.OnCoordinates(step, Selection::kComplete, complete.values);
    metrics.push_back({"manifold/rho", complete.rho()});
    metrics.push_back({"manifold/rho_paper", paper.rho()});
    for (const MatrixNorms& m : complete.matrices) metrics.push_back({"manifold/rho/" + m.matrix, m.rho()});
  }

 private:
  const EnsembleTrainer& trainer_;
  Projector paper_, complete_;
  bool store_complete_;
  int64_t every_;
};

class Imir final : public ModelFamily {
 public:
  std::string_view name() const override { return ImirSpecFamily().name(); }
  std::unique_ptr<TrainerBase> MakeTrainer(const v1::ExperimentSpec& resolved, const std::vector<uint64_t>& seeds,
                                           torch::Device device) const override {
    return std::make_unique<EnsembleTrainer>(resolved, seeds, device);
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
