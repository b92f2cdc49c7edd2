#include "server/store/store.h"

// Stored analysis answers: one row per (run, kind, request hash), counted
// against their owner's quota.

#include <optional>
#include <string>
#include <vector>

#include "server/common/clock.h"
#include "server/common/status_macros.h"
#include "server/store/sqlite.h"
#include "server/store/store_impl.h"
#include "server/store/store_internal.h"

namespace circuitlab::store {
absl::Status Store::PutAnalysis(int64_t run_id, const std::string& kind, int64_t request_hash,
                                const std::string& request, const std::string& result, const std::string& owner,
                                int64_t max_owner_bytes, int* evicted) {
  const int64_t now = Clock::Real()->NowMicros();
  if (evicted != nullptr) *evicted = 0;
  return impl_->Write([&](Connection& c) -> absl::Status {
    if (run_id == kNoRun) {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO spec_analyses(kind, request_hash, request, "
                                                  "result, created_at) VALUES (?, ?, ?, ?, ?)"));
      st.Bind(1, kind).Bind(2, request_hash).BindBlob(3, request).BindBlob(4, result).Bind(5, now);
      return st.Run();
    }
    CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO analyses(run_id, kind, request_hash, request, "
                                                "result, created_at, owner, bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"));
    st.Bind(1, run_id).Bind(2, kind).Bind(3, request_hash).BindBlob(4, request).BindBlob(5, result).Bind(6, now);
    st.Bind(7, owner).Bind(8, static_cast<int64_t>(request.size() + result.size()));
    CL_RETURN_IF_ERROR(st.Run());
    if (owner.empty() || max_owner_bytes <= 0) return absl::OkStatus();
    CL_ASSIGN_OR_RETURN(Statement sum, c.Prepare("SELECT COALESCE(SUM(bytes), 0) FROM analyses WHERE owner = ?"));
    sum.Bind(1, owner);
    CL_ASSIGN_OR_RETURN(bool got, sum.Step());
    int64_t over = (got ? sum.ColumnInt(0) : 0) - max_owner_bytes;
    if (over <= 0) return absl::OkStatus();
    // The owner's oldest answers go first, never the one just stored.
    struct Victim {
      int64_t run_id;
      std::string kind;
      int64_t hash;
    };
    std::vector<Victim> victims;
    CL_ASSIGN_OR_RETURN(Statement oldest, c.Prepare("SELECT run_id, kind, request_hash, bytes FROM analyses WHERE "
                                                    "owner = ? ORDER BY created_at, request_hash"));
    oldest.Bind(1, owner);
    while (over > 0) {
      CL_ASSIGN_OR_RETURN(bool row, oldest.Step());
      if (!row) break;
      Victim v{oldest.ColumnInt(0), oldest.ColumnText(1), oldest.ColumnInt(2)};
      if (v.run_id == run_id && v.kind == kind && v.hash == request_hash) continue;
      over -= oldest.ColumnInt(3);
      victims.push_back(std::move(v));
    }
    for (const Victim& v : victims) {
      CL_ASSIGN_OR_RETURN(Statement del,
                          c.Prepare("DELETE FROM analyses WHERE run_id = ? AND kind = ? AND request_hash = ?"));
      del.Bind(1, v.run_id).Bind(2, v.kind).Bind(3, v.hash);
      CL_RETURN_IF_ERROR(del.Run());
    }
    if (evicted != nullptr) *evicted = static_cast<int>(victims.size());
    return absl::OkStatus();
  });
}

absl::StatusOr<int64_t> Store::StoredAnalysisBytes(const std::string& owner) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT COALESCE(SUM(bytes), 0) FROM analyses WHERE owner = ?"));
  st.Bind(1, owner);
  CL_ASSIGN_OR_RETURN(bool got, st.Step());
  return got ? st.ColumnInt(0) : 0;
}

absl::StatusOr<std::optional<std::string>> Store::GetAnalysis(int64_t run_id, const std::string& kind,
                                                              int64_t request_hash) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  if (run_id == kNoRun) {
    CL_ASSIGN_OR_RETURN(Statement st,
                        r->Prepare("SELECT result FROM spec_analyses WHERE kind = ? AND request_hash = ?"));
    st.Bind(1, kind).Bind(2, request_hash);
    CL_ASSIGN_OR_RETURN(bool found, st.Step());
    if (!found) return std::optional<std::string>();
    return std::optional<std::string>(st.ColumnBlob(0));
  }
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT result FROM analyses WHERE run_id = ? AND kind = ? AND "
                                               "request_hash = ?"));
  st.Bind(1, run_id).Bind(2, kind).Bind(3, request_hash);
  CL_ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return std::optional<std::string>();
  return std::optional<std::string>(st.ColumnBlob(0));
}

absl::StatusOr<std::vector<Store::StoredAnalysis>> Store::ListAnalyses(int64_t run_id, const std::string& kind,
                                                                       int limit, std::optional<AnalysisCursor> after,
                                                                       int64_t max_bytes, bool* cut) {
  if (cut != nullptr) *cut = false;
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st,
                      r->Prepare("SELECT request, result, created_at, request_hash FROM analyses WHERE run_id = ? AND "
                                 "kind = ? AND (? = 0 OR created_at < ? OR (created_at = ? AND request_hash > ?)) "
                                 "ORDER BY created_at DESC, request_hash LIMIT ?"));
  const AnalysisCursor from = after.value_or(AnalysisCursor{});
  st.Bind(1, run_id).Bind(2, kind).Bind(3, static_cast<int64_t>(after.has_value())).Bind(4, from.created_at);
  st.Bind(5, from.created_at).Bind(6, from.request_hash).Bind(7, static_cast<int64_t>(limit));
  std::vector<StoredAnalysis> out;
  int64_t bytes = 0;
  for (;;) {
    CL_ASSIGN_OR_RETURN(bool found, st.Step());
    if (!found) break;
    StoredAnalysis row{st.ColumnBlob(0), st.ColumnBlob(1), st.ColumnInt(2), st.ColumnInt(3)};
    bytes += static_cast<int64_t>(row.request.size() + row.result.size());
    if (max_bytes > 0 && bytes > max_bytes && !out.empty()) {
      if (cut != nullptr) *cut = true;
      break;
    }
    out.push_back(std::move(row));
  }
  return out;
}

absl::StatusOr<std::optional<Store::StoredAnalysis>> Store::GetStoredAnalysis(int64_t run_id, const std::string& kind,
                                                                              int64_t request_hash) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT request, result, created_at FROM analyses WHERE run_id = ? AND "
                                               "kind = ? AND request_hash = ?"));
  st.Bind(1, run_id).Bind(2, kind).Bind(3, request_hash);
  CL_ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return std::optional<StoredAnalysis>();
  return std::optional<StoredAnalysis>(
      StoredAnalysis{st.ColumnBlob(0), st.ColumnBlob(1), st.ColumnInt(2), request_hash});
}

}  // namespace circuitlab::store
