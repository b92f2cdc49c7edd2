#include "server/engine/setup/checkpoint_io.h"

#include <sstream>
#include <string>
#include <vector>

#include "server/common/seeds.h"

namespace circuitlab::engine {

uint64_t InitSeedOf(uint64_t seed) { return DeriveSeed63(seed, "init"); }
uint64_t BatchSeedOf(uint64_t seed, int64_t step) { return DeriveSeed63(seed, "batch", static_cast<uint64_t>(step)); }

// Opens a checkpoint and checks its format; LibTorch's parse errors become
// DataLoss naming this build's release and the writer's (when recorded).
absl::Status OpenArchive(const std::string& bytes, torch::Device device, torch::serialize::InputArchive& archive,
                         int64_t& format) {
  try {
    std::istringstream in(bytes);
    archive.load_from(in, device);
    torch::Tensor f;
    archive.read("format", f);
    format = f.item<int64_t>();
  } catch (const c10::Error& e) {
    return absl::DataLossError("checkpoint could not be read by LibTorch " + TorchVersion() + ": " +
                               e.what_without_backtrace());
  }
  if (format < 1 || format > kCheckpointFormat) {
    return absl::InvalidArgumentError("checkpoint format " + std::to_string(format) + " is not supported (LibTorch " +
                                      TorchVersion() + " build reads formats 1 to " +
                                      std::to_string(kCheckpointFormat) + ")");
  }
  return absl::OkStatus();
}

// "LibTorch 1.13.0" for format 2, "an earlier release" for format 1.
std::string WriterOf(torch::serialize::InputArchive& archive) {
  c10::IValue v;
  return archive.try_read("torch_version", v) && v.isString() ? "LibTorch " + v.toStringRef() : "an earlier release";
}

absl::Status LoadWeights(const std::string& checkpoint, const std::vector<std::string>& names,
                         const std::vector<torch::Tensor>& params) {
  torch::serialize::InputArchive archive;
  int64_t format = 0;
  if (absl::Status s = OpenArchive(checkpoint, torch::kCPU, archive, format); !s.ok()) return s;
  return ReadGuarded(archive, [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor t;
      if (!archive.try_read("param/" + names[i], t)) {
        return absl::InvalidArgumentError("checkpoint has no parameter " + names[i] + " (it belongs to another model)");
      }
      if (!t.sizes().equals(params[i].sizes())) {
        return absl::InvalidArgumentError("checkpoint parameter " + names[i] + " has shape " + c10::str(t.sizes()) +
                                          ", the spec's model " + c10::str(params[i].sizes()));
      }
      params[i].copy_(t);
    }
    return absl::OkStatus();
  });
}

}  // namespace circuitlab::engine
