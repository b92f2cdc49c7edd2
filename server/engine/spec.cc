#include "server/engine/spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>
#include <string>

#include "server/common/status_macros.h"

namespace circuitlab::engine {
namespace {

constexpr int64_t kMaxResidualWidth = 1 << 16;

std::string Num(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

absl::Status OutOfRange(const std::string& field, double lo, double hi, double got) {
  return absl::InvalidArgumentError(field + " must be in [" + Num(lo) + ", " + Num(hi) + "], got " + Num(got));
}

// Checks one numeric field against [lo, hi].
template <typename T>
absl::Status CheckRange(const std::string& field, T value, T lo, T hi) {
  if (!(value >= lo && value <= hi)) {
    return OutOfRange(field, static_cast<double>(lo), static_cast<double>(hi), static_cast<double>(value));
  }
  return absl::OkStatus();
}

bool ValidTagChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' || c == '=' || c == '-';
}

absl::Status ResolveTask(v1::ExperimentSpec* spec) {
  if (spec->task().kind_case() == v1::TaskSpec::KIND_NOT_SET) spec->mutable_task()->mutable_associative_recall();
  auto* t = spec->mutable_task()->mutable_associative_recall();
  const std::string p = "task.associative_recall.";
  if (!t->has_num_common()) t->set_num_common(32);
  if (!t->has_num_rare()) t->set_num_rare(64);
  if (!t->has_num_heldout()) t->set_num_heldout(16);
  if (!t->has_num_blocks()) t->set_num_blocks(8);
  if (!t->has_block_length()) t->set_block_length(2);
  if (t->position_mode() == v1::POSITION_MODE_UNSPECIFIED) t->set_position_mode(v1::POSITION_MODE_BLOCK_OFFSET);
  if (!t->has_num_positions()) t->set_num_positions(64);

  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_common", t->num_common(), 0, 512));
  if (t->num_common() % 2 != 0) {
    return absl::InvalidArgumentError(p + "num_common must be even (common tokens come in fixed pairs), got " +
                                      std::to_string(t->num_common()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_rare", t->num_rare(), 0, 2048));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_heldout", t->num_heldout(), 0, 512));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_blocks", t->num_blocks(), 1, 256));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "block_length", t->block_length(), 2, 16));
  if (!v1::PositionMode_IsValid(t->position_mode())) {
    return absl::InvalidArgumentError(p + "position_mode is not a known value: " +
                                      std::to_string(t->position_mode()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_positions", t->num_positions(), 1, 4096));
  if (t->position_mode() == v1::POSITION_MODE_BLOCK_OFFSET && t->num_positions() < t->block_length()) {
    return absl::InvalidArgumentError(p + "num_positions must be at least block_length (" +
                                      std::to_string(t->block_length()) + ") in BLOCK_OFFSET mode, got " +
                                      std::to_string(t->num_positions()));
  }
  const uint32_t need_rare = 2 * t->num_blocks() + 2;
  if (t->num_rare() < need_rare) {
    return absl::InvalidArgumentError(
        p + "num_rare must be at least 2 * num_blocks + 2 = " + std::to_string(need_rare) +
        " so that every sequence can draw distinct rare pairs for its query and all its blocks, got " +
        std::to_string(t->num_rare()));
  }
  return absl::OkStatus();
}

absl::Status ResolveData(v1::ExperimentSpec* spec) {
  const auto& t = spec->task().associative_recall();
  auto* d = spec->mutable_data();
  const std::string p = "data.";
  if (!d->has_rare_fraction()) d->set_rare_fraction(t.num_common() == 0 ? 1.0 : 0.5);
  if (!d->has_variability()) d->set_variability(0.0);
  if (d->variability_mode() == v1::VARIABILITY_MODE_UNSPECIFIED) d->set_variability_mode(v1::VARIABILITY_MODE_REPAIR);
  if (!d->has_zipf_exponent()) d->set_zipf_exponent(0.0);
  if (!d->has_burstiness()) d->set_burstiness(1);
  if (!d->has_max_gap()) d->set_max_gap(0);

  CL_RETURN_IF_ERROR(CheckRange<double>(p + "rare_fraction", d->rare_fraction(), 0.0, 1.0));
  if (t.num_common() == 0 && d->rare_fraction() != 1.0) {
    return absl::InvalidArgumentError(p + "rare_fraction must be 1 when task.associative_recall.num_common is 0, got " +
                                      Num(d->rare_fraction()));
  }
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "variability", d->variability(), 0.0, 1.0));
  if (!v1::VariabilityMode_IsValid(d->variability_mode())) {
    return absl::InvalidArgumentError(p + "variability_mode is not a known value: " +
                                      std::to_string(d->variability_mode()));
  }
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "zipf_exponent", d->zipf_exponent(), 0.0, 10.0));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "burstiness", d->burstiness(), 1, t.num_blocks()));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "max_gap", d->max_gap(), 0, 16));
  return absl::OkStatus();
}

absl::Status ResolveModel(v1::ExperimentSpec* spec) {
  if (spec->model().kind_case() == v1::ModelSpec::KIND_NOT_SET) spec->mutable_model()->mutable_imir();
  auto* m = spec->mutable_model()->mutable_imir();
  const std::string p = "model.imir.";
  if (!m->has_num_layers()) m->set_num_layers(2);
  if (!m->has_num_heads()) m->set_num_heads(1);
  if (m->parameterisation() == v1::PARAMETERISATION_UNSPECIFIED) m->set_parameterisation(v1::PARAMETERISATION_FULL);
  if (m->init() == v1::INIT_SCHEME_UNSPECIFIED) m->set_init(v1::INIT_SCHEME_NORMAL);
  if (!m->has_init_std()) m->set_init_std(0.01);

  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_layers", m->num_layers(), 1, 6));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_heads", m->num_heads(), 1, 8));
  if (m->parameterisation() != v1::PARAMETERISATION_FULL) {
    return absl::InvalidArgumentError(p + "parameterisation must be PARAMETERISATION_FULL, got " +
                                      std::to_string(m->parameterisation()));
  }
  if (!v1::InitScheme_IsValid(m->init())) {
    return absl::InvalidArgumentError(p + "init is not a known value: " + std::to_string(m->init()));
  }
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "init_std", m->init_std(), 0.0, 1.0));
  const int64_t width = ResidualWidth(*spec);
  if (width > kMaxResidualWidth) {
    return absl::InvalidArgumentError("model residual width (num_heads+1)^num_layers * (vocabulary + positions) = " +
                                      std::to_string(width) + " exceeds " + std::to_string(kMaxResidualWidth) +
                                      "; use fewer layers/heads or a smaller vocabulary");
  }
  return absl::OkStatus();
}

absl::Status ResolveTraining(const EngineLimits& limits, v1::ExperimentSpec* spec) {
  auto* tr = spec->mutable_training();
  const std::string p = "training.";
  if (tr->optimizer() == v1::OPTIMIZER_KIND_UNSPECIFIED) tr->set_optimizer(v1::OPTIMIZER_KIND_SGD);
  if (!v1::OptimizerKind_IsValid(tr->optimizer())) {
    return absl::InvalidArgumentError(p + "optimizer is not a known value: " + std::to_string(tr->optimizer()));
  }
  if (!tr->has_learning_rate()) tr->set_learning_rate(tr->optimizer() == v1::OPTIMIZER_KIND_ADAM ? 1e-3 : 2.0);
  if (!tr->has_batch_size()) tr->set_batch_size(256);
  if (!tr->has_steps()) tr->set_steps(std::min<uint64_t>(1000, limits.max_steps));
  if (!tr->has_momentum()) tr->set_momentum(0.0);
  if (!tr->has_adam_beta1()) tr->set_adam_beta1(0.9);
  if (!tr->has_adam_beta2()) tr->set_adam_beta2(0.999);
  if (!tr->has_weight_decay()) tr->set_weight_decay(0.0);

  if (!(tr->learning_rate() > 0.0 && tr->learning_rate() <= 1000.0)) {
    return absl::InvalidArgumentError(p + "learning_rate must be in (0, 1000], got " + Num(tr->learning_rate()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "batch_size", tr->batch_size(), 1, 65536));
  if (tr->steps() > limits.max_steps) {
    return absl::ResourceExhaustedError(p + "steps must be at most this server's --max-steps (" +
                                        std::to_string(limits.max_steps) + "), got " + std::to_string(tr->steps()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "steps", tr->steps(), 1, 10'000'000));
  if (!(tr->momentum() >= 0.0 && tr->momentum() < 1.0)) {
    return absl::InvalidArgumentError(p + "momentum must be in [0, 1), got " + Num(tr->momentum()));
  }
  for (auto [name, beta] : {std::pair{"adam_beta1", tr->adam_beta1()}, std::pair{"adam_beta2", tr->adam_beta2()}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      return absl::InvalidArgumentError(p + name + " must be in [0, 1), got " + Num(beta));
    }
  }
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "weight_decay", tr->weight_decay(), 0.0, 1.0));
  return absl::OkStatus();
}

absl::Status ResolveRecording(v1::ExperimentSpec* spec) {
  const uint64_t steps = spec->training().steps();
  auto* r = spec->mutable_recording();
  const std::string p = "recording.";
  auto clamp_default = [&](uint32_t d) { return static_cast<uint32_t>(std::min<uint64_t>(d, steps)); };
  if (!r->has_metrics_every()) r->set_metrics_every(clamp_default(10));
  if (!r->has_eval_every()) r->set_eval_every(clamp_default(100));
  if (!r->has_eval_size()) r->set_eval_size(2048);
  if (!r->has_checkpoint_every()) r->set_checkpoint_every(clamp_default(250));
  if (!r->has_keep_checkpoints()) r->set_keep_checkpoints(0);
  if (!r->has_coordinates_every()) r->set_coordinates_every(r->eval_every());
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "metrics_every", r->metrics_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "eval_every", r->eval_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "eval_size", r->eval_size(), 16, 65536));
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "checkpoint_every", r->checkpoint_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "keep_checkpoints", r->keep_checkpoints(), 0, 1000));
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "coordinates_every", r->coordinates_every(), 0, steps));
  return absl::OkStatus();
}

absl::Status ResolveTop(v1::ExperimentSpec* spec) {
  if (spec->name().size() > 200) {
    return absl::InvalidArgumentError("name must be at most 200 characters, got " +
                                      std::to_string(spec->name().size()));
  }
  if (spec->name().empty()) spec->set_name("associative_recall");
  if (spec->tags_size() > 32) {
    return absl::InvalidArgumentError("tags must have at most 32 entries, got " + std::to_string(spec->tags_size()));
  }
  for (int i = 0; i < spec->tags_size(); ++i) {
    const std::string& tag = spec->tags(i);
    const std::string field = "tags[" + std::to_string(i) + "]";
    if (tag.empty() || tag.size() > 64) {
      return absl::InvalidArgumentError(field + " must be 1 to 64 characters long, got " +
                                        std::to_string(tag.size()));
    }
    if (!std::all_of(tag.begin(), tag.end(), ValidTagChar)) {
      return absl::InvalidArgumentError(field + " may only contain letters, digits and _.:=-, got '" + tag + "'");
    }
  }
  auto* res = spec->mutable_resources();
  if (res->device() == v1::DEVICE_KIND_UNSPECIFIED) res->set_device(v1::DEVICE_KIND_ANY);
  if (!v1::DeviceKind_IsValid(res->device())) {
    return absl::InvalidArgumentError("resources.device is not a known value: " + std::to_string(res->device()));
  }
  CL_RETURN_IF_ERROR(CheckRange<int32_t>("resources.priority", res->priority(), -1000, 1000));
  return absl::OkStatus();
}

}  // namespace

TaskShape ShapeOf(const v1::ExperimentSpec& spec) {
  const auto& t = spec.task().associative_recall();
  TaskShape s;
  s.vocab = 4 + int64_t{t.num_common()} + t.num_rare() + t.num_heldout();
  const int64_t n = t.num_blocks(), k = t.block_length();
  s.seq_len = 1 + n * (k + spec.data().max_gap()) + (k - 1);
  s.positions = t.position_mode() == v1::POSITION_MODE_ABSOLUTE ? s.seq_len : int64_t{t.num_positions()};
  return s;
}

int64_t ResidualWidth(const v1::ExperimentSpec& spec) {
  const TaskShape s = ShapeOf(spec);
  const auto& m = spec.model().imir();
  int64_t width = s.vocab + s.positions;
  for (uint32_t l = 0; l < m.num_layers(); ++l) width *= (m.num_heads() + 1);
  return width;
}

int64_t ParameterCount(const v1::ExperimentSpec& spec) {
  const TaskShape s = ShapeOf(spec);
  const auto& m = spec.model().imir();
  int64_t d = s.vocab + s.positions, params = 0;
  for (uint32_t l = 0; l < m.num_layers(); ++l) {
    params += int64_t{m.num_heads()} * d * d;
    d *= (m.num_heads() + 1);
  }
  return params + s.vocab * d;
}

uint64_t EstimateRunMemoryBytes(const v1::ExperimentSpec& spec) {
  const TaskShape s = ShapeOf(spec);
  const auto& m = spec.model().imir();
  const double batch = std::max<double>(spec.training().batch_size(), kEvalChunk);
  const double t = static_cast<double>(s.seq_len);
  double activations = 0;
  double d = static_cast<double>(s.vocab + s.positions);
  for (uint32_t l = 0; l < m.num_layers(); ++l) {
    // Inputs, query projections and head outputs, plus scores and softmax.
    activations += batch * t * d * (2.0 + m.num_heads()) + 3.0 * batch * m.num_heads() * t * t;
    d *= (m.num_heads() + 1);
  }
  activations += batch * d + 3.0 * batch * static_cast<double>(s.vocab);
  const double params = static_cast<double>(ParameterCount(spec));
  // The generator draws a random permutation of the rare (and held-out)
  // tokens and Gumbel keys over the pairs per sequence: float64 keys plus
  // int64 indices, for a training batch or an evaluation chunk at a time.
  const auto& task = spec.task().associative_recall();
  const double sampling =
      16.0 * batch * (task.num_rare() + task.num_heldout() + task.num_common() / 2.0 + 4.0 * task.num_blocks());
  // Evaluation sets are kept for the whole run: tokens, ids, block index per
  // position (int64) for each of the five sets.
  const double eval_sets = 5.0 * spec.recording().eval_size() * t * 3.0 * 8.0;
  // float32; parameters with gradient and two optimiser buffers; activations
  // kept for backward plus their gradients.
  return static_cast<uint64_t>(4.0 * (4.0 * params + 2.0 * activations) + sampling + eval_sets);
}

absl::Status ResolveSpec(const EngineLimits& limits, v1::ExperimentSpec* spec) {
  CL_RETURN_IF_ERROR(ResolveTop(spec));
  CL_RETURN_IF_ERROR(ResolveTask(spec));
  CL_RETURN_IF_ERROR(ResolveData(spec));
  CL_RETURN_IF_ERROR(ResolveModel(spec));
  CL_RETURN_IF_ERROR(ResolveTraining(limits, spec));
  CL_RETURN_IF_ERROR(ResolveRecording(spec));
  const uint64_t need = EstimateRunMemoryBytes(*spec);
  if (need > limits.max_run_memory_bytes) {
    return absl::ResourceExhaustedError("this run needs about " + std::to_string(need >> 20) +
                                        " MiB, more than this server's --max-run-memory-mb (" +
                                        std::to_string(limits.max_run_memory_bytes >> 20) +
                                        " MiB); reduce training.batch_size, the model or the task size");
  }
  return absl::OkStatus();
}

}  // namespace circuitlab::engine
