#include "coord/etcd_client.h"

#include <curl/curl.h>

#include <charconv>
#include <nlohmann/json.hpp>

namespace farpool::coord {
namespace {

using Json = nlohmann::json;

size_t AppendBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// A gRPC status code (as the gateway reports it) as a Status.
Status FromGrpc(int code, std::string message) {
  switch (code) {
    case 3:   // INVALID_ARGUMENT
    case 9:   // FAILED_PRECONDITION
    case 11:  // OUT_OF_RANGE (a compacted revision)
      return Status::InvalidArgument(std::move(message));
    case 4:  // DEADLINE_EXCEEDED
      return Status::TimedOut(std::move(message));
    case 5:  // NOT_FOUND (a lease)
      return Status::NotFound(std::move(message));
    case 7:   // PERMISSION_DENIED
    case 16:  // UNAUTHENTICATED
      return Status::PermissionDenied(std::move(message));
    case 8:  // RESOURCE_EXHAUSTED (too many requests, quota)
      return Status::ResourceExhausted(std::move(message));
    case 10:  // ABORTED
      return Status::Aborted(std::move(message));
    case 14:  // UNAVAILABLE (no leader, stopping)
      return Status::Unavailable(std::move(message));
    default:
      return Status::Internal(std::move(message));
  }
}

Json KeyField(std::string_view key) { return Base64Encode(key); }

Json PutRequest(std::string_view key, std::string_view value, int64_t lease) {
  Json put = {{"key", KeyField(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return put;
}

}  // namespace

Result<std::vector<std::string>> ParseEndpoints(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view one = list.substr(start, comma - start);
    start = comma + 1;
    if (one.empty()) continue;
    constexpr std::string_view kScheme = "http://";
    if (one.substr(0, kScheme.size()) != kScheme) {
      return Status::InvalidArgument("etcd endpoint '" + std::string(one) +
                                     "': expected http://HOST:PORT");
    }
    std::string_view hostport = one.substr(kScheme.size());
    while (!hostport.empty() && hostport.back() == '/') hostport.remove_suffix(1);
    const size_t colon = hostport.rfind(':');
    unsigned port = 0;
    const char* digits = hostport.data() + colon + 1;
    const char* end = hostport.data() + hostport.size();
    auto [ptr, ec] = colon == std::string_view::npos || colon == 0
                         ? std::from_chars_result{digits, std::errc::invalid_argument}
                         : std::from_chars(digits, end, port);
    if (ec != std::errc() || ptr != end || digits == end || port == 0 || port > 65535) {
      return Status::InvalidArgument("etcd endpoint '" + std::string(one) +
                                     "': expected http://HOST:PORT");
    }
    out.push_back(std::string(kScheme) + std::string(hostport));
  }
  if (out.empty()) return Status::InvalidArgument("no etcd endpoint given");
  return out;
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(Options options) {
  std::string joined;
  for (const std::string& e : options.endpoints) joined += (joined.empty() ? "" : ",") + e;
  FARPOOL_ASSIGN_OR_RETURN(options.endpoints, ParseEndpoints(joined));
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (global != CURLE_OK) {
    return Status::Internal(std::string("libcurl: ") + curl_easy_strerror(global));
  }
  std::unique_ptr<EtcdClient> client(new EtcdClient(std::move(options)));
  client->curl_ = curl_easy_init();
  if (client->curl_ == nullptr) return Status::Internal("libcurl: curl_easy_init failed");
  return client;
}

EtcdClient::EtcdClient(Options options) : options_(std::move(options)) {}

EtcdClient::~EtcdClient() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

std::string EtcdClient::EndpointList() const {
  std::string joined;
  for (const std::string& e : options_.endpoints) joined += (joined.empty() ? "" : ",") + e;
  return joined;
}

Result<std::string> EtcdClient::Call(std::string_view path, const std::string& body) {
  std::lock_guard lock(mu_);
  CURL* curl = static_cast<CURL*>(curl_);
  std::string failures;
  const size_t n = options_.endpoints.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t index = (preferred_ + k) % n;
    const std::string& endpoint = options_.endpoints[index];
    const std::string url = endpoint + std::string(path);
    std::string answer;
    char error[CURL_ERROR_SIZE] = {0};
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM in a threaded process
    curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");  // etcd is reached directly, never by proxy
    const CURLcode rc = curl_easy_perform(curl);
    if (rc != CURLE_OK) {
      failures += std::string(failures.empty() ? "" : "; ") + endpoint + ": " +
                  (error[0] != '\0' ? error : curl_easy_strerror(rc));
      continue;
    }
    preferred_ = index;
    long http = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
    if (auto e = ParseGatewayError(answer)) {
      return FromGrpc(e->code, "etcd " + endpoint + ": " + std::string(path) + ": " + e->message);
    }
    if (http != 200) {
      return Status::Protocol("etcd " + endpoint + ": " + std::string(path) + ": HTTP " +
                              std::to_string(http) + ": " + answer.substr(0, 200));
    }
    return answer;
  }
  return Status::Unavailable("etcd unreachable (" + std::string(path) + "): " + failures);
}

Result<std::optional<KeyValue>> EtcdClient::Get(std::string_view key) {
  FARPOOL_ASSIGN_OR_RETURN(std::string body,
                           Call("/v3/kv/range", Json{{"key", KeyField(key)}}.dump()));
  auto answer = ParseRange(body);
  if (!answer.ok()) return answer.status().WithContext("etcd " + EndpointList());
  if (answer->kvs.empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(std::move(answer->kvs.front()));
}

Result<RangeAnswer> EtcdClient::GetPrefix(std::string_view prefix) {
  Json request = {{"key", KeyField(prefix)}, {"range_end", KeyField(PrefixEnd(prefix))}};
  FARPOOL_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/range", request.dump()));
  auto answer = ParseRange(body);
  if (!answer.ok()) return answer.status().WithContext("etcd " + EndpointList());
  return answer;
}

Result<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  FARPOOL_ASSIGN_OR_RETURN(std::string body,
                           Call("/v3/kv/put", PutRequest(key, value, lease).dump()));
  return ParseHeaderRevision(body);
}

Status EtcdClient::Delete(std::string_view key) {
  return Call("/v3/kv/deleterange", Json{{"key", KeyField(key)}}.dump()).status();
}

Status EtcdClient::DeletePrefix(std::string_view prefix) {
  Json request = {{"key", KeyField(prefix)}, {"range_end", KeyField(PrefixEnd(prefix))}};
  return Call("/v3/kv/deleterange", request.dump()).status();
}

Result<TxnAnswer> EtcdClient::PutIf(const std::vector<Compare>& compares, std::string_view key,
                                    std::string_view value, int64_t lease) {
  Json compare = Json::array();
  for (const Compare& c : compares) {
    const bool create = c.target == Compare::Target::kCreateRevision;
    compare.push_back({{"key", KeyField(c.key)},
                       {"result", "EQUAL"},
                       {"target", create ? "CREATE" : "MOD"},
                       {create ? "create_revision" : "mod_revision", std::to_string(c.revision)}});
  }
  Json request = {{"compare", compare},
                  {"success", Json::array({{{"request_put", PutRequest(key, value, lease)}}})},
                  {"failure", Json::array({{{"request_range", {{"key", KeyField(key)}}}}})}};
  FARPOOL_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/txn", request.dump()));
  return ParseTxn(body);
}

Result<LeaseAnswer> EtcdClient::GrantLease(std::chrono::milliseconds ttl) {
  const int64_t seconds = std::max<int64_t>(1, (ttl.count() + 999) / 1000);
  FARPOOL_ASSIGN_OR_RETURN(std::string body,
                           Call("/v3/lease/grant", Json{{"TTL", std::to_string(seconds)}}.dump()));
  return ParseLeaseGrant(body);
}

Result<LeaseAnswer> EtcdClient::KeepAlive(int64_t id) {
  FARPOOL_ASSIGN_OR_RETURN(std::string body,
                           Call("/v3/lease/keepalive", Json{{"ID", std::to_string(id)}}.dump()));
  FARPOOL_ASSIGN_OR_RETURN(LeaseAnswer answer, ParseLeaseKeepAlive(body));
  if (answer.ttl <= 0) {
    return Status::NotFound("etcd " + EndpointList() + ": lease " + std::to_string(id) +
                            " has expired or was revoked");
  }
  return answer;
}

Status EtcdClient::RevokeLease(int64_t id) {
  return Call("/v3/lease/revoke", Json{{"ID", std::to_string(id)}}.dump()).status();
}

}  // namespace farpool::coord
