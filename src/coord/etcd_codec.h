// The encoding of etcd's v3 JSON gateway (grpc-gateway over etcd's gRPC API), kept apart from
// the HTTP client so that it is unit-tested without a server (coord/etcd_codec_test.cc).
//
// What the gateway expects and answers (etcd 3.4, POST to /v3/<service>/<method>):
//   - keys and values are base64 (standard alphabet, padded) in both directions;
//   - 64-bit integers (revisions, lease ids, TTLs) come back as JSON *strings* ("12"), and are
//     sent as strings too (a lease id above 2^53 does not survive a JSON double);
//   - fields at their zero value are omitted from answers (no "kvs" when nothing matched, no
//     "succeeded" when a txn failed, no "TTL" when a keepalive found no lease);
//   - an error is {"error": "...", "message": "...", "code": N} with N a gRPC status code.
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/status.h"

namespace farpool::coord {

std::string Base64Encode(std::string_view bytes);
// Rejects anything but canonical padded standard base64 (InvalidArgument naming the reason).
Result<std::string> Base64Decode(std::string_view text);

// The smallest key greater than every key that starts with `prefix` (etcd's range_end for a
// prefix query): the prefix with its last byte below 0xff incremented and what follows cut.
// "\0" (every key) for a prefix of only 0xff bytes or an empty one.
std::string PrefixEnd(std::string_view prefix);

// One key as etcd stores it (mvccpb.KeyValue).
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;  // 0: not attached to a lease
};

// A gRPC status code as the gateway reports it, and the etcd message that came with it.
struct GatewayError {
  int code = 0;
  std::string message;
};

// The error of an answer body, if it is one ({"error"|"message", "code"}); nullopt otherwise
// (also for a body that is not JSON: the caller's parse then says so).
std::optional<GatewayError> ParseGatewayError(std::string_view body);

// Answers, parsed. Every parser rejects a body that is not the expected JSON with
// Protocol("...: <what is wrong>").
struct RangeAnswer {
  int64_t revision = 0;  // the store's revision when the range was read (header.revision)
  std::vector<KeyValue> kvs;
};
Result<RangeAnswer> ParseRange(std::string_view body);

// header.revision of a put, delete or lease answer.
Result<int64_t> ParseHeaderRevision(std::string_view body);

struct TxnAnswer {
  bool succeeded = false;
  int64_t revision = 0;
  // The kvs of the first range operation among the branch's responses (the failure branch
  // reads the key it compared, so a loser learns the current value).
  std::vector<KeyValue> kvs;
};
Result<TxnAnswer> ParseTxn(std::string_view body);

struct LeaseAnswer {
  int64_t id = 0;
  int64_t ttl = 0;  // seconds left; 0 from a keepalive: the lease no longer exists
};
// /v3/lease/grant answers {"ID", "TTL"}; /v3/lease/keepalive wraps them in "result".
Result<LeaseAnswer> ParseLeaseGrant(std::string_view body);
Result<LeaseAnswer> ParseLeaseKeepAlive(std::string_view body);

// Watches (POST /v3/watch with {"create_request": {...}}): the gateway answers with a stream of
// JSON objects, one per WatchResponse, each {"result": {...}} (separated by newlines, but cut
// into HTTP chunks wherever the transport likes), or {"error": ...} when the stream fails.
// The request: `key` alone, or every key in [key, range_end) (PrefixEnd for a prefix); events
// from `start_revision` on (0: from the next write).
std::string WatchCreateRequest(std::string_view key, std::string_view range_end,
                               int64_t start_revision);

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;  // PUT is the zero value: the gateway omits "type" for it
  KeyValue kv;             // a delete carries the key and its mod_revision only
};

// One WatchResponse. What it is:
//   - created: the watch is set up (header.revision: the store's revision then; events from
//     start_revision may still follow, so it says nothing about what was seen);
//   - canceled: the stream ends; compact_revision > 0 when start_revision was compacted away
//     (the watcher must read the keys whole and watch from after that read);
//   - events: in revision order, each with its mod_revision;
//   - none of those: a progress notification (every event up to header.revision was sent).
struct WatchResponse {
  int64_t revision = 0;  // header.revision (absent on a cancel: 0)
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;
  std::string cancel_reason;
  std::vector<WatchEvent> events;
};
// One object of the stream. {"error": ...} becomes Unavailable naming etcd's message (the
// stream broke: the watcher starts another); anything that is not a watch response, Protocol.
Result<WatchResponse> ParseWatchResponse(std::string_view object);

// Cuts a watch stream into its JSON objects, whatever the chunks: bytes go in as they come,
// whole objects come out. Scans each byte once (braces outside strings, escapes in them).
// Thread-safety: none (one per stream).
class JsonStreamSplitter {
 public:
  void Append(std::string_view bytes) { buffer_.append(bytes); }
  // The next whole object, if one has arrived; what lies between objects (newlines, spaces)
  // is skipped. Protocol if the stream holds something that is not an object (a stray
  // closing brace, text outside braces) or an object larger than kMaxObject.
  Result<std::optional<std::string>> Next();
  // Bytes received and not yet returned as an object.
  size_t pending() const { return buffer_.size(); }

  static constexpr size_t kMaxObject = 64 << 20;

 private:
  std::string buffer_;
  size_t scanned_ = 0;  // bytes of buffer_ scanned (the state below is theirs)
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

}  // namespace farpool::coord
