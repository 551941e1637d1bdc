// The cluster secret's file and proofs (transport/auth.h).
#include "transport/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace farpool::transport {
namespace {

namespace fs = std::filesystem;
using Role = ClusterSecret::Role;

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("farpool-auth-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string File(const std::string& name) const { return (dir_ / name).string(); }
  void WriteText(const std::string& path, const std::string& text, mode_t mode) const {
    std::ofstream(path) << text;
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
  }
  fs::path dir_;
};

TEST_F(SecretFileTest, WrittenOwnerOnlyAndReadBack) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  ASSERT_TRUE(secret->Write(File("s")).ok());
  struct stat st {};
  ASSERT_EQ(stat(File("s").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 65) << "64 hex digits and a newline";
  auto back = ClusterSecret::Read(File("s"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const Nonce a{1}, b{2};
  EXPECT_EQ(back->Prove(Role::kClient, a, b), secret->Prove(Role::kClient, a, b));
  // Exclusive creation: an existing file (someone may have it open) is not reused.
  Status again = secret->Write(File("s"));
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("File exists"), std::string::npos) << again.message();
}

TEST_F(SecretFileTest, BadFilesAreRefusedWithTheReason) {
  auto expect = [&](const std::string& path, const std::string& needle) {
    auto r = ClusterSecret::Read(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(r.status().message().find("cluster secret file " + path), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  const std::string hex(64, 'a');
  WriteText(File("world"), hex + "\n", 0644);
  expect(File("world"), "mode 0644");
  expect(File("world"), "chmod 600");
  WriteText(File("short"), hex.substr(1) + "\n", 0600);
  expect(File("short"), "64 hex digits");
  WriteText(File("nohex"), std::string(63, 'a') + "g\n", 0600);
  expect(File("nohex"), "not a hex digit");
  WriteText(File("long"), hex + "\n" + "x", 0600);
  expect(File("long"), "64 hex digits");
  expect(File("absent"), "cannot open");
  fs::create_directories(dir_ / "dir");
  ASSERT_EQ(chmod(File("dir").c_str(), 0700), 0);
  expect(File("dir"), "not a regular file");
}

TEST(Proof, BindsTheSecretTheRoleAndBothNonces) {
  auto s1 = ClusterSecret::Generate();
  auto s2 = ClusterSecret::Generate();
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto c = RandomNonce(), s = RandomNonce();
  ASSERT_TRUE(c.ok() && s.ok());
  EXPECT_NE(*c, *s) << "fresh nonces";
  const Proof p = s1->Prove(Role::kClient, *c, *s);
  EXPECT_TRUE(s1->Verify(p, Role::kClient, *c, *s));
  EXPECT_FALSE(s2->Verify(p, Role::kClient, *c, *s)) << "another secret";
  EXPECT_FALSE(s1->Verify(p, Role::kServer, *c, *s)) << "a client's proof is no server's";
  EXPECT_FALSE(s1->Verify(p, Role::kClient, *s, *c)) << "nonces swapped";
  Nonce other = *s;
  other[31] ^= 1;
  EXPECT_FALSE(s1->Verify(p, Role::kClient, *c, other)) << "another server nonce";
  Proof flipped = p;
  flipped[0] ^= 0x80;
  EXPECT_FALSE(s1->Verify(flipped, Role::kClient, *c, *s));
}

}  // namespace
}  // namespace farpool::transport
