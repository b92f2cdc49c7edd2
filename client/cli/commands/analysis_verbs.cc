// The generic verbs: every AnalysisService job without a verb of its own
// gets one from the service's descriptor, named by the fronts' rule
// (server/common/analysis_names.h: GetLogitLens -> `circuitlab logit-lens`).
// Its flags are the request's fields (--eval-set for eval_set, lists
// comma-separated, enums by name), explained by the comments in the .proto
// (client/lib/proto_docs.h); fields that are messages come from --request
// FILE.json. The answer prints as tables (each repeated message field one
// table, columns its scalar fields), as CSV (--csv: the first table, the
// answer's echoes such as run_id and step leading each row), or as protobuf
// JSON (--json). An analysis added to the proto appears here with no line
// to write; a verb of its own replaces the generic one where the answer
// deserves a better picture (kOwnVerbs).
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"
#include "client/lib/proto_docs.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/common/analysis_names.h"
#include "server/common/field_text.h"

namespace circuitlab::cli {
namespace {
namespace analysis_verbs {

namespace pb = google::protobuf;

// AnalysisService methods with a verb of their own (commands/<verb>.cc).
constexpr std::pair<std::string_view, std::string_view> kOwnVerbs[] = {
    {"ProjectCheckpoint", "project"},      {"GetTrajectory", "coords"},
    {"CheckInvariance", "invariance"},     {"DetectCircuit", "detect"},
    {"Intervene", "intervene"},            {"LabelRun", "label"},
    {"CheckDataDependence", "data-dependence"}, {"AnalyzeTaskVectors", "task-vectors"},
    {"GetAttentionPatterns", "attention"}, {"ExportWeights", "export"},
    {"GetActivations", "activations"},     {"CancelAnalysis", "cancel-analysis"},
    {"ListAnalysisJobs", "analyses"},
};

// The answer's fields every job carries; not echoes of the request.
bool IsJobField(std::string_view name) {
  return name == "state" || name == "progress" || name == "error" || name == "job_id" || name == "from_store";
}

struct Options {
  const pb::MethodDescriptor* method = nullptr;
  std::string target, request_file;
  std::map<std::string, std::vector<std::string>> values;  // by field name, as typed
  std::map<std::string, bool> flags;                       // the bool fields
  bool csv = false, force = false;
};

std::string Flag(const pb::FieldDescriptor* f) {
  std::string name = "--" + std::string(f->name());
  for (char& c : name) c = c == '_' ? '-' : c;
  return name;
}

std::string EnumValues(const pb::EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() != 0) names.push_back(absl::AsciiStrToLower(e->value(i)->name()));
  }
  return absl::StrJoin(names, "|");
}

// One typed value into `f` of `m` (added when repeated), parsed as the HTTP
// gateway parses a query (server/common/field_text.h); InvalidArgument naming
// the flag.
absl::Status SetValue(pb::Message* m, const pb::FieldDescriptor* f, const std::string& text) {
  const absl::Status s = SetScalarFromText(m, f, text);
  if (absl::IsUnimplemented(s)) return absl::InvalidArgumentError(Flag(f) + ": set it in --request FILE.json");
  if (!s.ok()) return absl::InvalidArgumentError(Flag(f) + " expects " + std::string(s.message()) + ", got '" + text + "'");
  return s;
}

// The request: --request's file, the positional run or spec, the flags.
absl::Status BuildRequest(const Options& o, pb::Message* req) {
  const pb::Descriptor* d = req->GetDescriptor();
  if (!o.request_file.empty()) {
    if (absl::Status s = client::ReadJsonFile(o.request_file, req); !s.ok()) return s;
  }
  if (!o.target.empty()) {
    const pb::FieldDescriptor* spec = d->FindFieldByName("spec");
    if (spec != nullptr && std::filesystem::exists(o.target)) {
      absl::StatusOr<v1::ExperimentSpec> read = client::ReadSpecFile(o.target);
      if (!read.ok()) return read.status();
      req->GetReflection()->MutableMessage(req, spec)->CopyFrom(*read);
    } else {
      req->GetReflection()->SetString(req, d->FindFieldByName("run_id"), o.target);
    }
  }
  for (const auto& [name, texts] : o.values) {
    const pb::FieldDescriptor* f = d->FindFieldByName(name);
    if (texts.empty()) continue;
    if (f->is_repeated()) req->GetReflection()->ClearField(req, f);
    for (const std::string& text : texts) {
      if (absl::Status s = SetValue(req, f, text); !s.ok()) return s;
    }
  }
  for (const auto& [name, on] : o.flags) {
    if (on) req->GetReflection()->SetBool(req, d->FindFieldByName(name), true);
  }
  return absl::OkStatus();
}

// A scalar (element `i` when repeated) as text.
std::string Text(const pb::Message& m, const pb::FieldDescriptor* f, int i = -1) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = i >= 0;
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: return std::to_string(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
    case pb::FieldDescriptor::CPPTYPE_INT64: return std::to_string(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return std::to_string(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return std::to_string(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      const double v = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT
                           ? (rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f))
                           : (rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.6g", v);
      return buf;
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL: return (rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f)) ? "true" : "false";
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumValueDescriptor* v = rep ? r->GetRepeatedEnum(m, f, i) : r->GetEnum(m, f);
      return absl::AsciiStrToLower(v->name());
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: return rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
    default: return "";
  }
}

// A field of `m` as one cell: a scalar, or a repeated scalar's values
// joined by `sep` (the first 8 and a count on a terminal).
std::string Cell(const pb::Message& m, const pb::FieldDescriptor* f, const std::string& sep, bool clip) {
  if (!f->is_repeated()) return Text(m, f);
  const int n = m.GetReflection()->FieldSize(m, f);
  std::vector<std::string> items;
  for (int i = 0; i < n && (!clip || i < 8); ++i) items.push_back(Text(m, f, i));
  std::string out = absl::StrJoin(items, sep);
  if (clip && n > 8) out += sep + "... (" + std::to_string(n) + ")";
  return out;
}

bool IsScalar(const pb::FieldDescriptor* f) { return f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE; }

// The answer's echoes of the request (run_id, step, ...): set scalars
// outside a table.
std::vector<const pb::FieldDescriptor*> Echoes(const pb::Message& m) {
  std::vector<const pb::FieldDescriptor*> out;
  for (int i = 0; i < m.GetDescriptor()->field_count(); ++i) {
    const pb::FieldDescriptor* f = m.GetDescriptor()->field(i);
    if (IsScalar(f) && !f->is_repeated() && !IsJobField(f->name())) out.push_back(f);
  }
  return out;
}

// The first repeated message field with entries, as CSV.
int PrintCsv(const pb::Message& resp) {
  const pb::Reflection* r = resp.GetReflection();
  for (int i = 0; i < resp.GetDescriptor()->field_count(); ++i) {
    const pb::FieldDescriptor* table = resp.GetDescriptor()->field(i);
    if (IsScalar(table) || !table->is_repeated() || r->FieldSize(resp, table) == 0) continue;
    const std::vector<const pb::FieldDescriptor*> echoes = Echoes(resp);
    const pb::Descriptor* row = table->message_type();
    std::vector<std::string> header;
    for (const pb::FieldDescriptor* e : echoes) header.emplace_back(e->name());
    for (int c = 0; c < row->field_count(); ++c) {
      if (IsScalar(row->field(c))) header.emplace_back(row->field(c)->name());
    }
    std::printf("%s\n", absl::StrJoin(header, ",").c_str());
    for (int k = 0; k < r->FieldSize(resp, table); ++k) {
      const pb::Message& item = r->GetRepeatedMessage(resp, table, k);
      std::vector<std::string> cells;
      for (const pb::FieldDescriptor* e : echoes) cells.push_back(client::CsvField(Text(resp, e)));
      for (int c = 0; c < row->field_count(); ++c) {
        if (IsScalar(row->field(c))) cells.push_back(client::CsvField(Cell(item, row->field(c), ";", false)));
      }
      std::printf("%s\n", absl::StrJoin(cells, ",").c_str());
    }
    return 0;
  }
  std::fprintf(stderr, "error: this answer has no table to write as CSV; --json gives all of it\n");
  return 1;
}

// One repeated message field as a table; nested messages are left to --json.
void PrintTable(const pb::Message& resp, const pb::FieldDescriptor* table) {
  const pb::Reflection* r = resp.GetReflection();
  const pb::Descriptor* row = table->message_type();
  std::vector<const pb::FieldDescriptor*> cols;
  for (int c = 0; c < row->field_count(); ++c) {
    if (IsScalar(row->field(c))) cols.push_back(row->field(c));
  }
  std::vector<std::vector<std::string>> cells(1);
  for (const pb::FieldDescriptor* c : cols) cells[0].push_back(absl::AsciiStrToUpper(c->name()));
  for (int k = 0; k < r->FieldSize(resp, table); ++k) {
    const pb::Message& item = r->GetRepeatedMessage(resp, table, k);
    cells.emplace_back();
    for (const pb::FieldDescriptor* c : cols) cells.back().push_back(Cell(item, c, " ", true));
  }
  std::vector<size_t> width(cols.size(), 0);
  for (const auto& line : cells) {
    for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  }
  std::printf("\n%s (%d)\n", std::string(table->name()).c_str(), r->FieldSize(resp, table));
  for (const auto& line : cells) {
    std::string out = " ";
    for (size_t c = 0; c < line.size(); ++c) out += " " + line[c] + std::string(width[c] - line[c].size(), ' ');
    std::printf("%s\n", std::string(absl::StripTrailingAsciiWhitespace(out)).c_str());
  }
}

void PrintHuman(const Options& o, const pb::Message& resp) {
  std::vector<std::string> echoes;
  for (const pb::FieldDescriptor* e : Echoes(resp)) {
    const std::string text = Text(resp, e);
    if (!text.empty() && text != "0") echoes.push_back(std::string(e->name()) + " " + text);
  }
  const bool stored = resp.GetReflection()->GetBool(resp, resp.GetDescriptor()->FindFieldByName("from_store"));
  std::printf("%s: %s%s\n", std::string(o.method->name()).c_str(), absl::StrJoin(echoes, ", ").c_str(),
              stored ? "  (stored answer)" : "");
  for (int i = 0; i < resp.GetDescriptor()->field_count(); ++i) {
    const pb::FieldDescriptor* f = resp.GetDescriptor()->field(i);
    if (!f->is_repeated() || resp.GetReflection()->FieldSize(resp, f) == 0) continue;
    if (IsScalar(f)) {
      std::printf("%s: %s\n", std::string(f->name()).c_str(), Cell(resp, f, " ", true).c_str());
    } else {
      PrintTable(resp, f);
    }
  }
}

// A reflected answer as RunAnalysis (cli.h) waits on it.
struct Answer {
  std::shared_ptr<pb::Message> m;
  int state() const { return m->GetReflection()->GetEnumValue(*m, m->GetDescriptor()->FindFieldByName("state")); }
  double progress() const { return m->GetReflection()->GetDouble(*m, m->GetDescriptor()->FindFieldByName("progress")); }
  const std::string& job_id() const {
    return m->GetReflection()->GetStringReference(*m, m->GetDescriptor()->FindFieldByName("job_id"), nullptr);
  }
  const std::string& error() const {
    return m->GetReflection()->GetStringReference(*m, m->GetDescriptor()->FindFieldByName("error"), nullptr);
  }
};
std::string AnswerJson(const Answer& a) { return client::ToJson(*a.m); }

int Run(Context& ctx, const Options& o) {
  const pb::Message* prototype = pb::MessageFactory::generated_factory()->GetPrototype(o.method->input_type());
  std::unique_ptr<pb::Message> req(prototype->New());
  if (absl::Status s = BuildRequest(o, req.get()); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  }
  const pb::FieldDescriptor* force = o.method->input_type()->FindFieldByName("force");
  std::unique_ptr<pb::Message> resp(
      pb::MessageFactory::generated_factory()->GetPrototype(o.method->output_type())->New());
  auto call = [&](bool f) -> absl::StatusOr<Answer> {
    req->GetReflection()->SetBool(req.get(), force, f);
    Answer a{std::shared_ptr<pb::Message>(resp->New())};
    if (absl::Status s = ctx.client.CallAnalysis(*req, a.m.get()); !s.ok()) return s;
    return a;
  };
  Answer done;
  if (auto rc = RunAnalysis(ctx, AnalysisFrontName(o.method->name()), o.force, call, &done)) return *rc;
  if (o.csv) return PrintCsv(*done.m);
  PrintHuman(o, *done.m);
  return 0;
}

// `text` in lines of at most `width` characters (words kept whole).
std::string Wrap(const std::string& text, size_t width = 110) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + std::string(word);
  }
  return out + line;
}

// A flag's help: its field's comment, capitalised.
std::string FieldHelp(const pb::FieldDescriptor* f) {
  std::string text = client::CommentOf(f);
  if (!text.empty()) text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
  return text;
}

const char* TypeName(const pb::FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_INT64: return "INT";
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64: return "UINT";
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT: return "NUMBER";
    case pb::FieldDescriptor::CPPTYPE_ENUM: return "NAME";
    default: return "TEXT";
  }
}

void AddOne(CLI::App& app, Action* chosen, const pb::MethodDescriptor* method) {
  auto o = std::make_shared<Options>();
  o->method = method;
  const pb::Descriptor* d = method->input_type();
  const std::string verb = AnalysisFrontName(method->name());
  std::vector<std::string> nested;
  for (int i = 0; i < d->field_count(); ++i) {
    if (!IsScalar(d->field(i)) && d->field(i)->name() != "spec") nested.emplace_back(d->field(i)->name());
  }
  std::string help = Wrap(client::CommentOf(method));
  help += (help.empty() ? "" : "\n") + std::string("An analysis job on the server (the ") +
          std::string(method->name()) + " RPC); this command waits and shows progress.";
  if (!nested.empty()) help += "\nMessage fields (" + absl::StrJoin(nested, ", ") + "): set them in --request FILE.json.";
  help += "\n  circuitlab " + verb + " r3\n  circuitlab " + verb + " r3 --csv > " + verb + ".csv";
  CLI::App* sub = AddVerb(app, chosen, verb, help, o, Run);
  const bool has_spec = d->FindFieldByName("spec") != nullptr;
  if (d->FindFieldByName("run_id") != nullptr) {
    sub->add_option("TARGET", o->target, has_spec ? "Run id, or a spec file" : "Run id");
  }
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (!IsScalar(f) || f->name() == "run_id" || f->name() == "force") continue;
    std::string text = FieldHelp(f);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) text += " (" + EnumValues(f->enum_type()) + ")";
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_BOOL && !f->is_repeated()) {
      sub->add_flag(Flag(f), o->flags[std::string(f->name())], text);
      continue;
    }
    CLI::Option* opt = sub->add_option(Flag(f), o->values[std::string(f->name())],
                                       f->is_repeated() ? text + " (comma-separated)" : text);
    opt->type_name(TypeName(f));
    if (f->is_repeated()) {
      opt->delimiter(',');
    } else {
      opt->expected(1);
    }
  }
  sub->add_option("--request", o->request_file, "A " + std::string(d->name()) +
                                                    " as protobuf JSON; the flags above override its fields")
      ->check(CLI::ExistingFile);
  sub->add_flag("--csv", o->csv, "CSV of the answer's first table, each row led by the answer's echoes (run_id, step)");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace analysis_verbs
}  // namespace

void AddAnalysisVerbs(CLI::App& app, Action* chosen) {
  for (const google::protobuf::MethodDescriptor* method : client::Client::AnalysisMethods()) {
    bool own = false;
    for (const auto& [rpc, verb] : analysis_verbs::kOwnVerbs) own = own || rpc == method->name();
    if (!own && IsJobAnalysis(method)) analysis_verbs::AddOne(app, chosen, method);
  }
}

}  // namespace circuitlab::cli
