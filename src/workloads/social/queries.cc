// The six queries and the write mix.
#include "workloads/social/internal.h"
#include "workloads/social/social.h"
#include "workloads/txn_helpers.h"

namespace farpool::workloads {

using namespace social_internal;

Result<SocialQuery> ParseSocialQuery(std::string_view text) {
  std::string_view t = text;
  if (!t.empty() && (t[0] == 'q' || t[0] == 'Q')) t.remove_prefix(1);
  if (t.size() == 1 && t[0] >= '1' && t[0] <= '6') return SocialQuery(t[0] - '0');
  return Status::InvalidArgument("unknown query '" + std::string(text) + "' (expected q1..q6)");
}

std::string_view SocialQueryName(SocialQuery q) {
  static const char* const kNames[] = {"q1", "q2", "q3", "q4", "q5", "q6"};
  return kNames[int(q) - 1];
}

std::string_view SocialQueryDescription(SocialQuery q) {
  static const char* const kDesc[] = {"names of a user's friends",
                                      "number of new messages to a user",
                                      "number of new messages to a user's groups",
                                      "last 100 messages sent by a user",
                                      "text of a message",
                                      "names of a user's groups"};
  return kDesc[int(q) - 1];
}

namespace {

// The keys of `table` that start with `prefix` (the low `bits` bits are the id). The scans of
// the index tables want their keys only.
ScanRange PrefixRange(const Table& table, int64_t prefix, int bits, size_t limit, bool reverse) {
  const int64_t lo = prefix << bits;
  return {&table, lo, lo | ((int64_t{1} << bits) - 1), limit, reverse, ColumnSet::None()};
}

// The ids (low `bits` bits) of the keys that start with `prefix` in `table`, with ScanMany (its
// pool engines read the records with the leaves when their images are cached).
Status CollectIds(Transaction& txn, const Table& table, int64_t prefix, int bits,
                  std::vector<int64_t>* ids) {
  const int64_t mask = (int64_t{1} << bits) - 1;
  const ScanRange range = PrefixRange(table, prefix, bits, 0, false);
  return txn.ScanMany(std::span<const ScanRange>(&range, 1), [&](size_t, int64_t key, const Row&) {
    ids->push_back(key & mask);
    return true;
  });
}

// The `columns` of the rows of `target` that the keys in `ranges` name (their low `bits` bits),
// in one ScanThenGet, handed to `visit` with their id in scan order; every id must exist (the
// indexes name them).
Status JoinRows(Transaction& txn, std::span<const ScanRange> ranges, int bits, const Table& target,
                ColumnSet columns, const std::function<void(int64_t id, const Row& row)>& visit) {
  const int64_t mask = (int64_t{1} << bits) - 1;
  Status missing;
  FARPOOL_RETURN_IF_ERROR(txn.ScanThenGet(
      ranges, target, columns, [mask](size_t, int64_t key) { return key & mask; },
      [&](size_t, int64_t key, const Status& status, const Row& row) {
        if (!status.ok()) {
          missing = status;
          return false;
        }
        visit(key & mask, row);
        return true;
      }));
  return missing;
}

Status JoinRows(Transaction& txn, const ScanRange& range, int bits, const Table& target,
                ColumnSet columns, const std::function<void(int64_t id, const Row& row)>& visit) {
  return JoinRows(txn, std::span<const ScanRange>(&range, 1), bits, target, columns, visit);
}

Status QueryBody(Transaction& txn, const SocialTables& t, SocialQuery q, int64_t p, Answer* a) {
  *a = {};
  Row r;
  switch (q) {
    case SocialQuery::kFriends:
    case SocialQuery::kGroupNames: {
      const bool friends = q == SocialQuery::kFriends;
      return JoinRows(txn, PrefixRange(friends ? *t.friends : *t.members, p, kUserBits, 0, false),
                      kUserBits, friends ? *t.users : *t.groups, ColumnSet::All(),
                      [&](int64_t, const Row& row) {
                        ++a->rows;
                        a->checksum += HashString(row.GetChar(0));
                      });
    }
    case SocialQuery::kNewMessages:
    case SocialQuery::kNewGroupMessages: {
      std::vector<ScanRange> inboxes;
      if (q == SocialQuery::kNewMessages) {
        inboxes.push_back(PrefixRange(*t.inbox, p, kMidBits, 0, false));
      } else {
        std::vector<int64_t> groups;
        FARPOOL_RETURN_IF_ERROR(CollectIds(txn, *t.members, p, kUserBits, &groups));
        // Every group's inbox at once: their leaves, records and messages in one round trip
        // when the caches are warm.
        for (int64_t g : groups)
          inboxes.push_back(PrefixRange(*t.group_inbox, g, kMidBits, 0, false));
      }
      // The flag only: the text (a blob) is not read.
      FARPOOL_RETURN_IF_ERROR(JoinRows(txn, inboxes, kMidBits, *t.messages, ColumnSet{kIsRead},
                                       [&](int64_t, const Row& row) {
                                         if (row.GetInt64(kIsRead) == 0) ++a->rows;
                                       }));
      a->checksum = a->rows;
      return Status::Ok();
    }
    case SocialQuery::kLast100: {
      return JoinRows(txn, PrefixRange(*t.by_sender, p, kMidBits, 100, true), kMidBits, *t.messages,
                      ColumnSet{kTime, kTextCol}, [&](int64_t id, const Row& row) {
                        ++a->rows;
                        a->checksum = Chain(a->checksum, HashMessageRow(id, row.GetInt64(kTime),
                                                                        row.GetBytes(kTextCol)));
                      });
    }
    case SocialQuery::kText: {
      FARPOOL_RETURN_IF_ERROR(txn.Get(*t.messages, p, &r, ColumnSet{kTextCol}));
      *a = {1, HashString(r.GetBytes(kTextCol))};
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("unknown query");
}

}  // namespace

Status RunSocialQuery(Session& session, const SocialTables& t, SocialQuery q, int64_t param,
                      Answer* answer) {
  return RunTransaction(
      session, [&](Transaction& txn) -> Status { return QueryBody(txn, t, q, param, answer); });
}

Status PostMessage(Session& session, const SocialTables& t, const Message& m) {
  return RunTransaction(session,
                        [&](Transaction& txn) -> Status { return PutMessageRows(txn, t, m); });
}

Status MarkRead(Session& session, const SocialTables& t, int64_t mid) {
  return RunTransaction(session, [&](Transaction& txn) -> Status {
    Row r;
    FARPOOL_RETURN_IF_ERROR(txn.Get(*t.messages, mid, &r));
    if (r.GetInt64(kIsRead) == 1) return Status::Ok();
    r.SetInt64(kIsRead, 1);
    return txn.Put(*t.messages, mid, r);
  });
}

}  // namespace farpool::workloads
