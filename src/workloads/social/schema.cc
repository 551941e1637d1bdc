// The eight tables: schemas, creation, opening, and the parallel load of the generated data.
#include <algorithm>
#include <atomic>
#include <mutex>
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

Result<SocialTables> CreateSocialTables(Database& db, const SocialData& d) {
  SocialTables t;
  auto make = [&](const char* name, const Schema& s, bool ordered, uint64_t rows,
                  const Table** out) -> Status {
    FARPOOL_ASSIGN_OR_RETURN(*out, db.CreateTable(name, s, TableOptions{ordered, rows}));
    return Status::Ok();
  };
  const uint64_t to_users = d.messages() * 7 / 10, to_groups = d.messages() - to_users;
  FARPOOL_RETURN_IF_ERROR(make("sn_users", NameSchema(), false, d.users(), &t.users));
  FARPOOL_RETURN_IF_ERROR(make("sn_groups", NameSchema(), false, d.groups(), &t.groups));
  FARPOOL_RETURN_IF_ERROR(make("sn_friends", EdgeSchema(), true, d.users() * 12, &t.friends));
  FARPOOL_RETURN_IF_ERROR(make("sn_members", EdgeSchema(), true, d.users() * 4, &t.members));
  FARPOOL_RETURN_IF_ERROR(make("sn_messages", MessageSchema(), false, d.messages(), &t.messages));
  FARPOOL_RETURN_IF_ERROR(make("sn_by_sender", EdgeSchema(), true, d.messages(), &t.by_sender));
  FARPOOL_RETURN_IF_ERROR(make("sn_inbox", EdgeSchema(), true, to_users, &t.inbox));
  FARPOOL_RETURN_IF_ERROR(make("sn_group_inbox", EdgeSchema(), true, to_groups, &t.group_inbox));
  return t;
}

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

Status PutMessageRows(Transaction& txn, const SocialTables& t, const Message& m) {
  Row r(t.messages->schema());
  r.SetInt64(kSender, m.sender);
  r.SetInt64(kToUser, m.to_user);
  r.SetInt64(kToGroup, m.to_group);
  r.SetInt64(kTime, m.time);
  r.SetInt64(kIsRead, m.is_read);
  r.SetBytes(kTextCol, m.text);
  FARPOOL_RETURN_IF_ERROR(txn.Put(*t.messages, m.mid, r));
  Row e(t.by_sender->schema());
  e.SetInt64(0, m.time);
  FARPOOL_RETURN_IF_ERROR(txn.Put(*t.by_sender, Compose(m.sender, m.mid, kMidBits), e));
  if (m.to_user >= 0) return txn.Put(*t.inbox, Compose(m.to_user, m.mid, kMidBits), e);
  return txn.Put(*t.group_inbox, Compose(m.to_group, m.mid, kMidBits), e);
}

}  // namespace social_internal

namespace {

// One unit of loading work: rows [begin, end) of one kind.
struct LoadTask {
  int kind;  // 0 users, 1 groups, 2 friends (per user), 3 members (per user), 4 messages
  uint64_t begin, end;
};

}  // namespace

Status LoadSocial(Database& db, const SocialTables& t, const SocialData& d, int threads,
                  const std::function<void(uint64_t, uint64_t)>& progress, int batch) {
  if (d.users() > uint64_t(kUserMask) || d.messages() > uint64_t(kMidMask)) {
    return Status::InvalidArgument("social: scale too large (users < 2^26, messages < 2^36)");
  }
  threads = std::max(1, threads);
  batch = std::max(1, batch);
  std::vector<LoadTask> tasks;
  const uint64_t chunk = uint64_t(batch);
  auto add = [&](int kind, uint64_t n, uint64_t per) {
    for (uint64_t b = 0; b < n; b += per) tasks.push_back({kind, b, std::min(n, b + per)});
  };
  add(0, d.users(), chunk);
  add(1, d.groups(), chunk);
  add(2, d.users(), std::max<uint64_t>(1, chunk / 12));
  add(3, d.users(), std::max<uint64_t>(1, chunk / 4));
  add(4, d.messages(), std::max<uint64_t>(1, chunk / 3));
  // Rows each kind loads (friends/members are estimated from their averages).
  const uint64_t total = d.users() + d.groups() + d.users() * 11 + d.users() * 3 + d.messages() * 3;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::mutex err_mu;
  Status first_error;
  auto worker = [&](bool reporter) {
    auto session = db.NewSession();
    if (!session.ok()) {
      std::lock_guard<std::mutex> l(err_mu);
      first_error = session.status();
      return;
    }
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= tasks.size()) break;
      {
        std::lock_guard<std::mutex> l(err_mu);
        if (!first_error.ok()) break;
      }
      const LoadTask task = tasks[i];
      uint64_t rows = 0;
      Status s = RunTransaction(**session, [&](Transaction& txn) -> Status {
        rows = 0;
        for (uint64_t k = task.begin; k < task.end; ++k) {
          switch (task.kind) {
            case 0:
            case 1: {
              Row r(NameSchema());
              r.SetChar(0, task.kind == 0 ? d.UserName(k) : d.GroupName(k));
              FARPOOL_RETURN_IF_ERROR(
                  txn.Put(task.kind == 0 ? *t.users : *t.groups, int64_t(k), r));
              ++rows;
              break;
            }
            case 2:
            case 3: {
              const auto others = task.kind == 2 ? d.Friends(k) : d.Groups(k);
              for (uint64_t o : others) {
                Row r(EdgeSchema());
                r.SetInt64(0, d.Since(k, o + (task.kind == 3 ? (1ull << 40) : 0)));
                FARPOOL_RETURN_IF_ERROR(txn.Put(task.kind == 2 ? *t.friends : *t.members,
                                                Compose(int64_t(k), int64_t(o), kUserBits), r));
                ++rows;
              }
              break;
            }
            default:
              FARPOOL_RETURN_IF_ERROR(PutMessageRows(txn, t, d.GetMessage(k)));
              rows += 3;
          }
        }
        return Status::Ok();
      });
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(err_mu);
        if (first_error.ok()) first_error = s.WithContext("social: loading");
        break;
      }
      const uint64_t now = done.fetch_add(rows) + rows;
      if (reporter && progress) progress(std::min(now, total), total);
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker, false);
  worker(true);
  for (auto& th : pool) th.join();
  if (first_error.ok() && progress) progress(total, total);
  return first_error;
}

}  // namespace farpool::workloads
