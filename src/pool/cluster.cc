#include "farpool/cluster.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "transport/auth.h"

namespace farpool {

Result<ClusterConfig> ClusterConfig::Parse(std::string_view json, std::string_view origin) {
  const std::string where(origin);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::InvalidArgument("cluster file " + where + ": not valid JSON: " + e.what());
  }
  auto field_error = [&](const std::string& field, const std::string& why) {
    return Status::InvalidArgument("cluster file " + where + ": " + field + ": " + why);
  };
  if (!doc.is_object()) return field_error("top level", "expected an object");
  ClusterConfig config;
  if (doc.contains("version") && doc["version"] != 1) {
    return field_error("version", "unsupported version " + doc["version"].dump() + " (expected 1)");
  }
  if (doc.contains("transport")) {
    if (!doc["transport"].is_string()) return field_error("transport", "expected a string");
    auto fabric = ParseFabric(doc["transport"].get<std::string>());
    if (!fabric.ok()) return field_error("transport", fabric.status().message());
    config.transport = *fabric;
  }
  if (doc.contains("secret_file")) {
    if (!doc["secret_file"].is_string() || doc["secret_file"].get<std::string>().empty()) {
      return field_error("secret_file", "expected the name of the cluster's secret file");
    }
    config.secret_file = doc["secret_file"].get<std::string>();
  }
  if (doc.contains("pool")) {
    if (!doc["pool"].is_string()) return field_error("pool", "expected a pool's name");
    config.pool = doc["pool"].get<std::string>();
    if (Status valid = transport::ValidPoolName(config.pool); !valid.ok()) {
      return field_error("pool", valid.message());
    }
    if (config.secret_file.empty()) {
      return field_error("pool", "a pool's clients need its credential (secret_file)");
    }
  }
  if (!doc.contains("servers") || !doc["servers"].is_array() || doc["servers"].empty()) {
    return field_error("servers", "expected a non-empty array");
  }
  if (doc.contains("replicas")) {
    if (!doc["replicas"].is_number_unsigned() ||
        (doc["replicas"].get<uint64_t>() > 0 &&
         doc["replicas"].get<uint64_t>() >= doc["servers"].size())) {
      return field_error("replicas", "expected 0 to one less than the servers (" +
                                         std::to_string(doc["servers"].size()) + ")");
    }
    config.replicas = doc["replicas"].get<int>();
  }
  if (doc.contains("shared_pages")) {
    if (!doc["shared_pages"].is_boolean() ||
        (doc["shared_pages"].get<bool>() && config.replicas != 1)) {
      return field_error("shared_pages", "expected true or false (true only with replicas 1)");
    }
    config.shared_pages = doc["shared_pages"].get<bool>();
  }
  if (doc.contains("etcd")) {
    const auto& e = doc["etcd"];
    if (!e.is_object()) return field_error("etcd", "expected an object");
    if (!e.contains("endpoints") || !e["endpoints"].is_array() || e["endpoints"].empty()) {
      return field_error("etcd.endpoints", "expected a non-empty array of http://HOST:PORT");
    }
    for (const auto& endpoint : e["endpoints"]) {
      if (!endpoint.is_string()) return field_error("etcd.endpoints", "expected strings");
      config.etcd.endpoints.push_back(endpoint.get<std::string>());
    }
    if (!e.contains("prefix") || !e["prefix"].is_string() ||
        !e["prefix"].get<std::string>().ends_with("/")) {
      return field_error("etcd.prefix", "expected a key prefix ending with '/'");
    }
    config.etcd.prefix = e["prefix"].get<std::string>();
    if (e.contains("pid")) {
      if (!e["pid"].is_number_integer()) return field_error("etcd.pid", "expected an integer");
      config.etcd.pid = e["pid"].get<int64_t>();
    }
    if (e.contains("peer_port")) {
      if (!e["peer_port"].is_number_unsigned() || e["peer_port"].get<uint64_t>() > 65535) {
        return field_error("etcd.peer_port", "expected a port");
      }
      config.etcd.peer_port = e["peer_port"].get<uint16_t>();
    }
  }
  std::set<uint16_t> ids;
  for (size_t i = 0; i < doc["servers"].size(); ++i) {
    const auto& s = doc["servers"][i];
    const std::string name = "servers[" + std::to_string(i) + "]";
    if (!s.is_object()) return field_error(name, "expected an object");
    ServerAddress server;
    if (!s.contains("id") || !s["id"].is_number_unsigned() || s["id"].get<uint64_t>() > 65535) {
      return field_error(name + ".id", "expected an integer from 0 to 65535");
    }
    server.id = s["id"].get<uint16_t>();
    if (!ids.insert(server.id).second) {
      return field_error(name + ".id", "duplicate server id " + std::to_string(server.id));
    }
    if (!s.contains("address") || !s["address"].is_string()) {
      return field_error(name + ".address", "expected \"HOST:PORT\"");
    }
    auto hp = ParseHostPort(s["address"].get<std::string>());
    if (!hp.ok()) return field_error(name + ".address", hp.status().message());
    server.host = hp->first;
    server.port = hp->second;
    if (server.port == 0) return field_error(name + ".address", "port 0 is not a server's port");
    if (s.contains("memory")) {
      if (!s["memory"].is_number_unsigned()) return field_error(name + ".memory", "expected bytes");
      server.memory = s["memory"].get<uint64_t>();
    }
    if (s.contains("pid")) {
      if (!s["pid"].is_number_integer()) return field_error(name + ".pid", "expected an integer");
      server.pid = s["pid"].get<int64_t>();
    }
    if (s.contains("netns")) {
      if (!s["netns"].is_string()) return field_error(name + ".netns", "expected a string");
      server.netns = s["netns"].get<std::string>();
    }
    config.servers.push_back(std::move(server));
  }
  return config;
}

Result<ClusterConfig> ClusterConfig::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return Status::InvalidArgument("cluster file " + path + ": cannot open: " + strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  FARPOOL_ASSIGN_OR_RETURN(ClusterConfig config, Parse(ss.str(), path));
  if (!config.secret_file.empty()) {
    config.secret_file = (std::filesystem::path(path).parent_path() / config.secret_file)
                             .lexically_normal()
                             .string();
  }
  return config;
}

std::string ClusterConfig::ToJson() const {
  nlohmann::json doc;
  doc["version"] = 1;
  doc["transport"] = std::string(FabricName(transport));
  if (!secret_file.empty()) doc["secret_file"] = secret_file;
  if (!pool.empty()) doc["pool"] = pool;
  if (replicas > 0) doc["replicas"] = replicas;
  if (shared_pages) doc["shared_pages"] = true;
  doc["servers"] = nlohmann::json::array();
  for (const ServerAddress& s : servers) {
    doc["servers"].push_back({{"id", s.id},
                              {"address", s.Endpoint()},
                              {"memory", s.memory},
                              {"pid", s.pid},
                              {"netns", s.netns}});
  }
  if (!etcd.endpoints.empty()) {
    doc["etcd"] = {{"endpoints", etcd.endpoints},
                   {"prefix", etcd.prefix},
                   {"pid", etcd.pid},
                   {"peer_port", etcd.peer_port}};
  }
  return doc.dump(2) + "\n";
}

Status ClusterConfig::Save(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    if (!out) return Status::IoError("cannot write " + tmp + ": " + strerror(errno));
    out << ToJson();
    if (!out.flush()) return Status::IoError("cannot write " + tmp + ": " + strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::IoError("cannot rename " + tmp + " to " + path + ": " + strerror(errno));
  }
  return Status::Ok();
}

}  // namespace farpool
