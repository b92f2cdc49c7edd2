// circuitlab compare RUN RUN [RUN...] [--csv] [--all-metrics]: runs side by
// side: state and steps, the spec fields that differ (JSON paths), and the
// latest value of each metric.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <vector>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace compare_cmd {

constexpr size_t kMaxRuns = 20;

struct Options {
  std::vector<std::string> run_ids;
  bool csv = false;
  std::string metrics;  // a substring the metric names must contain ("" = all)
};

// Leaves of a JSON value by path ("training.learning_rate", "tags[0]"), as text.
void Flatten(const google::protobuf::Value& v, const std::string& path, std::map<std::string, std::string>* out) {
  using google::protobuf::Value;
  switch (v.kind_case()) {
    case Value::kStructValue:
      for (const auto& [k, child] : v.struct_value().fields()) Flatten(child, path.empty() ? k : path + "." + k, out);
      return;
    case Value::kListValue:
      for (int i = 0; i < v.list_value().values_size(); ++i) {
        Flatten(v.list_value().values(i), path + "[" + std::to_string(i) + "]", out);
      }
      if (v.list_value().values_size() == 0) (*out)[path] = "[]";
      return;
    case Value::kStringValue:
      (*out)[path] = v.string_value();
      return;
    case Value::kNumberValue: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.10g", v.number_value());
      (*out)[path] = buf;
      return;
    }
    case Value::kBoolValue:
      (*out)[path] = v.bool_value() ? "true" : "false";
      return;
    default:
      (*out)[path] = "null";
  }
}

std::map<std::string, std::string> SpecFields(const v1::ExperimentSpec& spec) {
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;  // a default value is a value to compare
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &json, o);
  google::protobuf::Value v;
  (void)google::protobuf::util::JsonStringToMessage(json, &v);
  std::map<std::string, std::string> out;
  Flatten(v, "", &out);
  out.erase("name");
  return out;
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Rows of the comparison: (section, key) -> one cell per run, in order.
struct Table {
  std::vector<std::pair<std::string, std::string>> keys;
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> cells;
  size_t width = 0;
  void Add(const std::string& section, const std::string& key, size_t i, const std::string& value) {
    auto k = std::make_pair(section, key);
    auto [it, fresh] = cells.try_emplace(k, std::vector<std::string>(width, "-"));
    if (fresh) keys.push_back(k);
    it->second[i] = value;
  }
};

// The runs' state, the spec fields that differ, the latest metrics whose
// names contain `metric_filter`.
Table Compare(const std::vector<v1::Run>& runs, const std::string& metric_filter) {
  Table t;
  t.width = runs.size();
  std::vector<std::map<std::string, std::string>> specs;
  std::set<std::string> paths;
  for (const v1::Run& r : runs) {
    specs.push_back(SpecFields(r.spec()));
    for (const auto& [p, v] : specs.back()) paths.insert(p);
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const v1::Run& r = runs[i];
    t.Add("run", "name", i, r.spec().name());
    t.Add("run", "state", i, v1::RunState_Name(r.state()).substr(10));  // RUN_STATE_
    t.Add("run", "step", i, std::to_string(r.progress().step()) + "/" + std::to_string(r.progress().total_steps()));
  }
  for (const std::string& p : paths) {
    std::vector<std::string> values;
    for (const auto& s : specs) values.push_back(s.count(p) ? s.at(p) : "-");
    if (std::adjacent_find(values.begin(), values.end(), std::not_equal_to<>()) == values.end()) continue;
    for (size_t i = 0; i < values.size(); ++i) t.Add("spec", p, i, values[i]);
  }
  std::set<std::string> metrics;
  for (const v1::Run& r : runs) {
    for (const auto& [name, v] : r.progress().latest()) {
      if (name.find(metric_filter) != std::string::npos) metrics.insert(name);
    }
  }
  for (const std::string& m : metrics) {
    for (size_t i = 0; i < runs.size(); ++i) {
      auto it = runs[i].progress().latest().find(m);
      if (it != runs[i].progress().latest().end()) t.Add("metric", m, i, Number(it->second));
    }
  }
  return t;
}

void PrintJson(const std::vector<v1::Run>& runs, Table& t) {
  google::protobuf::Struct out;
  auto& f = *out.mutable_fields();
  for (const v1::Run& r : runs) f["runs"].mutable_list_value()->add_values()->set_string_value(r.run_id());
  for (const auto& k : t.keys) {
    auto& section = *f[k.first == "run" ? "runs_info" : k.first == "spec" ? "spec_differs" : "metrics"]
                         .mutable_struct_value()
                         ->mutable_fields();
    for (const std::string& v : t.cells[k]) section[k.second].mutable_list_value()->add_values()->set_string_value(v);
  }
  std::cout << client::ToJson(out) << "\n";
}

void PrintCsv(const std::vector<v1::Run>& runs, Table& t) {
  std::printf("section,key");
  for (const v1::Run& r : runs) std::printf(",%s", client::CsvField(r.run_id()).c_str());
  std::printf("\n");
  for (const auto& k : t.keys) {
    std::printf("%s,%s", k.first.c_str(), client::CsvField(k.second).c_str());
    for (const std::string& v : t.cells[k]) std::printf(",%s", client::CsvField(v).c_str());
    std::printf("\n");
  }
}

void PrintText(const std::vector<v1::Run>& runs, Table& t) {
  size_t key_w = 6;
  for (const auto& k : t.keys) key_w = std::max(key_w, k.second.size());
  key_w = std::min<size_t>(key_w, 48);
  std::vector<size_t> col_w(runs.size(), 8);
  for (size_t i = 0; i < runs.size(); ++i) {
    col_w[i] = std::max(col_w[i], runs[i].run_id().size());
    for (const auto& k : t.keys) col_w[i] = std::min<size_t>(std::max(col_w[i], t.cells[k][i].size()), 32);
  }
  auto line = [&](const std::string& key, const std::vector<std::string>& row) {
    std::printf("  %-*s", static_cast<int>(key_w), key.substr(0, key_w).c_str());
    for (size_t i = 0; i < row.size(); ++i) {
      std::printf("  %-*s", static_cast<int>(col_w[i]), row[i].substr(0, col_w[i]).c_str());
    }
    std::printf("\n");
  };
  std::vector<std::string> ids;
  for (const v1::Run& r : runs) ids.push_back(r.run_id());
  line("", ids);
  std::string section;
  for (const auto& k : t.keys) {
    if (k.first != section) {
      section = k.first;
      std::printf("%s\n", section == "run"    ? "run"
                          : section == "spec" ? "spec fields that differ"
                                              : "latest metrics");
    }
    line(k.second, t.cells[k]);
  }
  if (std::none_of(t.keys.begin(), t.keys.end(), [](const auto& k) { return k.first == "spec"; })) {
    std::printf("(the specs are identical but for their names)\n");
  }
}

int Run(Context& ctx, const Options& o) {
  if (o.run_ids.size() < 2 || o.run_ids.size() > kMaxRuns) {
    std::fprintf(stderr, "error: compare takes 2 to %zu runs, got %zu\n", kMaxRuns, o.run_ids.size());
    return 2;
  }
  std::vector<v1::Run> runs;
  for (const std::string& id : o.run_ids) {
    auto run = ctx.client.GetRun(id);
    if (!run.ok()) return ReportError(run.status());
    runs.push_back(std::move(*run));
  }
  Table table = Compare(runs, o.metrics);
  if (ctx.g.json) {
    PrintJson(runs, table);
  } else if (o.csv) {
    PrintCsv(runs, table);
  } else {
    PrintText(runs, table);
  }
  return 0;
}

}  // namespace compare_cmd
}  // namespace

void AddCompare(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<compare_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "compare",
                          "Runs side by side: state and steps, the spec fields that differ (as JSON paths), and\n"
                          "the latest value of every metric. 2 to 20 runs.\n"
                          "  circuitlab compare r1 r2\n"
                          "  circuitlab compare r3 r4 r5 --metrics eval/ --csv > compare.csv",
                          o, compare_cmd::Run);
  sub->add_option("RUNS", o->run_ids, "Run ids")->required();
  sub->add_flag("--csv", o->csv, "CSV: section,key, then one column per run");
  sub->add_option("--metrics", o->metrics, "Only metrics whose name contains this (e.g. eval/ or accuracy)");
}

}  // namespace circuitlab::cli
