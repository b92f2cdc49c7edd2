#include "server/scheduler/sweeps.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_join.h"
#include "server/common/seeds.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/scheduler/sweep_values.h"

namespace circuitlab::scheduler {

using google::protobuf::Value;
using Json = nlohmann::json;
using sweep_values::ToJson;

SweepCore::SweepCore(Scheduler* scheduler, store::Store* store, AnalysisCore* analyses, int max_sweep_runs,
                     const Quotas* quotas)
    : scheduler_(scheduler), store_(store), analyses_(analyses), max_sweep_runs_(max_sweep_runs), quotas_(quotas) {}

absl::StatusOr<v1::Sweep> SweepCore::Submit(const v1::SweepSpec& sweep, const std::string& owner) {
  if (sweep.name().size() > 256) {
    return absl::InvalidArgumentError("sweep.name must have at most 256 characters, got " +
                                      std::to_string(sweep.name().size()));
  }
  if (HasControl(sweep.name())) {
    return absl::InvalidArgumentError("sweep.name must not contain control characters, got " + Quote(sweep.name()));
  }
  const int max_runs = MaxRunsFor(owner);
  // The queue's room is checked before the sweep is expanded (issue 14).
  if (const int64_t count = SweepMemberCount(sweep, max_runs); count <= max_runs) {
    CL_RETURN_IF_ERROR(scheduler_->CheckQueueRoom(count, owner));
  }
  CL_ASSIGN_OR_RETURN(std::vector<SweepMember> members, ExpandSweep(sweep, max_runs));
  if (members.empty()) return absl::InvalidArgumentError("the sweep has no members");
  std::vector<store::NewRun> rows;
  rows.reserve(members.size());
  for (SweepMember& m : members) {
    const std::string who = m.spec.name();
    absl::StatusOr<store::NewRun> row = scheduler_->PrepareRun(std::move(m.spec), owner);
    if (!row.ok()) {
      return absl::Status(row.status().code(), "sweep member " + who + ": " + std::string(row.status().message()));
    }
    Json values = Json::array();
    for (const Value& v : m.values) values.push_back(ToJson(v));
    row->sweep_values = values.dump();
    rows.push_back(std::move(*row));
  }
  store::NewSweep s;
  s.name = sweep.name().empty() ? sweep.base().name() : sweep.name();
  s.spec = sweep.SerializeAsString();
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(sweep, &s.spec_json, print).ok()) s.spec_json = "{}";
  s.created_at_us = rows.front().created_at_us;
  s.owner = owner;
  CL_ASSIGN_OR_RETURN(auto ids, scheduler_->SubmitSweep(s, std::move(rows), owner));
  return Get(FormatSweepId(ids.first));
}

absl::StatusOr<v1::Sweep> SweepCore::ToSweep(const store::SweepRow& row, const std::vector<store::RunRow>& runs) {
  v1::Sweep out;
  out.set_sweep_id(FormatSweepId(row.id));
  out.set_name(row.name);
  if (!out.mutable_spec()->ParseFromString(row.spec)) {
    return absl::DataLossError("stored spec of " + FormatSweepId(row.id) + " does not parse");
  }
  out.mutable_created_at()->set_seconds(row.created_at_us / 1000000);
  out.mutable_created_at()->set_nanos(static_cast<int32_t>(row.created_at_us % 1000000) * 1000);
  bool done = true;
  for (const store::RunRow& r : runs) {
    out.add_run_ids(FormatRunId(r.id));
    ++(*out.mutable_states())[v1::RunState_Name(static_cast<v1::RunState>(r.state))];
    done = done && IsFinal(r.state);
  }
  out.set_done(done);
  out.set_owner(row.owner);
  return out;
}

absl::StatusOr<v1::Sweep> SweepCore::Get(const std::string& sweep_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(sweep_id));
  CL_ASSIGN_OR_RETURN(store::SweepRow row, store_->GetSweep(id));
  CL_ASSIGN_OR_RETURN(std::vector<store::RunRow> runs, store_->SweepRuns(id));
  return ToSweep(row, runs);
}

absl::StatusOr<std::string> SweepCore::OwnerOf(const std::string& sweep_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(sweep_id));
  CL_ASSIGN_OR_RETURN(store::SweepRow row, store_->GetSweep(id));
  return row.owner;
}

absl::StatusOr<v1::Sweep> SweepCore::Cancel(const std::string& sweep_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(sweep_id));
  CL_RETURN_IF_ERROR(store_->GetSweep(id).status());
  CL_ASSIGN_OR_RETURN(std::vector<store::RunRow> runs, store_->SweepRuns(id));
  int cancelled = 0;
  for (const store::RunRow& r : runs) {
    if (IsFinal(r.state)) continue;
    absl::StatusOr<v1::Run> c = scheduler_->Cancel(FormatRunId(r.id));
    // A member that ended meanwhile answers FailedPrecondition: nothing to do.
    if (!c.ok() && c.status().code() != absl::StatusCode::kFailedPrecondition) return c.status();
    if (c.ok()) ++cancelled;
  }
  spdlog::info("cancelled sweep {}: {} member(s) stopped", FormatSweepId(id), cancelled);
  return Get(sweep_id);
}

absl::StatusOr<v1::DeleteSweepResponse> SweepCore::Delete(const std::string& sweep_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(sweep_id));
  CL_RETURN_IF_ERROR(store_->GetSweep(id).status());
  CL_ASSIGN_OR_RETURN(std::vector<store::RunRow> runs, store_->SweepRuns(id));
  std::vector<int64_t> ids;
  v1::DeleteSweepResponse out;
  out.set_sweep_id(FormatSweepId(id));
  for (const store::RunRow& r : runs) {
    ids.push_back(r.id);
    out.add_run_ids(FormatRunId(r.id));
  }
  CL_ASSIGN_OR_RETURN(int64_t freed, scheduler_->DeleteRuns(ids, id));
  out.set_freed_bytes(static_cast<uint64_t>(freed));
  return out;
}

}  // namespace circuitlab::scheduler
