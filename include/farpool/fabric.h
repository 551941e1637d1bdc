// Fabric: which interconnect a client or server may use, picked at run time.
//
//   auto  UCX picks the best transport both sides share: RDMA verbs (rc/dc) on a cluster
//         that has them, shared memory to a same-host peer, TCP otherwise.
//   shm   shared memory only (same host). A client maps each server's region into its own
//         address space and reads, writes and runs atomics with plain loads, stores and CPU
//         atomics: the server's CPU is not involved (MEMSCALE's load/store access).
//   tcp   TCP sockets only; one-sided operations are executed by the server's progress thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "farpool/status.h"

namespace farpool {

enum class Fabric : uint8_t { kAuto, kShm, kTcp };

Result<Fabric> ParseFabric(std::string_view text);  // "auto" | "shm" | "tcp"
std::string_view FabricName(Fabric fabric);

}  // namespace farpool
