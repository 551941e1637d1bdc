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

// The ids (low `bits` bits) of the keys in `ranges`, range by range, in one ScanMany.
Status CollectScans(Transaction& txn, std::span<const ScanRange> ranges, int bits,
                    std::vector<int64_t>* ids) {
  const int64_t mask = (int64_t{1} << bits) - 1;
  return txn.ScanMany(ranges, [&](size_t, int64_t key, const Row&) {
    ids->push_back(key & mask);
    return true;
  });
}

Status CollectScan(Transaction& txn, const Table& table, int64_t prefix, int bits, size_t limit,
                   bool reverse, std::vector<int64_t>* ids) {
  const ScanRange range = PrefixRange(table, prefix, bits, limit, reverse);
  return CollectScans(txn, std::span<const ScanRange>(&range, 1), bits, ids);
}

// The `columns` of the rows of `ids` in `table`, in one MultiGet; every id must exist (the
// indexes name them).
Status GetRows(Transaction& txn, const Table& table, const std::vector<int64_t>& ids,
               ColumnSet columns, std::vector<Row>* rows) {
  std::vector<TableKey> keys;
  keys.reserve(ids.size());
  for (int64_t id : ids) keys.push_back({&table, id, columns});
  return GetAll(txn, keys, rows);
}

Status QueryBody(Transaction& txn, const SocialTables& t, SocialQuery q, int64_t p, Answer* a) {
  *a = {};
  std::vector<int64_t> ids;
  std::vector<Row> rows;
  Row r;
  switch (q) {
    case SocialQuery::kFriends:
    case SocialQuery::kGroupNames: {
      const bool friends = q == SocialQuery::kFriends;
      FARPOOL_RETURN_IF_ERROR(
          CollectScan(txn, friends ? *t.friends : *t.members, p, kUserBits, 0, false, &ids));
      FARPOOL_RETURN_IF_ERROR(
          GetRows(txn, friends ? *t.users : *t.groups, ids, ColumnSet::All(), &rows));
      for (const Row& row : rows) {
        ++a->rows;
        a->checksum += HashString(row.GetChar(0));
      }
      return Status::Ok();
    }
    case SocialQuery::kNewMessages:
    case SocialQuery::kNewGroupMessages: {
      if (q == SocialQuery::kNewMessages) {
        FARPOOL_RETURN_IF_ERROR(CollectScan(txn, *t.inbox, p, kMidBits, 0, false, &ids));
      } else {
        std::vector<int64_t> groups;
        FARPOOL_RETURN_IF_ERROR(CollectScan(txn, *t.members, p, kUserBits, 0, false, &groups));
        // Every group's inbox at once: their leaves in one round trip, records in the next.
        std::vector<ScanRange> inboxes;
        for (int64_t g : groups)
          inboxes.push_back(PrefixRange(*t.group_inbox, g, kMidBits, 0, false));
        FARPOOL_RETURN_IF_ERROR(CollectScans(txn, inboxes, kMidBits, &ids));
      }
      // The flag only: the text (a blob) is not read.
      FARPOOL_RETURN_IF_ERROR(GetRows(txn, *t.messages, ids, ColumnSet{kIsRead}, &rows));
      for (const Row& row : rows) {
        if (row.GetInt64(kIsRead) == 0) ++a->rows;
      }
      a->checksum = a->rows;
      return Status::Ok();
    }
    case SocialQuery::kLast100: {
      FARPOOL_RETURN_IF_ERROR(CollectScan(txn, *t.by_sender, p, kMidBits, 100, true, &ids));
      FARPOOL_RETURN_IF_ERROR(GetRows(txn, *t.messages, ids, ColumnSet{kTime, kTextCol}, &rows));
      for (size_t i = 0; i < ids.size(); ++i) {
        ++a->rows;
        a->checksum = Chain(a->checksum, HashMessageRow(ids[i], rows[i].GetInt64(kTime),
                                                        rows[i].GetBytes(kTextCol)));
      }
      return Status::Ok();
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
