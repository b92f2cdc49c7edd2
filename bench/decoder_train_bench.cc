// Training-step benchmark of the decoder engine (SCIENCE.md B.2, and B.3 on
// E2 regression specs) on a latent task, C++/LibTorch side. Times (a) the full step as the server runs it
// (data generation + forward + backward + clipping + AdamW with the triangle
// schedule) and (b) the model step alone on fixed, pre-generated batches.
// With --dump FILE it writes the fixed batches and the initial weights so
// that the Python peer (decoder_peer.py) trains the same model from the same
// weights on exactly the same data; the first steps' losses are printed for
// a cross-check. Prints one JSON object.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "client/lib/client.h"
#include "server/common/seeds.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/families/family.h"
#include "server/engine/models/decoder_kernels.h"
#include "server/engine/setup/decoder_setup.h"
#include "server/engine/spec.h"
#include "server/engine/train/batch_split.h"
#include "server/engine/train/latent_trainer.h"
#include "server/engine/train/regression_trainer.h"

namespace ce = circuitlab::engine;

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Write(std::ofstream& out, const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  out.write(reinterpret_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

// (c) The task-vector analyses' forward (analysis/task_vectors.cc's
// HiddenStates): `n` sequences in chunks of kTvChunk, no gradient, every
// block's output stream captured at the last position as float64, for a
// decoder of `members` members (a pack) fed the same tokens. Returns member
// sequences per second.
double HiddenStatesRate(const circuitlab::v1::ExperimentSpec& spec, int members, int64_t n, int repeats) {
  torch::NoGradGuard no_grad;
  std::vector<uint64_t> seeds;
  for (int e = 0; e < members; ++e) seeds.push_back(spec.seed() + static_cast<uint64_t>(e));
  auto model = ce::MakeDecoder(spec, members, torch::kCPU);
  ce::InitializeDecoder(seeds, *model);
  ce::LatentTaskGenerator task(spec.task().latent(), circuitlab::PoolSeedOf(spec.seed()));
  torch::Generator gen = ce::MakeGenerator(7);
  const torch::Tensor tokens = task.SampleTrain(n, gen).tokens;  // [n, T]
  const int64_t last = tokens.size(1) - 1;
  std::vector<torch::Tensor> kept;
  ce::HookFn capture = [&](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
    if (point.find(".post_mlp") != std::string::npos) kept.push_back(v.select(2, last).to(torch::kDouble));
    return {};
  };
  auto pass = [&] {
    kept.clear();
    for (int64_t b = 0; b < n; b += ce::kTvChunk) {
      torch::Tensor chunk = tokens.narrow(0, b, std::min(ce::kTvChunk, n - b));
      model->Forward(chunk.unsqueeze(0).expand({members, chunk.size(0), chunk.size(1)}).contiguous(), &capture);
    }
  };
  pass();  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) pass();
  const double s = Seconds(t0, std::chrono::steady_clock::now());
  return static_cast<double>(members) * static_cast<double>(n) * repeats / s;
}

// The resolved decoder spec of `path`, at batch size `batch` (0: the spec's).
absl::StatusOr<circuitlab::v1::ExperimentSpec> DecoderSpec(const std::string& path, int batch) {
  absl::StatusOr<circuitlab::v1::ExperimentSpec> spec = circuitlab::client::ReadSpecFile(path);
  if (!spec.ok()) return spec.status();
  if (batch > 0) spec->mutable_training()->set_batch_size(static_cast<uint32_t>(batch));
  if (absl::Status s = ce::ResolveSpec({}, &*spec); !s.ok()) return s;
  if (!ce::SpecFamilyOf(*spec).has_task_vectors()) return absl::InvalidArgumentError("not a decoder spec");
  return spec;
}

// --hidden-states: one member after another against `members` packed, as
// one JSON line. Exit status 2 for a regression spec (no tokens).
int PrintHiddenStates(const circuitlab::v1::ExperimentSpec& spec, int members, int64_t n, int steps, int threads) {
  if (ce::SpecFamilyOf(spec).ContinuousInputWidth(spec) > 0) {
    std::fprintf(stderr, "--hidden-states: token tasks only\n");
    return 2;
  }
  const int repeats = std::max(1, steps / members);
  const double alone = HiddenStatesRate(spec, 1, n, repeats * members);
  const double packed = HiddenStatesRate(spec, members, n, repeats);
  std::printf("{\"side\": \"cpp\", \"threads\": %d, \"members\": %d, \"sequences\": %lld, "
              "\"alone_member_seqs_per_s\": %.1f, \"packed_member_seqs_per_s\": %.1f}\n",
              threads, members, static_cast<long long>(n), alone, packed);
  return 0;
}

}  // namespace

// The Python peer's file: the shapes and B.3 switches, the hyperparameters,
// the initial weights (then AppendBatches adds the batches).
void WriteHeader(const std::string& dump, const circuitlab::v1::ExperimentSpec& spec, const ce::DecoderModel& model,
                 int fixed_batches) {
  std::ofstream out(dump, std::ios::binary);
  const auto& m = spec.model().decoder();
  const auto& tr = spec.training();
  // input_dim (0: tokens), attention biases, final LayerNorm, GELU: the B.3 switches.
  const int64_t header[] = {fixed_batches,
                            tr.batch_size(),
                            ce::ShapeOf(spec).seq_len,
                            ce::ShapeOf(spec).vocab,
                            m.num_layers(),
                            m.d_model(),
                            m.num_heads(),
                            m.mlp_width(),
                            model.config().input_dim,
                            m.attention_bias(),
                            m.final_layernorm(),
                            m.activation() == circuitlab::v1::ACTIVATION_GELU};
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  const double hyper[] = {tr.learning_rate(), tr.weight_decay()};
  out.write(reinterpret_cast<const char*>(hyper), sizeof(hyper));
  for (const torch::Tensor& p : model.parameters()) Write(out, p.detach().squeeze(0).to(torch::kFloat));
}

void AppendBatches(const std::string& dump, const std::vector<torch::Tensor>& batches,
                   const std::vector<torch::Tensor>& targets) {
  std::ofstream out(dump, std::ios::binary | std::ios::app);
  for (size_t i = 0; i < batches.size(); ++i) {
    Write(out, batches[i]);
    if (!targets.empty()) Write(out, targets[i]);
  }
}

int main(int argc, char** argv) {
  CLI::App app{"Decoder training-step benchmark (C++ side)"};
  std::string spec_path, dump;
  int steps = 100, warmup = 10, fixed_batches = 8, threads = 1, batch = 0, members = 1;
  app.add_option("--spec", spec_path, "ExperimentSpec JSON (task.latent)")->required()->check(CLI::ExistingFile);
  app.add_option("--steps", steps, "Timed steps");
  app.add_option("--warmup", warmup, "Untimed steps first");
  app.add_option("--fixed-batches", fixed_batches, "Pre-generated batches cycled in mode (b)");
  app.add_option("--dump", dump, "Write batches and initial weights here for the Python peer");
  app.add_option("--threads", threads, "Threads per run (the server's --threads-per-run): the batch split")
      ->check(CLI::Range(1, 64));
  app.add_option("--batch", batch, "Batch size instead of the spec's (B.3's 256 needs ~19 GB; 0: the spec's)")
      ->check(CLI::Range(0, 65536));
  app.add_option("--members", members,
                 "Members trained as one ensemble in (a), seeds spec.seed + 0..members-1 (a packed sweep; issue 48)")
      ->check(CLI::Range(1, 64));
  int64_t hidden_states = 0;
  app.add_option("--hidden-states", hidden_states,
                 "Instead of (a) and (b): the task-vector analyses' forward over this many sequences, one member "
                 "after another against --members packed (token tasks; issue 48)")
      ->check(CLI::Range(0, 1 << 20));
  bool reference_ops = false;
  app.add_flag("--reference-ops", reference_ops,
               "The decoder's reference ATen ops instead of its fused CPU kernels (models/decoder_kernels.h)");
  CLI11_PARSE(app, argc, argv);
  ce::SetFusedKernelsEnabled(!reference_ops);
  at::set_num_threads(threads);  // the trainer takes them over (batch_split.h)

  absl::StatusOr<circuitlab::v1::ExperimentSpec> spec = DecoderSpec(spec_path, batch);
  if (!spec.ok()) {
    std::fprintf(stderr, "bad spec (a task.latent spec is needed): %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  spec->mutable_training()->set_steps(static_cast<uint64_t>(steps + warmup) * 4);
  if (hidden_states > 0) return PrintHiddenStates(*spec, members, hidden_states, steps, threads);
  // E2: continuous tokens read in (x, the y flag), a scalar read-out.
  const bool regression = ce::SpecFamilyOf(*spec).ContinuousInputWidth(*spec) > 0;
  // (a) the server's step.
  std::vector<uint64_t> seeds;
  for (int e = 0; e < members; ++e) seeds.push_back(spec->seed() + static_cast<uint64_t>(e));
  std::unique_ptr<ce::TrainerBase> trainer = ce::FamilyOf(*spec).MakeTrainer(ce::MembersOf(*spec, seeds), torch::kCPU);
  for (int i = 0; i < warmup; ++i) trainer->Step(false);
  const double waited0 = trainer->data_wait_seconds();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) trainer->Step(false);
  const double full_s = Seconds(t0, std::chrono::steady_clock::now());
  const double full = steps / full_s;
  // Data generation's share of the full step: the time the step waited for its batch.
  const double data_wait_share = (trainer->data_wait_seconds() - waited0) / full_s;

  // (b) the model step alone: forward, next-token CE, backward (split as the trainer splits it), AdamW.
  auto model = ce::MakeDecoder(*spec, 1, torch::kCPU);
  ce::InitializeDecoder({spec->seed()}, *model);
  const auto& tr = spec->training();
  if (!dump.empty()) WriteHeader(dump, *spec, *model, fixed_batches);
  // Tokens [B, T] int64, or E2's x [B, n, d] and y [B, n] float32.
  std::vector<torch::Tensor> batches, targets;
  for (int i = 0; i < fixed_batches; ++i) {
    torch::Generator gen = ce::MakeGenerator(1000 + i);
    if (regression) {
      ce::RegressionBatch b = static_cast<ce::RegressionTrainer&>(*trainer).task(0).SampleTrain(tr.batch_size(), gen);
      batches.push_back(b.x.to(torch::kFloat));
      targets.push_back(b.y.to(torch::kFloat));
    } else {
      batches.push_back(static_cast<ce::LatentTrainer&>(*trainer).task(0).SampleTrain(tr.batch_size(), gen).tokens);
    }
  }
  if (!dump.empty()) AppendBatches(dump, batches, targets);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(tr.learning_rate())
                                                   .betas({tr.adam_beta1(), tr.adam_beta2()})
                                                   .weight_decay(tr.weight_decay()));
  std::vector<double> first_losses;
  auto step = [&](int i) {
    const size_t k = static_cast<size_t>(i % fixed_batches);
    opt.zero_grad();
    ce::PartOutput out = ce::BackwardInParts(threads, tr.batch_size(), model->parameters(), [&](int64_t lo, int64_t n) {
      if (regression) {
        torch::Tensor y = targets[k].narrow(0, lo, n).unsqueeze(0);
        torch::Tensor x = batches[k].narrow(0, lo, n).unsqueeze(0);
        return ce::PartOutput{(ce::PredictRegression(*model, x, y) - y).pow(2).mean(at::IntArrayRef{1, 2}), {}};
      }
      torch::Tensor tokens = batches[k].narrow(0, lo, n).unsqueeze(0);
      return ce::PartOutput{ce::NextTokenLoss(model->Forward(tokens), tokens).mean(1), {}};
    });
    opt.step();
    if (first_losses.size() < 5) first_losses.push_back(out.loss.sum().item<double>());
  };
  for (int i = 0; i < warmup; ++i) step(i);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step(i);
  const double model_rate = steps / Seconds(t0, std::chrono::steady_clock::now());
  std::printf(
      "{\"side\": \"cpp\", \"threads\": %d, \"batch\": %u, \"members\": %d, \"full_steps_per_s\": %.3f, "
      "\"member_steps_per_s\": %.3f, \"model_steps_per_s\": %.3f, \"data_wait_share\": %.4f, "
      "\"first_losses\": [",
      threads, tr.batch_size(), members, full, full * members, model_rate, data_wait_share);
  for (size_t i = 0; i < first_losses.size(); ++i) std::printf("%s%.6f", i ? ", " : "", first_losses[i]);
  std::printf("]}\n");
  return 0;
}
