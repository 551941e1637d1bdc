#include "workloads/social.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace farpool::workloads {
namespace {

constexpr int kUserBits = 26;
constexpr int kMidBits = 36;
constexpr int64_t kMidMask = (int64_t{1} << kMidBits) - 1;
constexpr int64_t kUserMask = (int64_t{1} << kUserBits) - 1;
constexpr int64_t kEpoch = 1600000000;
constexpr uint64_t kFriendWindow = 32;
constexpr uint64_t kFriendPercent = 17;

enum Kind : uint64_t { kName = 1, kGroupName, kFriend, kMember, kMemberCount, kMsg, kText, kSince };

uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* const kFirst[] = {"Ada",     "Alan",   "Barbara", "Brian",   "Claude",
                              "Dennis",  "Donald", "Edsger",  "Frances", "Grace",
                              "Jim",     "John",   "Ken",     "Leslie",  "Margaret",
                              "Niklaus", "Radia",  "Robin",   "Shafi",   "Tony"};
const char* const kLast[] = {"Allen",   "Backus",  "Cerf",     "Dijkstra", "Engelbart",
                             "Floyd",   "Gray",    "Hamming",  "Hoare",    "Kahn",
                             "Knuth",   "Lamport", "Liskov",   "McCarthy", "Milner",
                             "Perlman", "Ritchie", "Thompson", "Wirth",    "Yao"};
const char* const kTopic[] = {"Chess", "Hiking",    "Jazz",   "Cooking", "Cycling", "Databases",
                              "Films", "Gardening", "Poetry", "Running", "Sailing", "Go"};
const char* const kWords[] = {
    "hello", "see",      "you",    "at",   "the",    "party", "tonight", "memory",
    "pool",  "is",       "fast",   "did",  "read",   "my",    "last",    "message",
    "lunch", "tomorrow", "great",  "news", "thanks", "for",   "photos",  "meeting",
    "moved", "to",       "friday", "call", "me",     "later", "ok",      "cluster"};
template <typename T, size_t N>
constexpr size_t Len(const T (&)[N]) {
  return N;
}

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
enum MsgCol { kSender = 0, kToUser, kToGroup, kTime, kIsRead, kTextCol };

int64_t Compose(int64_t hi, int64_t lo, int lo_bits) { return (hi << lo_bits) | lo; }

}  // namespace

uint64_t HashString(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, then mixed
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return Mix(h);
}

uint64_t HashMessageRow(int64_t mid, int64_t time, std::string_view text) {
  return Mix(uint64_t(mid) * 31 + uint64_t(time)) ^ HashString(text);
}

namespace {
uint64_t Chain(uint64_t h, uint64_t v) { return Mix(h ^ v) + 0x632be59bd9b4e019ull; }
}  // namespace

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

SocialData::SocialData(double scale, uint64_t seed) : seed_(seed) {
  users_ = std::max<uint64_t>(100, static_cast<uint64_t>(std::llround(1000 * scale)));
  groups_ = std::max<uint64_t>(10, users_ / 10);
  messages_ = 10 * users_;
}

uint64_t SocialData::Hash(uint64_t kind, uint64_t a, uint64_t b) const {
  return Mix(Mix(Mix(seed_ ^ (kind * 0x9e3779b97f4a7c15ull)) ^ a) ^ (b * 0xd1b54a32d192ed03ull));
}

std::string SocialData::UserName(uint64_t uid) const {
  const uint64_t h = Hash(kName, uid);
  return std::string(kFirst[h % Len(kFirst)]) + " " + kLast[(h >> 20) % Len(kLast)] + " #" +
         std::to_string(uid);
}

std::string SocialData::GroupName(uint64_t gid) const {
  return std::string(kTopic[Hash(kGroupName, gid) % Len(kTopic)]) + " club #" + std::to_string(gid);
}

std::vector<uint64_t> SocialData::Friends(uint64_t uid) const {
  std::vector<uint64_t> out;
  for (uint64_t d = 1; d <= kFriendWindow; ++d) {
    for (uint64_t v : {(uid + d) % users_, (uid + users_ - d) % users_}) {
      if (v == uid) continue;
      const uint64_t lo = std::min(uid, v), hi = std::max(uid, v);
      if (Hash(kFriend, lo, hi) % 100 < kFriendPercent) out.push_back(v);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<uint64_t> SocialData::Groups(uint64_t uid) const {
  const uint64_t n = 1 + Hash(kMemberCount, uid) % 6;
  std::vector<uint64_t> out;
  for (uint64_t k = 0; k < n; ++k) out.push_back(Hash(kMember, uid, k) % groups_);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t SocialData::Since(uint64_t a, uint64_t b) const {
  return kEpoch - int64_t(Hash(kSince, std::min(a, b), std::max(a, b)) % 100000000);
}

Message SocialData::GetMessage(uint64_t mid) const {
  Message m;
  m.mid = int64_t(mid);
  const uint64_t h = Hash(kMsg, mid), h2 = Mix(h);
  const uint64_t active = (users_ + 9) / 10;
  m.sender = (h & 1) ? int64_t((h >> 1) % users_) : int64_t(((h >> 1) % active) * 10);
  if ((h2 % 100) < 70) {
    m.to_user = int64_t((h2 >> 8) % users_);
  } else {
    m.to_group = int64_t((h2 >> 8) % groups_);
  }
  m.time = kEpoch + int64_t(mid);
  m.is_read = (Mix(h2) % 100) < 60 ? 1 : 0;
  uint64_t t = Hash(kText, mid);
  const int words = 3 + int(t % 18);
  for (int i = 0; i < words; ++i) {
    t = Mix(t);
    if (i) m.text += ' ';
    m.text += kWords[t % Len(kWords)];
  }
  return m;
}

std::vector<std::vector<Answer>> SocialData::Expect(const std::vector<uint64_t>& users,
                                                    const std::vector<uint64_t>& mids) const {
  std::vector<std::vector<Answer>> out(users.size(), std::vector<Answer>(kSocialQueries));
  std::unordered_map<uint64_t, std::vector<size_t>> by_user, by_group;
  std::vector<std::deque<Message>> last(users.size());
  for (size_t i = 0; i < users.size(); ++i) {
    const uint64_t u = users[i];
    by_user[u].push_back(i);
    Answer& q1 = out[i][0];
    for (uint64_t f : Friends(u)) {
      ++q1.rows;
      q1.checksum += HashString(UserName(f));
    }
    Answer& q6 = out[i][5];
    for (uint64_t g : Groups(u)) {
      by_group[g].push_back(i);
      ++q6.rows;
      q6.checksum += HashString(GroupName(g));
    }
  }
  for (uint64_t mid = 0; mid < messages_; ++mid) {
    Message m = GetMessage(mid);
    if (!m.is_read && m.to_user >= 0) {
      if (auto it = by_user.find(m.to_user); it != by_user.end()) {
        for (size_t i : it->second) ++out[i][1].rows;
      }
    }
    if (!m.is_read && m.to_group >= 0) {
      if (auto it = by_group.find(m.to_group); it != by_group.end()) {
        for (size_t i : it->second) ++out[i][2].rows;
      }
    }
    if (auto it = by_user.find(m.sender); it != by_user.end()) {
      for (size_t i : it->second) {
        last[i].push_back(m);
        if (last[i].size() > 100) last[i].pop_front();
      }
    }
  }
  for (size_t i = 0; i < users.size(); ++i) {
    out[i][1].checksum = out[i][1].rows;
    out[i][2].checksum = out[i][2].rows;
    Answer& q4 = out[i][3];
    for (auto it = last[i].rbegin(); it != last[i].rend(); ++it) {
      ++q4.rows;
      q4.checksum = Chain(q4.checksum, HashMessageRow(it->mid, it->time, it->text));
    }
    if (i < mids.size()) {
      Message m = GetMessage(mids[i]);
      out[i][4] = {1, HashString(m.text)};
    }
  }
  return out;
}

void SocialSample(const SocialData& data, int n, std::vector<uint64_t>* users,
                  std::vector<uint64_t>* mids) {
  users->clear();
  mids->clear();
  for (int i = 0; i < n; ++i) {
    // Spread over the ids, including the "active" senders (multiples of 10).
    users->push_back((Mix(data.seed() ^ 0xabcdef ^ uint64_t(i)) % data.users()) /
                     (i % 3 == 0 ? 10 : 1) * (i % 3 == 0 ? 10 : 1));
    mids->push_back(Mix(data.seed() ^ 0x123457 ^ uint64_t(i)) % data.messages());
  }
}

// ------------------------------------------------------------------ tables and loading

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

namespace {

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

// ------------------------------------------------------------------ queries

namespace {

Status CollectScan(Transaction& txn, const Table& table, int64_t prefix, int bits, size_t limit,
                   bool reverse, std::vector<int64_t>* ids) {
  const int64_t lo = prefix << bits, hi = lo | ((int64_t{1} << bits) - 1);
  const int64_t mask = (int64_t{1} << bits) - 1;
  return txn.Scan(table, lo, hi, limit, reverse, [&](int64_t key, const Row&) {
    ids->push_back(key & mask);
    return true;
  });
}

// The rows of `ids` in `table`, in one MultiGet; every id must exist (the indexes name them).
Status GetRows(Transaction& txn, const Table& table, const std::vector<int64_t>& ids,
               std::vector<Row>* rows) {
  std::vector<TableKey> keys;
  keys.reserve(ids.size());
  for (int64_t id : ids) keys.push_back({&table, id});
  std::vector<Status> found;
  FARPOOL_RETURN_IF_ERROR(txn.MultiGet(keys, rows, &found));
  for (const Status& f : found) FARPOOL_RETURN_IF_ERROR(f);
  return Status::Ok();
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
      FARPOOL_RETURN_IF_ERROR(GetRows(txn, friends ? *t.users : *t.groups, ids, &rows));
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
        for (int64_t g : groups) {
          FARPOOL_RETURN_IF_ERROR(CollectScan(txn, *t.group_inbox, g, kMidBits, 0, false, &ids));
        }
      }
      FARPOOL_RETURN_IF_ERROR(GetRows(txn, *t.messages, ids, &rows));
      for (const Row& row : rows) {
        if (row.GetInt64(kIsRead) == 0) ++a->rows;
      }
      a->checksum = a->rows;
      return Status::Ok();
    }
    case SocialQuery::kLast100: {
      FARPOOL_RETURN_IF_ERROR(CollectScan(txn, *t.by_sender, p, kMidBits, 100, true, &ids));
      FARPOOL_RETURN_IF_ERROR(GetRows(txn, *t.messages, ids, &rows));
      for (size_t i = 0; i < ids.size(); ++i) {
        ++a->rows;
        a->checksum = Chain(a->checksum, HashMessageRow(ids[i], rows[i].GetInt64(kTime),
                                                        rows[i].GetBytes(kTextCol)));
      }
      return Status::Ok();
    }
    case SocialQuery::kText: {
      FARPOOL_RETURN_IF_ERROR(txn.Get(*t.messages, p, &r));
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

// ------------------------------------------------------------------ export

namespace {

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

class CsvFile {
 public:
  Status Open(const std::string& path, const char* header) {
    f_ = std::fopen(path.c_str(), "w");
    if (!f_) return Status::IoError("cannot write " + path);
    path_ = path;
    std::fprintf(f_, "%s\n", header);
    return Status::Ok();
  }
  void Line(const std::string& line) {
    std::fwrite(line.data(), 1, line.size(), f_), std::fputc('\n', f_);
  }
  Status Close() {
    const bool ok = f_ && std::ferror(f_) == 0;
    if (f_) std::fclose(f_);
    f_ = nullptr;
    return ok ? Status::Ok() : Status::IoError("write failed: " + path_);
  }
  ~CsvFile() {
    if (f_) std::fclose(f_);
  }

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace

Status ExportSocialCsv(const SocialData& d, const std::string& dir, int samples) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir + ": " + ec.message());
  auto p = [&](const char* name) { return dir + "/" + name; };
  auto s = [](auto v) { return std::to_string(v); };
  CsvFile f;
  FARPOOL_RETURN_IF_ERROR(f.Open(p("users.csv"), "uid,name"));
  for (uint64_t u = 0; u < d.users(); ++u) f.Line(s(u) + "," + Quote(d.UserName(u)));
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(f.Open(p("groups.csv"), "gid,name"));
  for (uint64_t g = 0; g < d.groups(); ++g) f.Line(s(g) + "," + Quote(d.GroupName(g)));
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(f.Open(p("friends.csv"), "uid,fid,since"));
  for (uint64_t u = 0; u < d.users(); ++u) {
    for (uint64_t v : d.Friends(u)) f.Line(s(u) + "," + s(v) + "," + s(d.Since(u, v)));
  }
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(f.Open(p("members.csv"), "uid,gid,joined"));
  for (uint64_t u = 0; u < d.users(); ++u) {
    for (uint64_t g : d.Groups(u))
      f.Line(s(u) + "," + s(g) + "," + s(d.Since(u, g + (1ull << 40))));
  }
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(
      f.Open(p("messages.csv"), "mid,sender,to_user,to_group,time,is_read,text"));
  for (uint64_t mid = 0; mid < d.messages(); ++mid) {
    Message m = d.GetMessage(mid);
    f.Line(s(m.mid) + "," + s(m.sender) + "," + (m.to_user >= 0 ? s(m.to_user) : "") + "," +
           (m.to_group >= 0 ? s(m.to_group) : "") + "," + s(m.time) + "," + s(m.is_read) + "," +
           Quote(m.text));
  }
  FARPOOL_RETURN_IF_ERROR(f.Close());
  std::vector<uint64_t> users, mids;
  SocialSample(d, samples, &users, &mids);
  const auto expect = d.Expect(users, mids);
  FARPOOL_RETURN_IF_ERROR(f.Open(p("expect.csv"), "query,param,rows"));
  for (size_t i = 0; i < users.size(); ++i) {
    for (int q = 1; q <= kSocialQueries; ++q) {
      const uint64_t param = q == 5 ? mids[i] : users[i];
      f.Line("q" + s(q) + "," + s(param) + "," + s(expect[i][q - 1].rows));
    }
  }
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(f.Open(p("meta.csv"), "users,groups,messages,seed"));
  f.Line(s(d.users()) + "," + s(d.groups()) + "," + s(d.messages()) + "," + s(d.seed()));
  return f.Close();
}

}  // namespace farpool::workloads
