#include "server/scheduler/analyses/analysis_util.h"

#include <algorithm>

#include "server/common/text.h"
#include "server/engine/families/spec/spec_family.h"
#include "server/engine/spec.h"

namespace circuitlab::scheduler {

engine::Selection ToSelection(v1::BasisSelection s) {
  return s == v1::BASIS_SELECTION_COMPLETE ? engine::Selection::kComplete : engine::Selection::kPaper;
}

absl::Status CheckSelection(v1::BasisSelection s) {
  if (!v1::BasisSelection_IsValid(s)) {
    return absl::InvalidArgumentError("selection is not a known value: " + std::to_string(s));
  }
  return absl::OkStatus();
}

void FillCoordinate(const store::CoordinateDefRow& d, double value, v1::Coordinate* c) {
  c->set_label(d.label);
  c->set_canonical(d.canonical);
  c->set_matrix(d.matrix);
  c->set_layer(static_cast<uint32_t>(d.layer));
  c->set_head(static_cast<uint32_t>(d.head));
  c->set_block_q(d.block_q);
  c->set_block_k(d.block_k);
  c->set_element(d.element);
  c->set_value(value);
  c->set_magnitude(value * d.norm);
  c->set_gauge(d.gauge);
}

absl::Status NeedsCoordinates(const v1::ExperimentSpec& spec, const std::string& what) {
  const engine::SpecFamily& family = engine::SpecFamilyOf(spec);
  if (family.has_coordinates()) return absl::OkStatus();
  return absl::FailedPreconditionError(what + " needs an IMIR model (model.imir); this run trains model.decoder on "
                                       "task.latent (the " + std::string(family.name()) +
                                       " family, no IMIR coordinates): ask AnalyzeTaskVectors (circuitlab "
                                       "task-vectors)");
}

uint64_t JobMemory(const v1::ExperimentSpec& spec, uint64_t extra) {
  return engine::EstimateRunMemoryBytes(spec) + extra;
}

absl::Status CheckEvalSize(uint32_t n, uint32_t min, const std::string& field) {
  if (n != 0 && (n < min || n > kMaxEval)) {
    return absl::InvalidArgumentError(field + " must be in [" + std::to_string(min) + ", " + std::to_string(kMaxEval) +
                                      "] (0 = default), got " + std::to_string(n));
  }
  return absl::OkStatus();
}

absl::Status CheckEvalSet(engine::Analyzer& analyzer, const v1::ExperimentSpec& spec, const std::string& name,
                          const std::string& field) {
  const std::vector<std::string> sets = analyzer.EvalSets(spec);
  if (sets.empty() || std::find(sets.begin(), sets.end(), name) != sets.end()) return absl::OkStatus();
  std::string names;
  for (const std::string& s : sets) names += (names.empty() ? "" : ", ") + s;
  return absl::InvalidArgumentError(field + " must name one of this run's evaluation sets (" + names + "), got " +
                                    Quote(name));
}

absl::Status CheckSequenceShape(const google::protobuf::RepeatedPtrField<v1::InputSequence>& seqs,
                                const std::string& field) {
  if (seqs.empty() || seqs.size() > kMaxUserSequences) {
    return absl::InvalidArgumentError(field + " must have 1 to " + std::to_string(kMaxUserSequences) +
                                      " entries, got " + std::to_string(seqs.size()));
  }
  const int T = seqs[0].tokens_size();
  for (int b = 0; b < seqs.size(); ++b) {
    const std::string at = field + "[" + std::to_string(b) + "]";
    const int n = seqs[b].tokens_size();
    if (n < 1 || n > kMaxUserLength) {
      return absl::InvalidArgumentError(at + ".tokens must have 1 to " + std::to_string(kMaxUserLength) +
                                        " ids, got " + std::to_string(n));
    }
    if (n != T) {
      return absl::InvalidArgumentError(at + " has " + std::to_string(n) + " tokens, " + field + "[0] " +
                                        std::to_string(T) + ": every sequence of a request has the same length");
    }
    if (seqs[b].positions_size() > kMaxUserLength) {
      return absl::InvalidArgumentError(at + ".positions must have at most " + std::to_string(kMaxUserLength) +
                                        " ids");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSequencesFit(const v1::ExperimentSpec& spec,
                               const google::protobuf::RepeatedPtrField<v1::InputSequence>& seqs,
                               const std::string& field, const std::string& what) {
  if (engine::SpecFamilyOf(spec).ContinuousInputWidth(spec) > 0) {
    return absl::FailedPreconditionError(
        what + " reads IMIR and latent-task decoder runs, whose inputs are tokens; this run's decoder reads "
        "continuous vectors (the regression family)");
  }
  const engine::TaskShape shape = engine::ShapeOf(spec);
  const bool imir = engine::SpecFamilyOf(spec).has_coordinates();  // the IMIR block model
  const int64_t vocab = shape.vocab;
  const int64_t T = seqs[0].tokens_size();
  if (!imir && T > shape.seq_len) {
    return absl::InvalidArgumentError(field + " have " + std::to_string(T) + " tokens; this model reads at most " +
                                      std::to_string(shape.seq_len) + " (its context length)");
  }
  for (int b = 0; b < seqs.size(); ++b) {
    const v1::InputSequence& s = seqs[b];
    const std::string at = field + "[" + std::to_string(b) + "]";
    for (int t = 0; t < s.tokens_size(); ++t) {
      if (s.tokens(t) < 0 || s.tokens(t) >= vocab) {
        return absl::InvalidArgumentError(at + ".tokens[" + std::to_string(t) + "] must be in [0, " +
                                          std::to_string(vocab - 1) + "] (this model's vocabulary), got " +
                                          std::to_string(s.tokens(t)));
      }
    }
    if (!imir && s.positions_size() > 0) {
      return absl::InvalidArgumentError(at + ".positions: a decoder's positions are implicit (RoPE); send tokens only");
    }
    if (imir && s.positions_size() != s.tokens_size()) {
      return absl::InvalidArgumentError(at + ".positions must have one position id per token (" +
                                        std::to_string(s.tokens_size()) + "), got " +
                                        std::to_string(s.positions_size()) +
                                        ": the IMIR model reads a token and a position id at every position");
    }
    for (int t = 0; imir && t < s.positions_size(); ++t) {
      if (s.positions(t) < 0 || s.positions(t) >= shape.positions) {
        return absl::InvalidArgumentError(at + ".positions[" + std::to_string(t) + "] must be in [0, " +
                                          std::to_string(shape.positions - 1) + "] (this model's position ids), got " +
                                          std::to_string(s.positions(t)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace circuitlab::scheduler
