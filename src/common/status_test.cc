#include "farpool/status.h"

#include <gtest/gtest.h>

#include "farpool/address.h"
#include "farpool/fabric.h"

namespace farpool {
namespace {

Result<int> Half(int v) {
  if (v % 2 != 0) return Status::InvalidArgument(std::to_string(v) + " is odd");
  return v / 2;
}

Status Quarter(int v, int* out) {
  FARPOOL_ASSIGN_OR_RETURN(int h, Half(v));
  FARPOOL_ASSIGN_OR_RETURN(int q, Half(h));
  *out = q;
  return Status::Ok();
}

TEST(Status, PropagatesTheFirstErrorWithContext) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "3 is odd");
  EXPECT_EQ(s.WithContext("quartering").ToString(), "InvalidArgument: quartering: 3 is odd");
  EXPECT_EQ(Status::Ok().WithContext("x").ToString(), "OK");
}

TEST(Status, AbortedIsDistinctFromFailures) {
  EXPECT_NE(Status::Aborted("conflict").code(), Status::Internal("bug").code());
  EXPECT_EQ(StatusCodeName(StatusCode::kAborted), "Aborted");
}

TEST(Result, FromOkStatusIsAnInternalError) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(GlobalAddress, PacksServerAndOffset) {
  GlobalAddress a(3, 0x1f40);
  EXPECT_EQ(a.server(), 3);
  EXPECT_EQ(a.offset(), 0x1f40u);
  EXPECT_EQ(a.raw(), (uint64_t{3} << 48) | 0x1f40);
  EXPECT_EQ(GlobalAddress::FromRaw(a.raw()), a);
  EXPECT_EQ(a.ToString(), "s3+0x1f40");
  EXPECT_EQ((a + 0x40).offset(), 0x1f80u);
  EXPECT_TRUE(GlobalAddress().is_null());
  EXPECT_EQ(GlobalAddress().ToString(), "null");
  GlobalAddress top(65535, GlobalAddress::kOffsetMask);
  EXPECT_EQ(top.server(), 65535);
  EXPECT_EQ(top.offset(), GlobalAddress::kOffsetMask);
  EXPECT_LT(GlobalAddress(1, 5), GlobalAddress(2, 0));
}

TEST(Fabric, ParsesKnownNamesOnly) {
  EXPECT_EQ(*ParseFabric("shm"), Fabric::kShm);
  EXPECT_EQ(*ParseFabric("tcp"), Fabric::kTcp);
  EXPECT_EQ(*ParseFabric("auto"), Fabric::kAuto);
  auto bad = ParseFabric("carrier-pigeon");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("carrier-pigeon"), std::string::npos);
}

}  // namespace
}  // namespace farpool
