// The caller's own sequences (GetActivations' `sequences`, Intervene's
// Prompts) read into tensors against a run's model: token ids in the
// vocabulary, the IMIR block model's position ids (a decoder's are
// implicit), one length for all, at most the context length. Every error
// names the field and the allowed range. Engine-private (LibTorch).
#pragma once

#include <torch/torch.h>

#include <string>

#include "absl/status/statusor.h"
#include "circuitlab/v1/analysis_service.pb.h"

namespace circuitlab::engine {

struct Sequences {
  torch::Tensor tokens, pids;  // [1, B, T]; pids undefined for a decoder
  int64_t B = 0, T = 0;
};

// `positions` > 0: the IMIR model's position ids (one per token, each in
// [0, positions)); 0: a decoder's (none may be sent). `max_len` > 0 bounds T.
absl::StatusOr<Sequences> ReadSequences(const google::protobuf::RepeatedPtrField<v1::InputSequence>& seqs,
                                        const std::string& field, int64_t vocab, int64_t positions, int64_t max_len);

// Token ids [B] from `ids` (one per sequence, or one for all), each below `vocab`.
absl::StatusOr<torch::Tensor> ReadAnswers(const google::protobuf::RepeatedField<uint32_t>& ids,
                                          const std::string& field, int64_t B, int64_t vocab);

// Intervene's Prompts read against a model: the clean sequences, the
// corrupted ones (given exactly with a patch sweep, of the clean ones'
// shape; undefined otherwise), the answers [B] and the competing tokens [B]
// (undefined when none). The request's fields that name the service's own
// sequences (eval_sets, n_eval aside, logit_diff_tokens, reference sets)
// must be empty: InvalidArgument naming the field.
struct PromptSet {
  Sequences clean, corrupted;
  torch::Tensor answers, wrong;
};
absl::StatusOr<PromptSet> ReadPrompts(const v1::InterveneRequest& req, int64_t vocab, int64_t positions,
                                      int64_t max_len);

}  // namespace circuitlab::engine
