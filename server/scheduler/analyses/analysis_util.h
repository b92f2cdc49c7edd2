// Helpers the analysis modules under server/scheduler/analyses/ share:
// basis selections, coordinate rows, the IMIR-model check, evaluation sizes
// and the memory a job is admitted with. Internal to the scheduler.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "server/engine/api.h"
#include "server/store/store.h"

namespace circuitlab::scheduler {

// The largest n_eval any analysis takes (sequences per evaluation set), and
// the smallest DetectCircuit and LabelRun take.
constexpr uint32_t kMaxEval = 16384;
constexpr uint32_t kMinEval = 64;

engine::Selection ToSelection(v1::BasisSelection s);
// InvalidArgument for a value outside the enum.
absl::Status CheckSelection(v1::BasisSelection s);
void FillCoordinate(const store::CoordinateDefRow& d, double value, v1::Coordinate* c);
// FailedPrecondition naming `what` for a run whose model family has no IMIR
// coordinates (a decoder): the IMIR analyses (coordinates, circuits,
// invariance, coordinate edits) need the IMIR block model.
absl::Status NeedsCoordinates(const v1::ExperimentSpec& spec, const std::string& what);
// What admission counts for a job on `spec`'s model: the run's own estimate
// (weights, optimiser state, one training batch of activations: more than the
// analyses' evaluation chunks hold) plus the analysis's own largest buffers.
uint64_t JobMemory(const v1::ExperimentSpec& spec, uint64_t extra);
// n_eval 0 (the default) or in [min, kMaxEval]; InvalidArgument names `field`.
absl::Status CheckEvalSize(uint32_t n, uint32_t min, const std::string& field);

// `name` one of the evaluation sets of a run of `spec` (the analyzer's
// EvalSets; nothing checked when it cannot tell), before any job: HTTP and
// gRPC alike refuse an unknown set with InvalidArgument naming `field` and
// listing the sets, no job queued and no quota spent (issue 51 item 10).
absl::Status CheckEvalSet(engine::Analyzer& analyzer, const v1::ExperimentSpec& spec, const std::string& name,
                          const std::string& field);

// The caller's own sequences (GetActivations' `sequences`, Intervene's
// prompts), before anything is loaded: 1 to kMaxUserSequences of one length
// in [1, kMaxUserLength]; InvalidArgument naming `field`.
constexpr int kMaxUserSequences = 64;
constexpr int kMaxUserLength = 1024;
absl::Status CheckSequenceShape(const google::protobuf::RepeatedPtrField<v1::InputSequence>& seqs,
                                const std::string& field);
// The same sequences against the run's model (torch-free, from its spec):
// token ids in its vocabulary, the IMIR model's position ids (one per token,
// in range), a decoder's context length; a regression run reads vectors
// (FailedPrecondition naming `what`).
absl::Status CheckSequencesFit(const v1::ExperimentSpec& spec,
                               const google::protobuf::RepeatedPtrField<v1::InputSequence>& seqs,
                               const std::string& field, const std::string& what);

}  // namespace circuitlab::scheduler
