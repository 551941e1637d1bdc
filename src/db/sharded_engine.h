// The `sharded` engine: shared-nothing partitions with message-based two-phase commit under
// snapshot isolation (the classic design NAM-DB and MEMSCALE compare against).
#pragma once

#include <memory>

#include "farpool/db.h"

namespace farpool::db {

Result<std::unique_ptr<Database>> OpenShardedDatabase(const DatabaseOptions& options);

}  // namespace farpool::db
