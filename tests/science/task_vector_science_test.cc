// E.15's steering as a declarative Intervene op on a CPU-sized TV-micro
// fixture (E1 biased dice, 2 pre-LN blocks), against the untrained model of
// the same seed. The task-vector claims themselves (E.11-E.20 with G.4's
// gates and negative controls) are decided through their recipes at ci
// scale (reproduction_science_test.cc), one definition of each experiment.
#include <gtest/gtest.h>

#include <memory>

#include "server/engine/analysis/decoder_interventions.h"
#include "server/engine/train/latent_trainer.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

// TV-micro (SCIENCE.md E, G.4; E.15's ci scale): E1 with S = 6, 3 majors,
// 48 tokens, d_model 32, AdamW 2e-3 with 10% warm-up and linear decay,
// batch 32, 500 steps; and the untrained model of the same seed.
struct Fixture {
  std::unique_ptr<LatentTrainer> trained, untrained;
};

Fixture MakeFixture() {
  at::set_num_threads(1);
  const v1::ExperimentSpec spec = testing::ResolvedSpec(R"({"seed": 10086,
    "task": {"latent": {"kind": "LATENT_KIND_DICE", "diversity": -1}},
    "model": {"decoder": {"num_layers": 2, "d_model": 32, "num_heads": 2}},
    "training": {"steps": 500, "learning_rate": 0.002, "weight_decay": 0.0001},
    "recording": {"eval_size": 128}})");
  Fixture f;
  f.trained = std::make_unique<LatentTrainer>(spec, std::vector<uint64_t>{10086}, torch::kCPU);
  while (static_cast<uint64_t>(f.trained->step()) < spec.training().steps()) f.trained->Step(false);
  f.untrained = std::make_unique<LatentTrainer>(spec, std::vector<uint64_t>{10086}, torch::kCPU);
  return f;
}

// The same steering as a declarative Intervene op (D.6 replace_convex): the
// whole window 16-31 edited in one pass, KL to q_lambda over those positions.
TEST(TaskVectorScienceTest, ReplaceConvexInterveneSteers) {
  const Fixture f = MakeFixture();
  for (const std::string subtract : {"true_task", "projection"}) {
    v1::InterveneRequest req;
    v1::Intervention& op = *req.add_interventions();
    op.set_op(v1::Intervention::OP_REPLACE_CONVEX);
    op.set_hook("L2.post_attn");
    op.set_subtract(subtract);
    for (uint32_t p = 16; p <= 31; ++p) op.add_positions(p);
    req.add_eval_sets("id");
    req.set_n_eval(1024);
    req.set_seed(1);
    auto trained = InterveneDecoder(f.trained->model(), f.trained->task(0), req);
    auto untrained = InterveneDecoder(f.untrained->model(), f.untrained->task(0), req);
    ASSERT_TRUE(trained.ok()) << trained.status();
    ASSERT_TRUE(untrained.ok()) << untrained.status();
    const v1::InterventionEffect& e = trained->effects(0);
    const v1::InterventionEffect& u = untrained->effects(0);
    std::cout << subtract << ": KL(model || q_lambda) over 16-31 clean " << e.kl_ref_clean() << " -> steered "
              << e.kl_ref() << " (untrained " << u.kl_ref_clean() << " -> " << u.kl_ref() << ")\n";
    EXPECT_EQ(e.ref_name(), "mixture");
    EXPECT_LE(e.kl_ref(), 0.5 * e.kl_ref_clean());
    EXPECT_GT(u.kl_ref(), 0.5 * u.kl_ref_clean());
  }
}

}  // namespace
}  // namespace circuitlab::engine
