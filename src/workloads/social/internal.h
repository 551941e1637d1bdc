// Internals shared by the social network's files (src/workloads/social/): key layout, row
// schemas, hashing, the rows of one message. See social.h for the contract.
#pragma once

#include <cstdint>
#include <functional>

#include "workloads/social/social.h"

namespace farpool::workloads::social_internal {

// Keys of the "index" tables: the indexed field shifted left, the row's id in the low bits.
inline constexpr int kUserBits = 26;
inline constexpr int kMidBits = 36;
inline constexpr int64_t kMidMask = (int64_t{1} << kMidBits) - 1;
inline constexpr int64_t kUserMask = (int64_t{1} << kUserBits) - 1;

uint64_t Mix(uint64_t x);  // splitmix64 finalizer
// Ordered accumulation of answer checksums (q4).
uint64_t Chain(uint64_t h, uint64_t v);
inline int64_t Compose(int64_t hi, int64_t lo, int lo_bits) { return (hi << lo_bits) | lo; }

const Schema& NameSchema();     // sn_users, sn_groups
const Schema& EdgeSchema();     // friends, members and the message indexes
const Schema& MessageSchema();  // sn_messages
enum MsgCol { kSender = 0, kToUser, kToGroup, kTime, kIsRead, kTextCol };

// The rows of message m: its row in sn_messages and its two index entries (sn_by_sender, and
// sn_inbox or sn_group_inbox), each passed to `put` with the table's name. Stops at an error.
Status ForEachMessageRow(
    const Message& m, const std::function<Status(const char* table, int64_t key, const Row&)>& put);
// The message row and its two index entries, inside `txn`.
Status PutMessageRows(Transaction& txn, const SocialTables& t, const Message& m);

}  // namespace farpool::workloads::social_internal
