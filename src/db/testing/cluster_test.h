// A gtest fixture for real-process tests of the database: a cluster of `farpool server`
// processes (ShmTestCluster, on shared memory or TCP; FARPOOL_CLUSTER names its cluster file, for
// the workers this binary starts), a temporary directory for the test's files, the test's seed, and
// the parent's own database handle and session. TearDown closes the handle before the cluster goes
// down and removes the directory.
//
// REQUIRES: FARPOOL_BINARY (the farpool executable's path) is defined by the test's target.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "db/db_test_util.h"
#include "farpool/db.h"
#include "pool/test_cluster.h"

namespace farpool::db::testing {

class ClusterTest : public ::testing::Test {
 protected:
  // `fabric`: the cluster's transport (kShm: every process maps the servers' memory; kTcp:
  // every process reaches it with messages).
  explicit ClusterTest(std::string dir_prefix, Fabric fabric = Fabric::kShm)
      : dir_prefix_(std::move(dir_prefix)), fabric_(fabric) {}

  void SetUp() override {
    seed_ = TestSeed();
    LocalClusterOptions options = ShmTestCluster(FARPOOL_BINARY);
    options.transport = fabric_;
    cluster_ = std::make_unique<TestCluster>(options);
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status().ToString();
    dir_ = MakeTempDir(dir_prefix_);
    setenv("FARPOOL_CLUSTER", cluster_->cluster_file().c_str(), 1);
  }
  void TearDown() override {
    session_.reset();
    db_.reset();
    cluster_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  uint64_t seed_ = 0;
  std::unique_ptr<TestCluster> cluster_;
  std::string dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<Session> session_;

 private:
  std::string dir_prefix_;
  Fabric fabric_;
};

}  // namespace farpool::db::testing
