#include "coord/etcd_codec.h"

#include <charconv>
#include <nlohmann/json.hpp>

namespace farpool::coord {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int Sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

using Json = nlohmann::json;

Result<Json> ParseJson(std::string_view body, std::string_view what) {
  try {
    Json doc = Json::parse(body);
    if (!doc.is_object()) return Status::Protocol(std::string(what) + ": not a JSON object");
    return doc;
  } catch (const Json::parse_error& e) {
    return Status::Protocol(std::string(what) + ": not JSON: " + e.what());
  }
}

// A 64-bit integer field: a JSON string of digits (the gateway's form) or a number; absent: 0.
Result<int64_t> Int64Field(const Json& object, const char* name, std::string_view what) {
  auto it = object.find(name);
  if (it == object.end()) return int64_t{0};
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (!s.empty() && ec == std::errc() && ptr == s.data() + s.size()) return v;
  }
  return Status::Protocol(std::string(what) + ": field " + name +
                          " is not an integer: " + it->dump());
}

Result<std::string> BytesField(const Json& object, const char* name, std::string_view what) {
  auto it = object.find(name);
  if (it == object.end()) return std::string();
  if (!it->is_string()) {
    return Status::Protocol(std::string(what) + ": field " + name + " is not a string");
  }
  auto bytes = Base64Decode(it->get_ref<const std::string&>());
  if (!bytes.ok()) {
    return Status::Protocol(std::string(what) + ": field " + name + ": " +
                            bytes.status().message());
  }
  return bytes;
}

Result<std::vector<KeyValue>> ParseKvs(const Json& object, std::string_view what) {
  std::vector<KeyValue> out;
  auto it = object.find("kvs");
  if (it == object.end()) return out;
  if (!it->is_array()) return Status::Protocol(std::string(what) + ": kvs is not an array");
  for (const Json& j : *it) {
    if (!j.is_object()) return Status::Protocol(std::string(what) + ": a kv is not an object");
    KeyValue kv;
    FARPOOL_ASSIGN_OR_RETURN(kv.key, BytesField(j, "key", what));
    FARPOOL_ASSIGN_OR_RETURN(kv.value, BytesField(j, "value", what));
    FARPOOL_ASSIGN_OR_RETURN(kv.create_revision, Int64Field(j, "create_revision", what));
    FARPOOL_ASSIGN_OR_RETURN(kv.mod_revision, Int64Field(j, "mod_revision", what));
    FARPOOL_ASSIGN_OR_RETURN(kv.version, Int64Field(j, "version", what));
    FARPOOL_ASSIGN_OR_RETURN(kv.lease, Int64Field(j, "lease", what));
    out.push_back(std::move(kv));
  }
  return out;
}

Result<int64_t> HeaderRevision(const Json& doc, std::string_view what) {
  auto it = doc.find("header");
  if (it == doc.end() || !it->is_object()) {
    return Status::Protocol(std::string(what) + ": no header in the answer");
  }
  return Int64Field(*it, "revision", what);
}

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (rest == 2) v |= uint8_t(bytes[i + 1]) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    return Status::InvalidArgument("base64: length " + std::to_string(text.size()) +
                                   " is not a multiple of 4");
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (pad == 1 && text[i + 2] == '=') {
      return Status::InvalidArgument("base64: padding before the last character");
    }
    int s[4];
    for (int k = 0; k < 4 - pad; ++k) {
      s[k] = Sextet(text[i + k]);
      if (s[k] < 0) {
        return Status::InvalidArgument("base64: invalid character at " + std::to_string(i + k));
      }
    }
    for (int k = 4 - pad; k < 4; ++k) s[k] = 0;
    const uint32_t v = (s[0] << 18) | (s[1] << 12) | (s[2] << 6) | s[3];
    // Canonical form: the bits that padding drops must be zero.
    if ((pad == 1 && (v & 0xff) != 0) || (pad == 2 && (v & 0xffff) != 0)) {
      return Status::InvalidArgument("base64: non-zero bits under the padding");
    }
    out += char(v >> 16);
    if (pad < 2) out += char((v >> 8) & 0xff);
    if (pad < 1) out += char(v & 0xff);
  }
  return out;
}

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (uint8_t(end.back()) < 0xff) {
      end.back() = char(uint8_t(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::optional<GatewayError> ParseGatewayError(std::string_view body) {
  Json doc = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return std::nullopt;
  auto message = doc.find("message");
  auto error = doc.find("error");
  if (message == doc.end() && error == doc.end()) return std::nullopt;
  GatewayError e;
  if (message != doc.end() && message->is_string()) {
    e.message = message->get<std::string>();
  } else if (error != doc.end() && error->is_string()) {
    e.message = error->get<std::string>();
  } else {
    e.message = doc.dump();
  }
  if (auto code = doc.find("code"); code != doc.end() && code->is_number_integer()) {
    e.code = code->get<int>();
  }
  return e;
}

Result<RangeAnswer> ParseRange(std::string_view body) {
  FARPOOL_ASSIGN_OR_RETURN(Json doc, ParseJson(body, "range answer"));
  RangeAnswer a;
  FARPOOL_ASSIGN_OR_RETURN(a.revision, HeaderRevision(doc, "range answer"));
  FARPOOL_ASSIGN_OR_RETURN(a.kvs, ParseKvs(doc, "range answer"));
  return a;
}

Result<int64_t> ParseHeaderRevision(std::string_view body) {
  FARPOOL_ASSIGN_OR_RETURN(Json doc, ParseJson(body, "answer"));
  return HeaderRevision(doc, "answer");
}

Result<TxnAnswer> ParseTxn(std::string_view body) {
  FARPOOL_ASSIGN_OR_RETURN(Json doc, ParseJson(body, "txn answer"));
  TxnAnswer a;
  FARPOOL_ASSIGN_OR_RETURN(a.revision, HeaderRevision(doc, "txn answer"));
  if (auto s = doc.find("succeeded"); s != doc.end()) {
    if (!s->is_boolean()) return Status::Protocol("txn answer: succeeded is not a boolean");
    a.succeeded = s->get<bool>();
  }
  auto responses = doc.find("responses");
  if (responses == doc.end()) return a;
  if (!responses->is_array()) return Status::Protocol("txn answer: responses is not an array");
  for (const Json& r : *responses) {
    if (!r.is_object()) return Status::Protocol("txn answer: a response is not an object");
    auto range = r.find("response_range");
    if (range == r.end()) continue;
    if (!range->is_object()) return Status::Protocol("txn answer: response_range not an object");
    FARPOOL_ASSIGN_OR_RETURN(a.kvs, ParseKvs(*range, "txn answer"));
    break;
  }
  return a;
}

Result<LeaseAnswer> ParseLeaseGrant(std::string_view body) {
  FARPOOL_ASSIGN_OR_RETURN(Json doc, ParseJson(body, "lease grant answer"));
  LeaseAnswer a;
  FARPOOL_ASSIGN_OR_RETURN(a.id, Int64Field(doc, "ID", "lease grant answer"));
  FARPOOL_ASSIGN_OR_RETURN(a.ttl, Int64Field(doc, "TTL", "lease grant answer"));
  if (a.id == 0) return Status::Protocol("lease grant answer: no lease ID");
  return a;
}

Result<LeaseAnswer> ParseLeaseKeepAlive(std::string_view body) {
  FARPOOL_ASSIGN_OR_RETURN(Json doc, ParseJson(body, "lease keepalive answer"));
  auto result = doc.find("result");
  if (result == doc.end() || !result->is_object()) {
    return Status::Protocol("lease keepalive answer: no result");
  }
  LeaseAnswer a;
  FARPOOL_ASSIGN_OR_RETURN(a.id, Int64Field(*result, "ID", "lease keepalive answer"));
  FARPOOL_ASSIGN_OR_RETURN(a.ttl, Int64Field(*result, "TTL", "lease keepalive answer"));
  return a;
}

std::string WatchCreateRequest(std::string_view key, std::string_view range_end,
                               int64_t start_revision) {
  Json create = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) create["range_end"] = Base64Encode(range_end);
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  return Json{{"create_request", create}}.dump();
}

Result<WatchResponse> ParseWatchResponse(std::string_view object) {
  constexpr std::string_view kWhat = "watch response";
  FARPOOL_ASSIGN_OR_RETURN(Json doc, ParseJson(object, kWhat));
  if (auto error = doc.find("error"); error != doc.end()) {
    std::string message =
        error->is_object() && error->contains("message") && (*error)["message"].is_string()
            ? (*error)["message"].get<std::string>()
            : error->dump();
    return Status::Unavailable("etcd ended the watch stream: " + message);
  }
  auto result = doc.find("result");
  if (result == doc.end() || !result->is_object()) {
    return Status::Protocol(std::string(kWhat) + ": no result");
  }
  WatchResponse r;
  if (auto header = result->find("header"); header != result->end()) {
    if (!header->is_object()) return Status::Protocol(std::string(kWhat) + ": bad header");
    FARPOOL_ASSIGN_OR_RETURN(r.revision, Int64Field(*header, "revision", kWhat));
  }
  for (auto [name, flag] : {std::pair{"created", &r.created}, {"canceled", &r.canceled}}) {
    if (auto f = result->find(name); f != result->end()) {
      if (!f->is_boolean()) {
        return Status::Protocol(std::string(kWhat) + ": " + name + " is not a boolean");
      }
      *flag = f->get<bool>();
    }
  }
  FARPOOL_ASSIGN_OR_RETURN(r.compact_revision, Int64Field(*result, "compact_revision", kWhat));
  if (auto reason = result->find("cancel_reason"); reason != result->end() && reason->is_string()) {
    r.cancel_reason = reason->get<std::string>();
  }
  auto events = result->find("events");
  if (events == result->end()) return r;
  if (!events->is_array()) return Status::Protocol(std::string(kWhat) + ": events not an array");
  for (const Json& e : *events) {
    if (!e.is_object()) return Status::Protocol(std::string(kWhat) + ": an event not an object");
    WatchEvent event;
    if (auto type = e.find("type"); type != e.end()) {
      if (*type == "DELETE") {
        event.type = WatchEvent::Type::kDelete;
      } else if (*type != "PUT") {
        return Status::Protocol(std::string(kWhat) + ": event type " + type->dump());
      }
    }
    auto kv = e.find("kv");
    if (kv == e.end() || !kv->is_object()) {
      return Status::Protocol(std::string(kWhat) + ": an event without kv");
    }
    FARPOOL_ASSIGN_OR_RETURN(auto kvs, ParseKvs(Json{{"kvs", Json::array({*kv})}}, kWhat));
    event.kv = std::move(kvs.front());
    r.events.push_back(std::move(event));
  }
  return r;
}

Result<std::optional<std::string>> JsonStreamSplitter::Next() {
  while (scanned_ < buffer_.size()) {
    const char c = buffer_[scanned_++];
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (depth_ == 0) {
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
        buffer_.erase(0, scanned_);  // between objects: dropped
        scanned_ = 0;
        continue;
      }
      if (c != '{') {
        return Status::Protocol("watch stream: '" + std::string(1, c) + "' outside a JSON object");
      }
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{') {
      ++depth_;
    } else if (c == '}') {
      if (--depth_ == 0) {
        std::string object = buffer_.substr(0, scanned_);
        buffer_.erase(0, scanned_);
        scanned_ = 0;
        return std::optional<std::string>(std::move(object));
      }
    }
  }
  if (buffer_.size() > kMaxObject) {
    return Status::Protocol("watch stream: an object larger than " + std::to_string(kMaxObject) +
                            " bytes");
  }
  return std::optional<std::string>();
}

}  // namespace farpool::coord
