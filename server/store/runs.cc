#include "server/store/store.h"

// The runs table and its neighbours: run rows, tags, sweeps, state
// transitions, progress, listing and deletion.

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"
#include "server/store/sqlite.h"
#include "server/store/store_impl.h"
#include "server/store/store_internal.h"

namespace circuitlab::store {
namespace fs = std::filesystem;
namespace {

absl::StatusOr<int64_t> InsertRunRow(Connection& c, const NewRun& run) {
  CL_ASSIGN_OR_RETURN(Statement st,
                      c.Prepare("INSERT INTO runs(name, spec, spec_json, state, priority, device_request, "
                                "created_at, total_steps, owner, sweep_id, sweep_values) "
                                "VALUES (?,?,?,?,?,?,?,?,?,?,?)"));
  st.Bind(1, run.name)
      .BindBlob(2, run.spec)
      .Bind(3, run.spec_json)
      .Bind(4, int64_t{run.state})
      .Bind(5, int64_t{run.priority})
      .Bind(6, int64_t{run.device_request})
      .Bind(7, run.created_at_us)
      .Bind(8, run.total_steps)
      .Bind(9, run.owner);
  if (run.sweep_id > 0) {
    st.Bind(10, run.sweep_id);
  } else {
    st.BindNull(10);
  }
  st.Bind(11, run.sweep_values);
  CL_RETURN_IF_ERROR(st.Run());
  const int64_t id = c.LastInsertRowId();
  for (const std::string& tag : run.tags) {
    CL_ASSIGN_OR_RETURN(Statement t, c.Prepare("INSERT OR IGNORE INTO run_tags(tag, run_id) VALUES (?, ?)"));
    t.Bind(1, tag).Bind(2, id);
    CL_RETURN_IF_ERROR(t.Run());
  }
  return id;
}

}  // namespace

absl::StatusOr<int64_t> Store::InsertRun(const NewRun& run) {
  int64_t id = 0;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    CL_ASSIGN_OR_RETURN(id, InsertRunRow(c, run));
    return absl::OkStatus();
  }));
  return id;
}

absl::StatusOr<std::pair<int64_t, std::vector<int64_t>>> Store::InsertSweep(const NewSweep& sweep,
                                                                            std::vector<NewRun> runs) {
  std::pair<int64_t, std::vector<int64_t>> ids;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    ids.second.clear();
    CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT INTO sweeps(name, spec, spec_json, created_at, owner) "
                                                "VALUES (?,?,?,?,?)"));
    st.Bind(1, sweep.name).BindBlob(2, sweep.spec).Bind(3, sweep.spec_json).Bind(4, sweep.created_at_us);
    st.Bind(5, sweep.owner);
    CL_RETURN_IF_ERROR(st.Run());
    ids.first = c.LastInsertRowId();
    for (NewRun& run : runs) {
      run.sweep_id = ids.first;
      CL_ASSIGN_OR_RETURN(int64_t id, InsertRunRow(c, run));
      ids.second.push_back(id);
    }
    return absl::OkStatus();
  }));
  return ids;
}

absl::StatusOr<SweepRow> Store::GetSweep(int64_t sweep_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT id, name, spec, created_at, owner FROM sweeps WHERE id = ?"));
  st.Bind(1, sweep_id);
  CL_ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return absl::NotFoundError("sweep s" + std::to_string(sweep_id) + " not found");
  SweepRow row;
  row.id = st.ColumnInt(0);
  row.name = st.ColumnText(1);
  row.spec = st.ColumnBlob(2);
  row.created_at_us = st.ColumnInt(3);
  row.owner = st.ColumnText(4);
  return row;
}

absl::StatusOr<std::vector<RunRow>> Store::SweepRuns(int64_t sweep_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st,
                      r->Prepare(std::string("SELECT ") + kRunColumns + " FROM runs WHERE sweep_id = ? ORDER BY id"));
  st.Bind(1, sweep_id);
  std::vector<RunRow> rows;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    rows.push_back(ReadRunRow(st));
  }
  return rows;
}

absl::Status Store::TransitionRun(int64_t run_id, const RunTransition& t) {
  return impl_->Write([&](Connection& c) -> absl::Status {
    int current = 0;
    {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("SELECT state FROM runs WHERE id = ?"));
      st.Bind(1, run_id);
      CL_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) return absl::NotFoundError("run r" + std::to_string(run_id) + " not found");
      current = static_cast<int>(st.ColumnInt(0));
    }
    if (!t.from_states.empty() &&
        std::find(t.from_states.begin(), t.from_states.end(), current) == t.from_states.end()) {
      return absl::FailedPreconditionError("run r" + std::to_string(run_id) + " is in state " +
                                           std::to_string(current));
    }
    CL_ASSIGN_OR_RETURN(
        Statement st,
        c.Prepare("UPDATE runs SET state = ?1, device = COALESCE(?2, device), error = COALESCE(?3, error), "
                  "started_at = CASE WHEN ?4 IS NOT NULL AND started_at = 0 THEN ?4 ELSE started_at END, "
                  "finished_at = COALESCE(?5, finished_at), attempts = attempts + ?6, "
                  "packed_with = COALESCE(?8, packed_with) WHERE id = ?7"));
    st.Bind(1, int64_t{t.state});
    t.device ? st.Bind(2, *t.device) : st.BindNull(2);
    t.error ? st.Bind(3, *t.error) : st.BindNull(3);
    t.started_at_us ? st.Bind(4, *t.started_at_us) : st.BindNull(4);
    t.finished_at_us ? st.Bind(5, *t.finished_at_us) : st.BindNull(5);
    st.Bind(6, int64_t{t.increment_attempts ? 1 : 0}).Bind(7, run_id);
    t.packed_with ? st.Bind(8, *t.packed_with) : st.BindNull(8);
    return st.Run();
  });
}

void Store::RecordProgress(int64_t run_id, int64_t step) {
  impl_->Submit(
      [run_id, step](Connection& c) -> absl::Status {
        CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("UPDATE runs SET step = ? WHERE id = ?"));
        st.Bind(1, step).Bind(2, run_id);
        return st.Run();
      },
      /*sync=*/false);
}

absl::StatusOr<RunRow> Store::GetRun(int64_t run_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  RunRow row;
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare(std::string("SELECT ") + kRunColumns + " FROM runs WHERE id = ?"));
    st.Bind(1, run_id);
    CL_ASSIGN_OR_RETURN(bool found, st.Step());
    if (!found) return absl::NotFoundError("run r" + std::to_string(run_id) + " not found");
    row = ReadRunRow(st);
  }
  CL_RETURN_IF_ERROR(LoadTags(*r, row));
  return row;
}

absl::StatusOr<RunPage> Store::ListRuns(const RunFilter& filter) {
  // Built from fixed fragments and bound parameters only (the state list
  // holds validated integers), so few distinct statements are ever cached.
  std::string where = " WHERE 1=1";
  std::vector<std::string> text_params;
  if (!filter.states.empty()) {
    where += " AND state IN (";
    where += absl::StrJoin(filter.states, ",") + ")";
  }
  if (filter.sweep_id > 0) where += " AND sweep_id = " + std::to_string(filter.sweep_id);
  if (filter.owner.has_value()) {
    where += " AND owner = ?";
    text_params.push_back(*filter.owner);
  }
  for (size_t i = 0; i < filter.tags.size(); ++i) {
    where += " AND id IN (SELECT run_id FROM run_tags WHERE tag = ?)";
    text_params.push_back(filter.tags[i]);
  }
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  RunPage page;
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT count(*) FROM runs" + where));
    for (size_t i = 0; i < text_params.size(); ++i) st.Bind(static_cast<int>(i + 1), text_params[i]);
    CL_ASSIGN_OR_RETURN(bool row, st.Step());
    page.total = row ? st.ColumnInt(0) : 0;
  }
  // The page position and size are bound, so the cached statement is the
  // same for every page of a filter.
  const std::string sql =
      std::string("SELECT ") + kRunColumns + " FROM runs" + where + " AND id < ? ORDER BY id DESC LIMIT ?";
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare(sql));
    const int n = static_cast<int>(text_params.size());
    for (int i = 0; i < n; ++i) st.Bind(i + 1, text_params[i]);
    st.Bind(n + 1, filter.before_id > 0 ? filter.before_id : std::numeric_limits<int64_t>::max());
    st.Bind(n + 2, int64_t{std::max(1, filter.limit)});
    int64_t bytes = 0;
    while (true) {
      CL_ASSIGN_OR_RETURN(bool more, st.Step());
      if (!more) break;
      page.runs.push_back(ReadRunRow(st));
      const RunRow& row = page.runs.back();
      bytes += static_cast<int64_t>(row.spec.size() + row.name.size() + row.error.size() + row.warning.size());
      if (filter.max_bytes > 0 && bytes >= filter.max_bytes) {
        page.cut = true;
        break;
      }
    }
  }
  for (RunRow& row : page.runs) CL_RETURN_IF_ERROR(LoadTags(*r, row));
  return page;
}

absl::StatusOr<std::vector<int64_t>> Store::RunIdsInState(int state) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT id FROM runs WHERE state = ? ORDER BY priority DESC, id"));
  st.Bind(1, int64_t{state});
  std::vector<int64_t> ids;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    ids.push_back(st.ColumnInt(0));
  }
  return ids;
}

absl::StatusOr<int64_t> Store::DeleteRuns(const std::vector<int64_t>& run_ids, const std::vector<int>& ended,
                                          int64_t sweep_id) {
  int64_t freed = 0;
  std::vector<std::string> files;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    freed = 0;
    files.clear();
    for (int64_t id : run_ids) {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("SELECT state FROM runs WHERE id = ?"));
      st.Bind(1, id);
      CL_ASSIGN_OR_RETURN(bool found, st.Step());
      if (!found) return absl::NotFoundError("run r" + std::to_string(id) + " not found");
      const int state = static_cast<int>(st.ColumnInt(0));
      if (std::find(ended.begin(), ended.end(), state) == ended.end()) {
        return absl::FailedPreconditionError("run r" + std::to_string(id) +
                                             " has not ended; cancel it first "
                                             "(circuitlab cancel r" +
                                             std::to_string(id) + ")");
      }
      CL_ASSIGN_OR_RETURN(Statement paths, c.Prepare("SELECT path, size_bytes FROM checkpoints WHERE run_id = ?"));
      paths.Bind(1, id);
      while (true) {
        CL_ASSIGN_OR_RETURN(bool more, paths.Step());
        if (!more) break;
        files.push_back(paths.ColumnText(0));
        freed += paths.ColumnInt(1);
      }
      // Metrics, tags, checkpoints, coordinate definitions (and with them
      // their values) and analyses go with the row (ON DELETE CASCADE).
      CL_ASSIGN_OR_RETURN(Statement del, c.Prepare("DELETE FROM runs WHERE id = ?"));
      del.Bind(1, id);
      CL_RETURN_IF_ERROR(del.Run());
    }
    if (sweep_id > 0) {
      CL_ASSIGN_OR_RETURN(Statement del, c.Prepare("DELETE FROM sweeps WHERE id = ?"));
      del.Bind(1, sweep_id);
      CL_RETURN_IF_ERROR(del.Run());
    }
    return absl::OkStatus();
  }));
  // Files go only after the rows that pointed at them are gone.
  std::error_code ec;
  for (const std::string& p : files) fs::remove(CheckpointFile(impl_->dir(), p), ec);
  for (int64_t id : run_ids) fs::remove_all(impl_->dir() + "/checkpoints/r" + std::to_string(id), ec);
  // Returns freed pages to the file system when the database was created
  // with incremental auto-vacuum (new ones are); a no-op otherwise.
  CL_RETURN_IF_ERROR(impl_->Write([](Connection& c) { return c.Exec("PRAGMA incremental_vacuum"); }));
  return freed;
}

absl::Status Store::SetRunWarning(int64_t run_id, const std::string& warning) {
  return impl_->Write([&](Connection& c) -> absl::Status {
    CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("UPDATE runs SET warning = ? WHERE id = ?"));
    st.Bind(1, warning).Bind(2, run_id);
    return st.Run();
  });
}

absl::StatusOr<std::map<int, int64_t>> Store::CountRunsByState() {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT state, COUNT(*) FROM runs GROUP BY state"));
  std::map<int, int64_t> counts;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    counts[static_cast<int>(st.ColumnInt(0))] = st.ColumnInt(1);
  }
  return counts;
}

}  // namespace circuitlab::store
