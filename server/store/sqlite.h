// A thin RAII layer over one SQLite connection: cached prepared statements,
// typed binding, errors as absl::Status. Store-private (only server/store uses
// it); sqlite3.h stays inside sqlite.cc.
//
// Thread-safety: a Connection is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct sqlite3;
struct sqlite3_stmt;

namespace circuitlab::store {

class Connection;

// A prepared statement borrowed from the connection's cache. Reset and
// cleared of bindings when the handle goes away, so it can be reused.
class Statement {
 public:
  Statement(Statement&& other) noexcept : conn_(other.conn_), stmt_(other.stmt_) { other.stmt_ = nullptr; }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement();

  // Bind by 1-based index. Returns *this for chaining.
  Statement& Bind(int index, int64_t value);
  Statement& Bind(int index, double value);
  Statement& Bind(int index, std::string_view text);
  Statement& BindBlob(int index, std::string_view bytes);
  Statement& BindNull(int index);

  // Advances: true when a row is available, false when done.
  absl::StatusOr<bool> Step();
  // Runs to completion, ignoring rows.
  absl::Status Run();

  int64_t ColumnInt(int col) const;
  double ColumnDouble(int col) const;
  std::string ColumnText(int col) const;
  std::string ColumnBlob(int col) const;
  bool ColumnIsNull(int col) const;

 private:
  friend class Connection;
  Statement(Connection* conn, sqlite3_stmt* stmt) : conn_(conn), stmt_(stmt) {}
  absl::Status bind_status() const;

  Connection* conn_;
  sqlite3_stmt* stmt_;
  int bind_error_ = 0;
};

class Connection {
 public:
  // Opens (and for read_write creates) the database file with WAL, foreign
  // keys and a busy timeout set.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const std::string& path, bool read_write);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Executes one or more statements without results.
  absl::Status Exec(std::string_view sql);
  // A cached prepared statement for `sql`. The statement must not be held
  // twice at once.
  absl::StatusOr<Statement> Prepare(std::string_view sql);

  int64_t LastInsertRowId() const;
  int Changes() const;
  std::string ErrorMessage() const;

 private:
  friend class Statement;
  explicit Connection(sqlite3* db) : db_(db) {}
  sqlite3* db_;
  std::unordered_map<std::string, sqlite3_stmt*> cache_;
};

// BEGIN IMMEDIATE ... COMMIT, rolled back unless Commit() succeeds.
class Transaction {
 public:
  explicit Transaction(Connection* conn) : conn_(conn) {}
  ~Transaction();
  absl::Status Begin();
  absl::Status Commit();

 private:
  Connection* conn_;
  bool open_ = false;
};

}  // namespace circuitlab::store
