#include "db/sharded_engine.h"

namespace farpool::db {

Result<std::unique_ptr<Database>> OpenShardedDatabase(const DatabaseOptions& options) {
  return Status::InvalidArgument(
      "sharded engine: not implemented yet (see docs/database.md, \"Status\")");
}

}  // namespace farpool::db
