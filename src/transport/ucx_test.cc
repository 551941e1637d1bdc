// The transport under connection churn: many threads of one process, each with its own worker,
// opening connections that the server then closes, all at once. This is what a client process
// does when it wakes from a stop and finds itself evicted (every thread loses its connections
// and opens new ones). UCX keys its async event handlers by file descriptor and does not purge
// a worker's queue of missed events when a handler goes, so a descriptor closed on one worker
// and reused by another's new connection could deliver the first worker's stale event to the
// second's handler (an assertion inside UCX). transport/ucx.h serializes descriptor creation
// against closing-and-draining; this test would abort without it.
#include "transport/ucx.h"

#include <gtest/gtest.h>
#include <ucs/debug/log_def.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "transport/am_server.h"

namespace farpool::transport {
namespace {

using Clock = std::chrono::steady_clock;
constexpr unsigned kAm = 11;

// Answers every message with its own bytes, then closes the sender's connection (as a memory
// server closes an evicted process's connections).
class EchoThenClose : public AmHandler {
 public:
  explicit EchoThenClose(AmServer*& server) : server_(server) {}
  std::vector<std::byte> Handle(std::span<const std::byte> message, Peer* from) override {
    if (from != nullptr) {
      if (from->tag == 0) from->tag = ++next_tag_;
      server_->CloseConnections(from->tag, nullptr);
    }
    ++handled;
    return {message.begin(), message.end()};
  }
  std::vector<std::byte> Refuse(const Status&) override { return {}; }
  std::atomic<uint64_t> handled{0};

 private:
  AmServer*& server_;
  uint64_t next_tag_ = 0;
};

ucs_status_t Ignore(void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
  return UCS_OK;
}

// UCX's log goes to stderr, not into the caller's standard output (unless UCX_LOG_FILE says
// otherwise; unset in tests).
TEST(Ucx, ItsLogGoesToStderrNotStdout) {
  ASSERT_EQ(std::getenv("UCX_LOG_FILE"), nullptr);
  Context::Options co;
  co.fabric = Fabric::kTcp;
  auto context = Context::Create(co);
  ASSERT_TRUE(context.ok()) << context.status().ToString();
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  ucs_error("farpool log test %d", 42);
  std::fflush(stdout);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "");
  EXPECT_NE(err.find("UCX ERROR"), std::string::npos) << err;
  EXPECT_NE(err.find("farpool log test 42"), std::string::npos) << err;
}

TEST(Ucx, ManyThreadsLosingAndOpeningConnectionsAtOnce) {
  for (Fabric fabric : {Fabric::kTcp, Fabric::kShm}) {
    SCOPED_TRACE(std::string(FabricName(fabric)));
    AmServerOptions so;
    so.am_id = kAm;
    so.fabric = fabric;
    so.progress = ProgressMode::kEvent;
    auto server = AmServer::Listen(so);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    AmServer* raw = server->get();
    EchoThenClose handler(raw);
    (*server)->Start(handler);

    Context::Options co;
    co.fabric = fabric;
    auto context = Context::Create(co);
    ASSERT_TRUE(context.ok()) << context.status().ToString();
    constexpr int kThreads = 4;
    constexpr int kRounds = 150;
    std::atomic<int> closed_by_server{0};
    std::atomic<int> errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        auto worker = Worker::Create(**context, false);
        if (!worker.ok() || !(*worker)->SetAmHandler(kAm, &Ignore, nullptr).ok()) {
          ++errors;
          return;
        }
        const std::byte hello[8] = {};
        for (int r = 0; r < kRounds; ++r) {
          auto ep = Endpoint::Connect(**worker, "127.0.0.1", (*server)->port(), nullptr);
          if (!ep.ok()) {
            ++errors;
            continue;
          }
          const auto deadline = Clock::now() + std::chrono::seconds(10);
          Status sent = (*ep)->SendAm(kAm, hello, true, deadline, nullptr);
          while (sent.ok() && !(*ep)->failed() && Clock::now() < deadline) (*worker)->Progress();
          if ((*ep)->failed()) ++closed_by_server;
          ep->reset();  // the endpoint goes; the worker lives on and is progressed again
        }
      });
    }
    for (auto& th : threads) th.join();
    (*server)->Stop();
    EXPECT_EQ(errors.load(), 0);
    // Every connection carried its message and was closed by the server.
    EXPECT_EQ(handler.handled.load(), uint64_t{kThreads * kRounds});
    EXPECT_EQ(closed_by_server.load(), kThreads * kRounds);
  }
}

}  // namespace
}  // namespace farpool::transport
