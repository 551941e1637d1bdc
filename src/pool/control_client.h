// The client side of the control protocol (transport/wire.h), shared by the Pool's connections
// and a primary memory server's link to its backup: replies kept by request id, a request and
// its reply on one connection, and the hello with the cluster secret's challenge-response.
//
// Thread-safety: a ReplyBox and an Ask belong to the thread that progresses their worker.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "farpool/fabric.h"
#include "farpool/status.h"
#include "transport/auth.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace farpool::control {

// Receives control replies on a worker (its kControlAm handler): hands each to the waiter that
// expects it (Expect), or keeps it by request id for the waiting caller to take; drops what
// cannot be a reply (no request id, rendezvous) and late replies to abandoned requests.
struct ReplyBox {
  // Called from OnMessage, i.e. inside a progress of the worker, with the reply's bytes (valid
  // only during the call).
  using Land = void (*)(void* context, std::span<const std::byte> reply);

  // Replies that no Expect claimed, by request id.
  std::unordered_map<uint64_t, std::vector<std::byte>> replies;

  // The reply to `id` goes to `land(context, bytes)` instead of being kept: no copy. `context`
  // and whatever `land` writes to must stay valid until Forget(id).
  void Expect(uint64_t id, Land land, void* context);
  // Whether the reply to `id` arrived (landed, or kept in `replies`).
  bool Arrived(uint64_t id) const;
  // Ends an Expect. If its reply has not landed, the request is abandoned: its reply, should
  // it still come, is never handed to `land`, so the caller may reuse its memory; it is
  // dropped (kept in `replies` instead once kMaxAbandoned later requests were abandoned).
  void Forget(uint64_t id);

  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);

 private:
  struct Expected {
    uint64_t id;
    Land land;
    void* context;
    bool landed;
  };
  std::vector<Expected> expected_;  // few: one per message in flight
  static constexpr size_t kMaxAbandoned = 256;
  std::vector<uint64_t> abandoned_;  // forgotten before their reply came, the latest ones
};

// A decoded reply; `message` views into `bytes`.
struct Reply {
  std::vector<std::byte> bytes;
  wire::Message message;
};
using Encoder = std::function<std::vector<std::byte>(uint64_t request_id)>;
// One request built by `encode(request_id)` and its reply of opcode `expected`.
using Ask = std::function<Result<Reply>(const Encoder& encode, wire::Opcode expected)>;

// A received reply from the server called `name`: decoded (viewing into `bytes`), an
// ErrorReply as its Status, Protocol unless of opcode `expected`.
Result<wire::Message> CheckReply(const std::string& name, std::span<const std::byte> bytes,
                                 wire::Opcode expected);
// Whether `bytes` is a MovingReply (the server refused the request without executing it:
// it is being drained). Reads only the header: cheap enough for every reply.
bool IsMovingReply(std::span<const std::byte> bytes);
// CheckReply of a reply the caller keeps.
Result<Reply> TakeReply(const std::string& name, std::vector<std::byte> bytes,
                        wire::Opcode expected);

// An Ask on `ep`: sends, then progresses `worker` until the reply is in `box`, the connection
// fails (Unavailable, "connection lost") or `deadline` passes (TimedOut). Request ids come from
// `next_id`. All references must outlive the Ask.
Ask AskOn(std::string name, transport::Worker& worker, ReplyBox& box, transport::Endpoint& ep,
          uint64_t& next_id, std::chrono::steady_clock::time_point deadline);

// The hello of a new connection to the server called `name`: with a `secret`, the challenge
// first and `hello` carries our proof, and the server's reply must carry its proof. Returns the
// server's HelloReply. PermissionDenied ("authentication failed: ...") if either side refuses
// the other.
Result<Reply> Handshake(const std::string& name, const transport::ClusterSecret* secret,
                        wire::HelloRequest hello, const Ask& ask);

// A connection of its own to one server, for control requests outside a Pool: the cluster
// tool's (naming backups) and a primary's link to its backup. Open() connects and says
// `hello` (control::Handshake); every later request waits at most `timeout`.
class Connection {
 public:
  struct Options {
    std::string name;  // for messages: "server 3 (host:port)"
    std::string host;
    uint16_t port = 0;
    const transport::ClusterSecret* secret = nullptr;  // must outlive the connection
    Fabric fabric = Fabric::kAuto;
    std::chrono::milliseconds timeout{2000};
  };
  static Result<std::unique_ptr<Connection>> Open(const Options& options,
                                                  const wire::HelloRequest& hello);
  // A connection of the cluster's own tooling (the coordinator, `farpool cluster`) to server
  // `id` at `address` (HOST:PORT of its control port) on `port` (its control or its mirror's)
  // over TCP: the hello names this process and `tag` (nonzero, which tool in the server's log).
  // InvalidArgument for an address that is not HOST:PORT.
  static Result<std::unique_ptr<Connection>> OpenAsTool(uint16_t id, const std::string& address,
                                                        uint16_t port,
                                                        const transport::ClusterSecret* secret,
                                                        uint32_t tag,
                                                        std::chrono::milliseconds timeout);
  ~Connection();

  // The server's HelloReply (its tail, the packed rkey, is not kept).
  const wire::HelloReply& hello() const { return hello_; }
  const std::string& name() const { return options_.name; }
  // One request and its reply.
  Result<Reply> Call(const Encoder& encode, wire::Opcode expected);
  // Pipelining: send several requests (ids from NextId()), then await each reply.
  uint64_t NextId() { return next_id_++; }
  Status Send(std::span<const std::byte> message);
  // Aborted as soon as `give_up` (if set) returns true.
  Result<Reply> Await(uint64_t id, wire::Opcode expected,
                      std::chrono::steady_clock::time_point deadline,
                      const std::function<bool()>& give_up = nullptr);
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  // Without waiting (a caller that waits on worker() itself): one progress of the worker; the
  // reply to `id` if it has arrived (checked as Await does), else nullopt; whether the
  // connection has failed; and forgetting replies to requests below `id` that arrive after
  // their sender gave up on them.
  void Progress() { worker_->Progress(); }
  std::optional<Result<Reply>> Take(uint64_t id, wire::Opcode expected);
  bool failed() const { return ep_->failed(); }
  // Closes at once, without the graceful close's flush, which waits up to 2 s for a peer that
  // is stopped or cut off. No request may follow.
  void CloseNow() { ep_->ForceClose(); }
  void DropRepliesBelow(uint64_t id);
  transport::Worker& worker() { return *worker_; }

 private:
  Connection() = default;

  Options options_;
  std::unique_ptr<transport::Context> context_;
  std::unique_ptr<transport::Worker> worker_;
  ReplyBox box_;
  std::unique_ptr<transport::Endpoint> ep_;
  uint64_t next_id_ = 1;
  wire::HelloReply hello_{};
};

}  // namespace farpool::control
