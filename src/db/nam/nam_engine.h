// The NAM engines (`pool` and `local`): the database of include/farpool/db.h run by compute
// processes directly on memory (the pool, or this process's RAM) with one-sided operations.
// The protocol is in docs/database.md and nam_internal.h; the layouts of records, cells and
// version nodes in db/layout.h, those of the catalog, session slots and slab chunks in
// nam_internal.h ("layouts in memory").
#pragma once

#include <memory>

#include "farpool/db.h"

namespace farpool::db {

// Opens (creating it if the cluster holds none) the database of options.cluster_file (kPool)
// or of a fresh region of this process's RAM (kLocal).
Result<std::unique_ptr<Database>> OpenNamDatabase(const DatabaseOptions& options);

}  // namespace farpool::db
