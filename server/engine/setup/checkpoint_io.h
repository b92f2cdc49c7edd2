// What training and analysis both read of a run: its members' seeds by
// purpose and its checkpoints (the archive format, opening one, reading its
// weights alone). Engine-private (LibTorch); train/ writes checkpoints,
// analysis/ and train/ read them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/torch_compat.h"
#include "server/engine/torch_util.h"

namespace circuitlab::engine {

// Format 2 stores each parameter's optimiser state under the parameter's
// name ("optim/<name>", the fields the state's own serialize() writes) and
// the LibTorch release that wrote it. Format 1 (until issue 35) stored the
// optimiser as LibTorch saves it, each state keyed by its parameter's
// TensorImpl address printed as text: hex in 1.13, decimal in 2.x, whose own
// loader parses the key as a decimal number and so mixes up 1.13's states.
// Both are read here by matching keys as text, whichever release wrote them.
inline constexpr int64_t kCheckpointFormat = 2;

// Seeds of one member, by purpose (SCIENCE.md 0.3).
uint64_t InitSeedOf(uint64_t member_seed);
uint64_t BatchSeedOf(uint64_t member_seed, int64_t step);

// Opens a checkpoint and checks its format; LibTorch's parse errors become
// DataLoss naming this build's release and the writer's (when recorded).
absl::Status OpenArchive(const std::string& bytes, torch::Device device, torch::serialize::InputArchive& archive,
                         int64_t& format);

// "LibTorch 1.13.0" for format 2, "an earlier release" for format 1.
std::string WriterOf(torch::serialize::InputArchive& archive);

// Runs `read` (which may throw LibTorch errors on a damaged or foreign
// archive) and turns such errors into DataLoss naming both releases.
template <typename Read>
absl::Status ReadGuarded(torch::serialize::InputArchive& archive, Read read) {
  try {
    return read();
  } catch (const c10::Error& e) {
    return absl::DataLossError("checkpoint written by " + WriterOf(archive) + " could not be read by LibTorch " +
                               TorchVersion() + ": " + e.what_without_backtrace());
  }
}

// Reads only the weights of a checkpoint into `params` (named `names`; no
// optimiser, no evaluation sets). InvalidArgument when shapes or format do
// not match.
absl::Status LoadWeights(const std::string& checkpoint, const std::vector<std::string>& names,
                         const std::vector<torch::Tensor>& params);

}  // namespace circuitlab::engine
