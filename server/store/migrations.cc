#include "server/store/migrations.h"

#include <string>

#include "server/common/status_macros.h"

namespace circuitlab::store {
namespace {

// Numbered migrations. Never edit a shipped one; append a new one.
// Times are microseconds since the Unix epoch.
constexpr const char* kMigrations[] = {
    // 1: runs, tags, metrics, checkpoints.
    R"sql(
CREATE TABLE runs (
  id              INTEGER PRIMARY KEY AUTOINCREMENT,
  name            TEXT    NOT NULL,
  spec            BLOB    NOT NULL,
  spec_json       TEXT    NOT NULL,
  state           INTEGER NOT NULL,
  priority        INTEGER NOT NULL DEFAULT 0,
  device_request  INTEGER NOT NULL DEFAULT 0,
  created_at      INTEGER NOT NULL,
  started_at      INTEGER NOT NULL DEFAULT 0,
  finished_at     INTEGER NOT NULL DEFAULT 0,
  device          TEXT    NOT NULL DEFAULT '',
  error           TEXT    NOT NULL DEFAULT '',
  step            INTEGER NOT NULL DEFAULT 0,
  total_steps     INTEGER NOT NULL DEFAULT 0,
  attempts        INTEGER NOT NULL DEFAULT 0,
  checkpoint_step INTEGER NOT NULL DEFAULT 0,
  client          TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX runs_by_state ON runs(state, priority DESC, id);

CREATE TABLE run_tags (
  tag    TEXT    NOT NULL,
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  PRIMARY KEY (tag, run_id)
) WITHOUT ROWID;
CREATE INDEX run_tags_by_run ON run_tags(run_id);

CREATE TABLE metric_names (
  id   INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE
);

-- One clustered index answers "series X of run R over a step range".
CREATE TABLE metrics (
  run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  name_id INTEGER NOT NULL REFERENCES metric_names(id),
  step    INTEGER NOT NULL,
  value   REAL    NOT NULL,
  PRIMARY KEY (run_id, name_id, step)
) WITHOUT ROWID;

-- The checkpoint file holds weights, optimiser state and the RNG state
-- (data seed + step counter); this row points at it and guards it by checksum.
CREATE TABLE checkpoints (
  run_id     INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step       INTEGER NOT NULL,
  path       TEXT    NOT NULL,
  size_bytes INTEGER NOT NULL,
  checksum   INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
)sql",
    // 2: IMIR coordinates (basis described once per run and selection) and
    // stored analyses.
    R"sql(
CREATE TABLE coordinate_defs (
  coord_id    INTEGER PRIMARY KEY,
  run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  selection   TEXT    NOT NULL,
  coord_index INTEGER NOT NULL,
  label       TEXT    NOT NULL,
  canonical   TEXT    NOT NULL,
  matrix      TEXT    NOT NULL,
  layer       INTEGER NOT NULL,
  head        INTEGER NOT NULL,
  block_q     TEXT    NOT NULL,
  block_k     TEXT    NOT NULL,
  element     TEXT    NOT NULL,
  norm        REAL    NOT NULL,
  gauge       INTEGER NOT NULL,
  UNIQUE (run_id, selection, coord_index)
);
CREATE INDEX coordinate_defs_by_label ON coordinate_defs(run_id, selection, label);
CREATE INDEX coordinate_defs_by_canonical ON coordinate_defs(canonical, run_id) WHERE canonical != '';

-- "coordinate X over all steps of run R": the primary key.
-- "all coordinates of run R at step s": coordinates_by_step.
CREATE TABLE coordinates (
  coord_id INTEGER NOT NULL REFERENCES coordinate_defs(coord_id) ON DELETE CASCADE,
  step     INTEGER NOT NULL,
  run_id   INTEGER NOT NULL,
  value    REAL    NOT NULL,
  PRIMARY KEY (coord_id, step)
) WITHOUT ROWID;
CREATE INDEX coordinates_by_step ON coordinates(run_id, step);

-- Analyses are pure functions of (run, request): stored under a hash of the
-- canonical request and answered from here when asked again.
CREATE TABLE analyses (
  run_id       INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  kind         TEXT    NOT NULL,
  request_hash INTEGER NOT NULL,
  request      BLOB    NOT NULL,
  result       BLOB    NOT NULL,
  created_at   INTEGER NOT NULL,
  PRIMARY KEY (run_id, kind, request_hash)
) WITHOUT ROWID;
)sql",
    // 3: analyses of a spec alone (no run), e.g. CheckInvariance on a spec file.
    R"sql(
CREATE TABLE spec_analyses (
  kind         TEXT    NOT NULL,
  request_hash INTEGER NOT NULL,
  request      BLOB    NOT NULL,
  result       BLOB    NOT NULL,
  created_at   INTEGER NOT NULL,
  PRIMARY KEY (kind, request_hash)
) WITHOUT ROWID;
)sql",
    // 4: sweeps; a run may belong to one, with the values its axes gave it.
    R"sql(
CREATE TABLE sweeps (
  id         INTEGER PRIMARY KEY,
  name       TEXT    NOT NULL,
  spec       BLOB    NOT NULL,
  spec_json  TEXT    NOT NULL,
  created_at INTEGER NOT NULL,
  client     TEXT    NOT NULL DEFAULT ''
);
ALTER TABLE runs ADD COLUMN sweep_id INTEGER REFERENCES sweeps(id);
ALTER TABLE runs ADD COLUMN sweep_values TEXT NOT NULL DEFAULT '';
CREATE INDEX runs_by_sweep ON runs(sweep_id, id) WHERE sweep_id IS NOT NULL;
)sql",
    // 5: what the server worked around for a run (a damaged checkpoint).
    R"sql(
ALTER TABLE runs ADD COLUMN warning TEXT NOT NULL DEFAULT '';
)sql",
    // 6: runs and sweeps belong to the principal that submitted them (the
    // column held the self-asserted client label before; those runs keep it
    // as their owner, which only an admin matches).
    R"sql(
ALTER TABLE runs RENAME COLUMN client TO owner;
ALTER TABLE sweeps RENAME COLUMN client TO owner;
CREATE INDEX runs_by_owner ON runs(owner, id);
)sql",
    // 7: reproductions (ReproductionService): the job's whole record (a
    // serialized circuitlab.v1.Reproduction); owner and state are columns
    // for the listing and for resuming the unfinished ones at start.
    R"sql(
CREATE TABLE reproductions (
  id         INTEGER PRIMARY KEY,
  owner      TEXT    NOT NULL,
  state      INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  body       BLOB    NOT NULL
);
CREATE INDEX reproductions_by_state ON reproductions(state, id);
)sql",
    // 8: a reproduction's summary (the record in the BASIC view, a few
    // hundred bytes), what listings read instead of the whole record; NULL
    // for one stored before, whose listing reads the body.
    R"sql(
ALTER TABLE reproductions ADD COLUMN summary BLOB;
)sql",
    // 9: a stored analysis answer belongs to the principal whose job computed
    // it and counts its bytes against that principal's storage quota
    // (answers stored before belong to no one and count for no one).
    R"sql(
ALTER TABLE analyses ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE analyses ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
UPDATE analyses SET bytes = length(request) + length(result);
CREATE INDEX analyses_by_owner ON analyses(owner, created_at);
)sql",
    // 10: the runs a run's latest attempt was packed with ("r3,r4"; issue 48).
    R"sql(
ALTER TABLE runs ADD COLUMN packed_with TEXT NOT NULL DEFAULT '';
)sql",
};

constexpr int kLatest = static_cast<int>(sizeof(kMigrations) / sizeof(kMigrations[0]));

absl::StatusOr<int> UserVersion(Connection& conn) {
  CL_ASSIGN_OR_RETURN(Statement st, conn.Prepare("PRAGMA user_version"));
  CL_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return absl::InternalError("PRAGMA user_version returned no row");
  return static_cast<int>(st.ColumnInt(0));
}

}  // namespace

int LatestSchemaVersion() { return kLatest; }

absl::Status Migrate(Connection& conn) {
  CL_ASSIGN_OR_RETURN(int version, UserVersion(conn));
  if (version > kLatest) {
    return absl::FailedPreconditionError("database schema version " + std::to_string(version) +
                                         " is newer than this binary's (" + std::to_string(kLatest) +
                                         "); upgrade circuitlab-server or use another --data directory");
  }
  for (int v = version; v < kLatest; ++v) {
    Transaction tx(&conn);
    CL_RETURN_IF_ERROR(tx.Begin());
    CL_RETURN_IF_ERROR(conn.Exec(kMigrations[v]));
    CL_RETURN_IF_ERROR(conn.Exec("PRAGMA user_version = " + std::to_string(v + 1)));
    CL_RETURN_IF_ERROR(tx.Commit());
  }
  return absl::OkStatus();
}

}  // namespace circuitlab::store
