#include "transport/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace farpool::transport {
namespace {

constexpr std::string_view kClientLabel = "farpool client proof";
constexpr std::string_view kServerLabel = "farpool server proof";
constexpr std::string_view kPoolKeyLabel = "farpool pool key";
constexpr std::string_view kPoolIdLabel = "farpool pool id";
// The file: 64 lowercase hex digits and a newline.
constexpr size_t kFileSize = 2 * kSecretSize + 1;

std::string OpensslError() {
  char buf[256];
  ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
  return buf;
}

Status Random(uint8_t* out, size_t size) {
  if (RAND_bytes(out, static_cast<int>(size)) != 1) {
    return Status::Internal("no random bytes from OpenSSL: " + OpensslError());
  }
  return Status::Ok();
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<Nonce> RandomNonce() {
  Nonce n;
  FARPOOL_RETURN_IF_ERROR(Random(n.data(), n.size()));
  return n;
}

ClusterSecret::~ClusterSecret() { OPENSSL_cleanse(bytes_.data(), bytes_.size()); }

Result<ClusterSecret> ClusterSecret::Generate() {
  ClusterSecret s;
  FARPOOL_RETURN_IF_ERROR(Random(s.bytes_.data(), s.bytes_.size()));
  return s;
}

Result<ClusterSecret> ClusterSecret::Read(const std::string& path) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("cluster secret file " + path + ": " + why);
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return bad(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return bad(std::string("cannot stat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return bad("not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return bad(std::string("mode ") + mode +
               " lets group or others read or write it; it must be its owner's only (chmod 600)");
  }
  char text[kFileSize + 1];
  size_t got = 0;
  while (got < sizeof(text)) {
    const ssize_t n = read(fd, text + got, sizeof(text) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  ClusterSecret s;
  if (got != kFileSize || text[kFileSize - 1] != '\n') {
    OPENSSL_cleanse(text, sizeof(text));
    return bad("expected 64 hex digits and a newline (" + std::to_string(got) + " bytes read)");
  }
  for (size_t i = 0; i < kSecretSize; ++i) {
    const int hi = HexDigit(text[2 * i]), lo = HexDigit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      OPENSSL_cleanse(text, sizeof(text));
      return bad("expected 64 hex digits and a newline (a character that is not a hex digit)");
    }
    s.bytes_[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  OPENSSL_cleanse(text, sizeof(text));
  return s;
}

Status ClusterSecret::Write(const std::string& path) const {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return Status::IoError("cannot create cluster secret file " + path + ": " +
                           std::strerror(errno));
  }
  char text[kFileSize];
  for (size_t i = 0; i < kSecretSize; ++i) {
    static constexpr char kHex[] = "0123456789abcdef";
    text[2 * i] = kHex[bytes_[i] >> 4];
    text[2 * i + 1] = kHex[bytes_[i] & 0xf];
  }
  text[kFileSize - 1] = '\n';
  size_t done = 0;
  while (done < sizeof(text)) {
    const ssize_t n = write(fd, text + done, sizeof(text) - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  OPENSSL_cleanse(text, sizeof(text));
  const int e = errno;
  if (done != sizeof(text) || fsync(fd) != 0) {
    close(fd);
    unlink(path.c_str());
    return Status::IoError("cannot write cluster secret file " + path + ": " + std::strerror(e));
  }
  close(fd);
  return Status::Ok();
}

Proof ClusterSecret::Prove(Role role, const Nonce& client, const Nonce& server) const {
  const std::string_view label = role == Role::kClient ? kClientLabel : kServerLabel;
  uint8_t message[kServerLabel.size() + 2 * kNonceSize];
  static_assert(kClientLabel.size() == kServerLabel.size());
  std::memcpy(message, label.data(), label.size());
  std::memcpy(message + label.size(), client.data(), client.size());
  std::memcpy(message + label.size() + client.size(), server.data(), server.size());
  Proof proof{};
  unsigned int size = 0;
  HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()), message, sizeof(message),
       proof.data(), &size);
  return proof;
}

ClusterSecret ClusterSecret::DerivePool(std::string_view name) const {
  std::string message(kPoolKeyLabel);
  message.append(name);
  ClusterSecret pool;
  unsigned int size = 0;
  HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()),
       reinterpret_cast<const uint8_t*>(message.data()), message.size(), pool.bytes_.data(), &size);
  return pool;
}

Status ValidPoolName(std::string_view name) {
  if (name.empty() || name.size() > kMaxPoolName) {
    return Status::InvalidArgument("pool name '" + std::string(name) + "': 1 to " +
                                   std::to_string(kMaxPoolName) + " characters");
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_')) {
      return Status::InvalidArgument("pool name '" + std::string(name) +
                                     "': only letters, digits, '-' and '_'");
    }
  }
  return Status::Ok();
}

uint32_t PoolId(std::string_view name) {
  if (name.empty()) return 0;
  std::string message(kPoolIdLabel);
  message.append(name);
  uint8_t digest[32];
  unsigned int size = 0;
  EVP_Digest(message.data(), message.size(), digest, &size, EVP_sha256(), nullptr);
  uint32_t id = 0;
  std::memcpy(&id, digest, sizeof(id));
  return id == 0 ? 1 : id;
}

bool ClusterSecret::Verify(const Proof& proof, Role role, const Nonce& client,
                           const Nonce& server) const {
  const Proof expected = Prove(role, client, server);
  return CRYPTO_memcmp(expected.data(), proof.data(), proof.size()) == 0;
}

}  // namespace farpool::transport
