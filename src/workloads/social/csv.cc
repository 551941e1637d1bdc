// The CSV export for the peers (PostgreSQL, SQLite).
#include <cstdio>
#include <filesystem>

#include "workloads/social/internal.h"
#include "workloads/social/social.h"

namespace farpool::workloads {

using namespace social_internal;

namespace {

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

class CsvFile {
 public:
  Status Open(const std::string& path, const char* header) {
    f_ = std::fopen(path.c_str(), "w");
    if (!f_) return Status::IoError("cannot write " + path);
    path_ = path;
    std::fprintf(f_, "%s\n", header);
    return Status::Ok();
  }
  void Line(const std::string& line) {
    std::fwrite(line.data(), 1, line.size(), f_), std::fputc('\n', f_);
  }
  Status Close() {
    const bool ok = f_ && std::ferror(f_) == 0;
    if (f_) std::fclose(f_);
    f_ = nullptr;
    return ok ? Status::Ok() : Status::IoError("write failed: " + path_);
  }
  ~CsvFile() {
    if (f_) std::fclose(f_);
  }

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace

Status ExportSocialCsv(const SocialData& d, const std::string& dir, int samples) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir + ": " + ec.message());
  auto p = [&](const char* name) { return dir + "/" + name; };
  auto s = [](auto v) { return std::to_string(v); };
  CsvFile f;
  FARPOOL_RETURN_IF_ERROR(f.Open(p("users.csv"), "uid,name"));
  for (uint64_t u = 0; u < d.users(); ++u) f.Line(s(u) + "," + Quote(d.UserName(u)));
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(f.Open(p("groups.csv"), "gid,name"));
  for (uint64_t g = 0; g < d.groups(); ++g) f.Line(s(g) + "," + Quote(d.GroupName(g)));
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(f.Open(p("friends.csv"), "uid,fid,since"));
  for (uint64_t u = 0; u < d.users(); ++u) {
    for (uint64_t v : d.Friends(u)) f.Line(s(u) + "," + s(v) + "," + s(d.Since(u, v)));
  }
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(f.Open(p("members.csv"), "uid,gid,joined"));
  for (uint64_t u = 0; u < d.users(); ++u) {
    for (uint64_t g : d.Groups(u))
      f.Line(s(u) + "," + s(g) + "," + s(d.Since(u, g + (1ull << 40))));
  }
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(
      f.Open(p("messages.csv"), "mid,sender,to_user,to_group,time,is_read,text"));
  for (uint64_t mid = 0; mid < d.messages(); ++mid) {
    Message m = d.GetMessage(mid);
    f.Line(s(m.mid) + "," + s(m.sender) + "," + (m.to_user >= 0 ? s(m.to_user) : "") + "," +
           (m.to_group >= 0 ? s(m.to_group) : "") + "," + s(m.time) + "," + s(m.is_read) + "," +
           Quote(m.text));
  }
  FARPOOL_RETURN_IF_ERROR(f.Close());
  std::vector<uint64_t> users, mids;
  SocialSample(d, samples, &users, &mids);
  const auto expect = d.Expect(users, mids);
  FARPOOL_RETURN_IF_ERROR(f.Open(p("expect.csv"), "query,param,rows"));
  for (size_t i = 0; i < users.size(); ++i) {
    for (int q = 1; q <= kSocialQueries; ++q) {
      const uint64_t param = q == 5 ? mids[i] : users[i];
      f.Line("q" + s(q) + "," + s(param) + "," + s(expect[i][q - 1].rows));
    }
  }
  FARPOOL_RETURN_IF_ERROR(f.Close());
  FARPOOL_RETURN_IF_ERROR(f.Open(p("meta.csv"), "users,groups,messages,seed"));
  f.Line(s(d.users()) + "," + s(d.groups()) + "," + s(d.messages()) + "," + s(d.seed()));
  return f.Close();
}

}  // namespace farpool::workloads
