// ExportWeights: a stored checkpoint's weights as a safetensors file with
// the model's configuration as JSON, for every model family
// (docs/reference/weights.md). The tensors keep the engine's names and
// layouts without the ensemble dimension: the IMIR model (B.1) as its dense
// key-query matrices "L{l}.kq" [H, d_{l-1}, d_{l-1}] (layers from 1) and
// readout "out" [V, d_L], whatever its parameterisation; a decoder (B.2) as
// its parameters, linear maps stored [in, out] (x @ W, not PyTorch's
// nn.Linear [out, in]).
//
// safetensors: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw bytes.
#include <torch/torch.h>

#include <cctype>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

// The largest export: what the client's 64 MiB answers leave room for.
constexpr int64_t kMaxExportBytes = int64_t{48} << 20;

// A JSON string literal of `s` (the names here and protobuf's JSON are
// ASCII or valid UTF-8; quotes, backslashes and controls are escaped).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The safetensors file of `tensors` (float32 on the CPU after conversion)
// with `config` (a JSON object) as the metadata entry "config".
absl::StatusOr<std::string> Safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                        const std::string& config, uint64_t* parameters) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\",\"config\":" + Quote(config) + "}";
  std::vector<torch::Tensor> data;
  int64_t offset = 0;
  *parameters = 0;
  for (const auto& [name, t] : tensors) {
    torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    const int64_t bytes = c.numel() * 4;
    absl::StrAppend(&header, ",", Quote(name), ":{\"dtype\":\"F32\",\"shape\":[");
    for (int64_t i = 0; i < c.dim(); ++i) absl::StrAppend(&header, i == 0 ? "" : ",", c.size(i));
    absl::StrAppend(&header, "],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
    *parameters += static_cast<uint64_t>(c.numel());
    data.push_back(std::move(c));
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  if (offset + static_cast<int64_t>(header.size()) + 8 > kMaxExportBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the weights take ", offset, " bytes, more than an export's ",
                                                     kMaxExportBytes, " (48 MiB)"));
  }
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);  // little-endian
  out += header;
  out.reserve(out.size() + static_cast<size_t>(offset));
  for (const torch::Tensor& c : data) {
    out.append(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<size_t>(c.numel()) * 4);  // x86: LE
  }
  return out;
}

// The run's resolved spec as JSON (protobuf's mapping).
std::string SpecJson(const v1::ExperimentSpec& spec) {
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &json, o);
  return json.empty() ? "{}" : json;
}

absl::StatusOr<v1::ExportWeightsResponse> Answer(const std::string& family, const std::string& config,
                                                 const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  v1::ExportWeightsResponse out;
  uint64_t parameters = 0;
  absl::StatusOr<std::string> file = Safetensors(tensors, config, &parameters);
  if (!file.ok()) return file.status();
  out.set_family(family);
  out.set_config_json(config);
  out.set_safetensors(std::move(*file));
  out.set_parameters(parameters);
  return out;
}

absl::StatusOr<v1::ExportWeightsResponse> ImirExport(const AnalysisInput& in) {
  torch::NoGradGuard no_grad;
  const v1::ExperimentSpec& spec = in.spec;
  absl::StatusOr<DenseCheckpoint> opened = OpenDense(spec, in.checkpoint());
  if (!opened.ok()) return opened.status();
  const BlockTask* task = opened->task.get();
  const ImirModel* dense = opened->dense.get();
  const int64_t layers = spec.model().imir().num_layers(), heads = spec.model().imir().num_heads();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (int64_t l = 0; l < layers; ++l) tensors.emplace_back(absl::StrCat("L", l + 1, ".kq"), dense->kq(l)[0]);
  tensors.emplace_back("out", dense->readout()[0]);
  const std::string config =
      absl::StrCat("{\"format\":\"circuitlab-weights/2\",\"family\":\"imir\",\"vocab\":", task->vocab_size(),
                   ",\"positions\":", task->num_positions(), ",\"seq_len\":", task->seq_len(), ",\"layers\":", layers,
                   ",\"heads\":", heads, ",\"spec\":", SpecJson(spec), "}");
  return Answer("imir", config, tensors);
}

// A decoder checkpoint's tensor name as exported: blocks count from 1, as
// every surface counts layers (the checkpoint's own "L0.attn.q" is the
// file's "L1.attn.q"; format circuitlab-weights/2).
std::string ExportName(const std::string& name) {
  size_t dot = name.find('.');
  if (name.size() < 3 || name[0] != 'L' || dot == std::string::npos || dot < 2) return name;
  int64_t l = 0;
  for (size_t i = 1; i < dot; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return name;
    l = l * 10 + (name[i] - '0');
  }
  return absl::StrCat("L", l + 1, name.substr(dot));
}

absl::StatusOr<v1::ExportWeightsResponse> DecoderExport(const AnalysisInput& in, const std::string& family) {
  torch::NoGradGuard no_grad;
  absl::StatusOr<std::unique_ptr<DecoderModel>> model = LoadDecoder(in.spec, in.checkpoint());
  if (!model.ok()) return model.status();
  const DecoderConfig& c = (*model)->config();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  const std::vector<torch::Tensor> params = (*model)->parameters();
  const std::vector<std::string> names = (*model)->parameter_names();
  for (size_t i = 0; i < params.size(); ++i) tensors.emplace_back(ExportName(names[i]), params[i][0]);
  const std::string config = absl::StrCat(
      "{\"format\":\"circuitlab-weights/2\",\"family\":", Quote(family), ",\"vocab\":", c.vocab,
      ",\"d_model\":", c.d_model, ",\"heads\":", c.heads, ",\"mlp\":", c.mlp, ",\"layers\":", c.layers,
      ",\"max_len\":", c.max_len, ",\"input_dim\":", c.input_dim, ",\"activation\":\"",
      c.gelu ? "gelu_tanh" : "silu", "\",\"attention_bias\":", c.attn_bias ? "true" : "false",
      ",\"final_layernorm\":", c.final_ln ? "true" : "false", ",\"rope_base\":", c.rope_base,
      ",\"layernorm_eps\":1e-05,\"spec\":", SpecJson(in.spec), "}");
  return Answer(family, config, tensors);
}

}  // namespace

// The analysis table's entries (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::ExportWeightsRequest, v1::ExportWeightsResponse,
                           [](const AnalysisInput& in, const v1::ExportWeightsRequest&, const AnalysisProgress&,
                              const CancelToken*) { return ImirExport(in); });
CIRCUITLAB_ENGINE_ANALYSIS("latent", v1::ExportWeightsRequest, v1::ExportWeightsResponse,
                           [](const AnalysisInput& in, const v1::ExportWeightsRequest&, const AnalysisProgress&,
                              const CancelToken*) { return DecoderExport(in, "latent"); });
CIRCUITLAB_ENGINE_ANALYSIS("regression", v1::ExportWeightsRequest, v1::ExportWeightsResponse,
                           [](const AnalysisInput& in, const v1::ExportWeightsRequest&, const AnalysisProgress&,
                              const CancelToken*) { return DecoderExport(in, "regression"); });

}  // namespace circuitlab::engine
