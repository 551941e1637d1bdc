// The MEMSCALE social network (seed 000, section V): schema, seeded generator, the six short
// queries and a write mix, on any engine of include/farpool/db.h.
//
// Schema (every table keyed by an int64; "index" tables are ordered (B+tree) tables whose
// composite key is the indexed field followed by the row's id, so a range scan on the prefix is
// an index lookup; every query walks indexes only, as MEMSCALE's "short queries" do):
//
//   sn_users        hash     uid                  name char(32)
//   sn_groups       hash     gid                  name char(32)
//   sn_friends      ordered  uid<<26 | fid        since            (both directions stored)
//   sn_members      ordered  uid<<26 | gid        joined
//   sn_messages     hash     mid                  sender, to_user (-1 if to a group),
//                                                 to_group (-1 if to a user), time, is_read,
//                                                 text bytes (variable length, 20..140 B)
//   sn_by_sender    ordered  sender<<36 | mid     time   index messages(sender, mid)
//   sn_inbox        ordered  to_user<<36 | mid    time   index messages(to_user, mid)
//   sn_group_inbox  ordered  to_group<<36 | mid   time   index messages(to_group, mid)
//
// Limits: users and groups < 2^26, message ids < 2^36.
//
// Generator (SocialData; a pure function of (seed, scale), so the database, the CSV export for
// PostgreSQL/SQLite and the expected answers all see the same data without storing it):
//   users     1000·scale; name "<First> <Last> #<uid>".
//   groups    100·scale (at least 10); name "<Topic> club #<gid>".
//   friends   u and v are friends iff their ring distance is 1..32 and a hash of the pair is
//             below 17% (symmetric by construction): about 11 friends per user.
//   members   each user joins 1..6 distinct random groups (about 35 members per group).
//   messages  10·users; mid is also the time order (time = 1.6e9 s + mid). The sender is a
//             uniform user half of the time and one of the 10% "active" users (uid % 10 == 0)
//             otherwise (they send about 55 messages each); 70% go to a uniform user, 30% to a
//             uniform group; 60% are read; the text is 3..20 words.
//
// Queries (each one read-only transaction; the parameter is a uniform user, or a uniform
// message for q5; the rows an index scan names are read with one MultiGet):
//   q1  names of the user's friends          scan sn_friends prefix, get each sn_users row
//   q2  number of new (unread) messages sent to the user
//                                            scan sn_inbox prefix, get each message's is_read
//   q3  number of new messages sent to the user's groups
//                                            scan sn_members prefix; per group scan
//                                            sn_group_inbox prefix, get each message
//   q4  last 100 messages sent by the user   reverse scan sn_by_sender prefix (limit 100), get
//                                            each message (time and text)
//   q5  text of a message                    get sn_messages[mid]
//   q6  names of the user's groups           scan sn_members prefix, get each sn_groups row
// Each answer is (rows, checksum); SocialData::Expect computes the same from the generator.
//
// Write mix (MEMSCALE's multi-node experiment plus writes): "post" inserts a new message from
// a uniform user to a user or group with its index entries (4 puts, one transaction); "read"
// marks a uniform message read (get + put).
//
// Thread-safety: SocialData is immutable and safe to share. SocialQueries is stateless apart
// from its table handles (safe for concurrent use with one Session per thread).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "farpool/db.h"
#include "farpool/status.h"

namespace farpool::workloads {

enum class SocialQuery : uint8_t {
  kFriends = 1,
  kNewMessages,
  kNewGroupMessages,
  kLast100,
  kText,
  kGroupNames
};
constexpr int kSocialQueries = 6;
// "q1".."q6" (or 1..6).
Result<SocialQuery> ParseSocialQuery(std::string_view text);
std::string_view SocialQueryName(SocialQuery q);         // "q1".."q6"
std::string_view SocialQueryDescription(SocialQuery q);  // "names of a user's friends", ...

struct Answer {
  uint64_t rows = 0;
  uint64_t checksum = 0;
  bool operator==(const Answer&) const = default;
};

struct Message {
  int64_t mid = 0, sender = 0, to_user = -1, to_group = -1, time = 0, is_read = 0;
  std::string text;
};

// The generated network. REQUIRES: scale >= 0.1 (at least 100 users).
class SocialData {
 public:
  SocialData(double scale, uint64_t seed);

  uint64_t users() const { return users_; }
  uint64_t groups() const { return groups_; }
  uint64_t messages() const { return messages_; }
  uint64_t seed() const { return seed_; }

  std::string UserName(uint64_t uid) const;
  std::string GroupName(uint64_t gid) const;
  // Friends of uid, ascending; symmetric.
  std::vector<uint64_t> Friends(uint64_t uid) const;
  // Groups uid belongs to, ascending, distinct.
  std::vector<uint64_t> Groups(uint64_t uid) const;
  Message GetMessage(uint64_t mid) const;
  // A stable, arbitrary value for a friendship/membership row (its time).
  int64_t Since(uint64_t a, uint64_t b) const;

  // The expected answers of every query for each of `users` (and q5 for `mids`), computed
  // from the generator with one pass over the messages. Result [i][q-1] for users[i]; q5 uses
  // mids[i].
  std::vector<std::vector<Answer>> Expect(const std::vector<uint64_t>& users,
                                          const std::vector<uint64_t>& mids) const;

 private:
  uint64_t Hash(uint64_t kind, uint64_t a, uint64_t b = 0) const;
  uint64_t seed_, users_, groups_, messages_;
};

// Order-independent accumulation for sets (q1, q6) and ordered for lists (q4).
uint64_t HashString(std::string_view s);
uint64_t HashMessageRow(int64_t mid, int64_t time, std::string_view text);

struct SocialTables {
  const Table *users = nullptr, *groups = nullptr, *friends = nullptr, *members = nullptr,
              *messages = nullptr, *by_sender = nullptr, *inbox = nullptr, *group_inbox = nullptr;
};

// Creates the eight tables (sized for `data`) and loads the generated network into them with
// bulk loaders (Database::NewLoader): `threads` threads at once, each filling whole tables
// (users; groups; friends; members; messages with its three index tables); each table
// appears once it is whole. AlreadyExists if one of them exists.
// `progress(done, total)` is called now and then from one thread (rows added so far).
Result<SocialTables> LoadSocial(Database& db, const SocialData& data, int threads,
                                const std::function<void(uint64_t, uint64_t)>& progress = {});
Result<SocialTables> OpenSocialTables(Database& db);

// Runs query `q` with parameter `param` (a uid; a mid for q5) in one read-only transaction.
Status RunSocialQuery(Session& session, const SocialTables& t, SocialQuery q, int64_t param,
                      Answer* answer);

// Write mix: a new message `mid` (>= data.messages(), unique) from `sender` to a user or group.
Status PostMessage(Session& session, const SocialTables& t, const Message& m);
Status MarkRead(Session& session, const SocialTables& t, int64_t mid);

// CSV files for the peers (users.csv, groups.csv, friends.csv, members.csv, messages.csv) with
// a header line; text fields quoted. Plus expect.csv: query,param,rows,checksum for `samples`
// users (a deterministic sample) so peers can check their answers.
Status ExportSocialCsv(const SocialData& data, const std::string& dir, int samples = 100);

// The deterministic verification sample: `n` users and `n` messages spread over the data.
void SocialSample(const SocialData& data, int n, std::vector<uint64_t>* users,
                  std::vector<uint64_t>* mids);

}  // namespace farpool::workloads
