#include "server/store/sqlite.h"

#include <sqlite3.h>

namespace circuitlab::store {
namespace {

absl::Status SqliteError(sqlite3* db, int rc, std::string_view what) {
  std::string msg = std::string(what) + ": " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(msg);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(msg);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(msg);
    case SQLITE_CONSTRAINT:
      return absl::FailedPreconditionError(msg);
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

Statement::~Statement() {
  if (stmt_ != nullptr) {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
}

Statement& Statement::Bind(int index, int64_t value) {
  int rc = sqlite3_bind_int64(stmt_, index, value);
  if (rc != SQLITE_OK && bind_error_ == 0) bind_error_ = rc;
  return *this;
}
Statement& Statement::Bind(int index, double value) {
  int rc = sqlite3_bind_double(stmt_, index, value);
  if (rc != SQLITE_OK && bind_error_ == 0) bind_error_ = rc;
  return *this;
}
Statement& Statement::Bind(int index, std::string_view text) {
  int rc = sqlite3_bind_text64(stmt_, index, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  if (rc != SQLITE_OK && bind_error_ == 0) bind_error_ = rc;
  return *this;
}
Statement& Statement::BindBlob(int index, std::string_view bytes) {
  int rc = sqlite3_bind_blob64(stmt_, index, bytes.data(), bytes.size(), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK && bind_error_ == 0) bind_error_ = rc;
  return *this;
}
Statement& Statement::BindNull(int index) {
  int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK && bind_error_ == 0) bind_error_ = rc;
  return *this;
}

absl::Status Statement::bind_status() const {
  if (bind_error_ == 0) return absl::OkStatus();
  return SqliteError(conn_->db_, bind_error_, "bind");
}

absl::StatusOr<bool> Statement::Step() {
  if (auto s = bind_status(); !s.ok()) return s;
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return SqliteError(conn_->db_, rc, sqlite3_sql(stmt_));
}

absl::Status Statement::Run() {
  while (true) {
    auto row = Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::OkStatus();
  }
}

int64_t Statement::ColumnInt(int col) const { return sqlite3_column_int64(stmt_, col); }
double Statement::ColumnDouble(int col) const { return sqlite3_column_double(stmt_, col); }
std::string Statement::ColumnText(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
}
std::string Statement::ColumnBlob(int col) const {
  const void* p = sqlite3_column_blob(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  return p ? std::string(static_cast<const char*>(p), n) : std::string();
}
bool Statement::ColumnIsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& path, bool read_write) {
  sqlite3* db = nullptr;
  int flags = SQLITE_OPEN_NOMUTEX | (read_write ? (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) : SQLITE_OPEN_READONLY);
  int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteError(db, rc, "open " + path);
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<Connection> conn(new Connection(db));
  sqlite3_busy_timeout(db, 5000);
  sqlite3_extended_result_codes(db, 1);
  // Probe that the file really is a database before anything else.
  if (auto s = conn->Exec("PRAGMA foreign_keys=ON"); !s.ok()) return s;
  if (read_write) {
    // Incremental auto-vacuum lets deleting runs return pages to the file
    // system; it takes effect on a new database only (an existing one keeps
    // its mode until a full VACUUM).
    // temp_store=MEMORY: the writer opens a savepoint per queued write (so one
    // failing write does not take its batch down), and SQLite journals every
    // page a savepoint touches into a temporary sub-journal, by default a
    // file: ~4 pwrite calls per metric or coordinate row, 2/3 of the writer's
    // time. In memory it costs a page copy (a batch is at most a few MB).
    if (auto s = conn->Exec("PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                            "PRAGMA temp_store=MEMORY");
        !s.ok()) {
      return s;
    }
  }
  if (auto s = conn->Exec("SELECT count(*) FROM sqlite_master"); !s.ok()) return s;
  return conn;
}

Connection::~Connection() {
  for (auto& [sql, stmt] : cache_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

absl::Status Connection::Exec(std::string_view sql) {
  char* err = nullptr;
  std::string s(sql);
  int rc = sqlite3_exec(db_, s.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    return SqliteError(nullptr, rc, "sqlite exec: " + msg);
  }
  return absl::OkStatus();
}

absl::StatusOr<Statement> Connection::Prepare(std::string_view sql) {
  std::string key(sql);
  auto it = cache_.find(key);
  if (it != cache_.end()) return Statement(this, it->second);
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db_, key.data(), static_cast<int>(key.size()), SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "prepare '" + key + "'");
  cache_.emplace(key, stmt);
  return Statement(this, stmt);
}

int64_t Connection::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }
int Connection::Changes() const { return sqlite3_changes(db_); }
std::string Connection::ErrorMessage() const { return sqlite3_errmsg(db_); }

Transaction::~Transaction() {
  if (open_) conn_->Exec("ROLLBACK").IgnoreError();
}

absl::Status Transaction::Begin() {
  auto s = conn_->Exec("BEGIN IMMEDIATE");
  open_ = s.ok();
  return s;
}

absl::Status Transaction::Commit() {
  auto s = conn_->Exec("COMMIT");
  if (s.ok()) open_ = false;
  return s;
}

}  // namespace circuitlab::store
