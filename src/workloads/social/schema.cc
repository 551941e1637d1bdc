// The eight tables: schemas, creation, opening, and the parallel load of the generated data.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "workloads/social/internal.h"
#include "workloads/social/social.h"

namespace farpool::workloads {

using namespace social_internal;

namespace social_internal {

const Schema& NameSchema() {
  static const Schema s{{"name", ColumnType::kChar, 32}};
  return s;
}
const Schema& EdgeSchema() {
  static const Schema s{{"since", ColumnType::kInt64}};
  return s;
}
const Schema& MessageSchema() {
  static const Schema s{{"sender", ColumnType::kInt64},   {"to_user", ColumnType::kInt64},
                        {"to_group", ColumnType::kInt64}, {"time", ColumnType::kInt64},
                        {"is_read", ColumnType::kInt64},  {"text", ColumnType::kBytes}};
  return s;
}

}  // namespace social_internal

Result<SocialTables> OpenSocialTables(Database& db) {
  SocialTables t;
  FARPOOL_ASSIGN_OR_RETURN(t.users, db.OpenTable("sn_users"));
  FARPOOL_ASSIGN_OR_RETURN(t.groups, db.OpenTable("sn_groups"));
  FARPOOL_ASSIGN_OR_RETURN(t.friends, db.OpenTable("sn_friends"));
  FARPOOL_ASSIGN_OR_RETURN(t.members, db.OpenTable("sn_members"));
  FARPOOL_ASSIGN_OR_RETURN(t.messages, db.OpenTable("sn_messages"));
  FARPOOL_ASSIGN_OR_RETURN(t.by_sender, db.OpenTable("sn_by_sender"));
  FARPOOL_ASSIGN_OR_RETURN(t.inbox, db.OpenTable("sn_inbox"));
  FARPOOL_ASSIGN_OR_RETURN(t.group_inbox, db.OpenTable("sn_group_inbox"));
  return t;
}

namespace social_internal {

Status ForEachMessageRow(const Message& m,
                         const std::function<Status(const char*, int64_t, const Row&)>& put) {
  Row r(MessageSchema());
  r.SetInt64(kSender, m.sender);
  r.SetInt64(kToUser, m.to_user);
  r.SetInt64(kToGroup, m.to_group);
  r.SetInt64(kTime, m.time);
  r.SetInt64(kIsRead, m.is_read);
  r.SetBytes(kTextCol, m.text);
  FARPOOL_RETURN_IF_ERROR(put("sn_messages", m.mid, r));
  Row e(EdgeSchema());
  e.SetInt64(0, m.time);
  FARPOOL_RETURN_IF_ERROR(put("sn_by_sender", Compose(m.sender, m.mid, kMidBits), e));
  if (m.to_user >= 0) return put("sn_inbox", Compose(m.to_user, m.mid, kMidBits), e);
  return put("sn_group_inbox", Compose(m.to_group, m.mid, kMidBits), e);
}

Status PutMessageRows(Transaction& txn, const SocialTables& t, const Message& m) {
  return ForEachMessageRow(m, [&](const char* name, int64_t key, const Row& row) {
    const std::string_view n = name;
    const Table& table = n == "sn_messages"    ? *t.messages
                         : n == "sn_by_sender" ? *t.by_sender
                         : n == "sn_inbox"     ? *t.inbox
                                               : *t.group_inbox;
    return txn.Put(table, key, row);
  });
}

}  // namespace social_internal

namespace {

// A table to create and load: its name, schema, whether it is ordered, its expected rows.
struct TableSpec {
  const char* name;
  const Schema* schema;
  bool ordered;
  uint64_t rows;
};

}  // namespace

Result<SocialTables> LoadSocial(Database& db, const SocialData& d, int threads,
                                const std::function<void(uint64_t, uint64_t)>& progress) {
  if (d.users() > uint64_t(kUserMask) || d.messages() > uint64_t(kMidMask)) {
    return Status::InvalidArgument("social: scale too large (users < 2^26, messages < 2^36)");
  }
  const uint64_t to_users = d.messages() * 7 / 10, to_groups = d.messages() - to_users;
  // The jobs, biggest first; each fills the tables it names, in one thread.
  const std::vector<std::vector<TableSpec>> jobs = {
      {{"sn_messages", &MessageSchema(), false, d.messages()},
       {"sn_by_sender", &EdgeSchema(), true, d.messages()},
       {"sn_inbox", &EdgeSchema(), true, to_users},
       {"sn_group_inbox", &EdgeSchema(), true, to_groups}},
      {{"sn_friends", &EdgeSchema(), true, d.users() * 12}},
      {{"sn_members", &EdgeSchema(), true, d.users() * 4}},
      {{"sn_users", &NameSchema(), false, d.users()}},
      {{"sn_groups", &NameSchema(), false, d.groups()}},
  };
  // Rows each kind loads (friends/members are estimated from their averages).
  const uint64_t total = d.users() + d.groups() + d.users() * 11 + d.users() * 3 + d.messages() * 3;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  Status first_error;
  constexpr uint64_t kReportEvery = 1000;
  auto run = [&](const std::vector<TableSpec>& specs, bool reporter) -> Status {
    std::map<std::string_view, std::unique_ptr<Loader>> loaders;
    for (const TableSpec& t : specs) {
      FARPOOL_ASSIGN_OR_RETURN(loaders[t.name],
                               db.NewLoader(t.name, *t.schema, TableOptions{t.ordered, t.rows}));
    }
    uint64_t added = 0;
    auto put = [&](const char* name, int64_t key, const Row& row) -> Status {
      FARPOOL_RETURN_IF_ERROR(loaders.at(name)->Add(key, row));
      if (++added % kReportEvery == 0) {
        if (failed.load()) return Status::Aborted("social: another loading thread failed");
        const uint64_t now = done.fetch_add(kReportEvery) + kReportEvery;
        if (reporter && progress) progress(std::min(now, total), total);
      }
      return Status::Ok();
    };
    const std::string_view first = specs[0].name;
    if (first == "sn_messages") {
      for (uint64_t k = 0; k < d.messages(); ++k)
        FARPOOL_RETURN_IF_ERROR(ForEachMessageRow(d.GetMessage(k), put));
    } else if (first == "sn_friends" || first == "sn_members") {
      const bool friends = first == "sn_friends";
      for (uint64_t k = 0; k < d.users(); ++k) {
        for (uint64_t o : friends ? d.Friends(k) : d.Groups(k)) {
          Row r(EdgeSchema());
          r.SetInt64(0, d.Since(k, o + (friends ? 0 : (1ull << 40))));
          FARPOOL_RETURN_IF_ERROR(
              put(specs[0].name, Compose(int64_t(k), int64_t(o), kUserBits), r));
        }
      }
    } else {
      const bool users = first == "sn_users";
      for (uint64_t k = 0; k < (users ? d.users() : d.groups()); ++k) {
        Row r(NameSchema());
        r.SetChar(0, users ? d.UserName(k) : d.GroupName(k));
        FARPOOL_RETURN_IF_ERROR(put(specs[0].name, int64_t(k), r));
      }
    }
    for (auto& [name, loader] : loaders) FARPOOL_RETURN_IF_ERROR(loader->Finish().status());
    return Status::Ok();
  };
  auto worker = [&](bool reporter) {
    for (size_t i; (i = next.fetch_add(1)) < jobs.size() && !failed.load();) {
      Status s = run(jobs[i], reporter);
      if (!s.ok()) {
        failed = true;
        std::lock_guard<std::mutex> l(err_mu);
        if (first_error.ok() || first_error.code() == StatusCode::kAborted)
          first_error = s.WithContext("social: loading");
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < std::max(1, threads); ++i) pool.emplace_back(worker, false);
  worker(true);
  for (auto& th : pool) th.join();
  FARPOOL_RETURN_IF_ERROR(first_error);
  if (progress) progress(total, total);
  return OpenSocialTables(db);
}

}  // namespace farpool::workloads
