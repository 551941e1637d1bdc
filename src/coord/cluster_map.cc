#include "coord/cluster_map.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

namespace farpool::coord {

const MapServer* ClusterMap::Find(uint16_t id) const {
  for (const MapServer& s : servers) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

std::vector<int> ClusterMap::SlotsInUse(uint16_t id) const {
  std::vector<int> used;
  for (const MapServer& s : servers) {
    if (s.served_by == id && s.served_slot >= 0) used.push_back(s.served_slot);
    if (s.backup == id) used.push_back(s.backup_slot);
  }
  return used;
}

std::string ClusterMap::ToJson() const {
  nlohmann::json doc = {{"epoch", epoch}, {"replicas", replicas}};
  doc["servers"] = nlohmann::json::array();
  for (const MapServer& s : servers) {
    doc["servers"].push_back({{"id", s.id},
                              {"address", s.address},
                              {"memory", s.memory},
                              {"served_by", s.served_by},
                              {"backup", s.backup},
                              {"served_slot", s.served_slot},
                              {"backup_slot", s.backup_slot},
                              {"slots", s.slots}});
  }
  return doc.dump();
}

Result<ClusterMap> ClusterMap::Parse(std::string_view json, std::string_view origin) {
  const std::string where(origin);
  auto bad = [&](const std::string& field, const std::string& why) {
    return Status::InvalidArgument("cluster map " + where + ": " + field + ": " + why);
  };
  nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return bad("top level", "not a JSON object");
  ClusterMap map;
  if (!doc.contains("epoch") || !doc["epoch"].is_number_integer() || doc["epoch"] < 1) {
    return bad("epoch", "expected an integer >= 1");
  }
  map.epoch = doc["epoch"].get<int64_t>();
  if (!doc.contains("replicas") || !doc["replicas"].is_number_integer() || doc["replicas"] < 0 ||
      doc["replicas"] > 1) {
    return bad("replicas", "expected 0 or 1");
  }
  map.replicas = doc["replicas"].get<int>();
  if (!doc.contains("servers") || !doc["servers"].is_array()) {
    return bad("servers", "expected an array");
  }
  auto is_id = [](const nlohmann::json& j) {
    return j.is_number_unsigned() && j.get<uint64_t>() <= 65535;
  };
  for (size_t i = 0; i < doc["servers"].size(); ++i) {
    const auto& j = doc["servers"][i];
    const std::string name = "servers[" + std::to_string(i) + "]";
    if (!j.is_object()) return bad(name, "expected an object");
    MapServer s;
    if (!j.contains("id") || !is_id(j["id"])) return bad(name + ".id", "expected 0 to 65535");
    s.id = j["id"].get<uint16_t>();
    if (map.Find(s.id) != nullptr) return bad(name + ".id", "duplicate id");
    if (!j.contains("address") || !j["address"].is_string()) {
      return bad(name + ".address", "expected HOST:PORT");
    }
    s.address = j["address"].get<std::string>();
    if (j.contains("memory")) {
      if (!j["memory"].is_number_unsigned()) return bad(name + ".memory", "expected bytes");
      s.memory = j["memory"].get<uint64_t>();
    }
    if (!j.contains("served_by") || !is_id(j["served_by"])) {
      return bad(name + ".served_by", "expected a server id");
    }
    s.served_by = j["served_by"].get<uint16_t>();
    if (!j.contains("backup") || !j["backup"].is_number_integer() || j["backup"] < -1 ||
        j["backup"] > 65535) {
      return bad(name + ".backup", "expected a server id or -1");
    }
    s.backup = j["backup"].get<int>();
    // Maps written before mirror slots: one slot (the ring's), a failed-over region in it.
    s.served_slot = s.served_by == s.id ? -1 : 0;
    s.slots = map.replicas > 0 ? 1 : 0;
    auto slot = [&](const char* field, int min, int* out) -> Status {
      if (!j.contains(field)) return Status::Ok();
      if (!j[field].is_number_integer() || j[field] < min || j[field] > 64) {
        return bad(name + "." + field, "expected a slot from " + std::to_string(min) + " to 64");
      }
      *out = j[field].get<int>();
      return Status::Ok();
    };
    FARPOOL_RETURN_IF_ERROR(slot("served_slot", -1, &s.served_slot));
    FARPOOL_RETURN_IF_ERROR(slot("backup_slot", 0, &s.backup_slot));
    int slots = static_cast<int>(s.slots);
    FARPOOL_RETURN_IF_ERROR(slot("slots", 0, &slots));
    s.slots = static_cast<uint32_t>(slots);
    map.servers.push_back(std::move(s));
  }
  for (const MapServer& s : map.servers) {
    if (map.Find(s.served_by) == nullptr || (s.backup >= 0 && map.Find(s.backup) == nullptr)) {
      return bad("server " + std::to_string(s.id), "names a server that is not in the map");
    }
  }
  return map;
}

std::string NewClusterPrefix() {
  std::random_device random;
  const uint64_t id = (uint64_t{random()} << 32) | random();
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(id));
  return "/farpool/" + std::string(text) + "/";
}

}  // namespace farpool::coord
