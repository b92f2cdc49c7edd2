#include "server/engine/spec.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>
#include <string>

#include "server/common/status_macros.h"
#include "server/common/text.h"

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

absl::Status CheckPositionMode(const std::string& field, v1::PositionMode* mode) {
  if (*mode == v1::POSITION_MODE_UNSPECIFIED) *mode = v1::POSITION_MODE_BLOCK_OFFSET;
  if (!v1::PositionMode_IsValid(*mode)) {
    return absl::InvalidArgumentError(field + " is not a known value: " + std::to_string(*mode));
  }
  return absl::OkStatus();
}

absl::Status AtLeast(const std::string& field, uint32_t value, uint32_t need, const std::string& why) {
  if (value < need) {
    return absl::InvalidArgumentError(field + " must be at least " + std::to_string(need) + " (" + why + "), got " +
                                      std::to_string(value));
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

// E2 (LATENT_KIND_REGRESSION) has its own fields; the token kinds' fields do
// not apply to it and its fields do not apply to them.
absl::Status ResolveRegression(v1::LatentTask* t) {
  const std::string p = "task.latent.";
  for (auto [name, set] : {std::pair{"num_states", t->has_num_states()}, std::pair{"dirichlet_alpha", t->has_dirichlet_alpha()},
                           std::pair{"dyck_length", t->has_dyck_length()}, std::pair{"repeat_prob", t->has_repeat_prob()}}) {
    if (set) {
      return absl::InvalidArgumentError(p + name + " does not apply to LATENT_KIND_REGRESSION (continuous tokens; "
                                        "set dim, noise_std and num_points), leave it unset");
    }
  }
  if (!t->has_dim()) t->set_dim(6);
  if (!t->has_noise_std()) t->set_noise_std(0.5);
  if (!t->has_num_points()) t->set_num_points(16);
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "dim", t->dim(), 1, 64));
  if (!(t->noise_std() > 0.0 && t->noise_std() <= 10.0)) {
    return absl::InvalidArgumentError(p + "noise_std must be in (0, 10], got " + Num(t->noise_std()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_points", t->num_points(), 1, 256));
  if (t->has_seq_len() && t->seq_len() != 3 * t->num_points()) {
    return absl::InvalidArgumentError(p + "seq_len of LATENT_KIND_REGRESSION is 3 * num_points = " +
                                      std::to_string(3 * t->num_points()) + " (x, |-, y per point), got " +
                                      std::to_string(t->seq_len()) + "; leave it unset");
  }
  t->set_seq_len(3 * t->num_points());
  return absl::OkStatus();
}

absl::Status ResolveLatent(v1::LatentTask* t) {
  const std::string p = "task.latent.";
  if (t->kind() == v1::LATENT_KIND_UNSPECIFIED) t->set_kind(v1::LATENT_KIND_DICE);
  if (!v1::LatentKind_IsValid(t->kind())) {
    return absl::InvalidArgumentError(p + "kind is not a known value: " + std::to_string(t->kind()) +
                                      " (LATENT_KIND_DICE, LATENT_KIND_REGRESSION, LATENT_KIND_MARKOV, "
                                      "LATENT_KIND_DYCK)");
  }
  if (!t->has_diversity()) t->set_diversity(-1);
  if (!t->has_p_minor()) t->set_p_minor(0.1);
  if (!t->has_num_majors()) t->set_num_majors(3);
  if (!t->has_num_ood()) t->set_num_ood(32);
  CL_RETURN_IF_ERROR(CheckRange<int32_t>(p + "diversity", t->diversity(), -1, 12));
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "p_minor", t->p_minor(), 0.0, 1.0));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_majors", t->num_majors(), 2, 16));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_ood", t->num_ood(), 1, 1024));
  if (t->kind() == v1::LATENT_KIND_REGRESSION) return ResolveRegression(t);
  for (auto [name, set] : {std::pair{"dim", t->has_dim()}, std::pair{"noise_std", t->has_noise_std()},
                           std::pair{"num_points", t->has_num_points()}}) {
    if (set) {
      return absl::InvalidArgumentError(p + name + " applies only to LATENT_KIND_REGRESSION, leave it unset");
    }
  }
  const bool dyck = t->kind() == v1::LATENT_KIND_DYCK;
  if (!t->has_num_states()) t->set_num_states(t->kind() == v1::LATENT_KIND_MARKOV ? 7 : 6);
  if (!t->has_seq_len()) t->set_seq_len(dyck ? 85 : 48);
  if (!t->has_dirichlet_alpha()) t->set_dirichlet_alpha(1.0);
  if (!t->has_dyck_length()) t->set_dyck_length(10);
  if (!t->has_repeat_prob()) t->set_repeat_prob(0.25);
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_states", t->num_states(), 2, 64));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "seq_len", t->seq_len(), 4, 1024));
  if (!(t->dirichlet_alpha() > 0.0 && t->dirichlet_alpha() <= 100.0)) {
    return absl::InvalidArgumentError(p + "dirichlet_alpha must be in (0, 100], got " + Num(t->dirichlet_alpha()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "dyck_length", t->dyck_length(), 1, 64));
  if (!(t->repeat_prob() > 0.0 && t->repeat_prob() <= 1.0)) {
    return absl::InvalidArgumentError(p + "repeat_prob must be in (0, 1], got " + Num(t->repeat_prob()));
  }
  return absl::OkStatus();
}

absl::Status ResolveTask(v1::ExperimentSpec* spec) {
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
    case v1::TaskSpec::kLatent: return ResolveLatent(task->mutable_latent());
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

constexpr int kMaxCoordinateNames = 100000;
// A basis is built for COORDINATES models and for every IMIR run that records
// coordinates: its cost is bounded before it is built (issue 14: one 300-byte
// request once cost 48 s and 4.7 GB). Building touches d0^2 entries per block
// kind; each coordinate costs ~250 bytes of labels.
constexpr int64_t kMaxBasisWidth = 2048;          // d0 = vocabulary + positions

// Refuses a basis of `selection` over the spec's task and model that would
// be too large to build; `why` says what needs it.
absl::Status CheckBasisCost(const v1::ExperimentSpec& spec, Selection selection, const std::string& why) {
  const TaskShape shape = ShapeOf(spec);
  const int64_t d0 = shape.vocab + shape.positions;
  if (d0 > kMaxBasisWidth) {
    return absl::InvalidArgumentError(why + " needs the IMIR basis, whose blocks are d0 x d0 with d0 = vocabulary + "
                                      "positions = " + std::to_string(d0) + "; at most " +
                                      std::to_string(kMaxBasisWidth) + " (a smaller task, or model.imir FULL with "
                                      "recording.coordinates_every 0)");
  }
  const auto& m = spec.model().imir();
  const int64_t n = BasisSize(DeclaredSymmetry(spec), m.num_layers(), m.num_heads(), selection);
  if (n > kMaxBasisCoordinates) {
    return absl::InvalidArgumentError(why + " needs the " + std::string(SelectionName(selection)) +
                                      " basis of this task and model, which has " + std::to_string(n) +
                                      " coordinates; at most " + std::to_string(kMaxBasisCoordinates) +
                                      " (fewer layers, heads or tokens, or the PAPER basis)");
  }
  return absl::OkStatus();
}

absl::Status ResolveCoordinates(const v1::ExperimentSpec& spec, v1::ImirModel* m) {
  const std::string p = "model.imir.";
  if (m->coordinate_basis() == v1::BASIS_SELECTION_UNSPECIFIED) m->set_coordinate_basis(v1::BASIS_SELECTION_PAPER);
  if (!v1::BasisSelection_IsValid(m->coordinate_basis())) {
    return absl::InvalidArgumentError(p + "coordinate_basis is not a known value: " +
                                      std::to_string(m->coordinate_basis()));
  }
  if (m->coordinate_scaling() == v1::COORDINATE_SCALING_UNSPECIFIED) {
    m->set_coordinate_scaling(v1::COORDINATE_SCALING_UNIT_NORM);
  }
  if (!v1::CoordinateScaling_IsValid(m->coordinate_scaling())) {
    return absl::InvalidArgumentError(p + "coordinate_scaling is not a known value: " +
                                      std::to_string(m->coordinate_scaling()));
  }
  if (m->coordinates_size() > kMaxCoordinateNames) {
    return absl::InvalidArgumentError(p + "coordinates must have at most " + std::to_string(kMaxCoordinateNames) +
                                      " entries, got " + std::to_string(m->coordinates_size()));
  }
  CL_RETURN_IF_ERROR(CheckBasisCost(spec,
                                    m->coordinate_basis() == v1::BASIS_SELECTION_COMPLETE ? Selection::kComplete
                                                                                          : Selection::kPaper,
                                    "model.imir.parameterisation COORDINATES"));
  const Basis basis = CoordinateBasisOf(spec);
  std::vector<bool> trained(basis.coords.size(), m->coordinates_size() == 0);
  for (int i = 0; i < m->coordinates_size(); ++i) {
    const int32_t id = FindCoordinate(basis, m->coordinates(i));
    const std::string field = p + "coordinates[" + std::to_string(i) + "]";
    if (id < 0) {
      return absl::InvalidArgumentError(field + " '" + m->coordinates(i) + "' is not a coordinate of the " +
                                        SelectionName(basis.selection) + " basis of this task and model (" +
                                        std::to_string(basis.coords.size()) +
                                        " coordinates; list them with `circuitlab project`)");
    }
    if (trained[static_cast<size_t>(id)]) {
      return absl::InvalidArgumentError(field + " '" + m->coordinates(i) + "' names " + basis.coords[id].label +
                                        " a second time");
    }
    trained[static_cast<size_t>(id)] = true;
  }
  for (const auto& [name, value] : m->initial_coordinates()) {
    const int32_t id = FindCoordinate(basis, name);
    const std::string field = p + "initial_coordinates['" + name + "']";
    if (id < 0 || !trained[static_cast<size_t>(id)]) {
      return absl::InvalidArgumentError(field + (id < 0 ? " is not a coordinate of the basis"
                                                        : " is not one of model.imir.coordinates"));
    }
    if (!std::isfinite(value) || std::abs(value) > 1e6) {
      return absl::InvalidArgumentError(field + " must be finite and in [-1e6, 1e6], got " + Num(value));
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveDecoder(v1::ExperimentSpec* spec) {
  auto* m = spec->mutable_model()->mutable_decoder();
  const std::string p = "model.decoder.";
  if (!IsLatent(*spec)) {
    return absl::InvalidArgumentError("model.decoder is the model of task.latent; task." + TaskName(spec->task()) +
                                      " trains on model.imir");
  }
  const bool regression = spec->task().latent().kind() == v1::LATENT_KIND_REGRESSION;
  if (!m->has_num_layers()) m->set_num_layers(2);
  if (!m->has_d_model()) m->set_d_model(48);
  if (!m->has_num_heads()) m->set_num_heads(2);
  if (!m->has_mlp_width()) m->set_mlp_width(4 * std::min<uint32_t>(m->d_model(), 2048));
  if (m->activation() == v1::ACTIVATION_UNSPECIFIED) {
    m->set_activation(regression ? v1::ACTIVATION_GELU : v1::ACTIVATION_SILU);
  }
  if (!m->has_attention_bias()) m->set_attention_bias(regression);
  if (!m->has_final_layernorm()) m->set_final_layernorm(regression);
  if (!m->has_init_std()) m->set_init_std(0.02);
  if (!m->has_rope_base()) m->set_rope_base(10000.0);
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_layers", m->num_layers(), 1, 24));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "d_model", m->d_model(), 4, 1024));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_heads", m->num_heads(), 1, 16));
  if (m->d_model() % (2 * m->num_heads()) != 0) {
    return absl::InvalidArgumentError(p + "d_model must be a multiple of 2 * num_heads (RoPE rotates pairs of a "
                                      "head's dimensions), got d_model " + std::to_string(m->d_model()) +
                                      " and num_heads " + std::to_string(m->num_heads()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "mlp_width", m->mlp_width(), 1, 8192));
  if (!v1::Activation_IsValid(m->activation())) {
    return absl::InvalidArgumentError(p + "activation is not a known value: " + std::to_string(m->activation()));
  }
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "init_std", m->init_std(), 0.0, 1.0));
  return CheckRange<double>(p + "rope_base", m->rope_base(), 2.0, 1e7);
}

absl::Status ResolveModel(v1::ExperimentSpec* spec) {
  if (spec->model().kind_case() == v1::ModelSpec::KIND_NOT_SET) {
    if (IsLatent(*spec)) {
      spec->mutable_model()->mutable_decoder();
    } else {
      spec->mutable_model()->mutable_imir();
    }
  }
  if (spec->model().kind_case() == v1::ModelSpec::kDecoder) return ResolveDecoder(spec);
  if (IsLatent(*spec)) {
    return absl::InvalidArgumentError("model.imir needs a block-list task; task.latent trains on model.decoder");
  }
  auto* m = spec->mutable_model()->mutable_imir();
  const std::string p = "model.imir.";
  if (!m->has_num_layers()) m->set_num_layers(2);
  if (!m->has_num_heads()) m->set_num_heads(1);
  if (m->parameterisation() == v1::PARAMETERISATION_UNSPECIFIED) m->set_parameterisation(v1::PARAMETERISATION_FULL);
  if (m->init() == v1::INIT_SCHEME_UNSPECIFIED) m->set_init(v1::INIT_SCHEME_NORMAL);
  if (!m->has_init_std()) m->set_init_std(0.01);

  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_layers", m->num_layers(), 1, 6));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_heads", m->num_heads(), 1, 8));
  if (!v1::Parameterisation_IsValid(m->parameterisation())) {
    return absl::InvalidArgumentError(p + "parameterisation is not a known value: " +
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
  if (m->parameterisation() == v1::PARAMETERISATION_COORDINATES) {
    CL_RETURN_IF_ERROR(ResolveCoordinates(*spec, m));
  } else {
    if (m->init() == v1::INIT_SCHEME_PROJECTED) {
      return absl::InvalidArgumentError(p + "init INIT_SCHEME_PROJECTED needs parameterisation "
                                        "PARAMETERISATION_COORDINATES");
    }
    if (m->coordinates_size() > 0 || !m->initial_coordinates().empty() || m->coordinate_basis() != 0 ||
        m->coordinate_scaling() != 0) {
      return absl::InvalidArgumentError(p + "coordinates, initial_coordinates, coordinate_basis and "
                                        "coordinate_scaling need parameterisation PARAMETERISATION_COORDINATES");
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveTraining(const EngineLimits& limits, v1::ExperimentSpec* spec) {
  auto* tr = spec->mutable_training();
  const std::string p = "training.";
  const bool latent = IsLatent(*spec);
  // E2's defaults follow SCIENCE.md B.4 (TV-small-E2): AdamW 5e-4, batch 64,
  // clipping 1.0, squared error on the y positions.
  const bool regression = latent && spec->task().latent().kind() == v1::LATENT_KIND_REGRESSION;
  if (tr->optimizer() == v1::OPTIMIZER_KIND_UNSPECIFIED) {
    tr->set_optimizer(latent ? v1::OPTIMIZER_KIND_ADAMW : v1::OPTIMIZER_KIND_SGD);
  }
  if (!v1::OptimizerKind_IsValid(tr->optimizer())) {
    return absl::InvalidArgumentError(p + "optimizer is not a known value: " + std::to_string(tr->optimizer()));
  }
  if (!tr->has_learning_rate()) {
    tr->set_learning_rate(tr->optimizer() == v1::OPTIMIZER_KIND_SGD ? 2.0 : (regression ? 5e-4 : 1e-3));
  }
  if (!tr->has_batch_size()) tr->set_batch_size(regression ? 64 : (latent ? 32 : 256));
  if (tr->schedule() == v1::LR_SCHEDULE_UNSPECIFIED) {
    tr->set_schedule(latent ? v1::LR_SCHEDULE_TRIANGLE : v1::LR_SCHEDULE_CONSTANT);
  }
  if (!v1::LrSchedule_IsValid(tr->schedule())) {
    return absl::InvalidArgumentError(p + "schedule is not a known value: " + std::to_string(tr->schedule()));
  }
  if (!tr->has_warmup_fraction()) tr->set_warmup_fraction(0.1);
  if (!tr->has_min_learning_rate()) tr->set_min_learning_rate(std::min(1e-5, tr->learning_rate()));
  if (!tr->has_grad_clip()) tr->set_grad_clip(regression ? 1.0 : 0.0);
  if (!tr->has_steps()) tr->set_steps(std::min<uint64_t>(1000, limits.max_steps));
  if (!tr->has_momentum()) tr->set_momentum(0.0);
  if (!tr->has_adam_beta1()) tr->set_adam_beta1(0.9);
  if (!tr->has_adam_beta2()) tr->set_adam_beta2(0.999);
  if (!tr->has_weight_decay()) tr->set_weight_decay(0.0);
  if (tr->loss() == v1::LOSS_KIND_UNSPECIFIED) {
    tr->set_loss(regression ? v1::LOSS_KIND_MSE : v1::LOSS_KIND_CROSS_ENTROPY);
  }
  if (!v1::LossKind_IsValid(tr->loss())) {
    return absl::InvalidArgumentError(p + "loss is not a known value: " + std::to_string(tr->loss()));
  }

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
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "warmup_fraction", tr->warmup_fraction(), 0.0, 1.0));
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "min_learning_rate", tr->min_learning_rate(), 0.0, tr->learning_rate()));
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "grad_clip", tr->grad_clip(), 0.0, 1e6));
  if (regression && tr->loss() != v1::LOSS_KIND_MSE) {
    return absl::InvalidArgumentError(p + "loss must be LOSS_KIND_MSE for LATENT_KIND_REGRESSION (squared error "
                                      "of the prediction of every y_i)");
  }
  if (latent && !regression && tr->loss() != v1::LOSS_KIND_CROSS_ENTROPY) {
    return absl::InvalidArgumentError(p + "loss must be LOSS_KIND_CROSS_ENTROPY for task.latent (next-token "
                                      "cross-entropy on every position)");
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

absl::Status ResolveRecording(v1::ExperimentSpec* spec) {
  const uint64_t steps = spec->training().steps();
  auto* r = spec->mutable_recording();
  const std::string p = "recording.";
  auto clamp_default = [&](uint32_t d) { return static_cast<uint32_t>(std::min<uint64_t>(d, steps)); };
  if (!r->has_metrics_every()) r->set_metrics_every(clamp_default(10));
  if (!r->has_eval_every()) r->set_eval_every(clamp_default(100));
  const bool latent = IsLatent(*spec);
  if (!r->has_eval_size()) r->set_eval_size(latent ? 512 : 2048);
  if (!r->has_checkpoint_every()) r->set_checkpoint_every(clamp_default(250));
  if (!r->has_keep_checkpoints()) r->set_keep_checkpoints(0);
  if (!r->has_coordinates_every()) r->set_coordinates_every(latent ? 0 : r->eval_every());
  if (latent && (r->coordinates_every() != 0 || r->complete_coordinates())) {
    return absl::InvalidArgumentError(p + "coordinates_every and complete_coordinates record IMIR coordinates; "
                                      "model.decoder has none (leave them unset or 0)");
  }
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "metrics_every", r->metrics_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "eval_every", r->eval_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "eval_size", r->eval_size(), 16, 65536));
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "checkpoint_every", r->checkpoint_every(), 1, steps));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "keep_checkpoints", r->keep_checkpoints(), 0, 1000));
  CL_RETURN_IF_ERROR(CheckRange<uint64_t>(p + "coordinates_every", r->coordinates_every(), 0, steps));
  return absl::OkStatus();
}

// Recording coordinates builds the basis: asked for explicitly, one too
// large to build is refused; by default, such a run records none.
absl::Status ResolveRecordedBasis(v1::ExperimentSpec* spec, bool coordinates_every_given) {
  auto* r = spec->mutable_recording();
  if (IsLatent(*spec) || r->coordinates_every() == 0) return absl::OkStatus();
  const std::string p = "recording.";
  absl::Status paper = CheckBasisCost(*spec, Selection::kPaper, p + "coordinates_every");
  if (!paper.ok() && !coordinates_every_given && !r->complete_coordinates()) {
    r->set_coordinates_every(0);
    return absl::OkStatus();
  }
  CL_RETURN_IF_ERROR(paper);
  if (r->complete_coordinates()) {
    CL_RETURN_IF_ERROR(CheckBasisCost(*spec, Selection::kComplete, p + "complete_coordinates"));
  }
  return absl::OkStatus();
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

int64_t ResidualWidth(const v1::ExperimentSpec& spec) {
  if (spec.model().kind_case() == v1::ModelSpec::kDecoder) return spec.model().decoder().d_model();
  const TaskShape s = ShapeOf(spec);
  const auto& m = spec.model().imir();
  int64_t width = s.vocab + s.positions;
  for (uint32_t l = 0; l < m.num_layers(); ++l) width *= (m.num_heads() + 1);
  return width;
}

Basis CoordinateBasisOf(const v1::ExperimentSpec& spec) {
  const auto& m = spec.model().imir();
  return BuildBasis(DeclaredSymmetry(spec), m.num_layers(), m.num_heads(),
                    m.coordinate_basis() == v1::BASIS_SELECTION_COMPLETE ? Selection::kComplete : Selection::kPaper);
}

std::vector<int32_t> TrainedCoordinates(const v1::ExperimentSpec& spec, const Basis& basis) {
  const auto& m = spec.model().imir();
  std::vector<bool> trained(basis.coords.size(), m.coordinates_size() == 0);
  for (const std::string& name : m.coordinates()) {
    const int32_t id = FindCoordinate(basis, name);
    if (id >= 0) trained[static_cast<size_t>(id)] = true;
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i < trained.size(); ++i) {
    if (trained[i]) out.push_back(static_cast<int32_t>(i));
  }
  return out;
}

int64_t ParameterCount(const v1::ExperimentSpec& spec) {
  const TaskShape s = ShapeOf(spec);
  if (spec.model().kind_case() == v1::ModelSpec::kDecoder) {
    const auto& m = spec.model().decoder();
    const int64_t d = m.d_model(), f = m.mlp_width();
    // Per block: two LayerNorms, q/k/v/o (and their biases), the MLP with biases.
    const int64_t block = 4 * d + 4 * d * d + (m.attention_bias() ? 4 * d : 0) + 2 * d * f + f + d;
    const int64_t final_ln = m.final_layernorm() ? 2 * d : 0;
    const v1::LatentTask& t = spec.task().latent();
    if (t.kind() == v1::LATENT_KIND_REGRESSION) {
      // Read-in (dim + 1 -> d) and the pad vector; a bias-free scalar head.
      const int64_t in = int64_t{t.dim()} + 1;
      return in * d + in + m.num_layers() * block + final_ln + d;
    }
    return s.vocab * d + m.num_layers() * block + final_ln + d * s.vocab + s.vocab;
  }
  const auto& m = spec.model().imir();
  if (m.parameterisation() == v1::PARAMETERISATION_COORDINATES) {
    return m.coordinates_size() > 0 ? m.coordinates_size()
                                    : static_cast<int64_t>(CoordinateBasisOf(spec).coords.size());
  }
  int64_t d = s.vocab + s.positions, params = 0;
  for (uint32_t l = 0; l < m.num_layers(); ++l) {
    params += int64_t{m.num_heads()} * d * d;
    d *= (m.num_heads() + 1);
  }
  return params + s.vocab * d;
}

uint64_t EstimateRunMemoryBytes(const v1::ExperimentSpec& spec) {
  const TaskShape s = ShapeOf(spec);
  if (spec.model().kind_case() == v1::ModelSpec::kDecoder) {
    const auto& m = spec.model().decoder();
    const double t = static_cast<double>(s.seq_len), d = m.d_model(), f = m.mlp_width();
    // Per block and token: LN outputs, q/k/v/attention output, MLP hidden
    // before and after the activation; per head the T x T scores and softmax.
    auto per_block = [&](double batch) {
      return batch * t * (10.0 * d + 2.0 * f) + 2.0 * batch * m.num_heads() * t * t;
    };
    const double logits = 3.0 * t * static_cast<double>(s.vocab);
    const double batch = spec.training().batch_size();
    // Training keeps every block's activations and their gradients;
    // evaluation (no autograd) one block at a time, kLatentEvalChunk sequences.
    const double train = 2.0 * (m.num_layers() * per_block(batch) + batch * logits);
    const double eval = 2.0 * (per_block(kLatentEvalChunk) + kLatentEvalChunk * logits);
    const double params = static_cast<double>(ParameterCount(spec));
    // Evaluation sets: tokens (int64) and the reference predictor's log-probs
    // (float64) for at most three sets; their Bayes laws in chunks of 64.
    double eval_sets = 3.0 * spec.recording().eval_size() * t * 16.0 + 64.0 * t * 24.0 * s.vocab;
    if (spec.task().latent().kind() == v1::LATENT_KIND_REGRESSION) {
      // x and y (float32) and two reference predictions (float64) per point;
      // the known-pool posterior per point and task, 64 sequences at a time.
      const auto& lt = spec.task().latent();
      const double points = lt.num_points(), tasks = lt.num_majors() + (lt.diversity() >= 0 ? 1u << lt.diversity() : 0);
      eval_sets = 3.0 * spec.recording().eval_size() * points * (4.0 * (lt.dim() + 1) + 16.0) +
                  64.0 * points * tasks * 24.0;
    }
    return static_cast<uint64_t>(4.0 * (4.0 * params + train + eval) + eval_sets);
  }
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
  double params = static_cast<double>(ParameterCount(spec));
  if (m.parameterisation() == v1::PARAMETERISATION_COORDINATES) {
    // The dense matrices are materialised from the coefficients every step
    // (with their gradients), as large as a FULL model's parameters.
    v1::ExperimentSpec full = spec;
    full.mutable_model()->mutable_imir()->set_parameterisation(v1::PARAMETERISATION_FULL);
    params += static_cast<double>(ParameterCount(full)) / 2.0;
  }
  // Generators draw random permutations of their token pools (and, for
  // associative recall, Gumbel keys over the pairs) per sequence: float64
  // keys plus int64 indices, for a batch or an evaluation chunk at a time.
  const double sampling = 16.0 * batch * (static_cast<double>(s.vocab) + 4.0 * t);
  // Evaluation sets are kept for the whole run: tokens, ids, block index per
  // position (int64) for each of at most five sets.
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
  const bool coordinates_every_given = spec->recording().has_coordinates_every();
  CL_RETURN_IF_ERROR(ResolveRecording(spec));
  CL_RETURN_IF_ERROR(ResolveRecordedBasis(spec, coordinates_every_given));
  const uint64_t need = EstimateRunMemoryBytes(*spec);
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
  key.clear_seed();
  key.clear_resources();
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
