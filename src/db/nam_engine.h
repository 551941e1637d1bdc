// The NAM engines (`pool` and `local`): the database of include/farpool/db.h run by compute
// processes directly on memory (the pool, or this process's RAM) with one-sided operations.
// See docs/database.md for the protocol; the layouts are in db/layout.h.
#pragma once

#include <memory>

#include "db/memory.h"
#include "farpool/db.h"

namespace farpool::db {

Result<std::unique_ptr<Database>> OpenNamDatabase(const DatabaseOptions& options);

// Opens the database kept in `memory` (not owned). REQUIRES: memory outlives the database.
Result<std::unique_ptr<Database>> OpenNamDatabaseOn(Memory& memory, Engine engine,
                                                    const DatabaseOptions& options);

}  // namespace farpool::db
