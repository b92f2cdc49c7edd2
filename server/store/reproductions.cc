#include "server/store/store.h"

// The reproductions table: a reproduction's state, stored report and its
// summary column (the rows ListReproductions pages through).

#include <string>

#include "server/common/status_macros.h"
#include "server/store/sqlite.h"
#include "server/store/store_impl.h"
#include "server/store/store_internal.h"

namespace circuitlab::store {
absl::StatusOr<int64_t> Store::InsertReproduction(const ReproductionRow& row) {
  int64_t id = 0;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    CL_ASSIGN_OR_RETURN(
        Statement st,
        c.Prepare("INSERT INTO reproductions(owner, state, created_at, body, summary) VALUES (?,?,?,?,?)"));
    st.Bind(1, row.owner).Bind(2, static_cast<int64_t>(row.state)).Bind(3, row.created_at_us).BindBlob(4, row.body);
    st.BindBlob(5, row.summary);
    CL_RETURN_IF_ERROR(st.Run());
    id = c.LastInsertRowId();
    return absl::OkStatus();
  }));
  return id;
}

absl::Status Store::UpdateReproduction(int64_t id, int state, const std::string& body, const std::string& summary) {
  return impl_->Write([&](Connection& c) -> absl::Status {
    CL_ASSIGN_OR_RETURN(Statement st,
                        c.Prepare("UPDATE reproductions SET state = ?, body = ?, summary = ? WHERE id = ?"));
    st.Bind(1, static_cast<int64_t>(state)).BindBlob(2, body).BindBlob(3, summary).Bind(4, id);
    CL_RETURN_IF_ERROR(st.Run());
    if (c.Changes() == 0) return absl::NotFoundError("reproduction p" + std::to_string(id) + " not found");
    return absl::OkStatus();
  });
}

absl::StatusOr<ReproductionRow> Store::GetReproduction(int64_t id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT id, owner, state, created_at, body, COALESCE(summary, '') "
                                               "FROM reproductions WHERE id = ?"));
  st.Bind(1, id);
  CL_ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return absl::NotFoundError("reproduction p" + std::to_string(id) + " not found");
  return ReproductionRow{st.ColumnInt(0), st.ColumnText(1), static_cast<int>(st.ColumnInt(2)),
                         st.ColumnInt(3), st.ColumnBlob(4), st.ColumnBlob(5)};
}

absl::StatusOr<ReproductionPage> Store::ListReproductions(const ReproductionQuery& q) {
  // A row stored before the summary column lists its body as its summary.
  std::string sql = std::string("SELECT id, owner, state, created_at, ") + (q.with_body ? "body" : "''") +
                    ", CASE WHEN length(summary) > 0 THEN summary ELSE body END FROM reproductions WHERE (? = '' OR "
                    "owner = ?) AND (? = 0 OR id < ?)";
  if (!q.states.empty()) {
    sql += " AND state IN (";
    for (size_t i = 0; i < q.states.size(); ++i) sql += (i ? ",?" : "?");
    sql += ")";
  }
  sql += " ORDER BY id DESC LIMIT ?";
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare(sql));
  st.Bind(1, q.owner).Bind(2, q.owner).Bind(3, q.before_id).Bind(4, q.before_id);
  int k = 5;
  for (int s : q.states) st.Bind(k++, static_cast<int64_t>(s));
  st.Bind(k, static_cast<int64_t>(q.limit));
  ReproductionPage page;
  int64_t bytes = 0;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    ReproductionRow row{st.ColumnInt(0), st.ColumnText(1), static_cast<int>(st.ColumnInt(2)),
                        st.ColumnInt(3), st.ColumnBlob(4), st.ColumnBlob(5)};
    bytes += static_cast<int64_t>(row.body.size() + row.summary.size());
    if (q.max_bytes > 0 && bytes > q.max_bytes && !page.rows.empty()) {
      page.cut = true;
      break;
    }
    page.rows.push_back(std::move(row));
  }
  return page;
}

}  // namespace circuitlab::store
