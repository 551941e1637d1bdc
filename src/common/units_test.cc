#include "common/units.h"

#include <gtest/gtest.h>

namespace farpool {
namespace {

TEST(ParseSize, AcceptsBinaryDecimalAndBareUnits) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("64B"), 64u);
  EXPECT_EQ(*ParseSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseSize("4GiB"), 4ull << 30);
  EXPECT_EQ(*ParseSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseSize("2GB"), 2000000000u);
  EXPECT_EQ(*ParseSize("16K"), 16384u);
}

TEST(ParseSize, RejectsMalformedInputWithTheReason) {
  auto r = ParseSize("12 parsecs");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'12 parsecs'"), std::string::npos);
  EXPECT_NE(r.status().message().find("unknown unit"), std::string::npos);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("GiB").ok());
  EXPECT_FALSE(ParseSize("-4GiB").ok());
  EXPECT_FALSE(ParseSize("1.0001B").ok());  // not whole bytes
  EXPECT_FALSE(ParseSize("99999999TiB").ok());
}

TEST(FormatSize, PicksTheLargestWholeUnit) {
  EXPECT_EQ(FormatSize(0), "0 B");
  EXPECT_EQ(FormatSize(1023), "1023 B");
  EXPECT_EQ(FormatSize(4ull << 30), "4 GiB");
  EXPECT_EQ(FormatSize(3ull << 29), "1.50 GiB");
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(ParseDuration("20us")->count(), 20000);
  EXPECT_EQ(ParseDuration("1.5ms")->count(), 1500000);
  EXPECT_EQ(ParseDuration("2s")->count(), 2000000000);
  EXPECT_EQ(ParseDuration("7ns")->count(), 7);
  EXPECT_FALSE(ParseDuration("3 fortnights").ok());
}

}  // namespace
}  // namespace farpool
