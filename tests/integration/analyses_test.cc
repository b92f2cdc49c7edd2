// Integration tests: the real gRPC server (real engine unless stated) on an
// ephemeral loopback port, driven through the client library.
// Analyses of IMIR runs as jobs: coordinates and projections, the invariance and
// data-dependence checks, circuits, interventions, labels, and the job executor
// seen from a client (reads stay fast, jobs can be cancelled).
#include <gtest/gtest.h>

#include "server/common/thread_cancel.h"
#include "tests/integration/integration_util.h"
#include "tests/test_util/fake_analyzer.h"

namespace circuitlab::testing {
namespace {

// Coordinates recorded during training and the projection of the final
// checkpoint agree; a second projection comes from the store.
TEST(IntegrationTest, CoordinatesOverTrainingAndCheckpointProjection) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  v1::ExperimentSpec spec = TinySpec(60);
  spec.mutable_recording()->set_coordinates_every(20);
  spec.mutable_recording()->set_complete_coordinates(true);
  auto run = c.SubmitRun(spec);
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(WaitForEnd(c, run->run_id()), v1::RUN_STATE_SUCCEEDED);

  v1::GetTrajectoryRequest traj;
  traj.set_run_id(run->run_id());
  traj.add_names("alpha");
  traj.add_names("beta");
  traj.add_names("gamma");
  traj.add_names("delta");
  auto t = c.RunAnalysis<v1::GetTrajectoryResponse>(traj);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->series_size(), 4);
  EXPECT_EQ(t->series(0).coordinate().label(), "L1H1:[∅→∅]:S_1");
  EXPECT_EQ(t->series(0).steps_size(), 4);  // steps 0, 20, 40, 60
  EXPECT_EQ(t->series(0).steps(3), 60u);
  traj.clear_names();
  EXPECT_EQ(c.RunAnalysis<v1::GetTrajectoryResponse>(traj)->series_size(), 28);  // 4 + 16 + 8 with the relation C
  traj.set_selection(v1::BASIS_SELECTION_COMPLETE);
  auto complete = c.RunAnalysis<v1::GetTrajectoryResponse>(traj);
  EXPECT_GT(complete->series_size(), 100);

  v1::ProjectCheckpointRequest proj;
  proj.set_run_id(run->run_id());
  auto p = Analysis<v1::ProjectCheckpointResponse>(c, proj);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->step(), 60u);
  EXPECT_FALSE(p->from_store());
  ASSERT_EQ(p->coordinates_size(), 28);
  for (int i = 0; i < 4; ++i) {
    const auto& s = t->series(i);
    const std::string& label = s.coordinate().label();
    for (const auto& coord : p->coordinates()) {
      if (coord.label() == label) {
        EXPECT_NEAR(coord.value(), s.values(s.values_size() - 1), 1e-9) << label;
      }
    }
  }
  EXPECT_GT(p->rho(), p->rho_complete()) << "the paper set is a subspace of the complete set";
  v1::GetMetricsRequest m;
  m.set_run_id(run->run_id());
  m.add_names("manifold/rho");
  auto rho = c.GetMetrics(m);
  ASSERT_EQ(rho->series_size(), 1);
  EXPECT_NEAR(rho->series(0).values(rho->series(0).values_size() - 1), p->rho_complete(), 1e-9);

  auto again = Analysis<v1::ProjectCheckpointResponse>(c, proj);
  EXPECT_TRUE(again->from_store());
  EXPECT_EQ(again->rho(), p->rho());
  // A forced request recomputes: its first answer is the new job (pending) or
  // its fresh result, never the stored one. (Following the job with force
  // off may see it stored once it ends between two asks: CI saw that under
  // load, so only the first answer is checked.)
  proj.set_force(true);
  auto forced = c.RunAnalysis<v1::ProjectCheckpointResponse>(proj);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_FALSE(forced->from_store());
  EXPECT_TRUE(Analysis<v1::ProjectCheckpointResponse>(c, proj).ok());
  proj.set_step(13);
  auto missing = Analysis<v1::ProjectCheckpointResponse>(c, proj);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("checkpoints at steps: 20, 40, 60"), std::string::npos)
      << missing.status();
  proj.set_step(0);
  proj.set_selection(static_cast<v1::BasisSelection>(9));
  EXPECT_EQ(Analysis<v1::ProjectCheckpointResponse>(c, proj).status().code(), absl::StatusCode::kInvalidArgument);
  traj.set_max_step(5);
  traj.set_min_step(10);
  EXPECT_EQ(c.RunAnalysis<v1::GetTrajectoryResponse>(traj).status().code(), absl::StatusCode::kInvalidArgument);
  traj.set_run_id("r77");
  traj.set_max_step(0);
  EXPECT_EQ(c.RunAnalysis<v1::GetTrajectoryResponse>(traj).status().code(), absl::StatusCode::kNotFound);
}

// The invariance check runs as an analysis job: the first call waits up to
// ~2 s and answers DONE (computed for it) or QUEUED/RUNNING; then DONE with
// the ladder, then answered from the store.
TEST(IntegrationTest, InvarianceCheckIsAQueuedStoredJob) {
  TempDir dir;
  testing::FakeExecutor exec;
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());
  ASSERT_TRUE(c.SubmitRun(TinySpec(60)).ok());
  v1::CheckInvarianceRequest req;
  req.set_run_id("r1");
  req.add_sample_sizes(256);
  req.add_sample_sizes(1024);
  req.add_sample_sizes(4096);
  req.set_controls(true);
  auto first = c.RunAnalysis<v1::CheckInvarianceResponse>(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->from_store());
  EXPECT_NE(first->state(), v1::CheckInvarianceResponse::STATE_FAILED);
  if (first->state() != v1::CheckInvarianceResponse::STATE_DONE) {
    EXPECT_FALSE(first->job_id().empty());
  }
  absl::StatusOr<v1::CheckInvarianceResponse> r;
  ASSERT_TRUE(WaitFor([&] {
    r = c.RunAnalysis<v1::CheckInvarianceResponse>(req);
    return r.ok() && r->state() == v1::CheckInvarianceResponse::STATE_DONE;
  }, std::chrono::seconds(120)));
  ASSERT_EQ(r->checks_size(), 3);  // in_span + both controls (the tiny task has common pairs)
  EXPECT_EQ(r->checks(0).name(), "in_span");
  EXPECT_EQ(r->checks(2).name(), "control_no_relation");
  for (const auto& check : r->checks()) {
    ASSERT_EQ(check.series_size(), 4) << check.name();  // all, L1H1, L2H1, OUT
    EXPECT_EQ(check.series(0).off_fraction_size(), 3);
  }
  // The span keeps the gradient far better than a point off it.
  EXPECT_LT(r->checks(0).series(0).off_fraction(2), r->checks(1).series(0).off_fraction(2));
  const v1::CheckInvarianceResponse by_run = *r;
  EXPECT_TRUE(c.RunAnalysis<v1::CheckInvarianceResponse>(req)->from_store());
  req.set_run_id("r2");
  EXPECT_EQ(c.RunAnalysis<v1::CheckInvarianceResponse>(req).status().code(), absl::StatusCode::kNotFound);

  // A spec alone (no run): validated like SubmitRun, stored, answered again.
  req.clear_run_id();
  req.set_controls(false);
  *req.mutable_spec() = TinySpec(60);
  ASSERT_TRUE(WaitFor([&] {
    r = c.RunAnalysis<v1::CheckInvarianceResponse>(req);
    return r.ok() && r->state() == v1::CheckInvarianceResponse::STATE_DONE;
  }, std::chrono::seconds(120))) << r.status();
  ASSERT_EQ(r->checks_size(), 1);
  // The same task, model and seed as r1: the same ladder, value for value.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r->checks(0).series(0).off_fraction(i), by_run.checks(0).series(0).off_fraction(i));
  }
  EXPECT_TRUE(c.RunAnalysis<v1::CheckInvarianceResponse>(req)->from_store());
  req.set_run_id("r1");
  EXPECT_EQ(c.RunAnalysis<v1::CheckInvarianceResponse>(req).status().code(), absl::StatusCode::kInvalidArgument);  // both
  req.clear_run_id();
  req.mutable_spec()->mutable_model()->mutable_imir()->set_num_layers(9);
  auto bad = c.RunAnalysis<v1::CheckInvarianceResponse>(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "spec: model.imir.num_layers must be in [1, 6], got 9");
}

TEST(IntegrationTest, DetectInterveneAndLabelAgreeOnACoordinateModel) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  v1::ExperimentSpec spec = TinySpec(150);
  spec.mutable_model()->mutable_imir()->set_parameterisation(v1::PARAMETERISATION_COORDINATES);
  spec.mutable_model()->mutable_imir()->set_coordinate_scaling(v1::COORDINATE_SCALING_RAW);
  ASSERT_TRUE(c.SubmitRun(spec).ok());
  ASSERT_EQ(WaitForEnd(c, "r1"), v1::RUN_STATE_SUCCEEDED);

  v1::DetectCircuitRequest dreq;
  dreq.set_run_id("r1");
  dreq.set_n_eval(512);
  absl::StatusOr<v1::DetectCircuitResponse> d;
  ASSERT_TRUE(WaitFor([&] {
    d = c.RunAnalysis<v1::DetectCircuitResponse>(dreq);
    return d.ok() && (d->state() == v1::ANALYSIS_STATE_DONE || d->state() == v1::ANALYSIS_STATE_FAILED);
  }, std::chrono::seconds(120))) << d.status();
  ASSERT_EQ(d->state(), v1::ANALYSIS_STATE_DONE) << d->error();
  EXPECT_EQ(d->eval_set(), "icl_rare");
  // A coordinate model is its own projection.
  EXPECT_NEAR(d->m_dense(), d->m_ref(), 1e-12);
  EXPECT_FALSE(d->projection_not_faithful());
  // The greedy ablation keeps the metric within the tolerance, with fewer coordinates.
  EXPECT_GE(d->m_circuit(), d->m_ref() - 0.01);
  EXPECT_LT(d->circuit_size(), static_cast<int>(d->candidates()));
  EXPECT_GT(d->evaluations(), 0u);
  for (const auto& m : d->circuit()) EXPECT_FALSE(m.role().empty());
  EXPECT_TRUE(c.RunAnalysis<v1::DetectCircuitResponse>(dreq)->from_store());

  // Keeping only K* reproduces m_circuit on the same sequences.
  v1::InterveneRequest ireq;
  ireq.set_run_id("r1");
  ireq.set_n_eval(512);
  ireq.add_eval_sets("icl_rare");
  v1::Intervention* keep = ireq.add_interventions();
  keep->set_op(v1::Intervention::OP_KEEP_ONLY);
  for (const auto& m : d->circuit()) keep->add_coordinates(m.coordinate().label());
  auto iv = Analysis<v1::InterveneResponse>(c, ireq);
  ASSERT_TRUE(iv.ok()) << iv.status();
  ASSERT_EQ(iv->effects_size(), 1);
  EXPECT_DOUBLE_EQ(iv->effects(0).accuracy(), d->m_circuit());
  EXPECT_DOUBLE_EQ(iv->effects(0).accuracy_clean(), d->m_ref());
  // Scaling by 1 changes nothing; ablating the last head changes the model.
  ireq.clear_interventions();
  v1::Intervention* same = ireq.add_interventions();
  same->set_op(v1::Intervention::OP_SCALE_COORDINATE);
  same->set_scale(1.0);
  same->add_coordinates("gamma");
  iv = Analysis<v1::InterveneResponse>(c, ireq);
  ASSERT_TRUE(iv.ok()) << iv.status();
  EXPECT_NEAR(iv->effects(0).kl_clean(), 0.0, 1e-12);
  ireq.clear_interventions();
  v1::Intervention* head = ireq.add_interventions();
  head->set_op(v1::Intervention::OP_ABLATE_HEAD);
  head->set_layer(2);
  ireq.clear_eval_sets();
  iv = Analysis<v1::InterveneResponse>(c, ireq);
  ASSERT_TRUE(iv.ok()) << iv.status();
  EXPECT_GE(iv->effects_size(), 4);  // every evaluation set of the task
  EXPECT_GT(iv->effects(0).kl_clean(), 1e-6);
  head->set_layer(3);
  auto bad = Analysis<v1::InterveneResponse>(c, ireq);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "interventions[0].layer must be in [1, 2], got 3");
  head->set_op(v1::Intervention::OP_ZERO_COORDINATE);
  head->add_coordinates("no_such");
  EXPECT_EQ(Analysis<v1::InterveneResponse>(c, ireq).status().code(), absl::StatusCode::kInvalidArgument);

  // D.6 hook-point ops on the block model: zeroing the last head's output
  // at the query is ablating that head; patching every position of X_2 from
  // another set gives that set's answers; the mean attention is a real edit.
  auto effect = [&](const std::vector<v1::Intervention>& ops, const std::string& set) {
    v1::InterveneRequest r;
    r.set_run_id("r1");
    r.set_n_eval(512);
    r.add_eval_sets(set);
    for (const auto& op : ops) *r.add_interventions() = op;
    auto out = Analysis<v1::InterveneResponse>(c, r);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->effects(0) : v1::InterventionEffect();
  };
  v1::Intervention ablate;
  ablate.set_op(v1::Intervention::OP_ABLATE_HEAD);
  ablate.set_layer(2);
  v1::Intervention zero_out;
  zero_out.set_op(v1::Intervention::OP_ZERO);
  zero_out.set_hook("L2.H1.out");
  const v1::InterventionEffect by_weights = effect({ablate}, "icl_rare"), by_hook = effect({zero_out}, "icl_rare");
  EXPECT_NEAR(by_hook.loss(), by_weights.loss(), 1e-5);
  EXPECT_NEAR(by_hook.accuracy(), by_weights.accuracy(), 1e-12);
  EXPECT_GT(by_hook.kl_clean(), 1e-6);
  v1::Intervention keep_mean;
  keep_mean.set_op(v1::Intervention::OP_MEAN);
  keep_mean.set_hook("L1.attn");
  keep_mean.add_positions(3);
  EXPECT_GT(effect({keep_mean}, "icl_rare").kl_clean(), 0.0);
  // D.6 attention_mass: the query's mass on the previous position at layer 1
  // (clean, then with layer 1's pattern zeroed), and position 0 on itself
  // (the only key it sees: exactly 1).
  {
    v1::InterveneRequest r;
    r.set_run_id("r1");
    r.set_n_eval(256);
    r.add_eval_sets("icl_rare");
    v1::Intervention zero_attn;
    zero_attn.set_op(v1::Intervention::OP_ZERO);
    zero_attn.set_hook("L1.attn");
    *r.add_interventions() = zero_attn;
    v1::AttentionMass* prev = r.add_attention_mass();
    prev->set_pattern("L1.attn");
    prev->add_keys(-1);
    v1::AttentionMass* self = r.add_attention_mass();
    self->set_pattern("L2.attn");
    self->add_keys(0);
    self->add_queries(0);
    auto out = Analysis<v1::InterveneResponse>(c, r);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->effects(0).attention_mass_size(), 2);
    const v1::AttentionMassEffect& m = out->effects(0).attention_mass(0);
    EXPECT_EQ(m.pattern(), "L1.attn");
    ASSERT_EQ(m.clean_size(), 1);
    EXPECT_GT(m.clean(0), 0.0);
    EXPECT_LT(m.clean(0), 1.0);
    EXPECT_EQ(m.intervened(0), 0.0);  // the zeroed pattern
    EXPECT_NEAR(out->effects(0).attention_mass(1).clean(0), 1.0, 1e-6);
    EXPECT_NEAR(out->effects(0).attention_mass(1).intervened(0), 1.0, 1e-6);
    // D.6 logit_diff for a chosen pair replaces the task's: antisymmetric in
    // the pair, refused beyond the vocabulary.
    r.add_logit_diff_tokens(5);  // a common token and a rare one
    r.add_logit_diff_tokens(10);
    auto forward = Analysis<v1::InterveneResponse>(c, r);
    r.set_logit_diff_tokens(0, 10);
    r.set_logit_diff_tokens(1, 5);
    auto backward = Analysis<v1::InterveneResponse>(c, r);
    ASSERT_TRUE(forward.ok() && backward.ok()) << forward.status() << backward.status();
    EXPECT_TRUE(forward->effects(0).has_logit_diff());
    EXPECT_EQ(forward->effects(0).alt_name(), "tokens 5-10");
    EXPECT_NEAR(forward->effects(0).logit_diff(), -backward->effects(0).logit_diff(), 1e-9);
    EXPECT_NEAR(forward->effects(0).logit_diff_clean(), -backward->effects(0).logit_diff_clean(), 1e-9);
    EXPECT_NE(forward->effects(0).logit_diff(), forward->effects(0).logit_diff_clean());
    r.set_logit_diff_tokens(1, 100000);
    EXPECT_EQ(Analysis<v1::InterveneResponse>(c, r).status().code(), absl::StatusCode::kInvalidArgument);
    r.add_logit_diff_tokens(3);
    EXPECT_EQ(Analysis<v1::InterveneResponse>(c, r).status().code(), absl::StatusCode::kInvalidArgument);
    r.clear_logit_diff_tokens();
    prev->set_pattern("L1.resid");
    auto refused = Analysis<v1::InterveneResponse>(c, r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("attention_mass[0].pattern"), std::string::npos) << refused.status();
    prev->set_pattern("L1.attn");
    prev->set_keys(0, 100000);
    refused = Analysis<v1::InterveneResponse>(c, r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("attention_mass[0].keys[0] must be in"), std::string::npos)
        << refused.status();
  }
  v1::Intervention bad_hook = zero_out;
  bad_hook.set_hook("L3.resid");
  ireq.clear_interventions();
  *ireq.add_interventions() = bad_hook;
  auto refused = Analysis<v1::InterveneResponse>(c, ireq);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("L{l}.H{h}.out"), std::string::npos) << refused.status();
  bad_hook.set_hook("L2.resid");
  bad_hook.set_op(v1::Intervention::OP_ADD);
  bad_hook.add_vectors()->add_values(1.0);
  *ireq.mutable_interventions(0) = bad_hook;
  refused = Analysis<v1::InterveneResponse>(c, ireq);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("has width"), std::string::npos) << refused.status();
  bad_hook.clear_vectors();
  bad_hook.set_op(v1::Intervention::OP_REPLACE_CONVEX);  // an IMIR run has no task vectors
  *ireq.mutable_interventions(0) = bad_hook;
  EXPECT_EQ(Analysis<v1::InterveneResponse>(c, ireq).status().code(), absl::StatusCode::kFailedPrecondition);

  v1::LabelRunRequest lreq;
  lreq.set_run_id("r1");
  lreq.set_n_eval(256);
  absl::StatusOr<v1::LabelRunResponse> l;
  ASSERT_TRUE(WaitFor([&] {
    l = c.RunAnalysis<v1::LabelRunResponse>(lreq);
    return l.ok() && (l->state() == v1::ANALYSIS_STATE_DONE || l->state() == v1::ANALYSIS_STATE_FAILED);
  }, std::chrono::seconds(120))) << l.status();
  ASSERT_EQ(l->state(), v1::ANALYSIS_STATE_DONE) << l->error();
  ASSERT_GE(l->checkpoints_size(), 1);
  EXPECT_EQ(l->label(), l->checkpoints(l->checkpoints_size() - 1).label());
  EXPECT_EQ(l->checkpoints(0).head_ablation_size(), 2);
  // A 2-layer model has one candidate pair; its path is tried whenever the
  // accuracy stands (a pair label other than NONE).
  const v1::CheckpointLabel& last = l->checkpoints(l->checkpoints_size() - 1);
  EXPECT_EQ(last.pair_ablation_size(), last.pair() == "NONE" ? 0 : 1) << last.pair();
  if (last.pair() != "NONE") {
    ASSERT_TRUE(last.pair_ablation().contains("1-2"));
    EXPECT_EQ(last.pair() == "1-2", last.pair_ablation().at("1-2") >= 0.5) << last.pair();
  }
  dreq.set_metric("median");
  EXPECT_EQ(c.RunAnalysis<v1::DetectCircuitResponse>(dreq).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(IntegrationTest, EarlyStopAndDataDependenceCheck) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  // Early stop: the run ends SUCCEEDED at the first evaluation reaching the threshold.
  v1::ExperimentSpec spec = TinySpec(400);
  spec.mutable_training()->set_stop_metric("eval/iwl/accuracy");
  spec.mutable_training()->set_stop_at(-1.0);  // reached at the first evaluation
  ASSERT_TRUE(c.SubmitRun(spec).ok());
  ASSERT_EQ(WaitForEnd(c, "r1"), v1::RUN_STATE_SUCCEEDED);
  auto run = c.GetRun("r1");
  EXPECT_EQ(run->progress().step(), spec.recording().eval_every());
  EXPECT_EQ(run->checkpoint_step(), spec.recording().eval_every());
  // A metric the task does not record is refused at submission (issue 14).
  spec.mutable_training()->set_stop_metric("eval/no_such_set/accuracy");
  auto unknown = c.SubmitRun(spec);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("not an evaluation metric"), absl::string_view::npos) << unknown.status();
  spec.mutable_training()->set_stop_metric("train/loss");
  EXPECT_EQ(c.SubmitRun(spec).status().code(), absl::StatusCode::kInvalidArgument);

  // The data-dependence check on r1's task: the zero-point identities and
  // E.7's exact burstiness law hold at any sample size.
  v1::CheckDataDependenceRequest req;
  req.set_run_id("r1");
  req.set_samples(512);
  for (uint32_t b : {1u, 2u}) {
    v1::DataPoint* p = req.add_points();
    p->set_rare_fraction(1.0);
    p->set_burstiness(b);
  }
  v1::DataPoint* half = req.add_points();
  half->set_rare_fraction(0.5);
  half->set_delta_saturated(true);
  absl::StatusOr<v1::CheckDataDependenceResponse> r;
  ASSERT_TRUE(WaitFor([&] {
    r = c.RunAnalysis<v1::CheckDataDependenceResponse>(req);
    return r.ok() && (r->state() == v1::ANALYSIS_STATE_DONE || r->state() == v1::ANALYSIS_STATE_FAILED);
  }, std::chrono::seconds(120))) << r.status();
  ASSERT_EQ(r->state(), v1::ANALYSIS_STATE_DONE) << r->error();
  ASSERT_EQ(r->rows_size(), 3);
  for (const auto& row : r->rows()) {
    EXPECT_LT(row.identity_max_rel_error(), 1e-9);
    EXPECT_GT(row.gamma_stderr(), 0);  // defined even for few samples (chunk means)
  }
  EXPECT_DOUBLE_EQ(r->rows(0).ratio(), 1.0);  // f_r = 1 is its own reference
  EXPECT_NEAR(r->rows(1).grad_gamma(), r->rows(1).closed_form_gamma(), 1e-9);
  EXPECT_GT(r->rows(2).point().delta(), 1.0);  // delta* resolved
  EXPECT_DOUBLE_EQ(r->rows(2).phi(), 0.5);
  EXPECT_TRUE(c.RunAnalysis<v1::CheckDataDependenceResponse>(req)->from_store());
  req.mutable_points(0)->set_burstiness(99);
  auto bad = c.RunAnalysis<v1::CheckDataDependenceResponse>(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("points[0].burstiness must be in [1, 4]"), std::string::npos) << bad.status();
  req.clear_run_id();
  *req.mutable_spec() = TinySpec(60);
  req.mutable_spec()->mutable_task()->mutable_associative_recall()->set_num_common(0);
  req.mutable_spec()->mutable_data()->set_rare_fraction(1.0);
  auto no_commons = c.RunAnalysis<v1::CheckDataDependenceResponse>(req);
  EXPECT_EQ(no_commons.status().code(), absl::StatusCode::kFailedPrecondition) << no_commons.status();
}

// Issue 13: no handler runs model code. With the analysis worker held by a
// job that cannot finish and seven more queued, every read still answers
// (functional: the analyses cannot end before the reads do), each analysis
// call answers QUEUED/RUNNING with a job id after its brief wait, the jobs are
// listed, and CancelAnalysis ends them.
TEST(IntegrationTest, ReadsAnswerWhileAnalysesRunAndJobsCanBeCancelled) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  GatedAnalyzer analyzer;
  Server server(dir.path(), exec.get(), {}, {}, &analyzer);
  auto c = MakeClient(server.address());
  auto run = c.SubmitRun(TinySpec(40));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(WaitForEnd(c, run->run_id()), v1::RUN_STATE_SUCCEEDED);

  constexpr int kJobs = 8;
  std::atomic<int> pending{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kJobs; ++i) {
    callers.emplace_back([&, i] {
      auto own = MakeClient(server.address());
      v1::InterveneRequest req;
      req.set_run_id(run->run_id());
      req.set_seed(static_cast<uint64_t>(i + 1));  // eight distinct jobs
      req.add_interventions()->set_op(v1::Intervention::OP_ABLATE_HEAD);
      req.mutable_interventions(0)->set_layer(1);
      auto r = own.RunAnalysis<v1::InterveneResponse>(req);
      if (r.ok() && scheduler::IsPending(r->state()) && !r->job_id().empty()) ++pending;
    });
  }
  ASSERT_TRUE(WaitFor([&] {
    auto list = c.ListAnalysisJobs();
    return list.ok() && list->jobs_size() == kJobs;
  }));
  for (int i = 0; i < 20; ++i) {
    auto r = c.GetRun(run->run_id());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(c.ListRuns({}).ok());
  }
  auto list = c.ListAnalysisJobs();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->jobs_size(), kJobs) << "no analysis can have finished";
  EXPECT_EQ(list->jobs(0).state(), v1::ANALYSIS_STATE_RUNNING);
  EXPECT_EQ(list->jobs(0).kind(), "intervene");
  EXPECT_EQ(list->jobs(0).run_id(), run->run_id());
  EXPECT_EQ(list->jobs(1).state(), v1::ANALYSIS_STATE_QUEUED);
  EXPECT_EQ(list->workers(), 1u);
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(pending.load(), kJobs);
  EXPECT_EQ(analyzer.started.load(), 1);

  for (const v1::AnalysisJob& job : list->jobs()) {
    auto cancelled = c.CancelAnalysis(job.job_id());
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  }
  ASSERT_TRUE(WaitFor([&] { return c.ListAnalysisJobs()->jobs_size() == 0; }));
  EXPECT_EQ(c.CancelAnalysis(list->jobs(0).job_id()).status().code(), absl::StatusCode::kNotFound);
}


}  // namespace
}  // namespace circuitlab::testing
