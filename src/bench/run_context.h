// The run context every benchmark result carries (C++ benches; the Python harness has
// farpool.repo.run_context with the same fields): one JSON object with the git sha of the
// build, the host name, the cores this machine has and the UTC time, as
// {"git_sha", "host", "cores", "time"}.
//
// Thread-safety: safe to call from any thread.
#pragma once

#include <nlohmann/json.hpp>

namespace farpool {

nlohmann::json RunContext();

}  // namespace farpool
