#include "server/engine/spec.h"

#include <gtest/gtest.h>

namespace circuitlab::engine {
namespace {

TEST(SpecTest, EmptySpecResolvesToDocumentedDefaults) {
  v1::ExperimentSpec spec;
  ASSERT_TRUE(ResolveSpec({}, &spec).ok());
  const auto& t = spec.task().associative_recall();
  EXPECT_EQ(t.num_common(), 32u);
  EXPECT_EQ(t.num_rare(), 64u);
  EXPECT_EQ(t.num_heldout(), 16u);
  EXPECT_EQ(t.num_blocks(), 8u);
  EXPECT_EQ(t.block_length(), 2u);
  EXPECT_EQ(t.position_mode(), v1::POSITION_MODE_BLOCK_OFFSET);
  EXPECT_EQ(t.num_positions(), 64u);
  EXPECT_DOUBLE_EQ(spec.data().rare_fraction(), 0.5);
  EXPECT_EQ(spec.data().variability_mode(), v1::VARIABILITY_MODE_REPAIR);
  EXPECT_EQ(spec.model().imir().num_layers(), 2u);
  EXPECT_EQ(spec.training().optimizer(), v1::OPTIMIZER_KIND_SGD);
  EXPECT_DOUBLE_EQ(spec.training().learning_rate(), 2.0);
  EXPECT_EQ(spec.training().steps(), 1000u);
  EXPECT_EQ(spec.recording().eval_every(), 100u);
  EXPECT_EQ(spec.recording().coordinates_every(), 100u);  // follows eval_every
  EXPECT_FALSE(spec.recording().complete_coordinates());
  EXPECT_EQ(spec.resources().device(), v1::DEVICE_KIND_ANY);
  EXPECT_EQ(spec.name(), "associative_recall");
  // Resolving twice changes nothing.
  v1::ExperimentSpec again = spec;
  ASSERT_TRUE(ResolveSpec({}, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), spec.SerializeAsString());
}

TEST(SpecTest, AdamGetsItsOwnDefaultLearningRate) {
  v1::ExperimentSpec spec;
  spec.mutable_training()->set_optimizer(v1::OPTIMIZER_KIND_ADAM);
  ASSERT_TRUE(ResolveSpec({}, &spec).ok());
  EXPECT_DOUBLE_EQ(spec.training().learning_rate(), 1e-3);
}

TEST(SpecTest, ShortRunsClampRecordingDefaults) {
  v1::ExperimentSpec spec;
  spec.mutable_training()->set_steps(5);
  ASSERT_TRUE(ResolveSpec({}, &spec).ok());
  EXPECT_EQ(spec.recording().eval_every(), 5u);
  EXPECT_EQ(spec.recording().checkpoint_every(), 5u);
}

struct BadCase {
  std::string name;
  std::function<void(v1::ExperimentSpec&)> mutate;
  absl::StatusCode code;
  std::string message;  // the exact message, or a prefix when it ends in '*'
};

class SpecErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(SpecErrorTest, NamesFieldRangeAndValue) {
  v1::ExperimentSpec spec;
  GetParam().mutate(spec);
  absl::Status s = ResolveSpec({}, &spec);
  EXPECT_EQ(s.code(), GetParam().code) << s;
  const std::string& want = GetParam().message;
  if (!want.empty() && want.back() == '*') {
    EXPECT_EQ(std::string(s.message()).substr(0, want.size() - 1), want.substr(0, want.size() - 1)) << s;
  } else {
    EXPECT_EQ(s.message(), want);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fields, SpecErrorTest,
    ::testing::Values(
        BadCase{"blocks", [](auto& s) { s.mutable_task()->mutable_associative_recall()->set_num_blocks(0); },
                absl::StatusCode::kInvalidArgument, "task.associative_recall.num_blocks must be in [1, 256], got 0"},
        BadCase{"odd_common", [](auto& s) { s.mutable_task()->mutable_associative_recall()->set_num_common(7); },
                absl::StatusCode::kInvalidArgument,
                "task.associative_recall.num_common must be even (common tokens come in fixed pairs), got 7"},
        BadCase{"too_few_rare", [](auto& s) { s.mutable_task()->mutable_associative_recall()->set_num_rare(10); },
                absl::StatusCode::kInvalidArgument, "task.associative_recall.num_rare must be at least 2 * num_blocks + 2 = 18*"},
        BadCase{"block_length", [](auto& s) { s.mutable_task()->mutable_associative_recall()->set_block_length(1); },
                absl::StatusCode::kInvalidArgument, "task.associative_recall.block_length must be in [2, 16], got 1"},
        BadCase{"positions",
                [](auto& s) {
                  s.mutable_task()->mutable_associative_recall()->set_block_length(4);
                  s.mutable_task()->mutable_associative_recall()->set_num_positions(3);
                },
                absl::StatusCode::kInvalidArgument, "task.associative_recall.num_positions must be at least block_length*"},
        BadCase{"rare_fraction", [](auto& s) { s.mutable_data()->set_rare_fraction(1.5); },
                absl::StatusCode::kInvalidArgument, "data.rare_fraction must be in [0, 1], got 1.5"},
        BadCase{"nan", [](auto& s) { s.mutable_data()->set_variability(std::nan("")); },
                absl::StatusCode::kInvalidArgument, "data.variability must be in [0, 1], got nan"},
        BadCase{"no_common_needs_all_rare",
                [](auto& s) {
                  s.mutable_task()->mutable_associative_recall()->set_num_common(0);
                  s.mutable_data()->set_rare_fraction(0.5);
                },
                absl::StatusCode::kInvalidArgument,
                "data.rare_fraction must be 1 when task.associative_recall.num_common is 0, got 0.5"},
        BadCase{"burstiness", [](auto& s) { s.mutable_data()->set_burstiness(9); },
                absl::StatusCode::kInvalidArgument, "data.burstiness must be in [1, 8], got 9"},
        BadCase{"layers", [](auto& s) { s.mutable_model()->mutable_imir()->set_num_layers(0); },
                absl::StatusCode::kInvalidArgument, "model.imir.num_layers must be in [1, 6], got 0"},
        BadCase{"width",
                [](auto& s) {
                  s.mutable_model()->mutable_imir()->set_num_layers(6);
                  s.mutable_model()->mutable_imir()->set_num_heads(8);
                },
                absl::StatusCode::kInvalidArgument, "model residual width*"},
        // Issue 14 item 2: a ~300-byte spec whose COMPLETE basis (absolute
        // positions: no position symmetry) would cost gigabytes is refused
        // from the basis size alone, before the basis is built.
        BadCase{"complete_basis_too_large",
                [](auto& s) {
                  auto* t = s.mutable_task()->mutable_associative_recall();
                  t->set_num_blocks(64);
                  t->set_block_length(8);
                  t->set_num_rare(160);
                  t->set_position_mode(v1::POSITION_MODE_ABSOLUTE);
                  auto* m = s.mutable_model()->mutable_imir();
                  m->set_parameterisation(v1::PARAMETERISATION_COORDINATES);
                  m->set_coordinate_basis(v1::BASIS_SELECTION_COMPLETE);
                },
                absl::StatusCode::kInvalidArgument,
                "model.imir.parameterisation COORDINATES needs the complete basis of this task and model, which has*"},
        BadCase{"name_control", [](auto& s) { s.set_name("a\nb"); }, absl::StatusCode::kInvalidArgument,
                "name must not contain control characters (newlines, tabs, escapes), got 'a\\nb'"},
        BadCase{"data_for_other_task",
                [](auto& s) {
                  s.mutable_task()->mutable_k_hop();
                  s.mutable_data()->set_rare_fraction(0.5);
                },
                absl::StatusCode::kInvalidArgument,
                "data applies only to task.associative_recall; task.k_hop has no data statistics, leave data unset"},
        BadCase{"hops", [](auto& s) { s.mutable_task()->mutable_k_hop()->set_hops(7); },
                absl::StatusCode::kInvalidArgument, "task.k_hop.hops must be in [1, 6], got 7"},
        BadCase{"khop_tokens", [](auto& s) { s.mutable_task()->mutable_k_hop()->set_num_tokens(8); },
                absl::StatusCode::kInvalidArgument, "task.k_hop.num_tokens must be at least 11 (2 * num_blocks*"},
        BadCase{"ngram_alphabet", [](auto& s) { s.mutable_task()->mutable_ngram()->set_alphabet(1); },
                absl::StatusCode::kInvalidArgument, "task.ngram.alphabet must be in [2, 16], got 1"},
        BadCase{"cr_multiple",
                [](auto& s) { s.mutable_task()->mutable_conditional_retrieval()->set_num_blocks(5); },
                absl::StatusCode::kInvalidArgument,
                "task.conditional_retrieval.num_blocks must be a multiple of tags_per_key (2), got 5"},
        BadCase{"minimal_items",
                [](auto& s) {
                  s.mutable_task()->mutable_minimal_icl()->set_num_pairs(40);
                  s.mutable_task()->mutable_minimal_icl()->set_num_items(20);
                },
                absl::StatusCode::kInvalidArgument, "task.minimal_icl.num_items must be in [40, 2048], got 20"},
        BadCase{"unknown_coordinate",
                [](auto& s) {
                  auto* m = s.mutable_model()->mutable_imir();
                  m->set_parameterisation(v1::PARAMETERISATION_COORDINATES);
                  m->add_coordinates("alpha");
                  m->add_coordinates("L9H1:[∅→∅]:I_t");
                },
                absl::StatusCode::kInvalidArgument,
                "model.imir.coordinates[1] 'L9H1:[∅→∅]:I_t' is not a coordinate of the paper basis*"},
        BadCase{"duplicate_coordinate",
                [](auto& s) {
                  auto* m = s.mutable_model()->mutable_imir();
                  m->set_parameterisation(v1::PARAMETERISATION_COORDINATES);
                  m->add_coordinates("gamma");
                  m->add_coordinates("OUT:[(0,1)]:I");
                },
                absl::StatusCode::kInvalidArgument,
                "model.imir.coordinates[1] 'OUT:[(0,1)]:I' names OUT:[(0,1)]:I a second time"},
        BadCase{"initial_not_trained",
                [](auto& s) {
                  auto* m = s.mutable_model()->mutable_imir();
                  m->set_parameterisation(v1::PARAMETERISATION_COORDINATES);
                  m->add_coordinates("gamma");
                  (*m->mutable_initial_coordinates())["beta"] = 1.0;
                },
                absl::StatusCode::kInvalidArgument,
                "model.imir.initial_coordinates['beta'] is not one of model.imir.coordinates"},
        BadCase{"projected_needs_coordinates",
                [](auto& s) { s.mutable_model()->mutable_imir()->set_init(v1::INIT_SCHEME_PROJECTED); },
                absl::StatusCode::kInvalidArgument,
                "model.imir.init INIT_SCHEME_PROJECTED needs parameterisation PARAMETERISATION_COORDINATES"},
        BadCase{"coordinates_need_coordinates",
                [](auto& s) { s.mutable_model()->mutable_imir()->add_coordinates("alpha"); },
                absl::StatusCode::kInvalidArgument, "model.imir.coordinates, initial_coordinates*"},
        BadCase{"loss", [](auto& s) { s.mutable_training()->set_loss(static_cast<v1::LossKind>(9)); },
                absl::StatusCode::kInvalidArgument, "training.loss is not a known value: 9"},
        BadCase{"lr", [](auto& s) { s.mutable_training()->set_learning_rate(0); },
                absl::StatusCode::kInvalidArgument, "training.learning_rate must be in (0, 1000], got 0"},
        BadCase{"batch", [](auto& s) { s.mutable_training()->set_batch_size(0); },
                absl::StatusCode::kInvalidArgument, "training.batch_size must be in [1, 65536], got 0"},
        BadCase{"momentum", [](auto& s) { s.mutable_training()->set_momentum(1.0); },
                absl::StatusCode::kInvalidArgument, "training.momentum must be in [0, 1), got 1"},
        BadCase{"steps_limit", [](auto& s) { s.mutable_training()->set_steps(20'000'000); },
                absl::StatusCode::kResourceExhausted, "training.steps must be at most this server's --max-steps*"},
        BadCase{"eval_every", [](auto& s) { s.mutable_recording()->set_eval_every(2000); },
                absl::StatusCode::kInvalidArgument, "recording.eval_every must be in [1, 1000], got 2000"},
        BadCase{"coordinates_every", [](auto& s) { s.mutable_recording()->set_coordinates_every(5000); },
                absl::StatusCode::kInvalidArgument, "recording.coordinates_every must be in [0, 1000], got 5000"},
        BadCase{"eval_size", [](auto& s) { s.mutable_recording()->set_eval_size(1); },
                absl::StatusCode::kInvalidArgument, "recording.eval_size must be in [16, 65536], got 1"},
        BadCase{"priority", [](auto& s) { s.mutable_resources()->set_priority(5000); },
                absl::StatusCode::kInvalidArgument, "resources.priority must be in [-1000, 1000], got 5000"},
        BadCase{"tag", [](auto& s) { s.add_tags("bad tag!"); }, absl::StatusCode::kInvalidArgument,
                "tags[0] may only contain letters, digits and _.:=-, got 'bad tag!'"},
        BadCase{"name", [](auto& s) { s.set_name(std::string(300, 'n')); }, absl::StatusCode::kInvalidArgument,
                "name must be at most 200 characters, got 300"},
        BadCase{"enum", [](auto& s) { s.mutable_training()->set_optimizer(static_cast<v1::OptimizerKind>(42)); },
                absl::StatusCode::kInvalidArgument, "training.optimizer is not a known value: 42"},
        BadCase{"memory",
                [](auto& s) {
                  s.mutable_task()->mutable_associative_recall()->set_num_blocks(256);
                  s.mutable_task()->mutable_associative_recall()->set_num_rare(2048);
                  s.mutable_training()->set_batch_size(65536);
                },
                absl::StatusCode::kResourceExhausted, "this run needs about*"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(SpecTest, ShapeAndWidth) {
  v1::ExperimentSpec spec;
  auto* t = spec.mutable_task()->mutable_associative_recall();
  t->set_num_common(8);
  t->set_num_rare(24);
  t->set_num_heldout(8);
  t->set_num_blocks(6);
  t->set_num_positions(16);
  ASSERT_TRUE(ResolveSpec({}, &spec).ok());
  TaskShape s = ShapeOf(spec);
  EXPECT_EQ(s.vocab, 4 + 8 + 24 + 8);
  EXPECT_EQ(s.seq_len, 1 + 6 * 2 + 1);
  EXPECT_EQ(s.positions, 16);
  EXPECT_EQ(ResidualWidth(spec), 4 * (44 + 16));
  EXPECT_EQ(ParameterCount(spec), 60 * 60 + 120 * 120 + 44 * 240);
}

TEST(SpecTest, LatentTaskResolvesToTvMicroDefaults) {
  v1::ExperimentSpec spec;
  spec.mutable_task()->mutable_latent();
  ASSERT_TRUE(ResolveSpec({}, &spec).ok());
  const auto& t = spec.task().latent();
  EXPECT_EQ(t.kind(), v1::LATENT_KIND_DICE);
  EXPECT_EQ(t.num_states(), 6u);
  EXPECT_EQ(t.seq_len(), 48u);
  EXPECT_EQ(t.diversity(), -1);
  EXPECT_DOUBLE_EQ(t.p_minor(), 0.1);
  EXPECT_EQ(t.num_majors(), 3u);
  EXPECT_EQ(t.major_pool(), v1::MAJOR_POOL_DIRICHLET);
  ASSERT_TRUE(spec.model().has_decoder());  // the latent family's model
  EXPECT_EQ(spec.model().decoder().init(), v1::DECODER_INIT_NORMAL);
  EXPECT_EQ(spec.model().decoder().d_model(), 48u);
  EXPECT_EQ(spec.model().decoder().mlp_width(), 192u);
  EXPECT_EQ(spec.model().decoder().activation(), v1::ACTIVATION_SILU);
  EXPECT_EQ(spec.training().optimizer(), v1::OPTIMIZER_KIND_ADAMW);
  EXPECT_DOUBLE_EQ(spec.training().learning_rate(), 1e-3);
  EXPECT_EQ(spec.training().batch_size(), 32u);
  EXPECT_EQ(spec.training().schedule(), v1::LR_SCHEDULE_TRIANGLE);
  EXPECT_DOUBLE_EQ(spec.training().warmup_fraction(), 0.1);
  EXPECT_DOUBLE_EQ(spec.training().min_learning_rate(), 1e-5);
  EXPECT_EQ(spec.recording().coordinates_every(), 0u);  // no IMIR coordinates
  EXPECT_EQ(spec.name(), "latent");
  EXPECT_EQ(ShapeOf(spec).vocab, 6);
  EXPECT_GT(ParameterCount(spec), 0);
  v1::ExperimentSpec again = spec;
  ASSERT_TRUE(ResolveSpec({}, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), spec.SerializeAsString());
  // The Dyck kind adds the up and down symbols.
  v1::ExperimentSpec dyck;
  dyck.mutable_task()->mutable_latent()->set_kind(v1::LATENT_KIND_DYCK);
  ASSERT_TRUE(ResolveSpec({}, &dyck).ok());
  EXPECT_EQ(ShapeOf(dyck).vocab, 8);
  EXPECT_EQ(dyck.task().latent().seq_len(), 85u);
  EXPECT_EQ(dyck.task().latent().major_pool(), v1::MAJOR_POOL_UNSPECIFIED);  // DICE only
}

// The torch-free families (families/spec/): one per resolved spec, each
// saying what it has, so that nothing else branches on the model kind.
TEST(SpecFamilyTest, EachSpecHasOneFamilyThatSaysWhatItHas) {
  v1::ExperimentSpec imir, dice, dyck, regression;
  dyck.mutable_task()->mutable_latent()->set_kind(v1::LATENT_KIND_DYCK);
  dice.mutable_task()->mutable_latent();
  regression.mutable_task()->mutable_latent()->set_kind(v1::LATENT_KIND_REGRESSION);
  for (v1::ExperimentSpec* s : {&imir, &dice, &dyck, &regression}) ASSERT_TRUE(ResolveSpec({}, s).ok());

  const SpecFamily& f = SpecFamilyOf(imir);
  EXPECT_EQ(f.name(), "imir");
  EXPECT_TRUE(f.has_coordinates());
  EXPECT_FALSE(f.has_task_vectors());
  EXPECT_EQ(f.NumHeads(imir), 1);
  EXPECT_EQ(f.ContinuousInputWidth(imir), 0);

  const SpecFamily& latent = SpecFamilyOf(dice);
  EXPECT_EQ(latent.name(), "latent");
  EXPECT_EQ(&SpecFamilyOf(dyck), &latent);
  EXPECT_FALSE(latent.has_coordinates());
  EXPECT_TRUE(latent.has_task_vectors());
  EXPECT_EQ(latent.NumHeads(dice), 2);
  EXPECT_EQ(latent.ResidualWidth(dice), 48);
  EXPECT_TRUE(latent.OffersTaskVectorAnalysis("p1", dice.task().latent()));
  EXPECT_FALSE(latent.OffersTaskVectorAnalysis("dyck_p0", dice.task().latent()));
  EXPECT_TRUE(latent.OffersTaskVectorAnalysis("dyck_p0", dyck.task().latent()));
  EXPECT_FALSE(latent.OffersTaskVectorAnalysis("p0", dyck.task().latent()));  // no Bayes predictor
  EXPECT_EQ(latent.TaskVectorSitesOf(dice).last, 46u);                       // T - 2
  EXPECT_STREQ(latent.TaskVectorSitesOf(dice).unit, "positions");

  const SpecFamily& e2 = SpecFamilyOf(regression);
  EXPECT_EQ(e2.name(), "regression");
  EXPECT_TRUE(e2.has_task_vectors());
  EXPECT_EQ(e2.ContinuousInputWidth(regression), 7);  // x (dim 6) and the y flag
  EXPECT_FALSE(e2.OffersTaskVectorAnalysis("p1", regression.task().latent()));
  EXPECT_TRUE(e2.OffersTaskVectorAnalysis("kl", regression.task().latent()));
  EXPECT_EQ(e2.TaskVectorSitesOf(regression).last, 15u);  // num_points - 1
  EXPECT_STREQ(e2.TaskVectorSitesOf(regression).unit, "points");

  // The facade's sizes are the family's.
  for (const v1::ExperimentSpec* s : {&imir, &dice, &regression}) {
    EXPECT_EQ(ParameterCount(*s), SpecFamilyOf(*s).ParameterCount(*s));
    EXPECT_EQ(EstimateRunMemoryBytes(*s), SpecFamilyOf(*s).EstimateRunMemoryBytes(*s));
  }
}

TEST(SpecFamilyTest, AModelThatCannotTrainTheTaskIsRefused) {
  v1::ExperimentSpec decoder_on_blocks;
  decoder_on_blocks.mutable_model()->mutable_decoder();
  EXPECT_EQ(ResolveSpec({}, &decoder_on_blocks).message(),
            "model.decoder is the model of task.latent; task.associative_recall trains on model.imir");
  v1::ExperimentSpec imir_on_latent;
  imir_on_latent.mutable_task()->mutable_latent();
  imir_on_latent.mutable_model()->mutable_imir();
  EXPECT_EQ(ResolveSpec({}, &imir_on_latent).message(),
            "model.imir needs a block-list task; task.latent trains on model.decoder");
  v1::ExperimentSpec ce_on_e2;
  ce_on_e2.mutable_task()->mutable_latent()->set_kind(v1::LATENT_KIND_REGRESSION);
  ce_on_e2.mutable_training()->set_loss(v1::LOSS_KIND_CROSS_ENTROPY);
  EXPECT_EQ(ResolveSpec({}, &ce_on_e2).message(),
            "training.loss must be LOSS_KIND_MSE for LATENT_KIND_REGRESSION (squared error of the prediction of "
            "every y_i)");
}

TEST(SpecTest, RegressionResolvesToTheB3ModelAndItsTraining) {
  v1::ExperimentSpec spec;
  spec.mutable_task()->mutable_latent()->set_kind(v1::LATENT_KIND_REGRESSION);
  ASSERT_TRUE(ResolveSpec({}, &spec).ok());
  const auto& t = spec.task().latent();
  EXPECT_EQ(t.dim(), 6u);
  EXPECT_DOUBLE_EQ(t.noise_std(), 0.5);
  EXPECT_EQ(t.num_points(), 16u);
  EXPECT_EQ(t.seq_len(), 48u);  // x, |-, y per point
  EXPECT_FALSE(t.has_num_states());
  EXPECT_FALSE(t.has_dyck_length());
  const auto& m = spec.model().decoder();
  EXPECT_EQ(m.activation(), v1::ACTIVATION_GELU);
  EXPECT_TRUE(m.attention_bias());
  EXPECT_TRUE(m.final_layernorm());
  EXPECT_EQ(spec.training().loss(), v1::LOSS_KIND_MSE);
  EXPECT_DOUBLE_EQ(spec.training().learning_rate(), 5e-4);
  EXPECT_EQ(spec.training().batch_size(), 64u);
  EXPECT_DOUBLE_EQ(spec.training().grad_clip(), 1.0);
  EXPECT_EQ(ShapeOf(spec).vocab, 1);  // the scalar prediction
  v1::ExperimentSpec again = spec;
  ASSERT_TRUE(ResolveSpec({}, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), spec.SerializeAsString());
  // The token kinds keep B.2's bias-free attention and no final LayerNorm.
  v1::ExperimentSpec dice;
  dice.mutable_task()->mutable_latent();
  ASSERT_TRUE(ResolveSpec({}, &dice).ok());
  EXPECT_FALSE(dice.model().decoder().attention_bias());
  EXPECT_FALSE(dice.model().decoder().final_layernorm());

  auto error = [](auto edit) {
    v1::ExperimentSpec s;
    s.mutable_task()->mutable_latent()->set_kind(v1::LATENT_KIND_REGRESSION);
    edit(s);
    return std::string(ResolveSpec({}, &s).message());
  };
  EXPECT_EQ(error([](auto& s) { s.mutable_task()->mutable_latent()->set_dim(0); }),
            "task.latent.dim must be in [1, 64], got 0");
  EXPECT_EQ(error([](auto& s) { s.mutable_task()->mutable_latent()->set_noise_std(0); }),
            "task.latent.noise_std must be in (0, 10], got 0");
  EXPECT_EQ(error([](auto& s) { s.mutable_task()->mutable_latent()->set_num_points(300); }),
            "task.latent.num_points must be in [1, 256], got 300");
  EXPECT_NE(error([](auto& s) { s.mutable_task()->mutable_latent()->set_num_states(6); })
                .find("task.latent.num_states does not apply to LATENT_KIND_REGRESSION"),
            std::string::npos);
  EXPECT_NE(error([](auto& s) { s.mutable_task()->mutable_latent()->set_seq_len(20); })
                .find("task.latent.seq_len of LATENT_KIND_REGRESSION is 3 * num_points = 48"),
            std::string::npos);
  EXPECT_NE(error([](auto& s) { s.mutable_training()->set_loss(v1::LOSS_KIND_CROSS_ENTROPY); })
                .find("training.loss must be LOSS_KIND_MSE for LATENT_KIND_REGRESSION"),
            std::string::npos);
  v1::ExperimentSpec dim_on_dice;
  dim_on_dice.mutable_task()->mutable_latent()->set_dim(4);
  EXPECT_EQ(std::string(ResolveSpec({}, &dim_on_dice).message()),
            "task.latent.dim applies only to LATENT_KIND_REGRESSION, leave it unset");
}

TEST(SpecTest, LatentAndDecoderErrorsNameTheField) {
  auto error = [](auto edit) {
    v1::ExperimentSpec spec;
    spec.mutable_task()->mutable_latent();
    edit(spec);
    return std::string(ResolveSpec({}, &spec).message());
  };
  EXPECT_EQ(error([](auto& s) { s.mutable_task()->mutable_latent()->set_diversity(13); }),
            "task.latent.diversity must be in [-1, 12], got 13");
  EXPECT_EQ(error([](auto& s) { s.mutable_task()->mutable_latent()->set_num_states(1); }),
            "task.latent.num_states must be in [2, 64], got 1");
  EXPECT_EQ(error([](auto& s) { s.mutable_task()->mutable_latent()->set_repeat_prob(0); }),
            "task.latent.repeat_prob must be in (0, 1], got 0");
  EXPECT_NE(error([](auto& s) { s.mutable_model()->mutable_decoder()->set_d_model(30); s.mutable_model()->mutable_decoder()->set_num_heads(4); })
                .find("model.decoder.d_model must be a multiple of 2 * num_heads"),
            std::string::npos);
  EXPECT_NE(error([](auto& s) { s.mutable_model()->mutable_imir(); }).find("task.latent trains on model.decoder"),
            std::string::npos);
  EXPECT_NE(error([](auto& s) { s.mutable_training()->set_loss(v1::LOSS_KIND_MSE); })
                .find("training.loss must be LOSS_KIND_CROSS_ENTROPY for task.latent"),
            std::string::npos);
  EXPECT_NE(error([](auto& s) { s.mutable_recording()->set_coordinates_every(10); }).find("model.decoder has none"),
            std::string::npos);
  EXPECT_EQ(error([](auto& s) { s.mutable_training()->set_grad_clip(-1); }),
            "training.grad_clip must be in [0, 1e+06], got -1");
  EXPECT_EQ(error([](auto& s) { s.mutable_training()->set_warmup_fraction(2); }),
            "training.warmup_fraction must be in [0, 1], got 2");
  EXPECT_EQ(error([](auto& s) {
              s.mutable_task()->mutable_latent()->set_kind(v1::LATENT_KIND_MARKOV);
              s.mutable_task()->mutable_latent()->set_major_pool(v1::MAJOR_POOL_DISJOINT);
            }),
            "task.latent.major_pool applies only to LATENT_KIND_DICE, leave it unset");
  EXPECT_EQ(error([](auto& s) {
              s.mutable_task()->mutable_latent()->set_num_majors(7);
              s.mutable_task()->mutable_latent()->set_major_pool(v1::MAJOR_POOL_DISJOINT);
            }),
            "task.latent.major_pool MAJOR_POOL_DISJOINT gives each major its own faces, so num_majors must be at "
            "most num_states, got 7 majors and 6 states");
  EXPECT_EQ(error([](auto& s) { s.mutable_model()->mutable_decoder()->set_init(static_cast<v1::DecoderInit>(9)); }),
            "model.decoder.init is not a known value: 9");
  // A decoder on a block-list task is refused too.
  v1::ExperimentSpec block;
  block.mutable_model()->mutable_decoder();
  EXPECT_NE(std::string(ResolveSpec({}, &block).message()).find("model.decoder is the model of task.latent"),
            std::string::npos);
  // Too big for the server: RESOURCE_EXHAUSTED.
  v1::ExperimentSpec big;
  big.mutable_task()->mutable_latent()->set_seq_len(1024);
  big.mutable_model()->mutable_decoder()->set_d_model(1024);
  big.mutable_training()->set_batch_size(4096);
  EXPECT_EQ(ResolveSpec({}, &big).code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace circuitlab::engine
