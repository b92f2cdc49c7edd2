#include "server/engine/analysis/prompts.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace circuitlab::engine {

absl::StatusOr<Sequences> ReadSequences(const google::protobuf::RepeatedPtrField<v1::InputSequence>& seqs,
                                        const std::string& field, int64_t vocab, int64_t positions, int64_t max_len) {
  Sequences in;
  in.B = seqs.size();
  in.T = in.B == 0 ? 0 : seqs[0].tokens_size();
  if (in.B == 0 || in.T == 0) return absl::InvalidArgumentError(field + " must hold at least one non-empty sequence");
  if (max_len > 0 && in.T > max_len) {
    return absl::InvalidArgumentError(absl::StrCat(field, " have ", in.T, " tokens; this model reads at most ",
                                                   max_len, " (its context length)"));
  }
  std::vector<int64_t> tokens, pids;
  for (int b = 0; b < seqs.size(); ++b) {
    const v1::InputSequence& s = seqs[b];
    const std::string at = absl::StrCat(field, "[", b, "]");
    if (s.tokens_size() != in.T) {
      return absl::InvalidArgumentError(absl::StrCat(at, " has ", s.tokens_size(), " tokens, ", field, "[0] ", in.T,
                                                     ": every sequence of a request has the same length"));
    }
    for (int t = 0; t < s.tokens_size(); ++t) {
      if (s.tokens(t) < 0 || s.tokens(t) >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(at, ".tokens[", t, "] must be in [0, ", vocab - 1,
                                                       "] (this model's vocabulary), got ", s.tokens(t)));
      }
      tokens.push_back(s.tokens(t));
    }
    if (positions == 0) {
      if (s.positions_size() > 0) {
        return absl::InvalidArgumentError(at + ".positions: a decoder's positions are implicit (RoPE); send tokens only");
      }
      continue;
    }
    if (s.positions_size() != s.tokens_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".positions must have one position id per token (", s.tokens_size(), "), got ", s.positions_size(),
          ": the IMIR model reads a token and a position id at every position"));
    }
    for (int t = 0; t < s.positions_size(); ++t) {
      if (s.positions(t) < 0 || s.positions(t) >= positions) {
        return absl::InvalidArgumentError(absl::StrCat(at, ".positions[", t, "] must be in [0, ", positions - 1,
                                                       "] (this model's position ids), got ", s.positions(t)));
      }
      pids.push_back(s.positions(t));
    }
  }
  in.tokens = torch::tensor(tokens, torch::kLong).view({1, in.B, in.T});
  if (positions > 0) in.pids = torch::tensor(pids, torch::kLong).view({1, in.B, in.T});
  return in;
}

absl::StatusOr<torch::Tensor> ReadAnswers(const google::protobuf::RepeatedField<uint32_t>& ids,
                                          const std::string& field, int64_t B, int64_t vocab) {
  if (ids.size() != 1 && ids.size() != B) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must hold one token id per sequence (", B,
                                                   ") or one for all, got ", ids.size()));
  }
  std::vector<int64_t> out;
  for (int i = 0; i < ids.size(); ++i) {
    if (static_cast<int64_t>(ids[i]) >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] must be in [0, ", vocab - 1,
                                                     "] (this model's vocabulary), got ", ids[i]));
    }
    out.push_back(ids[i]);
  }
  torch::Tensor t = torch::tensor(out, torch::kLong);
  return ids.size() == B ? t : t.expand({B}).contiguous();
}

absl::StatusOr<PromptSet> ReadPrompts(const v1::InterveneRequest& req, int64_t vocab, int64_t positions,
                                      int64_t max_len) {
  const v1::Prompts& p = req.prompts();
  if (!req.eval_sets().empty()) {
    return absl::InvalidArgumentError("eval_sets must be empty with prompts: the prompts are the evaluated sequences");
  }
  if (!req.logit_diff_tokens().empty()) {
    return absl::InvalidArgumentError(
        "logit_diff_tokens must be empty with prompts: name the competing tokens in prompts.wrong");
  }
  if (req.has_patch() && !req.patch().reference_set().empty()) {
    return absl::InvalidArgumentError("patch.reference_set must be empty with prompts: the clean prompts are the "
                                      "run patched from");
  }
  for (int i = 0; i < req.interventions_size(); ++i) {
    if (!req.interventions(i).reference_set().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("interventions[", i,
                                                     "].reference_set must be empty with prompts: the clean "
                                                     "prompts are the reference"));
    }
  }
  PromptSet out;
  absl::StatusOr<Sequences> clean = ReadSequences(p.clean(), "prompts.clean", vocab, positions, max_len);
  if (!clean.ok()) return clean.status();
  out.clean = std::move(*clean);
  if (req.has_patch() != (p.corrupted_size() > 0)) {
    return absl::InvalidArgumentError(req.has_patch() ? "prompts.corrupted: a patch sweep patches the clean prompts "
                                                        "into corrupted ones; give one per clean prompt"
                                                      : "prompts.corrupted is read by a patch sweep only; add patch "
                                                        "or leave it empty");
  }
  if (req.has_patch()) {
    if (p.corrupted_size() != p.clean_size()) {
      return absl::InvalidArgumentError(absl::StrCat("prompts.corrupted must pair one to one with prompts.clean (",
                                                     p.clean_size(), " sequences), got ", p.corrupted_size()));
    }
    absl::StatusOr<Sequences> corrupted = ReadSequences(p.corrupted(), "prompts.corrupted", vocab, positions, max_len);
    if (!corrupted.ok()) return corrupted.status();
    if (corrupted->T != out.clean.T) {
      return absl::InvalidArgumentError(absl::StrCat("prompts.corrupted have ", corrupted->T,
                                                     " tokens, prompts.clean ", out.clean.T,
                                                     ": a patched site must exist in both"));
    }
    out.corrupted = std::move(*corrupted);
  }
  absl::StatusOr<torch::Tensor> answers = ReadAnswers(p.answers(), "prompts.answers", out.clean.B, vocab);
  if (!answers.ok()) return answers.status();
  out.answers = std::move(*answers);
  if (p.wrong_size() > 0) {
    absl::StatusOr<torch::Tensor> wrong = ReadAnswers(p.wrong(), "prompts.wrong", out.clean.B, vocab);
    if (!wrong.ok()) return wrong.status();
    out.wrong = std::move(*wrong);
  }
  return out;
}

}  // namespace circuitlab::engine
