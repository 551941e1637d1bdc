// The sharded engine's row codec: a row's value on the wire and in the partitions is the fixed
// payload (Schema::PayloadSize() bytes), then per kBytes column a u32 length and the bytes.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "farpool/db.h"
#include "farpool/status.h"

namespace farpool::db::shard {

// REQUIRES: `row` has a schema and its payload is the schema's size.
std::string EncodeRow(const Row& row);
// Decodes a value of table `t` into *row; Protocol naming the table if the value does not
// match the schema (too short, a bytes length past the end, or bytes left over).
Status DecodeRow(const Table& t, std::string_view value, Row* row);

}  // namespace farpool::db::shard
