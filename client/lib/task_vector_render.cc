#include "client/lib/task_vector_render.h"

#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "client/lib/text_format.h"

namespace circuitlab::client {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

}  // namespace

std::string TaskVectorCsv(const v1::AnalyzeTaskVectorsResponse& r) {
  std::ostringstream out;
  out << "run_id,step,sweep_values,name,layer,position,value\n";
  for (const v1::TaskVectorValue& v : r.values()) {
    char value[32];
    std::snprintf(value, sizeof(value), "%.9g", v.value());
    out << v.run_id() << "," << v.step() << "," << CsvField(v.sweep_values()) << "," << CsvField(v.name()) << ","
        << v.layer() << "," << v.position() << "," << value << "\n";
  }
  return out.str();
}

std::string TaskVectorText(const v1::AnalyzeTaskVectorsResponse& r) {
  // (run, step) in answer order, then (name, layer) in answer order.
  struct Series {
    std::string name;
    int layer;
    std::vector<std::pair<int, double>> points;
  };
  struct Group {
    std::string run, sweep_values;
    uint64_t step;
    std::vector<Series> series;
  };
  std::vector<Group> groups;
  for (const v1::TaskVectorValue& v : r.values()) {
    if (groups.empty() || groups.back().run != v.run_id() || groups.back().step != v.step()) {
      groups.push_back({v.run_id(), v.sweep_values(), v.step(), {}});
    }
    auto& ss = groups.back().series;
    Series* s = nullptr;
    for (auto& x : ss) {
      if (x.name == v.name() && x.layer == v.layer()) s = &x;
    }
    if (s == nullptr) {
      ss.push_back({v.name(), v.layer(), {}});
      s = &ss.back();
    }
    s->points.emplace_back(v.position(), v.value());
  }
  std::ostringstream out;
  const auto& q = r.request();
  out << "hook " << q.hook() << "; steering estimated at " << q.estimation_hook() << ", injected at "
      << q.injection_hook() << "\n";
  for (const Group& g : groups) {
    out << g.run << " step " << g.step;
    if (!g.sweep_values.empty()) out << "  " << g.sweep_values;
    out << "\n";
    char line[96];
    std::snprintf(line, sizeof(line), "  %-36s %5s  %s\n", "NAME", "LAYER", "VALUE (t=position: value)");
    out << line;
    for (const Series& s : g.series) {
      std::snprintf(line, sizeof(line), "  %-36s %5s  ", s.name.c_str(), s.layer < 0 ? "-" : std::to_string(s.layer).c_str());
      out << line;
      if (s.points.size() == 1 && s.points[0].first < 0) {
        out << Num(s.points[0].second) << "\n";
        continue;
      }
      const size_t n = s.points.size(), shown = std::min<size_t>(n, 8);
      for (size_t i = 0; i < shown; ++i) {
        const size_t k = shown == 1 ? 0 : i * (n - 1) / (shown - 1);
        out << (i ? "  " : "") << "t=" << s.points[k].first << ": " << Num(s.points[k].second);
      }
      if (n > shown) out << "  (" << n << " positions; --csv)";
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace circuitlab::client
