// The `sharded` engine: shared-nothing partitions with message-based two-phase commit under
// snapshot isolation (the classic design NAM-DB and MEMSCALE compare against).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "farpool/db.h"

namespace farpool::db {

// Opens (creating its catalog if new) the sharded database of options.cluster_file's partition
// servers, or of options.partitions partition servers started as threads of this process.
Result<std::unique_ptr<Database>> OpenShardedDatabase(const DatabaseOptions& options);

// The partition (0..partitions-1) that owns `key` in every table.
size_t ShardedPartitionOf(int64_t key, size_t partitions);

}  // namespace farpool::db
