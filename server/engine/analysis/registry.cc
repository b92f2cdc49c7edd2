#include "server/engine/analysis/registry.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "absl/strings/str_join.h"

namespace circuitlab::engine {
namespace {

using Key = std::pair<std::string, std::string>;  // (family, request full name)

struct Table {
  std::mutex mu;  // registration runs at static initialisation; lookups later
  std::map<Key, AnalysisFn> entries;
};

Table& TheTable() {
  static Table* table = new Table;  // never destroyed: lookups may run at exit
  return *table;
}

}  // namespace

bool RegisterAnalysis(std::string_view family, const google::protobuf::Descriptor* request, AnalysisFn fn) {
  Table& t = TheTable();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.entries.emplace(Key(std::string(family), request->full_name()), std::move(fn)).second) {
    std::fprintf(stderr, "engine analysis %s registered twice for family %s\n", request->full_name().c_str(),
                 std::string(family).c_str());
    std::abort();
  }
  return true;
}

const AnalysisFn* FindAnalysis(std::string_view family, const google::protobuf::Descriptor* request) {
  Table& t = TheTable();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.entries.find(Key(std::string(family), request->full_name()));
  return it == t.entries.end() ? nullptr : &it->second;
}

std::string AnalysisName(const google::protobuf::Descriptor* request) {
  std::string name = request->name();
  constexpr std::string_view kSuffix = "Request";
  if (name.size() > kSuffix.size() && name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
    name.resize(name.size() - kSuffix.size());
  }
  return name;
}

std::string AnalysesOf(std::string_view family) {
  Table& t = TheTable();
  std::set<std::string> names;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    for (const auto& [key, fn] : t.entries) {
      if (key.first != family) continue;
      const auto* d = google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(key.second);
      names.insert(d != nullptr ? AnalysisName(d) : key.second);
    }
  }
  if (names.empty()) return "no analyses";
  const std::vector<std::string> v(names.begin(), names.end());
  if (v.size() == 1) return v[0];
  return absl::StrJoin(v.begin(), v.end() - 1, ", ") + " and " + v.back();
}

}  // namespace circuitlab::engine
