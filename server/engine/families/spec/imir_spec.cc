// The imir family, torch-free: model.imir's defaults and checks, its
// coordinate basis and what recording coordinates costs, its sizes.
#include "server/engine/families/spec/imir_spec.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "server/common/field_checks.h"
#include "server/common/status_macros.h"
#include "server/engine/families/spec/spec_family.h"
#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {
namespace {

constexpr int64_t kMaxResidualWidth = 1 << 16;
constexpr int kMaxCoordinateNames = 100000;
// A basis is built for COORDINATES models and for every IMIR run that records
// coordinates: its cost is bounded before it is built (issue 14: one 300-byte
// request once cost 48 s and 4.7 GB). Building touches d0^2 entries per block
// kind; each coordinate costs ~250 bytes of labels.
constexpr int64_t kMaxBasisWidth = 2048;  // d0 = vocabulary + positions

// Refuses a basis of `selection` over the spec's task and model that would
// be too large to build; `why` says what needs it.
absl::Status CheckBasisCost(const v1::ExperimentSpec& spec, Selection selection, const std::string& why) {
  const TaskShape shape = ShapeOf(spec);
  const int64_t d0 = shape.vocab + shape.positions;
  if (d0 > kMaxBasisWidth) {
    return absl::InvalidArgumentError(why +
                                      " needs the IMIR basis, whose blocks are d0 x d0 with d0 = vocabulary + "
                                      "positions = " +
                                      std::to_string(d0) + "; at most " + std::to_string(kMaxBasisWidth) +
                                      " (a smaller task, or model.imir FULL with "
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
    return absl::InvalidArgumentError(
        p + "coordinate_basis is not a known value: " + std::to_string(m->coordinate_basis()));
  }
  if (m->coordinate_scaling() == v1::COORDINATE_SCALING_UNSPECIFIED) {
    m->set_coordinate_scaling(v1::COORDINATE_SCALING_UNIT_NORM);
  }
  if (!v1::CoordinateScaling_IsValid(m->coordinate_scaling())) {
    return absl::InvalidArgumentError(
        p + "coordinate_scaling is not a known value: " + std::to_string(m->coordinate_scaling()));
  }
  if (m->coordinates_size() > kMaxCoordinateNames) {
    return absl::InvalidArgumentError(p + "coordinates must have at most " + std::to_string(kMaxCoordinateNames) +
                                      " entries, got " + std::to_string(m->coordinates_size()));
  }
  CL_RETURN_IF_ERROR(CheckBasisCost(
      spec, m->coordinate_basis() == v1::BASIS_SELECTION_COMPLETE ? Selection::kComplete : Selection::kPaper,
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
      return absl::InvalidArgumentError(
          field + (id < 0 ? " is not a coordinate of the basis" : " is not one of model.imir.coordinates"));
    }
    if (!std::isfinite(value) || std::abs(value) > 1e6) {
      return absl::InvalidArgumentError(field + " must be finite and in [-1e6, 1e6], got " + FormatNumber(value));
    }
  }
  return absl::OkStatus();
}

class Imir final : public SpecFamily {
 public:
  std::string_view name() const override { return "imir"; }
  const FamilyDefaults& defaults() const override {
    static const FamilyDefaults d;  // SGD, constant rate, batch 256, cross-entropy or MSE
    return d;
  }

  absl::Status ResolveModel(v1::ExperimentSpec* spec) const override {
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
      return absl::InvalidArgumentError(
          p + "parameterisation is not a known value: " + std::to_string(m->parameterisation()));
    }
    if (!v1::InitScheme_IsValid(m->init())) {
      return absl::InvalidArgumentError(p + "init is not a known value: " + std::to_string(m->init()));
    }
    CL_RETURN_IF_ERROR(CheckRange<double>(p + "init_std", m->init_std(), 0.0, 1.0));
    const int64_t width = ResidualWidth(*spec);
    if (width > kMaxResidualWidth) {
      return absl::InvalidArgumentError(
          "model residual width (num_heads+1)^num_layers * (vocabulary + positions) = " + std::to_string(width) +
          " exceeds " + std::to_string(kMaxResidualWidth) + "; use fewer layers/heads or a smaller vocabulary");
    }
    if (m->parameterisation() == v1::PARAMETERISATION_COORDINATES) return ResolveCoordinates(*spec, m);
    if (m->init() == v1::INIT_SCHEME_PROJECTED) {
      return absl::InvalidArgumentError(p +
                                        "init INIT_SCHEME_PROJECTED needs parameterisation "
                                        "PARAMETERISATION_COORDINATES");
    }
    if (m->coordinates_size() > 0 || !m->initial_coordinates().empty() || m->coordinate_basis() != 0 ||
        m->coordinate_scaling() != 0) {
      return absl::InvalidArgumentError(p +
                                        "coordinates, initial_coordinates, coordinate_basis and "
                                        "coordinate_scaling need parameterisation PARAMETERISATION_COORDINATES");
    }
    return absl::OkStatus();
  }

  // Coordinates are recorded every evaluation by default. Recording them
  // builds the basis: asked for explicitly, one too large to build is
  // refused; by default, such a run records none.
  absl::Status ResolveCoordinateRecording(v1::ExperimentSpec* spec, bool given) const override {
    auto* r = spec->mutable_recording();
    const std::string p = "recording.";
    if (!given) r->set_coordinates_every(r->eval_every());
    CL_RETURN_IF_ERROR(
        CheckRange<uint64_t>(p + "coordinates_every", r->coordinates_every(), 0, spec->training().steps()));
    if (r->coordinates_every() == 0) return absl::OkStatus();
    absl::Status paper = CheckBasisCost(*spec, Selection::kPaper, p + "coordinates_every");
    if (!paper.ok() && !given && !r->complete_coordinates()) {
      r->set_coordinates_every(0);
      return absl::OkStatus();
    }
    CL_RETURN_IF_ERROR(paper);
    if (r->complete_coordinates()) {
      CL_RETURN_IF_ERROR(CheckBasisCost(*spec, Selection::kComplete, p + "complete_coordinates"));
    }
    return absl::OkStatus();
  }

  // d_L = (H+1)^L (V+P).
  int64_t ResidualWidth(const v1::ExperimentSpec& spec) const override {
    const TaskShape s = ShapeOf(spec);
    const auto& m = spec.model().imir();
    int64_t width = s.vocab + s.positions;
    for (uint32_t l = 0; l < m.num_layers(); ++l) width *= (m.num_heads() + 1);
    return width;
  }

  int64_t ParameterCount(const v1::ExperimentSpec& spec) const override {
    const TaskShape s = ShapeOf(spec);
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

  uint64_t EstimateRunMemoryBytes(const v1::ExperimentSpec& spec) const override {
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

  int64_t NumHeads(const v1::ExperimentSpec& spec) const override { return spec.model().imir().num_heads(); }
  bool has_coordinates() const override { return true; }
  bool PacksOnCpu(const v1::ExperimentSpec& resolved) const override { return resolved.training().batch_size() <= 32; }
  // Initial coordinates only set the members' starting values (the phase
  // diagram's axes). A coordinate model trains on the basis of its task's
  // symmetry, and associative recall draws its common pairs (the basis' C
  // relation) from the seed: such a model packs with its own seed only.
  void ClearMemberSettings(v1::ExperimentSpec* key) const override {
    v1::ImirModel* m = key->mutable_model()->mutable_imir();
    m->clear_initial_coordinates();
    const bool seeded_basis = m->parameterisation() == v1::PARAMETERISATION_COORDINATES &&
                              key->task().has_associative_recall() && key->task().associative_recall().num_common() > 0;
    if (!seeded_basis) key->clear_seed();
  }
};

}  // namespace

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

const SpecFamily& ImirSpecFamily() {
  static const Imir family;
  return family;
}

}  // namespace circuitlab::engine
