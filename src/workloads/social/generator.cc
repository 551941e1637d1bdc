// The generator: SocialData, a pure function of (seed, scale), and the hashes of answers.
#include <algorithm>
#include <cmath>
#include <deque>
#include <unordered_map>

#include "workloads/social/internal.h"
#include "workloads/social/social.h"

namespace farpool::workloads {

using namespace social_internal;

namespace social_internal {

uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Chain(uint64_t h, uint64_t v) { return Mix(h ^ v) + 0x632be59bd9b4e019ull; }

}  // namespace social_internal

namespace {

constexpr int64_t kEpoch = 1600000000;
constexpr uint64_t kFriendWindow = 32;
constexpr uint64_t kFriendPercent = 17;

enum Kind : uint64_t { kName = 1, kGroupName, kFriend, kMember, kMemberCount, kMsg, kText, kSince };

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

}  // namespace

uint64_t HashString(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, then mixed
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return Mix(h);
}

uint64_t HashMessageRow(int64_t mid, int64_t time, std::string_view text) {
  return Mix(uint64_t(mid) * 31 + uint64_t(time)) ^ HashString(text);
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

}  // namespace farpool::workloads
