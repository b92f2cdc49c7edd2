#include "server/engine/spec.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "server/common/field_checks.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"

namespace circuitlab::engine {
namespace {

bool ValidTagChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' || c == '=' || c == '-';
}

absl::Status CheckPositionMode(const std::string& field, v1::PositionMode* mode) {
  if (*mode == v1::POSITION_MODE_UNSPECIFIED) *mode = v1::POSITION_MODE_BLOCK_OFFSET;
  if (!v1::PositionMode_IsValid(*mode)) {
    return absl::InvalidArgumentError(field + " is not a known value: " + std::to_string(*mode));
  }
  return absl::OkStatus();
}

// The fields the block-list tasks with position ids share (k-hop,
// conditional retrieval, permutation inversion): num_tokens (32),
// num_blocks (6), position_mode (BLOCK_OFFSET), num_positions (16).
template <typename Task>
absl::Status ResolveBlockList(const std::string& p, Task* t, uint32_t min_blocks, uint32_t min_positions) {
  if (!t->has_num_tokens()) t->set_num_tokens(32);
  if (!t->has_num_blocks()) t->set_num_blocks(6);
  if (!t->has_num_positions()) t->set_num_positions(16);
  v1::PositionMode mode = t->position_mode();
  CL_RETURN_IF_ERROR(CheckPositionMode(p + "position_mode", &mode));
  t->set_position_mode(mode);
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_tokens", t->num_tokens(), 4, 2048));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_blocks", t->num_blocks(), min_blocks, 256));
  return CheckRange<uint32_t>(p + "num_positions", t->num_positions(), min_positions, 4096);
}

absl::Status ResolveKHop(v1::KHopTask* t) {
  const std::string p = "task.k_hop.";
  if (!t->has_hops()) t->set_hops(2);
  CL_RETURN_IF_ERROR(ResolveBlockList(p, t, 1, 2));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "hops", t->hops(), 1, t->num_blocks()));
  return AtLeast(p + "num_tokens", t->num_tokens(), 2 * t->num_blocks() - t->hops() + 1,
                 "2 * num_blocks - hops + 1 distinct tokens per sequence");
}

absl::Status ResolveNGram(v1::NGramTask* t) {
  const std::string p = "task.ngram.";
  if (!t->has_alphabet()) t->set_alphabet(3);
  if (!t->has_order()) t->set_order(2);
  if (!t->has_length()) t->set_length(32);
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "alphabet", t->alphabet(), 2, 16));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "order", t->order(), 2, 4));
  return CheckRange<uint32_t>(p + "length", t->length(), t->order(), 512);
}

absl::Status ResolveIoi(v1::IoiTask* t) {
  const std::string p = "task.ioi.";
  if (!t->has_num_names()) t->set_num_names(32);
  if (!t->has_max_fillers()) t->set_max_fillers(0);
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_names", t->num_names(), 3, 2048));
  return CheckRange<uint32_t>(p + "max_fillers", t->max_fillers(), 0, 16);
}

absl::Status ResolveConditionalRetrieval(v1::ConditionalRetrievalTask* t) {
  const std::string p = "task.conditional_retrieval.";
  if (!t->has_num_tags()) t->set_num_tags(4);
  if (!t->has_tags_per_key()) t->set_tags_per_key(2);
  CL_RETURN_IF_ERROR(ResolveBlockList(p, t, 2, 3));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_tags", t->num_tags(), 2, 64));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "tags_per_key", t->tags_per_key(), 2, t->num_tags()));
  if (t->num_blocks() % t->tags_per_key() != 0) {
    return absl::InvalidArgumentError(p + "num_blocks must be a multiple of tags_per_key (" +
                                      std::to_string(t->tags_per_key()) + "), got " +
                                      std::to_string(t->num_blocks()));
  }
  return AtLeast(p + "num_tokens", t->num_tokens(), t->num_blocks() / t->tags_per_key() + t->num_blocks(),
                 "num_blocks / tags_per_key keys and num_blocks values, all distinct");
}

absl::Status ResolvePermutationInversion(v1::PermutationInversionTask* t) {
  const std::string p = "task.permutation_inversion.";
  CL_RETURN_IF_ERROR(ResolveBlockList(p, t, 1, 2));
  return AtLeast(p + "num_tokens", t->num_tokens(), t->num_blocks() + 1, "num_blocks + 1");
}

absl::Status ResolveMinimalIcl(v1::MinimalIclTask* t) {
  const std::string p = "task.minimal_icl.";
  if (!t->has_num_pairs()) t->set_num_pairs(8);
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_pairs", t->num_pairs(), 1, 256));
  if (!t->has_num_items()) t->set_num_items(std::max<uint32_t>(32, t->num_pairs()));
  if (!t->has_num_labels()) t->set_num_labels(std::max<uint32_t>(32, t->num_pairs()));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_items", t->num_items(), t->num_pairs(), 2048));
  return CheckRange<uint32_t>(p + "num_labels", t->num_labels(), t->num_pairs(), 2048);
}

absl::Status ResolveTask(const SpecFamily& family, v1::ExperimentSpec* spec) {
  auto* task = spec->mutable_task();
  switch (task->kind_case()) {
    case v1::TaskSpec::kKHop: return ResolveKHop(task->mutable_k_hop());
    case v1::TaskSpec::kNgram: return ResolveNGram(task->mutable_ngram());
    case v1::TaskSpec::kIoi: return ResolveIoi(task->mutable_ioi());
    case v1::TaskSpec::kConditionalRetrieval:
      return ResolveConditionalRetrieval(task->mutable_conditional_retrieval());
    case v1::TaskSpec::kPermutationInversion:
      return ResolvePermutationInversion(task->mutable_permutation_inversion());
    case v1::TaskSpec::kMinimalIcl: return ResolveMinimalIcl(task->mutable_minimal_icl());
    case v1::TaskSpec::kLatent: return family.ResolveTask(spec);
    default: break;
  }
  auto* t = task->mutable_associative_recall();
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
  if (spec->task().kind_case() != v1::TaskSpec::kAssociativeRecall) {
    if (spec->data().ByteSizeLong() != 0) {
      return absl::InvalidArgumentError("data applies only to task.associative_recall; task." +
                                        TaskName(spec->task()) + " has no data statistics, leave data unset");
    }
    return absl::OkStatus();
  }
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
                                      FormatNumber(d->rare_fraction()));
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

absl::Status ResolveTraining(const SpecFamily& family, const EngineLimits& limits, v1::ExperimentSpec* spec) {
  auto* tr = spec->mutable_training();
  const std::string p = "training.";
  const FamilyDefaults& def = family.defaults();
  if (tr->optimizer() == v1::OPTIMIZER_KIND_UNSPECIFIED) tr->set_optimizer(def.optimizer);
  if (!v1::OptimizerKind_IsValid(tr->optimizer())) {
    return absl::InvalidArgumentError(p + "optimizer is not a known value: " + std::to_string(tr->optimizer()));
  }
  if (!tr->has_learning_rate()) {
    tr->set_learning_rate(tr->optimizer() == v1::OPTIMIZER_KIND_SGD ? 2.0 : def.adam_learning_rate);
  }
  if (!tr->has_batch_size()) tr->set_batch_size(def.batch_size);
  if (tr->schedule() == v1::LR_SCHEDULE_UNSPECIFIED) tr->set_schedule(def.schedule);
  if (!v1::LrSchedule_IsValid(tr->schedule())) {
    return absl::InvalidArgumentError(p + "schedule is not a known value: " + std::to_string(tr->schedule()));
  }
  if (!tr->has_warmup_fraction()) tr->set_warmup_fraction(0.1);
  if (!tr->has_min_learning_rate()) tr->set_min_learning_rate(std::min(1e-5, tr->learning_rate()));
  if (!tr->has_grad_clip()) tr->set_grad_clip(def.grad_clip);
  if (!tr->has_steps()) tr->set_steps(std::min<uint64_t>(1000, limits.max_steps));
  if (!tr->has_momentum()) tr->set_momentum(0.0);
  if (!tr->has_adam_beta1()) tr->set_adam_beta1(0.9);
  if (!tr->has_adam_beta2()) tr->set_adam_beta2(0.999);
  if (!tr->has_weight_decay()) tr->set_weight_decay(0.0);
  if (tr->loss() == v1::LOSS_KIND_UNSPECIFIED) tr->set_loss(def.loss);
  if (!v1::LossKind_IsValid(tr->loss())) {
    return absl::InvalidArgumentError(p + "loss is not a known value: " + std::to_string(tr->loss()));
  }

  if (!(tr->learning_rate() > 0.0 && tr->learning_rate() <= 1000.0)) {
    return absl::InvalidArgumentError(p + "learning_rate must be in (0, 1000], got " + FormatNumber(tr->learning_rate()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "batch_size", tr->batch_size(), 1, 65536));
  if (tr->steps() > limits.max_steps) {
    return absl::ResourceExhaustedError(p + "steps must be at most this server's --max-steps (" +
                                        std::to_string(limits.max_steps) + "), got " + std::to_string(tr->steps()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "steps", tr->steps(), 1, 10'000'000));
  if (!(tr->momentum() >= 0.0 && tr->momentum() < 1.0)) {
    return absl::InvalidArgumentError(p + "momentum must be in [0, 1), got " + FormatNumber(tr->momentum()));
  }
  for (auto [name, beta] : {std::pair{"adam_beta1", tr->adam_beta1()}, std::pair{"adam_beta2", tr->adam_beta2()}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      return absl::InvalidArgumentError(p + name + " must be in [0, 1), got " + FormatNumber(beta));
    }
  }
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "weight_decay", tr->weight_decay(), 0.0, 1.0));
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "warmup_fraction", tr->warmup_fraction(), 0.0, 1.0));
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "min_learning_rate", tr->min_learning_rate(), 0.0, tr->learning_rate()));
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "grad_clip", tr->grad_clip(), 0.0, 1e6));
  if (def.loss_only != nullptr && tr->loss() != def.loss) {
    return absl::InvalidArgumentError(p + "loss must be " + v1::LossKind_Name(def.loss) + " for " + def.loss_only);
  }
  if (tr->stop_metric().empty()) {
    if (tr->has_stop_at()) return absl::InvalidArgumentError(p + "stop_at needs " + p + "stop_metric");
  } else {
    const std::string& m = tr->stop_metric();
    const size_t slash = m.find('/', 5);
    if (m.size() > 128 || m.rfind("eval/", 0) != 0 || slash == std::string::npos || slash + 1 >= m.size()) {
      return absl::InvalidArgumentError(p +
                                        "stop_metric must name an evaluation metric eval/<set>/<name> "
                                        "(e.g. eval/icl_rare/accuracy, eval/id/loss), got " +
                                        Quote(m));
    }
    if (!tr->has_stop_at() || !std::isfinite(tr->stop_at())) {
      return absl::InvalidArgumentError(p + "stop_at must be a finite number when stop_metric is set");
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveRecording(const SpecFamily& family, v1::ExperimentSpec* spec) {
  const uint64_t steps = spec->training().steps();
  auto* r = spec->mutable_recording();
  const std::string p = "recording.";
  auto clamp_default = [&](uint32_t d) { return static_cast<uint32_t>(std::min<uint64_t>(d, steps)); };
  const bool coordinates_every_given = r->has_coordinates_every();
  if (!r->has_metrics_every()) r->set_metrics_every(clamp_default(10));
  if (!r->has_eval_every()) r->set_eval_every(clamp_default(100));
  if (!r->has_eval_size()) r->set_eval_size(family.defaults().eval_size);
  if (!r->has_checkpoint_every()) r->set_checkpoint_every(clamp_default(250));
  if (!r->has_keep_checkpoints()) r->set_keep_checkpoints(0);
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "metrics_every", r->metrics_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "eval_every", r->eval_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "eval_size", r->eval_size(), 16, 65536));
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "checkpoint_every", r->checkpoint_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "keep_checkpoints", r->keep_checkpoints(), 0, 1000));
  return family.ResolveCoordinateRecording(spec, coordinates_every_given);
}

absl::Status ResolveTop(v1::ExperimentSpec* spec) {
  if (spec->name().size() > 200) {
    return absl::InvalidArgumentError("name must be at most 200 characters, got " +
                                      std::to_string(spec->name().size()));
  }
  if (HasControl(spec->name())) {
    return absl::InvalidArgumentError("name must not contain control characters (newlines, tabs, escapes), got " +
                                      Quote(spec->name()));
  }
  if (spec->name().empty()) spec->set_name(TaskName(spec->task()));
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
      return absl::InvalidArgumentError(field + " may only contain letters, digits and _.:=-, got " + Quote(tag));
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

int64_t ResidualWidth(const v1::ExperimentSpec& spec) { return SpecFamilyOf(spec).ResidualWidth(spec); }

int64_t ParameterCount(const v1::ExperimentSpec& spec) { return SpecFamilyOf(spec).ParameterCount(spec); }

uint64_t EstimateRunMemoryBytes(const v1::ExperimentSpec& spec) {
  return SpecFamilyOf(spec).EstimateRunMemoryBytes(spec);
}

absl::Status ResolveSpec(const EngineLimits& limits, v1::ExperimentSpec* spec) {
  CL_RETURN_IF_ERROR(ResolveTop(spec));
  CL_ASSIGN_OR_RETURN(const SpecFamily* family, ResolveFamily(spec));
  CL_RETURN_IF_ERROR(ResolveTask(*family, spec));
  CL_RETURN_IF_ERROR(ResolveData(spec));
  CL_RETURN_IF_ERROR(family->ResolveModel(spec));
  CL_RETURN_IF_ERROR(ResolveTraining(*family, limits, spec));
  CL_RETURN_IF_ERROR(ResolveRecording(*family, spec));
  const uint64_t need = family->EstimateRunMemoryBytes(*spec);
  if (need > limits.max_run_memory_bytes) {
    return absl::ResourceExhaustedError("this run needs about " + std::to_string(need >> 20) +
                                        " MiB, more than this server's --max-run-memory-mb (" +
                                        std::to_string(limits.max_run_memory_bytes >> 20) +
                                        " MiB); reduce training.batch_size, the model or the task size");
  }
  return absl::OkStatus();
}

std::string PackKey(const v1::ExperimentSpec& resolved) {
  v1::ExperimentSpec key = resolved;
  key.clear_name();
  key.clear_tags();
  key.clear_resources();
  SpecFamilyOf(resolved).ClearMemberSettings(&key);
  std::string out;
  {
    // Deterministic serialization: map fields (initial_coordinates) in key
    // order. The streams flush into `out` when they go out of scope.
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    key.SerializeToCodedStream(&coded);
  }
  return out;
}

bool PackableTogether(const v1::ExperimentSpec& a, const v1::ExperimentSpec& b) {
  return PackKey(a) == PackKey(b);
}

}  // namespace circuitlab::engine
