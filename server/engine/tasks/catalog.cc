#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {
namespace {

bool Absolute(v1::PositionMode mode) { return mode == v1::POSITION_MODE_ABSOLUTE; }

// Symmetry with the four specials as singleton classes followed by `classes`
// (name, size) in vocabulary order.
TaskSymmetry Layout(const std::vector<std::pair<std::string, int64_t>>& classes) {
  TaskSymmetry s;
  s.class_names = {"FILL", "SEP", "QRY", "GIVE"};
  for (int c = 0; c < kNumSpecials; ++c) s.token_class.push_back(c);
  for (const auto& [name, size] : classes) {
    const int id = static_cast<int>(s.class_names.size());
    s.class_names.push_back(name);
    s.token_class.insert(s.token_class.end(), static_cast<size_t>(size), id);
  }
  s.partner.assign(s.token_class.size(), -1);
  s.heldout.assign(s.token_class.size(), false);
  return s;
}

}  // namespace

std::string TaskName(const v1::TaskSpec& task) {
  switch (task.kind_case()) {
    case v1::TaskSpec::kKHop: return "k_hop";
    case v1::TaskSpec::kNgram: return "ngram";
    case v1::TaskSpec::kIoi: return "ioi";
    case v1::TaskSpec::kConditionalRetrieval: return "conditional_retrieval";
    case v1::TaskSpec::kPermutationInversion: return "permutation_inversion";
    case v1::TaskSpec::kMinimalIcl: return "minimal_icl";
    case v1::TaskSpec::kLatent: return "latent";
    default: return "associative_recall";
  }
}

TaskShape ShapeOf(const v1::ExperimentSpec& spec) {
  const auto& task = spec.task();
  TaskShape s;
  bool absolute = true;
  int64_t positions = 0;
  switch (task.kind_case()) {
    case v1::TaskSpec::kKHop: {
      const auto& t = task.k_hop();
      s.vocab = kNumSpecials + t.num_tokens();
      s.seq_len = 2 + 2 * int64_t{t.num_blocks()};
      absolute = Absolute(t.position_mode());
      positions = t.num_positions();
      break;
    }
    case v1::TaskSpec::kNgram: {
      const auto& t = task.ngram();
      s.vocab = kNumSpecials + t.alphabet();
      s.seq_len = 1 + int64_t{t.length()};
      break;
    }
    case v1::TaskSpec::kIoi: {
      const auto& t = task.ioi();
      s.vocab = kNumSpecials + t.num_names();
      s.seq_len = 6 + int64_t{t.max_fillers()};
      break;
    }
    case v1::TaskSpec::kConditionalRetrieval: {
      const auto& t = task.conditional_retrieval();
      s.vocab = kNumSpecials + t.num_tags() + t.num_tokens();
      s.seq_len = 3 + 3 * int64_t{t.num_blocks()};
      absolute = Absolute(t.position_mode());
      positions = t.num_positions();
      break;
    }
    case v1::TaskSpec::kPermutationInversion: {
      const auto& t = task.permutation_inversion();
      s.vocab = kNumSpecials + t.num_tokens();
      s.seq_len = 2 + 2 * int64_t{t.num_blocks()};
      absolute = Absolute(t.position_mode());
      positions = t.num_positions();
      break;
    }
    case v1::TaskSpec::kMinimalIcl: {
      const auto& t = task.minimal_icl();
      s.vocab = kNumSpecials + t.num_items() + t.num_labels();
      s.seq_len = 2 + 2 * int64_t{t.num_pairs()};
      break;
    }
    case v1::TaskSpec::kLatent: {
      const auto& t = task.latent();
      s.vocab = LatentVocab(t);
      s.seq_len = t.seq_len();
      break;
    }
    default: {
      const auto& t = task.associative_recall();
      s.vocab = kNumSpecials + int64_t{t.num_common()} + t.num_rare() + t.num_heldout();
      const int64_t n = t.num_blocks(), k = t.block_length();
      s.seq_len = 1 + n * (k + spec.data().max_gap()) + (k - 1);
      absolute = Absolute(t.position_mode());
      positions = t.num_positions();
    }
  }
  s.positions = absolute ? s.seq_len : positions;
  return s;
}

int64_t LatentVocab(const v1::LatentTask& t) {
  if (t.kind() == v1::LATENT_KIND_REGRESSION) return 1;  // the scalar prediction
  return int64_t{t.num_states()} + (t.kind() == v1::LATENT_KIND_DYCK ? 2 : 0);
}

TaskSymmetry AssocRecallSymmetry(int64_t num_common, int64_t num_rare, int64_t num_heldout, int64_t block_length,
                                 int64_t positions, bool absolute_positions) {
  TaskSymmetry s = Layout({{"common", num_common}, {"rare", num_rare}, {"heldout", num_heldout}});
  for (int64_t i = 0; i + 1 < num_common; i += 2) {
    s.partner[kNumSpecials + i] = static_cast<int>(kNumSpecials + i + 1);
    s.partner[kNumSpecials + i + 1] = static_cast<int>(kNumSpecials + i);
  }
  for (size_t i = static_cast<size_t>(kNumSpecials + num_common + num_rare); i < s.heldout.size(); ++i) {
    s.heldout[i] = true;
  }
  s.positions = positions;
  s.cyclic_positions = !absolute_positions;
  s.paper_shifts.clear();
  for (int64_t r = 0; r < block_length; ++r) s.paper_shifts.push_back(r);
  return s;
}

TaskSymmetry DeclaredSymmetry(const v1::ExperimentSpec& spec) {
  const auto& task = spec.task();
  TaskSymmetry s;
  bool absolute = true;
  std::vector<int64_t> shifts = {0, 1};
  switch (task.kind_case()) {
    case v1::TaskSpec::kKHop:
      s = Layout({{"tok", task.k_hop().num_tokens()}});
      absolute = Absolute(task.k_hop().position_mode());
      break;
    case v1::TaskSpec::kNgram:
      s = Layout({{"letter", task.ngram().alphabet()}});
      shifts.clear();
      for (int64_t r = 0; r < task.ngram().order(); ++r) shifts.push_back(r);
      break;
    case v1::TaskSpec::kIoi:
      s = Layout({{"name", task.ioi().num_names()}});
      break;
    case v1::TaskSpec::kConditionalRetrieval:
      s = Layout({{"tag", task.conditional_retrieval().num_tags()}, {"tok", task.conditional_retrieval().num_tokens()}});
      absolute = Absolute(task.conditional_retrieval().position_mode());
      shifts = {0, 1, 2};
      break;
    case v1::TaskSpec::kPermutationInversion:
      s = Layout({{"tok", task.permutation_inversion().num_tokens()}});
      absolute = Absolute(task.permutation_inversion().position_mode());
      shifts = {0, 1, -1};  // the backward-in-block selection (A.1.6)
      break;
    case v1::TaskSpec::kMinimalIcl:
      s = Layout({{"item", task.minimal_icl().num_items()}, {"label", task.minimal_icl().num_labels()}});
      break;
    default: {
      const auto& t = task.associative_recall();
      return AssocRecallSymmetry(t.num_common(), t.num_rare(), t.num_heldout(), t.block_length(),
                                 ShapeOf(spec).positions, Absolute(t.position_mode()));
    }
  }
  s.positions = ShapeOf(spec).positions;
  s.cyclic_positions = !absolute;
  s.paper_shifts = shifts;
  return s;
}

}  // namespace circuitlab::engine
