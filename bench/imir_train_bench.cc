// Training-step benchmark of the IMIR engine (C++/LibTorch side).
//
// Times, on one spec: (a) the full training step as the server runs it (data
// generation + forward + backward + SGD), (b) the model step alone on fixed,
// pre-generated batches, and (c) one evaluation pass. With --dump FILE it also
// writes the fixed batches so the Python peer (imir_peer.py) trains the same
// model on exactly the same data. Prints one JSON object.
#include <ATen/CPUGeneratorImpl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "client/lib/client.h"
#include "server/common/seeds.h"
#include "server/engine/api.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/spec.h"
#include "server/engine/train/trainer.h"

namespace ce = circuitlab::engine;

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void WriteBatches(const std::string& path, const std::vector<ce::Batch>& batches, int64_t vocab, int64_t positions,
                  int64_t layers, int64_t heads, double lr) {
  std::ofstream out(path, std::ios::binary);
  const int64_t header[] = {static_cast<int64_t>(batches.size()), batches[0].tokens.size(0),
                            batches[0].tokens.size(1), vocab, positions, layers, heads};
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(&lr), sizeof(lr));
  for (const ce::Batch& b : batches) {
    for (const torch::Tensor& t : {b.tokens, b.pids, b.target}) {
      torch::Tensor c = t.contiguous();
      out.write(reinterpret_cast<const char*>(c.data_ptr<int64_t>()), c.numel() * sizeof(int64_t));
    }
  }
}

// Multiply-adds of one forward of the dense reference model (SCIENCE.md
// B.1) on a batch: every layer but the last at every position, the last at
// the query, the readout. A training step is ~3 forwards (the backward two).
double DenseForwardMacs(int64_t batch, int64_t T, int64_t d0, int64_t V, int64_t layers, int64_t heads) {
  double macs = 0, d = static_cast<double>(d0);
  for (int64_t l = 0; l < layers; ++l) {
    const double rows = l + 1 < layers ? static_cast<double>(T) : 1.0;
    macs += batch * rows * heads * (d * d + 2.0 * T * d);  // queries, scores, head outputs
    d *= heads + 1;
  }
  return macs + batch * d * V;
}

// One core's float32 GEMM rate (512^3, best of five), the roofline.
double GemmGflops() {
  const torch::Tensor a = torch::randn({512, 512}), b = torch::randn({512, 512});
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    torch::Tensor c = torch::mm(a, b);
    best = std::max(best, 2.0 * 512 * 512 * 512 / Seconds(t0, std::chrono::steady_clock::now()) / 1e9);
  }
  return best;
}

}  // namespace

// The IMIR projection onto the paper and complete bases against the step
// time, interleaved so machine noise hits both alike: overhead at "every N
// steps" = t_project / (N t_step), as JSON members "N": overhead.
struct ProjectionCost {
  double step_s = 0, project_s = 0;
  std::string overhead;
};
ProjectionCost MeasureProjection(ce::EnsembleTrainer& trainer, const circuitlab::v1::ExperimentSpec& spec, int steps,
                                 const std::vector<int>& project_every) {
  const ce::Projector paper(ce::BuildBasis(trainer.task(0).Symmetry(), spec.model().imir().num_layers(),
                                           spec.model().imir().num_heads(), ce::Selection::kPaper));
  const ce::Projector complete(ce::BuildBasis(trainer.task(0).Symmetry(), spec.model().imir().num_layers(),
                                              spec.model().imir().num_heads(), ce::Selection::kComplete));
  double step_s = 0, project_s = 0;
  for (int i = 0; i < steps; ++i) {
    auto s0 = std::chrono::steady_clock::now();
    trainer.Step(false);
    auto s1 = std::chrono::steady_clock::now();
    Project(paper, trainer.model(), 0);
    Project(complete, trainer.model(), 0);
    auto s2 = std::chrono::steady_clock::now();
    step_s += Seconds(s0, s1);
    project_s += Seconds(s1, s2);
  }
  std::string projected;
  for (int every : project_every) {
    if (every <= 0) continue;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s\"%d\": %.4f", projected.empty() ? "" : ", ", every,
                  project_s / (every * step_s));
    projected += buf;
  }
  return {step_s, project_s, projected};
}

// `count` training batches of the run's task from seeds of their own (what
// the Python peer reads from --dump).
std::vector<ce::Batch> FixedBatches(const ce::BlockTask& task, const circuitlab::v1::ExperimentSpec& spec, int count) {
  std::vector<ce::Batch> batches;
  for (int i = 0; i < count; ++i) {
    torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(circuitlab::DeriveSeed63(spec.seed(), "bench", i));
    batches.push_back(task.Sample(spec.training().batch_size(), ce::SampleMode::kTrain, gen));
  }
  return batches;
}

int main(int argc, char** argv) {
  CLI::App app{"IMIR training-step benchmark (C++ side)"};
  std::string spec_path;
  int steps = 200, warmup = 20, threads = 1, fixed_batches = 8;
  std::string dump;
  std::vector<int> project_every = {100, 10, 1};
  app.add_option("--spec", spec_path, "ExperimentSpec JSON")->required()->check(CLI::ExistingFile);
  app.add_option("--steps", steps, "Timed steps");
  app.add_option("--warmup", warmup, "Untimed steps first");
  app.add_option("--threads", threads, "Intra-op threads");
  app.add_option("--fixed-batches", fixed_batches, "Pre-generated batches cycled in mode (b)");
  app.add_option("--dump", dump, "Write the fixed batches here for the Python peer");
  app.add_option("--project-every", project_every, "Report the projection overhead at these recording intervals");
  CLI11_PARSE(app, argc, argv);

  ce::ConfigureRuntime(threads);
  at::set_num_threads(threads);
  auto spec = circuitlab::client::ReadSpecFile(spec_path);
  absl::Status st = spec.ok() ? ce::ResolveSpec({}, &*spec) : spec.status();
  if (!st.ok()) {
    std::fprintf(stderr, "bad spec: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  spec->mutable_training()->set_steps(1'000'000);

  // (a) full step, as the server runs it.
  ce::EnsembleTrainer trainer(*spec, {spec->seed()}, torch::kCPU);
  for (int i = 0; i < warmup; ++i) trainer.Step(false);
  const double waited0 = trainer.data_wait_seconds();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) trainer.Step(false);
  auto t1 = std::chrono::steady_clock::now();
  const double full = steps / Seconds(t0, t1);
  // Data generation's share of the full step: the time the step waited for
  // its batch (the prefetch thread draws it while the previous step runs).
  const double data_wait_share = (trainer.data_wait_seconds() - waited0) / Seconds(t0, t1);

  // (d) the IMIR projection onto the paper and complete bases, as the server
  // records it.
  const ProjectionCost projection = MeasureProjection(trainer, *spec, steps, project_every);
  const double step_s = projection.step_s, project_s = projection.project_s;
  const std::string& projected = projection.overhead;

  // (c) one evaluation pass over every evaluation set.
  auto e0 = std::chrono::steady_clock::now();
  trainer.Evaluate();
  auto e1 = std::chrono::steady_clock::now();

  // (b) model step only, on fixed batches (the part the Python peer also does).
  const auto& task = trainer.task(0);
  const std::vector<ce::Batch> batches = FixedBatches(task, *spec, fixed_batches);
  const auto& m = spec->model().imir();
  if (!dump.empty()) {
    WriteBatches(dump, batches, task.vocab_size(), task.num_positions(), m.num_layers(), m.num_heads(),
                 spec->training().learning_rate());
  }
  const std::unique_ptr<ce::ImirModel> model_ptr = ce::MakeModel(*spec, task, 1, torch::kCPU);
  ce::ImirModel& model = *model_ptr;
  model.Initialize({1});
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(spec->training().learning_rate()));
  auto model_step = [&](const ce::Batch& b) {
    torch::Tensor logits = model.Forward(b.tokens.unsqueeze(0), b.pids.unsqueeze(0));
    torch::Tensor loss = torch::nll_loss(torch::log_softmax(logits[0], -1), b.target);
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < warmup; ++i) model_step(batches[i % fixed_batches]);
  auto m0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) model_step(batches[i % fixed_batches]);
  auto m1 = std::chrono::steady_clock::now();
  const double model_only = steps / Seconds(m0, m1);

  // The dense step's FLOPs at the achieved rate against one core's GEMM rate:
  // above 1 means the step skips work the dense formulation does (the block
  // kernel's gathers), not that it beats the GEMM.
  const double dense_mflop =
      6 *
      DenseForwardMacs(spec->training().batch_size(), task.seq_len(), task.vocab_size() + task.num_positions(),
                       task.vocab_size(), m.num_layers(), m.num_heads()) /
      1e6;
  const double gemm = GemmGflops();
  int64_t trained = 0;
  for (const auto& p : model.parameters()) trained += p.numel();
  std::printf(
      "{\"impl\": \"cpp\", \"threads\": %d, \"batch\": %u, \"seq_len\": %lld, \"d0\": %lld, \"layers\": %u, "
      "\"full_steps_per_s\": %.2f, \"model_steps_per_s\": %.2f, \"eval_pass_s\": %.3f, "
      "\"step_ms\": %.3f, \"projection_ms\": %.3f, \"projection_overhead_every\": {%s}, "
      "\"forward\": \"%s\", \"parameters\": %lld, \"dense_mflop_per_step\": %.1f, \"gemm_gflops\": %.1f, "
      "\"dense_roofline_fraction\": %.2f, \"data_wait_share\": %.4f}\n",
      threads, spec->training().batch_size(), static_cast<long long>(task.seq_len()),
      static_cast<long long>(task.vocab_size() + task.num_positions()), m.num_layers(), full, model_only,
      Seconds(e0, e1), 1000 * step_s / steps, 1000 * project_s / steps, projected.c_str(),
      !model.coordinate_model() ? "block-kernel"
      : model.sparse_forward()  ? "block-sparse"
                                : "materialised-block-kernel",
      static_cast<long long>(trained), dense_mflop, gemm, model_only * dense_mflop / 1e3 / gemm, data_wait_share);
  return 0;
}
