// farpool._native: the C++ half of the Python client (`import farpool`; python/farpool/client.py
// holds the Python half and python/farpool/_native.pyi the types).
//
// What it binds: Pool and Batch (include/farpool/pool.h), Database, Session, Transaction and
// Table (include/farpool/db.h). Addresses are Python ints (GlobalAddress::raw()); rows are dicts
// keyed by column name.
//
// Contracts kept here:
//   - The GIL is released around every call into the pool or the database (they may wait on
//     the network), and held whenever a Python object is touched. Destructors keep it (a
//     Database or Pool destroyed after its servers stopped holds it while it gives up on them).
//     Buffers passed to read/write are held with the buffer protocol (PyObject_GetBuffer) for the
//     duration of the call, or until Batch.wait() for a batch, so they cannot be resized or freed
//     meanwhile; the bytes move between the pool and the caller's memory without an intermediate
//     copy.
//   - Every non-OK Status becomes the exception class that farpool.errors maps its code to
//     (farpool.Aborted, farpool.Unavailable, ...), carrying the Status message.
//   - Lifetimes follow the C++ REQUIREs with keep_alive: a Batch keeps its Pool alive, a Table
//     and a Session their Database, a Transaction its Session.
//   - Threads: a Session and its Transactions belong to one thread at a time, a Batch to the
//     thread that made it (as in C++); the Python side gives each thread its own Session.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "farpool/cluster.h"
#include "farpool/db.h"
#include "farpool/pool.h"
#include "farpool/status.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace farpool::python {
namespace {

// farpool.errors.from_status and farpool.Aborted, looked up once at import. Deliberately
// leaked references: they must outlive every call, and static destructors run after the
// interpreter is gone.
nb::handle g_from_status;
nb::handle g_aborted;

// Raises the farpool exception for a non-OK status. REQUIRES: the GIL is held.
[[noreturn]] void Raise(const Status& status) {
  const std::string& m = status.message();  // may quote bytes that are not UTF-8 (a path)
  nb::object message = nb::steal(
      PyUnicode_DecodeUTF8(m.data(), static_cast<Py_ssize_t>(m.size()), "backslashreplace"));
  if (!message.is_valid()) throw nb::python_error();
  nb::object exc =
      nb::borrow(g_from_status)(nb::str(StatusCodeName(status.code()).data()), message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Take(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

// A Py_buffer held for as long as this object lives. REQUIRES: the GIL is held at construction
// and destruction.
class BufferView {
 public:
  BufferView(nb::handle object, bool writable) {
    if (PyObject_GetBuffer(object.ptr(), &view_, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      throw nb::python_error();
    }
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  void* data() const { return view_.buf; }
  uint64_t size() const { return static_cast<uint64_t>(view_.len); }

 private:
  Py_buffer view_{};
};

GlobalAddress Address(uint64_t raw) { return GlobalAddress::FromRaw(raw); }

// Runs `f` (returning a Status) with the GIL released. REQUIRES: f touches no Python object.
template <typename F>
Status Unlocked(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

// Runs `f` (returning a Result) with the GIL released and returns its value, or raises.
// REQUIRES: f touches no Python object.
template <typename F>
auto Released(F&& f) {
  decltype(f()) r = Status::Internal("not run");
  {
    nb::gil_scoped_release release;
    r = f();
  }
  return Take(std::move(r));
}

// Any sequence (a tuple, a list) as a tuple.
nb::tuple TupleOf(nb::handle sequence) {
  nb::tuple t = nb::steal<nb::tuple>(PySequence_Tuple(sequence.ptr()));
  if (!t.is_valid()) throw nb::python_error();
  return t;
}

// ------------------------------------------------------------------------------- pool

Placement PlacementOf(std::optional<uint16_t> server, std::optional<uint64_t> key) {
  if (server && key) {
    Raise(Status::InvalidArgument("alloc: give server= or key=, not both"));
  }
  if (server) return Placement::OnServer(*server);
  if (key) return Placement::ByKey(*key);
  return Placement::Striped();
}

std::unique_ptr<Pool> Connect(const std::string& cluster_file,
                              const std::optional<std::string>& transport,
                              const std::string& remote_access, bool direct_access) {
  PoolOptions options;
  if (transport) options.transport = Take(ParseFabric(*transport));
  options.remote_access = Take(ParseRemoteAccess(remote_access));
  options.direct_access = direct_access;
  return Released([&]() -> Result<std::unique_ptr<Pool>> {
    FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, ClusterConfig::Load(cluster_file));
    return Pool::Connect(config, options);
  });
}

nb::dict StatsDict(const ServerStats& s) {
  nb::dict d;
  d["id"] = s.id;
  d["endpoint"] = s.endpoint;
  d["clients"] = s.clients;
  d["capacity"] = s.capacity;
  d["leased"] = s.leased;
  d["largest_free"] = s.largest_free;
  d["chunk_size"] = s.chunk_size;
  d["requests_served"] = s.requests_served;
  d["rejected"] = s.rejected;
  d["auth_refused"] = s.auth_refused;
  d["pool_refused"] = s.pool_refused;
  d["uptime_ns"] = s.uptime_ns;
  d["pid"] = s.pid;
  d["rss_private"] = s.rss_private;
  return d;
}

nb::dict CountersDict(const OpCounters& c) {
  nb::dict d;
  d["reads"] = c.reads;
  d["writes"] = c.writes;
  d["cas"] = c.cas;
  d["faa"] = c.faa;
  d["bytes_read"] = c.bytes_read;
  d["bytes_written"] = c.bytes_written;
  d["round_trips"] = c.round_trips;
  d["messages"] = c.messages;
  return d;
}

// A Batch with the Python buffers and result slots its posted operations use, kept until
// Wait(). Thread-safety: the thread that made it, as Batch.
class PyBatch {
 public:
  explicit PyBatch(Pool& pool) : batch_(std::make_unique<Batch>(pool)) {}
  ~PyBatch() {
    {
      nb::gil_scoped_release release;
      batch_.reset();  // waits for posted operations, which may still use the buffers
    }
    views_.clear();
  }

  void ReadInto(uint64_t address, nb::handle buffer) {
    auto view = std::make_unique<BufferView>(buffer, /*writable=*/true);
    // Posting may send a full message and wait for room (Batch::Reserve): without the GIL.
    Check(Unlocked([&] { return batch_->Read(Address(address), view->data(), view->size()); }));
    views_.push_back(std::move(view));
  }
  nb::object Read(uint64_t address, uint64_t size) {
    nb::object out =
        nb::steal(PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
    if (!out.is_valid()) throw nb::python_error();
    ReadInto(address, out);
    return out;
  }
  void Write(uint64_t address, nb::handle data) {
    auto view = std::make_unique<BufferView>(data, /*writable=*/false);
    Check(Unlocked([&] { return batch_->Write(Address(address), view->data(), view->size()); }));
    views_.push_back(std::move(view));
  }
  size_t CompareAndSwap(uint64_t address, uint64_t expected, uint64_t desired) {
    previous_.push_back(std::make_unique<uint64_t>(0));
    uint64_t* previous = previous_.back().get();
    Status s = Unlocked(
        [&] { return batch_->CompareAndSwap(Address(address), expected, desired, previous); });
    if (!s.ok()) {
      previous_.pop_back();
      Raise(s);
    }
    return previous_.size() - 1;
  }
  size_t FetchAdd(uint64_t address, uint64_t delta) {
    previous_.push_back(std::make_unique<uint64_t>(0));
    uint64_t* previous = previous_.back().get();
    Status s = Unlocked([&] { return batch_->FetchAdd(Address(address), delta, previous); });
    if (!s.ok()) {
      previous_.pop_back();
      Raise(s);
    }
    return previous_.size() - 1;
  }
  void Fence() {
    Check(Unlocked([&] { return batch_->Fence(); }));
  }
  std::vector<uint64_t> Wait() {
    Status s = Unlocked([&] { return batch_->Wait(); });
    views_.clear();
    std::vector<uint64_t> previous;
    previous.reserve(previous_.size());
    for (const auto& p : previous_) previous.push_back(*p);
    previous_.clear();
    Check(s);
    return previous;
  }
  size_t posted() const { return batch_->posted(); }

 private:
  std::unique_ptr<Batch> batch_;
  std::vector<std::unique_ptr<BufferView>> views_;
  std::vector<std::unique_ptr<uint64_t>> previous_;  // stable addresses for the batch to fill
};

// ------------------------------------------------------------------------------- database

Result<ColumnType> ParseColumnType(const std::string& text) {
  if (text == "int64") return ColumnType::kInt64;
  if (text == "double") return ColumnType::kDouble;
  if (text == "char") return ColumnType::kChar;
  if (text == "bytes") return ColumnType::kBytes;
  return Status::InvalidArgument("unknown column type '" + text +
                                 "' (int64, double, char or bytes)");
}

const char* ColumnTypeName(ColumnType type) {
  switch (type) {
    case ColumnType::kInt64:
      return "int64";
    case ColumnType::kDouble:
      return "double";
    case ColumnType::kChar:
      return "char";
    case ColumnType::kBytes:
      return "bytes";
  }
  return "?";
}

// A schema from [(name, type) or (name, "char", length), ...].
Schema SchemaOf(nb::handle columns) {
  std::vector<Column> out;
  for (nb::handle item : columns) {
    const auto malformed = [&] {
      return Status::InvalidArgument(
          "a column is (name, type) or (name, \"char\", length) with a length of 1..4096, got " +
          nb::cast<std::string>(nb::repr(item)));
    };
    if (PyUnicode_Check(item.ptr()) || PyBytes_Check(item.ptr())) Raise(malformed());
    nb::tuple t = TupleOf(item);
    if (t.size() != 2 && t.size() != 3) Raise(malformed());
    Column c;
    try {
      c.name = nb::cast<std::string>(t[0]);
      c.type = Take(ParseColumnType(nb::cast<std::string>(t[1])));
      if (t.size() == 3) c.length = nb::cast<uint32_t>(t[2]);
    } catch (const nb::cast_error&) {
      Raise(malformed());
    }
    out.push_back(std::move(c));
  }
  Schema schema(std::move(out));
  Check(schema.Validate());
  return schema;
}

nb::list ColumnsOf(const Table& table) {
  nb::list out;
  for (const Column& c : table.schema().columns()) {
    if (c.type == ColumnType::kChar) {
      out.append(nb::make_tuple(c.name, ColumnTypeName(c.type), c.length));
    } else {
      out.append(nb::make_tuple(c.name, ColumnTypeName(c.type)));
    }
  }
  return out;
}

// A char or bytes value: str (UTF-8, surrogateescape so that any bytes round-trip) or any
// bytes-like object.
std::string BytesOf(nb::handle value) {
  if (PyUnicode_Check(value.ptr())) {
    nb::object encoded =
        nb::steal(PyUnicode_AsEncodedString(value.ptr(), "utf-8", "surrogateescape"));
    if (!encoded.is_valid()) throw nb::python_error();
    return std::string(PyBytes_AS_STRING(encoded.ptr()),
                       static_cast<size_t>(PyBytes_GET_SIZE(encoded.ptr())));
  }
  BufferView view(value, /*writable=*/false);
  return std::string(static_cast<const char*>(view.data()), view.size());
}

void SetColumn(const Table& table, Row& row, size_t i, nb::handle value) {
  const Column& c = table.schema().columns()[i];
  switch (c.type) {
    case ColumnType::kInt64: {
      if (!PyLong_Check(value.ptr())) {
        throw nb::type_error(("column '" + c.name + "' of table '" + table.name() +
                              "' is int64, got " + Py_TYPE(value.ptr())->tp_name)
                                 .c_str());
      }
      const long long v = PyLong_AsLongLong(value.ptr());
      if (v == -1 && PyErr_Occurred()) throw nb::python_error();
      row.SetInt64(i, v);
      return;
    }
    case ColumnType::kDouble: {
      const double v = PyFloat_AsDouble(value.ptr());
      if (v == -1.0 && PyErr_Occurred()) throw nb::python_error();
      row.SetDouble(i, v);
      return;
    }
    case ColumnType::kChar: {
      std::string v = BytesOf(value);
      if (v.size() > c.length) {
        Raise(Status::InvalidArgument("column '" + c.name + "' of table '" + table.name() +
                                      "' holds at most " + std::to_string(c.length) +
                                      " bytes, got " + std::to_string(v.size())));
      }
      row.SetChar(i, v);
      return;
    }
    case ColumnType::kBytes:
      row.SetBytes(i, BytesOf(value));
      return;
  }
}

// A row from a dict {column: value} (absent columns are zero or empty; an unknown name is an
// error) or a sequence of every column's value in order.
Row RowOf(const Table& table, nb::handle values) {
  const Schema& schema = table.schema();
  Row row(schema);
  if (PyDict_Check(values.ptr())) {
    for (auto [name, value] : nb::borrow<nb::dict>(values)) {
      const std::string column = nb::cast<std::string>(name);
      const int i = schema.Find(column);
      if (i < 0) {
        std::string known;
        for (const Column& c : schema.columns()) known += (known.empty() ? "" : ", ") + c.name;
        Raise(Status::InvalidArgument("table '" + table.name() + "' has no column '" + column +
                                      "' (columns: " + known + ")"));
      }
      SetColumn(table, row, static_cast<size_t>(i), value);
    }
    return row;
  }
  nb::object sequence = nb::steal(PySequence_Fast(values.ptr(), "a row is a dict or a sequence"));
  if (!sequence.is_valid()) throw nb::python_error();
  const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(sequence.ptr()));
  if (n != schema.size()) {
    Raise(Status::InvalidArgument("table '" + table.name() + "' has " +
                                  std::to_string(schema.size()) + " columns, the row gives " +
                                  std::to_string(n) + " values"));
  }
  for (size_t i = 0; i < n; ++i) {
    SetColumn(table, row, i,
              nb::handle(PySequence_Fast_GET_ITEM(sequence.ptr(), static_cast<Py_ssize_t>(i))));
  }
  return row;
}

nb::dict DictOf(const Row& row) {
  const Schema& schema = *row.schema();
  nb::dict d;
  for (size_t i = 0; i < schema.size(); ++i) {
    const Column& c = schema.columns()[i];
    nb::object v;
    switch (c.type) {
      case ColumnType::kInt64:
        v = nb::steal(PyLong_FromLongLong(row.GetInt64(i)));
        break;
      case ColumnType::kDouble:
        v = nb::steal(PyFloat_FromDouble(row.GetDouble(i)));
        break;
      case ColumnType::kChar: {
        const std::string_view s = row.GetChar(i);
        v = nb::steal(
            PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape"));
        break;
      }
      case ColumnType::kBytes: {
        const std::string& s = row.GetBytes(i);
        v = nb::bytes(s.data(), s.size());
        break;
      }
    }
    if (!v.is_valid()) throw nb::python_error();
    d[c.name.c_str()] = v;
  }
  return d;
}

// A Transaction: owned (Session.begin) or lent by RunTransaction for one attempt of
// Session.run, which finishes it itself (commit and rollback are refused on a lent one).
class PyTransaction {
 public:
  explicit PyTransaction(std::unique_ptr<Transaction> owned)
      : owned_(std::move(owned)), txn_(owned_.get()) {}
  static PyTransaction Lent(Transaction& txn) { return PyTransaction(&txn); }

  // After the attempt of Session.run that lent it: any further use is refused.
  void EndLoan() { txn_ = nullptr; }

  // Get, or GetForUpdate (`lock`: the record is locked as it is read).
  nb::object Get(const Table& table, int64_t key, bool lock) {
    Transaction& txn = Live();
    Row row;
    Status s = Unlocked(
        [&] { return lock ? txn.GetForUpdate(table, key, &row) : txn.Get(table, key, &row); });
    if (s.code() == StatusCode::kNotFound) return nb::none();
    Check(s);
    return DictOf(row);
  }

  // MultiGet, or MultiGetForUpdate (`lock`).
  nb::list MultiGet(nb::handle pairs, bool lock) {
    Transaction& txn = Live();
    std::vector<TableKey> keys;
    for (nb::handle item : pairs) {
      nb::tuple t = TupleOf(item);
      if (t.size() != 2) Raise(Status::InvalidArgument("multi_get takes (table, key) pairs"));
      keys.push_back({nb::cast<Table*>(t[0]), nb::cast<int64_t>(t[1])});
    }
    std::vector<Row> rows;
    std::vector<Status> statuses;
    Check(Unlocked([&] {
      return lock ? txn.MultiGetForUpdate(keys, &rows, &statuses)
                  : txn.MultiGet(keys, &rows, &statuses);
    }));
    nb::list out;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (statuses[i].code() == StatusCode::kNotFound) {
        out.append(nb::none());
      } else {
        Check(statuses[i]);
        out.append(DictOf(rows[i]));
      }
    }
    return out;
  }

  void Put(const Table& table, int64_t key, nb::handle values) {
    Transaction& txn = Live();
    Row row = RowOf(table, values);
    Check(Unlocked([&] { return txn.Put(table, key, row); }));
  }

  void Delete(const Table& table, int64_t key) {
    Transaction& txn = Live();
    Check(Unlocked([&] { return txn.Delete(table, key); }));
  }

  nb::list Scan(const Table& table, int64_t lo, int64_t hi, size_t limit, bool reverse) {
    Transaction& txn = Live();
    std::vector<std::pair<int64_t, Row>> found;
    Status s;
    {
      nb::gil_scoped_release release;
      s = txn.Scan(table, lo, hi, limit, reverse, [&](int64_t key, const Row& row) {
        found.emplace_back(key, row);
        return true;
      });
    }
    Check(s);
    nb::list out;
    for (const auto& [key, row] : found) out.append(nb::make_tuple(key, DictOf(row)));
    return out;
  }

  void Commit() {
    Transaction& txn = Owned("commit");
    finished_ = true;
    Check(Unlocked([&] { return txn.Commit(); }));
  }

  void Rollback() {
    Transaction& txn = Owned("rollback");
    if (finished_) return;  // idempotent, as Transaction::Rollback
    finished_ = true;
    nb::gil_scoped_release release;
    txn.Rollback();
  }

  // Commits when the block ended normally, rolls back when it raised (the exception goes on).
  void Exit(nb::handle exc_type) {
    if (!exc_type.is_none()) {
      Rollback();
    } else if (!finished_) {
      Commit();
    }
  }

  bool finished() const { return finished_ || txn_ == nullptr; }

 private:
  explicit PyTransaction(Transaction* lent) : txn_(lent) {}

  Transaction& Live() {
    if (txn_ == nullptr) {
      Raise(Status::InvalidArgument(
          "this transaction belonged to one attempt of run(), which has ended"));
    }
    if (finished_)
      Raise(Status::InvalidArgument("the transaction is finished (committed or rolled back)"));
    return *txn_;
  }
  Transaction& Owned(const char* what) {
    if (owned_ == nullptr) {
      Raise(Status::InvalidArgument(std::string(what) +
                                    ": run() commits its transaction itself (raise to roll back)"));
    }
    return *owned_;
  }

  std::unique_ptr<Transaction> owned_;
  Transaction* txn_ = nullptr;
  bool finished_ = false;
};

// "si" (snapshot isolation, the default) or "rc" (read committed): db.h, Isolation.
TransactionOptions OptionsOf(std::string_view isolation) {
  Result<Isolation> parsed = ParseIsolation(isolation);
  if (!parsed.ok()) Raise(parsed.status());
  return TransactionOptions{*parsed};
}

std::unique_ptr<PyTransaction> Begin(Session& session, std::string_view isolation) {
  const TransactionOptions options = OptionsOf(isolation);
  return std::make_unique<PyTransaction>(Released([&] { return session.Begin(options); }));
}

// Session.run: RunTransaction with a Python body. The body runs with the GIL held; Aborted from
// it (or from the commit) is retried by RunTransaction, any other exception ends the run and is
// raised again here, unchanged.
nb::object Run(Session& session, nb::callable body, int max_attempts, std::string_view isolation) {
  const TransactionOptions options = OptionsOf(isolation);
  nb::object result = nb::none();
  std::exception_ptr raised;
  Status s;
  {
    nb::gil_scoped_release release;
    s = RunTransaction(
        session, options,
        [&](Transaction& txn) -> Status {
          nb::gil_scoped_acquire acquire;
          auto* lent = new PyTransaction(PyTransaction::Lent(txn));
          nb::object handle = nb::cast(lent, nb::rv_policy::take_ownership);
          Status outcome;
          try {
            result = body(handle);
          } catch (nb::python_error& e) {
            if (e.matches(g_aborted)) {
              outcome = Status::Aborted(nb::cast<std::string>(nb::str(e.value())));
            } else {
              raised = std::current_exception();
              outcome = Status::Internal("the body of run() raised");
            }
          } catch (...) {
            raised = std::current_exception();
            outcome = Status::Internal("the body of run() raised");
          }
          lent->EndLoan();
          return outcome;
        },
        max_attempts);
  }
  if (raised) std::rethrow_exception(raised);
  Check(s);
  return result;
}

nb::dict TxnCountersDict(const TxnCounters& c) {
  nb::dict d;
  d["reads"] = c.reads;
  d["writes"] = c.writes;
  d["cas"] = c.cas;
  d["faa"] = c.faa;
  d["messages"] = c.messages;
  d["round_trips"] = c.round_trips;
  d["commits"] = c.commits;
  d["aborts"] = c.aborts;
  d["commits_cut"] = c.commits_cut;
  return d;
}

std::unique_ptr<Database> OpenDatabase(const std::string& engine, const std::string& cluster_file,
                                       uint32_t max_sessions, double lease_seconds) {
  DatabaseOptions options;
  options.engine = Take(ParseEngine(engine));
  options.cluster_file = cluster_file;
  options.max_sessions = max_sessions;
  options.lease = std::chrono::milliseconds(static_cast<int64_t>(lease_seconds * 1000));
  return Released([&] { return Database::Open(options); });
}

}  // namespace
}  // namespace farpool::python

using namespace farpool;          // NOLINT(google-build-using-namespace): the module's body
using namespace farpool::python;  // NOLINT(google-build-using-namespace)

NB_MODULE(_native, m) {
  m.doc() = "farpool's C++ client (pool and database); use it through `import farpool`.";
  nb::module_ errors = nb::module_::import_("farpool.errors");
  g_from_status = errors.attr("from_status").inc_ref();
  g_aborted = errors.attr("Aborted").inc_ref();
  // Objects still alive when the interpreter exits (a module-level Database, say) are reclaimed
  // by the process's exit, not reported.
  nb::set_leak_warnings(false);

  m.attr("ROOT_SIZE") = Pool::kRootSize;
  m.def(
      "address",
      [](uint16_t server, uint64_t offset) { return GlobalAddress(server, offset).raw(); },
      "server"_a, "offset"_a, "The address (an int) of byte `offset` of server `server`'s region.");
  m.def(
      "address_str", [](uint64_t raw) { return Address(raw).ToString(); }, "address"_a,
      "'s3+0x1f40' (server 3, offset 0x1f40), or 'null'.");

  nb::class_<Pool>(m, "Pool",
                   "A process's view of the memory pool (include/farpool/pool.h). Safe for use "
                   "by any number of threads. Addresses are ints.")
      .def_static("connect", &Connect, "cluster_file"_a, "transport"_a = nb::none(),
                  "remote_access"_a = "auto", "direct_access"_a = true,
                  "Connects to every server of the cluster file. Raises (naming the server) if "
                  "one is unreachable.")
      .def_prop_ro("transport",
                   [](const Pool& p) { return std::string(FabricName(p.transport())); })
      .def_prop_ro("server_ids", &Pool::server_ids)
      .def("access_path", &Pool::AccessPath, "server"_a,
           "'direct', 'one-sided' or 'messages': how operations reach server `server`.")
      .def(
          "root", [](const Pool& p, uint16_t server) { return p.RootArea(server).raw(); },
          "server"_a,
          "The address of this client's pool's root area on server `server` (ROOT_SIZE bytes, "
          "see pool.h).")
      .def(
          "alloc",
          [](Pool& p, uint64_t size, std::optional<uint16_t> server, std::optional<uint64_t> key) {
            const Placement placement = PlacementOf(server, key);
            return Released([&] { return p.Alloc(size, placement); }).raw();
          },
          "size"_a, nb::kw_only(), "server"_a = nb::none(), "key"_a = nb::none(),
          "Allocates `size` bytes: striped over the servers, on `server`, or on the server "
          "`key` hashes to. Returns the address.")
      .def(
          "free",
          [](Pool& p, uint64_t address) {
            Check(Unlocked([&] { return p.Free(Address(address)); }));
          },
          "address"_a, "Frees an object this Pool allocated.")
      .def(
          "trim", [](Pool& p) { Check(Unlocked([&] { return p.Trim(); })); },
          "Gives the memory this client freed back to its servers.")
      .def(
          "read",
          [](Pool& p, uint64_t address, uint64_t size) {
            nb::object out =
                nb::steal(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
            if (!out.is_valid()) throw nb::python_error();
            char* data = PyBytes_AS_STRING(out.ptr());
            Check(Unlocked([&] { return p.Read(Address(address), data, size); }));
            return out;
          },
          "address"_a, "size"_a, "Reads `size` bytes at `address` into new bytes.")
      .def(
          "read_into",
          [](Pool& p, uint64_t address, nb::handle buffer) {
            BufferView view(buffer, /*writable=*/true);
            Check(Unlocked([&] { return p.Read(Address(address), view.data(), view.size()); }));
          },
          "address"_a, "buffer"_a,
          "Fills a writable contiguous buffer (bytearray, memoryview, numpy array) from "
          "`address`, without an intermediate copy.")
      .def(
          "write",
          [](Pool& p, uint64_t address, nb::handle data) {
            BufferView view(data, /*writable=*/false);
            Check(Unlocked([&] { return p.Write(Address(address), view.data(), view.size()); }));
          },
          "address"_a, "data"_a,
          "Writes a contiguous buffer (bytes, bytearray, memoryview, numpy array) at `address`.")
      .def(
          "cas",
          [](Pool& p, uint64_t address, uint64_t expected, uint64_t desired) {
            return Released([&] { return p.CompareAndSwap(Address(address), expected, desired); });
          },
          "address"_a, "expected"_a, "desired"_a,
          "Atomic compare-and-swap of the 8-byte word at `address`; returns the previous value "
          "(the swap happened iff it equals `expected`).")
      .def(
          "fetch_add",
          [](Pool& p, uint64_t address, uint64_t delta) {
            return Released([&] { return p.FetchAdd(Address(address), delta); });
          },
          "address"_a, "delta"_a,
          "Atomically adds `delta` (mod 2**64) to the 8-byte word at `address`; returns the "
          "previous value.")
      .def(
          "stats",
          [](Pool& p, uint16_t server) {
            return StatsDict(Released([&] { return p.Stats(server); }));
          },
          "server"_a, "Server `server`'s statistics, as a dict.")
      .def(
          "counters", [](const Pool& p) { return CountersDict(p.counters()); },
          "Operations this Pool has issued, as a dict.")
      .def(
          "batch", [](Pool& p) { return std::make_unique<PyBatch>(p); }, nb::keep_alive<0, 1>(),
          "A new Batch: operations posted together and completed by one wait().");

  nb::class_<PyBatch>(m, "Batch",
                      "Operations posted together, completed by one wait() (pool.h's Batch). "
                      "Used only by the thread that made it. Buffers are held until wait().")
      .def("read_into", &PyBatch::ReadInto, "address"_a, "buffer"_a,
           "Posts a read filling `buffer` (writable, contiguous) at wait().")
      .def("read", &PyBatch::Read, "address"_a, "size"_a,
           "Posts a read of `size` bytes; returns the bytearray that wait() fills.")
      .def("write", &PyBatch::Write, "address"_a, "data"_a, "Posts a write of `data`.")
      .def("cas", &PyBatch::CompareAndSwap, "address"_a, "expected"_a, "desired"_a,
           "Posts a compare-and-swap; returns the index of its previous value in wait()'s list.")
      .def("fetch_add", &PyBatch::FetchAdd, "address"_a, "delta"_a,
           "Posts a fetch-and-add; returns the index of its previous value in wait()'s list.")
      .def("fence", &PyBatch::Fence,
           "Operations posted after it take effect at a server after those posted before it.")
      .def("wait", &PyBatch::Wait,
           "Waits for every posted operation; returns the previous values of the atomics in "
           "the order posted. Raises the first error. The batch can be reused.")
      .def_prop_ro("posted", &PyBatch::posted)
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__",
          [](PyBatch& b, nb::handle exc_type, nb::handle, nb::handle) {
            if (exc_type.is_none()) (void)b.Wait();
          },
          "exc_type"_a.none(), "exc"_a.none(), "traceback"_a.none(),
          "Waits if the block ended normally (destroying a batch waits too).");

  nb::class_<Table>(m, "Table",
                    "A table's handle: name, id, columns. Valid while its Database lives.")
      .def_prop_ro("name", &Table::name)
      .def_prop_ro("id", &Table::id)
      .def_prop_ro("ordered", &Table::ordered)
      .def_prop_ro("columns", &ColumnsOf,
                   "[(name, type) or (name, 'char', length), ...] as create_table takes them.")
      .def("__repr__", [](const Table& t) {
        return "<farpool.Table '" + t.name() + "' id=" + std::to_string(t.id()) + ">";
      });

  nb::class_<PyTransaction>(
      m, "Transaction",
      "A snapshot-isolation transaction (db.h). As a context manager it commits when the block "
      "ends normally (raising farpool.Aborted if it lost a conflict) and rolls back when the "
      "block raises.")
      .def(
          "get",
          [](PyTransaction& t, const Table& table, int64_t key) {
            return t.Get(table, key, false);
          },
          "table"_a, "key"_a,
          "The row of `key` as a dict (this transaction's own writes included), or None.")
      .def(
          "multi_get", [](PyTransaction& t, nb::handle pairs) { return t.MultiGet(pairs, false); },
          "pairs"_a,
          "get() of several (table, key) pairs at once (two round trips on the pool engine).")
      .def(
          "get_for_update",
          [](PyTransaction& t, const Table& table, int64_t key) { return t.Get(table, key, true); },
          "table"_a, "key"_a,
          "get() that locks the record as it reads it (db.h, GetForUpdate): the newest committed "
          "row, held until the transaction ends, so a read-modify-write of it loses no update. "
          "Waits briefly for another holder, then raises farpool.Aborted.")
      .def(
          "multi_get_for_update",
          [](PyTransaction& t, nb::handle pairs) { return t.MultiGet(pairs, true); }, "pairs"_a,
          "get_for_update() of several (table, key) pairs at once (locks taken in address order).")
      .def("put", &PyTransaction::Put, "table"_a, "key"_a, "row"_a,
           "Inserts or replaces the row of `key` (buffered until commit). `row` is a dict "
           "(absent columns are zero or empty) or a sequence of every column's value.")
      .def("delete", &PyTransaction::Delete, "table"_a, "key"_a,
           "Deletes `key` (buffered); raises farpool.NotFound if it has no visible row.")
      .def("scan", &PyTransaction::Scan, "table"_a, "lo"_a = std::numeric_limits<int64_t>::min(),
           "hi"_a = std::numeric_limits<int64_t>::max(), "limit"_a = 0, "reverse"_a = false,
           "[(key, row), ...] for lo <= key <= hi in key order, at most `limit` (0: all). "
           "REQUIRES: an ordered table. Does not see this transaction's own writes.")
      .def("commit", &PyTransaction::Commit,
           "Installs the writes or raises farpool.Aborted (first committer wins).")
      .def("rollback", &PyTransaction::Rollback, "Drops the buffered writes. Idempotent.")
      .def_prop_ro("finished", &PyTransaction::finished)
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__",
          [](PyTransaction& t, nb::handle exc_type, nb::handle, nb::handle) { t.Exit(exc_type); },
          "exc_type"_a.none(), "exc"_a.none(), "traceback"_a.none());

  nb::class_<Session>(m, "Session",
                      "A compute thread's context (a session slot in the database). One thread "
                      "at a time.")
      .def("begin", &Begin, "isolation"_a = "si", nb::keep_alive<0, 1>(),
           "A new transaction: isolation \"si\" (snapshot isolation) or \"rc\" (read "
           "committed).")
      .def("run", &Run, "body"_a, "max_attempts"_a = 1000, "isolation"_a = "si",
           "Runs body(txn) in a transaction and commits, retrying with randomized backoff while "
           "it or the commit raises farpool.Aborted, at most `max_attempts` times; returns "
           "body's result. Any other exception is raised at once. isolation as for begin().")
      .def_prop_ro("counters", [](const Session& s) { return TxnCountersDict(s.counters()); });

  nb::class_<Database>(m, "Database", "The transactional database (db.h). Safe for concurrent use.")
      .def_static("open", &OpenDatabase, "engine"_a, "cluster_file"_a, "max_sessions"_a,
                  "lease_seconds"_a)
      .def_prop_ro("engine", [](const Database& d) { return std::string(EngineName(d.engine())); })
      .def(
          "create_table",
          [](Database& d, const std::string& name, nb::handle columns, bool ordered,
             uint64_t expected_rows) {
            const Schema schema = SchemaOf(columns);
            const TableOptions options{.ordered = ordered, .expected_rows = expected_rows};
            return Released([&] { return d.CreateTable(name, schema, options); });
          },
          "name"_a, "columns"_a, "ordered"_a = false, "expected_rows"_a = 1024,
          nb::rv_policy::reference_internal)
      .def(
          "open_table",
          [](Database& d, const std::string& name) {
            return Released([&] { return d.OpenTable(name); });
          },
          "name"_a, nb::rv_policy::reference_internal)
      .def(
          "drop_table",
          [](Database& d, const std::string& name) {
            Check(Unlocked([&] { return d.DropTable(name); }));
          },
          "name"_a)
      .def("list_tables", [](Database& d) { return Released([&] { return d.ListTables(); }); })
      .def(
          "new_session", [](Database& d) { return Released([&] { return d.NewSession(); }); },
          nb::keep_alive<0, 1>());
}
