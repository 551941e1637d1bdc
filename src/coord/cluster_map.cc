#include "coord/cluster_map.h"

#include <algorithm>
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

std::vector<MapServer::Backup> MapServer::Backups() const {
  std::vector<Backup> all;
  if (backup < 0) return all;
  all.push_back({static_cast<uint16_t>(backup), backup_slot});
  all.insert(all.end(), more_backups.begin(), more_backups.end());
  return all;
}

bool MapServer::DropBackup(uint16_t id) {
  std::vector<Backup> all = Backups();
  const auto gone =
      std::remove_if(all.begin(), all.end(), [&](const Backup& b) { return b.id == id; });
  if (gone == all.end()) return false;
  all.erase(gone, all.end());
  backup = all.empty() ? -1 : all.front().id;
  backup_slot = all.empty() ? 0 : all.front().slot;
  more_backups.assign(all.empty() ? all.end() : all.begin() + 1, all.end());
  return true;
}

std::vector<int> ClusterMap::SlotsInUse(uint16_t id) const {
  std::vector<int> used;
  for (const MapServer& s : servers) {
    if (s.served_by == id && s.served_slot >= 0) used.push_back(s.served_slot);
    for (const MapServer::Backup& b : s.Backups()) {
      if (b.id == id) used.push_back(b.slot);
    }
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
    if (!s.more_backups.empty()) {
      nlohmann::json more = nlohmann::json::array();
      for (const MapServer::Backup& b : s.more_backups) {
        more.push_back({{"id", b.id}, {"slot", b.slot}});
      }
      doc["servers"].back()["more_backups"] = std::move(more);
    }
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
      doc["replicas"] > 64) {
    return bad("replicas", "expected 0 to 64");
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
    if (j.contains("more_backups")) {
      const auto& more = j["more_backups"];
      if (!more.is_array() || s.backup < 0) {
        return bad(name + ".more_backups", "expected an array, with a backup");
      }
      for (size_t k = 0; k < more.size(); ++k) {
        const std::string field = name + ".more_backups[" + std::to_string(k) + "]";
        if (!more[k].is_object() || !more[k].contains("id") || !is_id(more[k]["id"]) ||
            !more[k].contains("slot") || !more[k]["slot"].is_number_integer() ||
            more[k]["slot"] < 0 || more[k]["slot"] > 64) {
          return bad(field, "expected {\"id\": a server id, \"slot\": 0 to 64}");
        }
        s.more_backups.push_back({more[k]["id"].get<uint16_t>(), more[k]["slot"].get<int>()});
      }
    }
    map.servers.push_back(std::move(s));
  }
  for (const MapServer& s : map.servers) {
    const std::vector<MapServer::Backup> backups = s.Backups();
    if (map.Find(s.served_by) == nullptr ||
        std::any_of(backups.begin(), backups.end(),
                    [&](const MapServer::Backup& b) { return map.Find(b.id) == nullptr; })) {
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
