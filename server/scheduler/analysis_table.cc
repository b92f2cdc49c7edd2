#include "server/scheduler/analysis_table.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace circuitlab::scheduler {
namespace {

struct Table {
  std::mutex mu;
  std::map<std::string, AnalysisEntry> by_request;  // request type's full name
};

Table& TheTable() {
  static Table* table = new Table;  // never destroyed: lookups may run at exit
  return *table;
}

}  // namespace

bool RegisterJobAnalysis(AnalysisEntry entry) {
  Table& t = TheTable();
  std::lock_guard<std::mutex> lock(t.mu);
  const std::string name = entry.request->GetDescriptor()->full_name();
  for (const auto& [n, e] : t.by_request) {
    if (e.kind == entry.kind) {
      std::fprintf(stderr, "analysis kind %s registered twice\n", entry.kind.c_str());
      std::abort();
    }
  }
  if (!t.by_request.emplace(name, std::move(entry)).second) {
    std::fprintf(stderr, "analysis %s registered twice\n", name.c_str());
    std::abort();
  }
  return true;
}

const AnalysisEntry* FindJobAnalysis(const google::protobuf::Descriptor* request) {
  Table& t = TheTable();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.by_request.find(request->full_name());
  return it == t.by_request.end() ? nullptr : &it->second;
}

std::vector<const AnalysisEntry*> JobAnalyses() {
  Table& t = TheTable();
  std::lock_guard<std::mutex> lock(t.mu);
  std::map<std::string, const AnalysisEntry*> by_kind;
  for (const auto& [name, e] : t.by_request) by_kind[e.kind] = &e;
  std::vector<const AnalysisEntry*> out;
  for (const auto& [kind, e] : by_kind) out.push_back(e);
  return out;
}

}  // namespace circuitlab::scheduler
