// What every front calls an AnalysisService method, from the service's
// descriptor alone, so that an analysis added to the proto reaches each
// front under one name with no list to edit:
//   the CLI's generic verb        circuitlab logit-lens RUN --layers 1,2
//   the HTTP route                /api/v1/runs/{id}/analyses/logit-lens
//   the Python method             client.logit_lens(run_id, ...)
// The name is the method's in kebab case without a leading "Get"
// (GetLogitLens -> logit-lens; DetectCircuit -> detect-circuit); Python's
// snake case follows the same rule (client/python/circuitlab/client.py).
// Header-only: protobuf's descriptors, nothing of gRPC.
#pragma once

#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/descriptor.h"

namespace circuitlab {

// "GetLogitLens" -> "logit-lens".
inline std::string AnalysisFrontName(std::string_view method) {
  if (method.size() > 3 && method.substr(0, 3) == "Get" && std::isupper(static_cast<unsigned char>(method[3]))) {
    method.remove_prefix(3);
  }
  std::string out;
  for (char c : method) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      if (!out.empty()) out += '-';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

// The AnalysisService of `file` (the file of any of its messages).
inline const google::protobuf::ServiceDescriptor* AnalysisServiceOf(const google::protobuf::FileDescriptor* file) {
  return file == nullptr ? nullptr : file->FindServiceByName("AnalysisService");
}

// The AnalysisService method that takes `request` (null: none).
inline const google::protobuf::MethodDescriptor* AnalysisMethodOf(const google::protobuf::Descriptor* request) {
  const google::protobuf::ServiceDescriptor* service = AnalysisServiceOf(request->file());
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    if (service->method(i)->input_type() == request) return service->method(i);
  }
  return nullptr;
}

// An analysis that runs as a job: its answer carries the job's state and id
// (a pending answer is asked again), and its request a `force`.
inline bool IsJobAnalysis(const google::protobuf::MethodDescriptor* method) {
  return method->output_type()->FindFieldByName("state") != nullptr &&
         method->output_type()->FindFieldByName("job_id") != nullptr &&
         method->input_type()->FindFieldByName("force") != nullptr;
}

}  // namespace circuitlab
