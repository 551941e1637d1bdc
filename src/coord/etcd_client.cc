#include "coord/etcd_client.h"

#include <curl/curl.h>

#include <charconv>
#include <functional>
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

// A watch stream's bytes as curl hands them over: cut into objects, each given to `on_object`;
// the first failure (a malformed stream, or what on_object returns) ends the stream.
struct StreamState {
  JsonStreamSplitter splitter;
  std::function<Status(std::string_view object)> on_object;
  Status ended;
  bool done = false;
};

size_t OnStreamBytes(char* data, size_t size, size_t n, void* p) {
  auto* state = static_cast<StreamState*>(p);
  if (state->done) return size * n;  // the loop ends the transfer at its next turn
  state->splitter.Append(std::string_view(data, size * n));
  while (true) {
    auto object = state->splitter.Next();
    Status s = object.ok() ? Status::Ok() : object.status();
    if (s.ok() && !object->has_value()) break;
    if (s.ok()) s = state->on_object(**object);
    if (!s.ok()) {
      state->ended = std::move(s);
      state->done = true;
      break;
    }
  }
  return size * n;
}

Json KeyField(std::string_view key) { return Base64Encode(key); }

Json PutRequest(std::string_view key, std::string_view value, int64_t lease) {
  Json put = {{"key", KeyField(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return put;
}

// A txn's compare list: each of `compares` must hold (EQUAL).
Json CompareField(const std::vector<Compare>& compares) {
  Json compare = Json::array();
  for (const Compare& c : compares) {
    const bool create = c.target == Compare::Target::kCreateRevision;
    compare.push_back({{"key", KeyField(c.key)},
                       {"result", "EQUAL"},
                       {"target", create ? "CREATE" : "MOD"},
                       {create ? "create_revision" : "mod_revision", std::to_string(c.revision)}});
  }
  return compare;
}

// The options every request to etcd's gateway has: a POST of `body` to `url` (both must
// outlive the transfer), the answer's bytes to `write(data)`, curl's message to `error`, a
// connect within `connect_timeout`, no signals (a threaded process), never through a proxy.
void SetPost(CURL* curl, const std::string& url, const std::string& body, curl_write_callback write,
             void* data, char* error, std::chrono::milliseconds connect_timeout) {
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, data);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM in a threaded process
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");  // etcd is reached directly, never by proxy
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
    SetPost(curl, url, body, AppendBody, &answer, error, options_.timeout);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
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

Result<RangeAnswer> EtcdClient::GetAt(std::string_view key) {
  FARPOOL_ASSIGN_OR_RETURN(std::string body,
                           Call("/v3/kv/range", Json{{"key", KeyField(key)}}.dump()));
  auto answer = ParseRange(body);
  if (!answer.ok()) return answer.status().WithContext("etcd " + EndpointList());
  return answer;
}

Result<std::optional<KeyValue>> EtcdClient::Get(std::string_view key) {
  FARPOOL_ASSIGN_OR_RETURN(RangeAnswer answer, GetAt(key));
  if (answer.kvs.empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(std::move(answer.kvs.front()));
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
  Json request = {{"compare", CompareField(compares)},
                  {"success", Json::array({{{"request_put", PutRequest(key, value, lease)}}})},
                  {"failure", Json::array({{{"request_range", {{"key", KeyField(key)}}}}})}};
  FARPOOL_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/txn", request.dump()));
  return ParseTxn(body);
}

Result<bool> EtcdClient::DeleteIf(const std::vector<Compare>& compares, std::string_view key) {
  Json request = {{"compare", CompareField(compares)},
                  {"success", Json::array({{{"request_delete_range", {{"key", KeyField(key)}}}}})}};
  FARPOOL_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/txn", request.dump()));
  FARPOOL_ASSIGN_OR_RETURN(TxnAnswer answer, ParseTxn(body));
  return answer.succeeded;
}

Status EtcdClient::Compact(int64_t revision) {
  return Call("/v3/kv/compaction", Json{{"revision", std::to_string(revision)}}.dump()).status();
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

// ------------------------------------------------------------------------------ EtcdWatch

Result<std::unique_ptr<EtcdWatch>> EtcdWatch::Start(Options options) {
  if (!options.on_update) return Status::InvalidArgument("etcd watch: no on_update given");
  std::unique_ptr<EtcdWatch> w(new EtcdWatch(std::move(options)));
  FARPOOL_ASSIGN_OR_RETURN(w->client_,
                           EtcdClient::Create({w->options_.endpoints, w->options_.timeout}));
  // The endpoints as the client checked and normalized them.
  FARPOOL_ASSIGN_OR_RETURN(w->endpoints_, ParseEndpoints(w->client_->EndpointList()));
  w->multi_ = curl_multi_init();
  if (w->multi_ == nullptr) return Status::Internal("libcurl: curl_multi_init failed");
  w->thread_ = std::thread([p = w.get()] { p->Run(); });
  return w;
}

EtcdWatch::EtcdWatch(Options options) : options_(std::move(options)) {}

EtcdWatch::~EtcdWatch() {
  stop_.store(true);
  {
    std::lock_guard lock(mu_);  // a Pause between its check and its wait sees stop_
  }
  cv_.notify_all();
  if (multi_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(multi_));
  if (thread_.joinable()) thread_.join();
  if (multi_ != nullptr) curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

bool EtcdWatch::Pause(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  return !cv_.wait_for(lock, d, [&] { return stop_.load(); });
}

Result<int64_t> EtcdWatch::Snapshot() {
  auto range = options_.prefix ? client_->GetPrefix(options_.key) : client_->GetAt(options_.key);
  if (!range.ok()) return range.status();
  Update u;
  u.snapshot = true;
  u.revision = range->revision;
  u.kvs = std::move(range->kvs);
  options_.on_update(u);
  snapshots_.fetch_add(1, std::memory_order_relaxed);
  revision_.store(u.revision, std::memory_order_relaxed);
  return u.revision;
}

void EtcdWatch::Run() {
  const std::vector<std::string>& endpoints = endpoints_;
  int64_t next = options_.start_revision;
  size_t endpoint = 0;
  while (!stop_.load() && !endpoints.empty()) {
    if (next == 0) {
      auto read = Snapshot();
      if (!read.ok()) {
        if (!Pause(options_.retry)) break;
        continue;
      }
      next = *read + 1;
    }
    Status s = Stream(endpoints[endpoint], &next);
    if (stop_.load()) break;
    if (s.code() == StatusCode::kNotFound) {
      next = 0;  // compacted: read whole, at once
      continue;
    }
    endpoint = (endpoint + 1) % endpoints.size();
    if (!Pause(options_.retry)) break;
  }
}

Status EtcdWatch::Stream(const std::string& endpoint, int64_t* next) {
  CURLM* multi = static_cast<CURLM*>(multi_);
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return Status::Internal("libcurl: curl_easy_init failed");
  const std::string url = endpoint + "/v3/watch";
  const std::string body = WatchCreateRequest(
      options_.key, options_.prefix ? PrefixEnd(options_.key) : std::string(), *next);
  const std::string where = "etcd " + endpoint + ": watch of " + options_.key;
  StreamState state;
  state.on_object = [&](std::string_view object) -> Status {
    auto r = ParseWatchResponse(object);
    if (!r.ok()) return r.status().WithContext(where);
    if (r->canceled) {
      if (r->compact_revision > 0) {
        return Status::NotFound(where + ": revision " + std::to_string(*next) +
                                " was compacted (at " + std::to_string(r->compact_revision) + ")");
      }
      return Status::Unavailable(where + ": canceled by etcd: " + r->cancel_reason);
    }
    if (r->created) {
      streams_.fetch_add(1, std::memory_order_relaxed);
      up_.store(true, std::memory_order_release);
      return Status::Ok();
    }
    if (r->events.empty()) {  // progress: everything up to r->revision was sent
      *next = std::max(*next, r->revision + 1);
      return Status::Ok();
    }
    Update u;
    for (WatchEvent& e : r->events) {
      if (e.kv.mod_revision >= *next) u.events.push_back(std::move(e));  // not seen before
    }
    if (u.events.empty()) return Status::Ok();
    u.revision = u.events.back().kv.mod_revision;
    options_.on_update(u);
    *next = u.revision + 1;
    revision_.store(u.revision, std::memory_order_relaxed);
    return Status::Ok();
  };
  char error[CURL_ERROR_SIZE] = {0};
  SetPost(curl, url, body, OnStreamBytes, &state, error, options_.timeout);
  // A dead peer that never closed the connection (see the header): found within ~5 s.
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPIDLE, 2L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPINTVL, 1L);
  curl_multi_add_handle(multi, curl);
  Status result;
  while (true) {
    int running = 0;
    const CURLMcode mc = curl_multi_perform(multi, &running);
    if (mc != CURLM_OK) {
      result = Status::Internal(where + ": libcurl: " + curl_multi_strerror(mc));
      break;
    }
    if (state.done) {
      result = std::move(state.ended);
      break;
    }
    if (stop_.load()) break;
    if (running == 0) {
      CURLcode rc = CURLE_OK;
      int left = 0;
      while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
        if (m->msg == CURLMSG_DONE) rc = m->data.result;
      }
      long http = 0;
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
      result = Status::Unavailable(
          where + ": stream ended: " +
          (rc != CURLE_OK ? std::string(error[0] != '\0' ? error : curl_easy_strerror(rc))
                          : "HTTP " + std::to_string(http) + ", closed by etcd"));
      break;
    }
    curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
  }
  up_.store(false, std::memory_order_release);
  curl_multi_remove_handle(multi, curl);
  curl_easy_cleanup(curl);
  return result;
}

}  // namespace farpool::coord
