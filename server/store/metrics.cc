#include "server/store/store.h"

// The time series of a run: metrics (name-interned, appended in batches)
// and the IMIR coordinates (their definitions and values per step).

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"
#include "server/store/sqlite.h"
#include "server/store/store_impl.h"
#include "server/store/store_internal.h"

namespace circuitlab::store {
void Store::AppendMetrics(int64_t run_id, std::vector<MetricPoint> points) {
  if (points.empty() || impl_->JoinMetrics(run_id, points)) return;
  Impl* impl = impl_.get();
  auto shared = std::make_shared<std::vector<MetricPoint>>(std::move(points));
  impl_->Submit(
      [impl, run_id, shared](Connection& c) -> absl::Status {
        // Read under the writer's ownership: once this op is taken off the
        // queue nothing joins it any more.
        for (const MetricPoint& p : *shared) {
          CL_ASSIGN_OR_RETURN(int64_t name_id, impl->NameId(c, p.name));
          CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO metrics(run_id, name_id, step, value) "
                                                      "VALUES (?, ?, ?, ?)"));
          st.Bind(1, run_id).Bind(2, name_id).Bind(3, p.step).Bind(4, p.value);
          CL_RETURN_IF_ERROR(st.Run());
        }
        impl->CountOpRows(shared->size(), 0);
        return absl::OkStatus();
      },
      /*sync=*/false, shared, run_id);
}

absl::StatusOr<std::vector<MetricSeries>> Store::GetMetrics(int64_t run_id, const MetricQuery& q) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  // Which series.
  std::vector<std::pair<int64_t, std::string>> names;
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT DISTINCT n.id, n.name FROM metric_names n WHERE EXISTS "
                                                 "(SELECT 1 FROM metrics m WHERE m.run_id = ? AND m.name_id = n.id) "
                                                 "ORDER BY n.name"));
    st.Bind(1, run_id);
    while (true) {
      CL_ASSIGN_OR_RETURN(bool more, st.Step());
      if (!more) break;
      std::string name = st.ColumnText(1);
      if (q.names.empty() || std::find(q.names.begin(), q.names.end(), name) != q.names.end()) {
        names.emplace_back(st.ColumnInt(0), std::move(name));
      }
    }
  }
  const int64_t max_step = q.max_step > 0 ? q.max_step : std::numeric_limits<int64_t>::max();
  const int64_t per_series_cap =
      std::min<int64_t>(q.max_points, q.max_total_points / std::max<int64_t>(1, static_cast<int64_t>(names.size())));
  std::vector<MetricSeries> out;
  for (auto& [id, name] : names) {
    MetricSeries s;
    s.name = name;
    CL_RETURN_IF_ERROR(ReadDownsampled(
        *r, "SELECT count(*) FROM metrics WHERE run_id = ? AND name_id = ? AND step BETWEEN ? AND ?",
        "SELECT step, value FROM metrics WHERE run_id = ? AND name_id = ? AND step BETWEEN ? AND ? ORDER BY step",
        {run_id, id}, q.min_step, max_step, per_series_cap, s.steps, s.values, s.total_points));
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::map<std::string, double>> Store::LatestMetrics(int64_t run_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  // A loose index scan: hop from one series to the next through the primary
  // key (run_id, name_id, step), then read each series' last row; a few index
  // seeks per series instead of a scan of every point of the run.
  CL_ASSIGN_OR_RETURN(
      Statement st, r->Prepare("WITH RECURSIVE series(id) AS ("
                               " SELECT (SELECT min(name_id) FROM metrics WHERE run_id = ?1)"
                               " UNION ALL SELECT (SELECT min(name_id) FROM metrics WHERE run_id = ?1 AND name_id > id)"
                               " FROM series WHERE id IS NOT NULL) "
                               "SELECT n.name, (SELECT value FROM metrics WHERE run_id = ?1 AND name_id = series.id "
                               "ORDER BY step DESC LIMIT 1) FROM series JOIN metric_names n ON n.id = series.id"));
  st.Bind(1, run_id);
  std::map<std::string, double> out;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    out[st.ColumnText(0)] = st.ColumnDouble(1);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> Store::PutCoordinateDefs(int64_t run_id, const std::string& selection,
                                                              const std::vector<CoordinateDefRow>& defs) {
  std::vector<int64_t> ids;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    ids.clear();
    {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("SELECT coord_id FROM coordinate_defs WHERE run_id = ? AND "
                                                  "selection = ? ORDER BY coord_index"));
      st.Bind(1, run_id).Bind(2, selection);
      while (true) {
        CL_ASSIGN_OR_RETURN(bool more, st.Step());
        if (!more) break;
        ids.push_back(st.ColumnInt(0));
      }
    }
    if (!ids.empty()) {
      if (ids.size() != defs.size()) {
        return absl::FailedPreconditionError("run r" + std::to_string(run_id) + " already has " +
                                             std::to_string(ids.size()) + " " + selection + " coordinates, not " +
                                             std::to_string(defs.size()));
      }
      return absl::OkStatus();
    }
    for (const CoordinateDefRow& d : defs) {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT INTO coordinate_defs(run_id, selection, coord_index, label, "
                                                  "canonical, matrix, layer, head, block_q, block_k, element, norm, "
                                                  "gauge) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"));
      st.Bind(1, run_id).Bind(2, selection).Bind(3, int64_t{d.index}).Bind(4, d.label).Bind(5, d.canonical);
      st.Bind(6, d.matrix).Bind(7, int64_t{d.layer}).Bind(8, int64_t{d.head}).Bind(9, d.block_q).Bind(10, d.block_k);
      st.Bind(11, d.element).Bind(12, d.norm).Bind(13, int64_t{d.gauge ? 1 : 0});
      CL_RETURN_IF_ERROR(st.Run());
      ids.push_back(c.LastInsertRowId());
    }
    return absl::OkStatus();
  }));
  return ids;
}

void Store::AppendCoordinates(int64_t run_id, int64_t step, std::vector<int64_t> ids, std::vector<double> values) {
  if (ids.empty()) return;
  Impl* impl = impl_.get();
  impl_->Submit(
      [impl, run_id, step, ids = std::move(ids), values = std::move(values)](Connection& c) -> absl::Status {
        for (size_t i = 0; i < ids.size() && i < values.size(); ++i) {
          CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO coordinates(coord_id, step, run_id, "
                                                      "value) VALUES (?, ?, ?, ?)"));
          st.Bind(1, ids[i]).Bind(2, step).Bind(3, run_id).Bind(4, values[i]);
          CL_RETURN_IF_ERROR(st.Run());
        }
        impl->CountOpRows(0, std::min(ids.size(), values.size()));
        return absl::OkStatus();
      },
      /*sync=*/false);
}

absl::StatusOr<std::vector<CoordinateSeries>> Store::GetTrajectory(int64_t run_id, const TrajectoryQuery& q) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  std::vector<CoordinateDefRow> defs;
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare(std::string("SELECT ") + kCoordinateDefColumns +
                                                 " FROM coordinate_defs WHERE run_id = ? AND selection = ? "
                                                 "ORDER BY coord_index"));
    st.Bind(1, run_id).Bind(2, q.selection);
    while (true) {
      CL_ASSIGN_OR_RETURN(bool more, st.Step());
      if (!more) break;
      CoordinateDefRow d = ReadCoordinateDef(st);
      const bool wanted =
          q.names.empty() || std::find(q.names.begin(), q.names.end(), d.label) != q.names.end() ||
          (!d.canonical.empty() && std::find(q.names.begin(), q.names.end(), d.canonical) != q.names.end());
      if (wanted) defs.push_back(std::move(d));
    }
  }
  const int64_t max_step = q.max_step > 0 ? q.max_step : std::numeric_limits<int64_t>::max();
  const int64_t cap =
      std::min<int64_t>(q.max_points, q.max_total_points / std::max<int64_t>(1, static_cast<int64_t>(defs.size())));
  std::vector<CoordinateSeries> out;
  for (CoordinateDefRow& d : defs) {
    CoordinateSeries s;
    CL_RETURN_IF_ERROR(
        ReadDownsampled(*r, "SELECT count(*) FROM coordinates WHERE coord_id = ? AND step BETWEEN ? AND ?",
                        "SELECT step, value FROM coordinates WHERE coord_id = ? AND step BETWEEN ? AND ? ORDER BY step",
                        {d.id}, q.min_step, max_step, cap, s.steps, s.values, s.total_points));
    s.def = std::move(d);
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<CoordinateDefRow, double>>> Store::CoordinatesAt(int64_t run_id,
                                                                                      const std::string& selection,
                                                                                      int64_t step) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st,
                      r->Prepare(std::string("SELECT c.value, ") + kCoordinateDefColumns +
                                 " FROM coordinates c JOIN coordinate_defs USING (coord_id) WHERE c.run_id = ? AND "
                                 "c.step = ? AND selection = ? ORDER BY coord_index"));
  st.Bind(1, run_id).Bind(2, step).Bind(3, selection);
  std::vector<std::pair<CoordinateDefRow, double>> out;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    out.emplace_back(ReadCoordinateDef(st, 1), st.ColumnDouble(0));
  }
  return out;
}

absl::StatusOr<std::vector<Store::LastValue>> Store::LastCoordinateOfRuns(const std::vector<int64_t>& run_ids,
                                                                          const std::string& selection,
                                                                          const std::string& label) {
  const std::string ids = absl::StrCat("[", absl::StrJoin(run_ids, ","), "]");
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  // coordinate_defs_by_label finds each run's coordinate; the coordinates
  // primary key (coord_id, step) finds its last step.
  CL_ASSIGN_OR_RETURN(Statement st,
                      r->Prepare("SELECT d.run_id, c.step, c.value FROM coordinate_defs d JOIN coordinates c ON "
                                 "c.coord_id = d.coord_id AND c.step = (SELECT max(step) FROM coordinates WHERE "
                                 "coord_id = d.coord_id) WHERE d.run_id IN (SELECT value FROM json_each(?1)) AND "
                                 "d.selection = ?2 AND (d.label = ?3 OR d.canonical = ?3) ORDER BY d.run_id"));
  st.Bind(1, ids).Bind(2, selection).Bind(3, label);
  std::vector<LastValue> out;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    out.push_back({st.ColumnInt(0), st.ColumnInt(1), st.ColumnDouble(2)});
  }
  return out;
}

}  // namespace circuitlab::store
