// Wire format of farpool's messages between a client and a memory server, carried as UCX
// active messages (id kControlAm): control (hello, lease, release, stats, evict, goodbye) and
// batches of memory operations. Where a client maps the region (shared memory) or has one-sided
// verbs (RDMA), data never travels here; over TCP a client sends each batch of reads, writes and
// atomics to a server as one BatchRequest, which the server executes on its region
// (pool/memory_ops.h has the layout of the operations in the tail).
//
// Access control (transport/auth.h): a connection to a server that has a cluster secret must
// authenticate before anything else is executed. The client sends a ChallengeRequest (its
// nonce), the server a ChallengeReply (its nonce), the client a HelloRequest with its proof
// (HMAC-SHA256 over both nonces), and the server, once the proof checks, a HelloReply with its
// own proof, which the client checks. Every other request of a connection that has not
// authenticated gets an ErrorReply and is counted (StatsReply::auth_refused); a connection
// authenticates once, later hellos on it need no proof.
//
// Replication (docs/pool.md "Replication"): a server may keep a mirror of another server's
// region (its primary) after its own; the primary forwards what its requests changed
// (ReplicateRequest, MirrorLeaseRequest) before it answers them, and a client that has lost a
// primary asks the backup to take its data over (PromoteRequest), after which the backup
// refuses the old primary's forwards: a primary cut off from its clients can no longer
// acknowledge a write.
//
// Every message is one frame of transport/frame.h (magic "FPW1", version 5): the 24-byte
// header, one fixed-size body struct of the header's opcode, then (for a few opcodes) a tail
// whose length is a field of the body (TailRule::kDeclared: at most kMaxDeclaredTail bytes,
// kMaxBatchTail for batches). The frame codec checks every length; messages of another
// version are rejected with a Protocol status that names both versions; the server answers
// them with an ErrorReply and keeps running.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/status.h"
#include "transport/frame.h"

namespace farpool::wire {

inline constexpr uint32_t kMagic = 0x31575046;  // "FPW1"
// 2: the hello pins the client process (boot id, start time, HelloReply::flags); evict.
// 3: goodbye (a Pool that closes unpins its process).
// 4: the cluster secret's challenge-response (challenge, proofs in hello and its reply) and
//    StatsReply::auth_refused.
// 5: replication (HelloReply's mirror fields, backup, replicate, mirror lease, promote,
//    degrade).
// 6: pools (HelloRequest::pool, HelloReply::root_offset and mirror_root_offset,
//    kHelloPoolClient, StatsReply::pool_refused, MirrorLeaseRequest::owner).
// 7: MovingReply (a server being drained refuses requests without executing them); the
//    waiting compare-and-swap's flag kWaitOnly (memory_ops.h: wait until free, change nothing).
// 8: the lookup-lock-read (memory_ops.h kLookupLockRead: a locking read's lookup, lock and
//    copy in one operation).
// 9: shared-pages backups (ReplicateRequest's shared file and kReplicateShare,
//    kHelloSharedPages).
// 10: MovedFileRequest/Reply (a client that connects after a failover maps the moved region).
// 11: kReplicateDetach (a primary gives its backup slot's copy up; the slot frees its memory).
// 12: BackupReply::slot (the slot of the copy the reply is about, which the coordinator names).
// 13: BackupRequest::term and its tail of the map's backups (MapBackup): a primary gives up the
//     copies the map does not name and refuses a deposed coordinator's requests.
// 14: StatusCode::kEvicted in ErrorReply: a server refuses an evicted (or departed) process
//     tag with it, not with Unavailable, so the client tells its fence from an outage.
inline constexpr uint16_t kVersion = 14;
// Batches: the operations of a request, the read data and atomic results of a reply. Small
// enough to go eagerly in one UCX active message, large enough for a commit's worth of
// records; a client splits larger batches into several messages.
inline constexpr size_t kMaxBatchTail = 64 << 10;

enum class Opcode : uint16_t {
  kHelloRequest = 1,
  kHelloReply = 2,
  kLeaseRequest = 3,
  kLeaseReply = 4,
  kReleaseRequest = 5,
  kReleaseReply = 6,
  kStatsRequest = 7,
  kStatsReply = 8,
  kErrorReply = 9,  // server -> client when a request failed: transport::ErrorBody + reason
  kBatchRequest = 10,
  kBatchReply = 11,
  kEvictRequest = 12,
  kEvictReply = 13,
  kGoodbyeRequest = 14,
  kGoodbyeReply = 15,
  kChallengeRequest = 16,
  kChallengeReply = 17,
  kBackupRequest = 18,
  kBackupReply = 19,
  kReplicateRequest = 20,
  kReplicateReply = 21,
  kMirrorLeaseRequest = 22,
  kMirrorLeaseReply = 23,
  kPromoteRequest = 24,
  kPromoteReply = 25,
  kDegradeRequest = 26,
  kDegradeReply = 27,
  kMovingReply = 28,  // server -> client: a request refused, not executed (MovingReply)
  kMovedFileRequest = 29,
  kMovedFileReply = 30,
};
std::string_view OpcodeName(Opcode op);

// Client -> server, the first message on a connection to a server that may have a cluster
// secret: the client's fresh nonce for this connection's challenge-response.
struct ChallengeRequest {
  uint8_t client_nonce[32];
};
static_assert(sizeof(ChallengeRequest) == 32);

// ChallengeReply::flags: the server has no cluster secret (started without --secret-file): it
// authenticates nobody and cannot prove anything; a client that has a secret refuses it.
inline constexpr uint32_t kChallengeOpen = 1u << 0;
// Server -> client: the server's fresh nonce. A new ChallengeRequest on the connection replaces
// the challenge; each challenge admits one hello's proof, right or wrong.
struct ChallengeReply {
  uint8_t server_nonce[32];
  uint32_t flags;  // kChallengeOpen
  uint32_t reserved;
};
static_assert(sizeof(ChallengeReply) == 40);

// HelloRequest::flags.
// The client will map the region if the server allows it (kHelloMayMap): it asks to be pinned.
inline constexpr uint32_t kHelloWantsMap = 1u << 0;
// `proof` holds the client's proof for this connection's challenge (a client without a secret
// leaves it clear; a server with a secret then refuses it: "no cluster secret").
inline constexpr uint32_t kHelloHasProof = 1u << 1;

// Client -> server, first message on a connection. Every connection of one Pool carries the
// same nonce; its low 32 bits, never 0, are the Pool's process tag (Pool::process_tag): what
// the server counts clients by and what an EvictRequest names.
struct HelloRequest {
  uint64_t client_pid;
  uint64_t client_nonce;  // random per Pool
  // Field 22 of /proc/<pid>/stat (clock ticks since boot) and the kernel's boot id
  // (common/host.h): with client_pid they name the process for good, so that a server on the
  // same host can pin it (pidfd) before it lets it map the region. Zero if unknown.
  uint64_t start_time;
  uint8_t boot_id[16];
  uint32_t flags;  // kHelloWantsMap, kHelloHasProof
  uint32_t reserved;
  // ClusterSecret::Prove(kClient, client nonce, server nonce) of the connection's challenge,
  // with the credential of `pool` (transport/auth.h: the cluster secret for the default pool).
  uint8_t proof[32];
  // The pool (tenant) the connection acts for, NUL-padded; all zero: the default pool. Only
  // the first hello of a connection (the one that authenticates) sets it.
  char pool[32];
};
static_assert(sizeof(HelloRequest) == 112);

// HelloReply::flags. kHelloMayMap is set only if the client asked (kHelloWantsMap) and the
// server pinned its process: the same boot id as the server's, pidfd_open(client_pid)
// succeeded, the process's start time read after opening the pidfd is the hello's, and the
// server may signal it. Only then can an eviction kill it (a store into a mapping cannot be
// revoked any other way), so only then may it map. Otherwise the other bits say why not.
inline constexpr uint16_t kHelloMayMap = 1u << 0;
inline constexpr uint16_t kHelloOtherBoot = 1u << 1;      // another host, or another boot
inline constexpr uint16_t kHelloNoPidfd = 1u << 2;        // pidfd_open failed (no such pid here)
inline constexpr uint16_t kHelloStartMismatch = 1u << 3;  // the pid is another process here
inline constexpr uint16_t kHelloNoSignal = 1u << 4;       // the server may not signal it
inline constexpr uint16_t kHelloPinRefused = 1u << 5;     // the tag is pinned to another pid
// `proof` holds the server's proof (it has a secret and the client proved it knows it too).
inline constexpr uint16_t kHelloServerProof = 1u << 6;
// The connection acts for a pool other than the default: it gets no remote key (rkey_size 0)
// and may not map the region (either would reach every pool's bytes); its operations go
// through messages, which the server checks against the chunks its pool owns.
inline constexpr uint16_t kHelloPoolClient = 1u << 7;
// The server's backup holds its region's pages themselves (shared-pages backups, docs/pool.md):
// a client that maps the region changes it with mapped stores and atomics, as without a backup;
// nothing needs forwarding.
inline constexpr uint16_t kHelloSharedPages = 1u << 8;
// "" if `flags` allow mapping, else why not, for error messages.
std::string HelloMapRefusal(uint16_t flags);

// A memory server's region is [root area | chunk 0 | chunk 1 | ...]: the root area, the first
// kRootAreaSize bytes, is never leased (pool/server/chunk_allocator.h); clients place objects in
// the chunks after it (pool/object_allocator.h).
inline constexpr uint64_t kRootAreaSize = 4096;
// The first bytes of the root area are touched by nobody (offset 0 of server 0 is the null
// address); clients use the rest (Pool::Root).
inline constexpr uint64_t kRootReserved = 64;
// Inside the reserved bytes, a server whose backups share its pages keeps the insert-if-absent
// it is executing (two words: the lock's offset + 1, 0 for none, and the lock word), so that the
// backup that adopts the pages after a kill can release the lock the dead process held
// (memory_ops::Region::insert_intent, pool/server/mirror.h).
inline constexpr uint64_t kInsertIntentOffset = 16;

// Server -> client: what the client needs to address the region. Tail: packed rkey. Sent only
// to a connection that has authenticated (or by a server without a secret).
struct HelloReply {
  uint16_t server_id;
  uint16_t flags;        // kHelloMayMap, or why not
  uint32_t rkey_size;    // tail length
  uint64_t region_base;  // virtual address of offset 0 in the server process
  uint64_t region_size;  // bytes donated, the root area included
  uint64_t chunk_size;   // lease granularity
  uint64_t server_pid;
  // With kHelloServerProof: ClusterSecret::Prove(kServer, client nonce, server nonce).
  uint8_t proof[32];
  // The server whose region this one mirrors (kNoMirror: none), and where the mirror starts in
  // this server's region (past region_size): a client that has failed that server over to
  // this one addresses its offset o here at mirror_offset + o. mirror_port: where the mirror
  // takes its primary's forwards.
  uint16_t mirror_of;
  uint16_t mirror_port;
  uint16_t reserved[2];
  uint64_t mirror_offset;
  // Where the connection's pool has its root area in this region (Pool::root): 0 for the
  // default pool (the region's root area); for another pool, the chunk the server leased to
  // it as its root at its first hello. mirror_root_offset: the same in the mirrored region
  // (offsets of the mirrored server), 0 if none.
  uint64_t root_offset;
  uint64_t mirror_root_offset;
};
static_assert(sizeof(HelloReply) == 104);
inline constexpr uint16_t kNoMirror = 0xffff;

// Lease `size` bytes (a multiple of chunk_size) as one contiguous run. `mirror` nonzero: in
// the region of server `mirror - 1`, which this one has taken over (its promoted mirror slot;
// offsets are that server's), for a client that has failed that server over.
struct LeaseRequest {
  uint64_t size;
  uint32_t mirror;
  uint32_t reserved;
};
static_assert(sizeof(LeaseRequest) == 16);

struct LeaseReply {
  uint64_t offset;
  uint64_t size;
};
static_assert(sizeof(LeaseReply) == 16);

// Give back exactly one run previously leased (`mirror` as in LeaseRequest).
struct ReleaseRequest {
  uint64_t offset;
  uint64_t size;
  uint32_t mirror;
  uint32_t reserved;
};
static_assert(sizeof(ReleaseRequest) == 24);

struct ReleaseReply {
  uint64_t freed;
};
static_assert(sizeof(ReleaseReply) == 8);

struct StatsRequest {
  uint64_t reserved;
};
static_assert(sizeof(StatsRequest) == 8);

struct StatsReply {
  uint16_t server_id;
  uint16_t reserved0;
  uint32_t clients;       // connected endpoints
  uint64_t capacity;      // bytes donated
  uint64_t leased;        // bytes leased to clients
  uint64_t largest_free;  // largest contiguous leasable run
  uint64_t chunk_size;
  uint64_t requests_served;  // control requests answered
  uint64_t rejected;         // malformed or incompatible messages rejected
  uint64_t uptime_ns;
  uint64_t server_pid;
  uint64_t rss_private;  // server's private resident memory (overhead beyond the region)
  // Requests refused for want of authentication: hellos with a wrong or no proof, and every
  // other request of a connection that has not authenticated.
  uint64_t auth_refused;
  // Requests refused because they named memory of another pool than their connection's
  // (leases, releases, batch operations) or a control operation a pool's client may not send.
  uint64_t pool_refused;
};
static_assert(sizeof(StatsReply) == 96);

// Client -> server: `op_count` memory operations (pool/memory_ops.h) in the tail. The server
// checks every operation before it executes any, then executes them in order.
struct BatchRequest {
  uint32_t op_count;
  uint32_t ops_size;  // tail length
};
static_assert(sizeof(BatchRequest) == 8);

// Server -> client: the results of every operation, in request order (read data, 8-byte
// previous values of atomics; writes contribute nothing).
struct BatchReply {
  uint32_t op_count;
  uint32_t results_size;  // tail length
};
static_assert(sizeof(BatchReply) == 8);

// Client -> server: evict the client process whose hello carried process tag `tag` (nonzero,
// at most 32 bits; not the sender's own). The server refuses the tag from now on (hellos and
// requests carrying it get an ErrorReply), closes every connection carrying it, and if it pinned
// that process (it may map the region) sends it SIGKILL once. It never waits: the reply says
// whether the killed process has exited yet, and the client asks again until it has
// (Pool::Evict).
struct EvictRequest {
  uint64_t tag;
};
static_assert(sizeof(EvictRequest) == 8);

// EvictReply::flags.
inline constexpr uint32_t kEvictKilled = 1u << 0;  // the process maps the region: SIGKILL sent
inline constexpr uint32_t kEvictExited = 1u << 1;  // ... and it has exited
// Server -> client. The eviction is complete at this server iff !(flags & kEvictKilled) or
// (flags & kEvictExited).
struct EvictReply {
  uint32_t connections_closed;  // by this request (0 when asked again)
  uint32_t flags;
};
static_assert(sizeof(EvictReply) == 8);

// Client -> server, the last message of a Pool that closes cleanly, sent after it unmapped the
// region: `tag` is the sender's own process tag (the one its hello carried; anything else is
// refused). The server drops that process's pin (closes the pidfd) and refuses the tag from
// then on, as if evicted but without a kill: a Pool's tag never returns after its close, and
// an eviction of it later can no longer kill the still-running process.
struct GoodbyeRequest {
  uint64_t tag;
};
static_assert(sizeof(GoodbyeRequest) == 8);
// Server -> client.
struct GoodbyeReply {
  uint32_t unpinned;  // 1 if the process was pinned here (it mapped the region), else 0
  uint32_t reserved;
};
static_assert(sizeof(GoodbyeReply) == 8);

// ---- Replication (docs/pool.md "Replication").

// Tool or coordinator -> primary: forward every change to server `backup_id` at HOST:PORT,
// into its mirror slot `slot`. Until a primary has a backup, every request that would change
// its region or its leases is refused: nothing is acknowledged with fewer copies than asked.
// Named before any lease (cluster up) the copy starts equal; named later (re-replication,
// docs/pool.md "Re-replication") the primary first copies its region and lease book in
// slices while it serves, and `remaining` says how many bytes are left to copy (0: the copy is
// complete and every change since is forwarded). Asking again with the same backup and slot
// reports progress. A primary that keeps a copy on `backup_id` already, in another slot (a copy
// an earlier coordinator chose), reports on that copy instead: BackupReply::slot names it,
// unless that slot refused its forwards as another primary's (then the copy is made anew).
//
// The tail lists the region's backups in the cluster map the sender read (MapBackup, in the
// map's order; `backups_size` bytes): the primary gives up every copy of the region on a
// server the map does not name, other than `backup_id`'s (a copy under way, or whole but
// unnamed: a reply the coordinator lost, a map write that failed), and never one the map
// names. `backup_id` kNoBackup names no target: the primary only gives up what the map does not
// name (the coordinator's request for a region below its copies that no server has room for)
// and replies {0, 0}. `term`: the coordinator's term (coord/membership.h, the create_revision of
// its key); 0 from the cluster's tools (cluster up, drain). The primary remembers the highest term
// it has been sent and refuses a request of a lower one (a deposed coordinator's, read from an
// older map) with PermissionDenied (docs/pool.md "The map's backups in the request").
struct BackupRequest {
  uint16_t backup_id;
  uint16_t port;
  uint16_t slot;
  // Whose region: the primary's own id, or a region it serves from a promoted mirror slot.
  uint16_t region;
  char host[64];  // NUL-terminated
  int64_t term;
  uint32_t backups_size;  // tail bytes: a multiple of sizeof(MapBackup)
  uint32_t reserved;
};
static_assert(sizeof(BackupRequest) == 88);
inline constexpr uint16_t kNoBackup = 0xffff;  // BackupRequest::backup_id: no target
// One backup of the request's region in the map: its server and slot.
struct MapBackup {
  uint16_t id;
  uint16_t slot;
};
static_assert(sizeof(MapBackup) == 4);
// A BackupRequest naming server `backup_id` at `host`:`port` as the keeper of `region`'s copy
// in its mirror slot `slot`, sent in `term` with `backups` (the tail to encode with it: the
// map's backups of the region). InvalidArgument if `host` does not fit or the backups do not
// fit a tail.
Result<BackupRequest> MakeBackupRequest(uint16_t backup_id, std::string_view host, uint16_t port,
                                        uint16_t region, uint16_t slot, int64_t term,
                                        std::span<const MapBackup> backups);
// The encoded request with `backups` as its tail (backups_size set from it).
std::vector<std::byte> EncodeBackupRequest(uint64_t request_id, BackupRequest request,
                                           std::span<const MapBackup> backups);
// The map's backups a decoded BackupRequest carries; InvalidArgument if its tail is not a
// whole number of them.
Result<std::vector<MapBackup>> MapBackupsOf(const transport::Frame& request);
// Its host, up to the NUL (or the whole field if a malformed request has none).
inline std::string_view HostOf(const BackupRequest& request) {
  return {request.host, strnlen(request.host, sizeof(request.host))};
}
struct BackupReply {
  uint64_t remaining;
  // The backup's slot that holds (or is being filled with) the copy: the request's, or the one
  // this primary's copy on that server is in already.
  uint16_t slot;
  uint16_t reserved[3];
};
static_assert(sizeof(BackupReply) == 16);

// Primary -> backup: writes (memory_ops kWrite operations, offsets in the primary's region) to
// apply to the mirror. Refused once the backup has taken the primary's data over (promoted).
// `slot`: the backup's mirror slot that holds the primary's copy. kReplicateAttach (the first
// forward of a new BackupLink) makes that slot the primary's, with an empty lease book, unless
// the slot has been promoted (it serves a region).
//
// kReplicateShare (with kReplicateAttach, same host only): the backup maps the primary's region
// file over the slot instead of keeping a copy (pool/server/shared_pages.h): process
// `share_pid` (started at `share_start_time`) holds it open as descriptor `share_fd`, inode
// `share_inode`. Its forwards then carry lease changes only.
//
// kReplicateDetach (no operations): the primary gives the slot's copy up (it degraded, or
// abandoned a copy under way), or the coordinator does, for a copy the map of a failover no
// longer names (Coordinator::DropCopies): the slot holds nobody's copy from then on and gives
// its memory back. Admitted as any forward (the slot's primary, in order, not promoted).
struct ReplicateRequest {
  uint16_t primary_id;
  uint16_t slot;
  uint32_t op_count;
  uint32_t ops_size;  // tail length
  uint32_t flags;     // kReplicateAttach, kReplicateShare, kReplicateDetach
  uint64_t share_pid;
  uint64_t share_start_time;
  uint64_t share_inode;
  int32_t share_fd;
  uint32_t reserved;
};
inline constexpr uint32_t kReplicateAttach = 1;
inline constexpr uint32_t kReplicateShare = 2;
inline constexpr uint32_t kReplicateDetach = 4;
static_assert(sizeof(ReplicateRequest) == 48);
struct ReplicateReply {
  uint64_t bytes_applied;
};
static_assert(sizeof(ReplicateReply) == 8);

// Primary -> backup: a lease (leased = 1; 2: a pool's root area) or release (0) of [offset,
// offset + size) for pool `owner` (transport::PoolId) in the primary's lease book, mirrored
// so that the backup checks clients' addresses as the primary did once it has taken over.
// Refused once promoted, as ReplicateRequest.
inline constexpr uint8_t kMirrorRelease = 0;
inline constexpr uint8_t kMirrorLease = 1;
inline constexpr uint8_t kMirrorLeaseRoot = 2;
struct MirrorLeaseRequest {
  uint64_t offset;
  uint64_t size;
  uint16_t primary_id;
  uint8_t leased;  // kMirrorRelease, kMirrorLease or kMirrorLeaseRoot
  uint8_t slot;    // as in ReplicateRequest (ServerOptions::mirror_slots is at most 64)
  uint32_t owner;
};
static_assert(sizeof(MirrorLeaseRequest) == 24);
struct MirrorLeaseReply {
  uint64_t reserved;
};
static_assert(sizeof(MirrorLeaseReply) == 8);

// Client -> backup: server `id`, whose region this server mirrors, is gone; serve its data
// from the mirror (at HelloReply::mirror_offset) and refuse its forwards from now on.
// Idempotent.
struct PromoteRequest {
  uint16_t id;
  uint16_t reserved[3];
};
static_assert(sizeof(PromoteRequest) == 8);
struct PromoteReply {
  uint64_t leased;  // bytes of the mirrored lease book
};
static_assert(sizeof(PromoteReply) == 8);

// Client -> primary, on the primary's mirror port (its own loop may be waiting for the dead
// backup): its backup, server `backup_id`, is gone; stop forwarding to it, the primary's data
// has one copy from now on, and the changes waiting for that backup are acknowledged.
// Idempotent.
struct DegradeRequest {
  uint16_t backup_id;
  uint16_t reserved[3];
};
static_assert(sizeof(DegradeRequest) == 8);
struct DegradeReply {
  uint64_t reserved;
};
static_assert(sizeof(DegradeReply) == 8);

// Server -> client, the reply to a batch, lease or release request that a server being
// drained (`farpool cluster drain`, MemoryServer::Drain) refused WITHOUT executing any of it:
// the server is handing the regions it serves over to their backups. The client follows the
// cluster map to the region's new server and sends the request again there (safe for every
// kind of request, writes included, because nothing of it took effect here).
struct MovingReply {
  uint16_t server_id;
  uint16_t reserved[3];
};
static_assert(sizeof(MovingReply) == 8);

// Client -> server, shared pages (docs/pool.md "A client that connects after a failover maps
// the moved region"): the file of server `primary_id`'s region, which this server serves from a
// promoted mirror slot whose pages it adopted. Answered only to a connection of the default
// pool whose process this server pinned (it may map this server's region: an eviction by this
// server kills it, the fence a mapping needs), and only once the slot is promoted (this server
// killed the old primary before it served the pages); an ErrorReply with the reason otherwise.
struct MovedFileRequest {
  uint16_t primary_id;
  uint16_t reserved[3];
};
static_assert(sizeof(MovedFileRequest) == 8);
// Server -> client: the client opens /proc/<pid>/fd/<fd> (the same user, as for the region
// UCX lets it map), checks that it is `inode` of process `pid` started at `start_time`, and maps
// its first `size` bytes: the pages the server executes that region's requests on.
struct MovedFileReply {
  uint64_t pid;
  uint64_t start_time;
  uint64_t inode;
  int32_t fd;
  uint32_t reserved;
  uint64_t size;
};
static_assert(sizeof(MovedFileReply) == 40);

// A decoded message: the header plus views into the caller's buffer.
using Message = transport::Message<Opcode>;

// Validates and splits one received message. Never reads outside `bytes`, which must outlive
// the Message (its views point into them): decoding a temporary buffer does not compile.
Result<Message> Decode(std::span<const std::byte> bytes);
Result<Message> Decode(std::vector<std::byte>&& bytes) = delete;

// Encodes header + body + tail into one buffer; instantiated in wire.cc for exactly the body
// structs above.
template <typename Body>
std::vector<std::byte> Encode(uint64_t request_id, const Body& body,
                              std::span<const std::byte> tail = {});

std::vector<std::byte> EncodeError(uint64_t request_id, const Status& status);
// Turns an ErrorReply back into the Status it carries.
Status DecodeError(const Message& message);

}  // namespace farpool::wire
