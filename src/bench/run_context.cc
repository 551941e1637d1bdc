#include "bench/run_context.h"

#include <unistd.h>

#include <ctime>
#include <thread>

#include "farpool_version.h"  // generated at build time: cmake/version.cmake

namespace farpool {

nlohmann::json RunContext() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char when[32];
  std::time_t now = std::time(nullptr);
  std::tm utc;
  gmtime_r(&now, &utc);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {{"git_sha", FARPOOL_GIT_SHA},
          {"host", host},
          {"cores", std::thread::hardware_concurrency()},
          {"time", when}};
}

}  // namespace farpool
