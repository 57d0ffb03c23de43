#include "executor/communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <stdexcept>

namespace longseq {

void SingleRankCommunicator::all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes_per_rank));
}

void SingleRankCommunicator::all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes_per_rank));
}

void SingleRankCommunicator::send_receive_bytes(const void* send, int destination, void* recv, int source, int64_t bytes) {
  if (destination != 0 || source != 0) throw std::invalid_argument("send_receive: a group of one rank has only rank 0");
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes));
}

void SingleRankCommunicator::reduce_scatter(const float* send, float* recv, int64_t count) {
  if (send != recv) std::copy_n(send, count, recv);
}

namespace {

// One setting on the wire: its value's FNV-1a hash (compared) and its first characters (shown).
struct SettingRecord {
  uint64_t hash = 0;
  char shown[40] = {};
};

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

}  // namespace

std::string file_fingerprint(const std::string& path) {
  if (path.empty()) return "";
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) return "no such file";
  if (!std::filesystem::is_regular_file(status)) return "not a file";
  std::ifstream file(path, std::ios::binary);
  if (!file) return "not readable";
  std::ostringstream bytes;
  bytes << file.rdbuf();
  const std::string contents = bytes.str();
  char text[64];
  std::snprintf(text, sizeof text, "%zu B, digest %016llx", contents.size(), static_cast<unsigned long long>(fnv1a(contents)));
  return text;
}

void ranks_agree(Communicator& world, const std::vector<std::pair<std::string, std::string>>& settings) {
  const size_t count = settings.size();
  std::vector<SettingRecord> own(count), all(count * static_cast<size_t>(world.size()));
  for (size_t i = 0; i < count; ++i) {
    own[i].hash = fnv1a(settings[i].second);
    std::strncpy(own[i].shown, settings[i].second.c_str(), sizeof own[i].shown - 1);
  }
  world.all_gather_bytes(own.data(), all.data(), static_cast<int64_t>(count * sizeof(SettingRecord)));
  for (size_t i = 0; i < count; ++i)
    for (int rank = 1; rank < world.size(); ++rank) {
      const SettingRecord& first = all[i];
      const SettingRecord& other = all[static_cast<size_t>(rank) * count + i];
      if (other.hash == first.hash) continue;
      throw RanksDisagree(settings[i].first, "",
                          "ranks disagree: rank 0 has '" + std::string(first.shown) + "', rank " + std::to_string(rank) + " has '" +
                              std::string(other.shown) + "' (every rank of a job must run the same configuration)");
    }
}

namespace {
double peer_timeout_seconds = 600;
}  // namespace

void peer_timeout_set(double seconds) { peer_timeout_seconds = seconds; }
double peer_timeout_s() { return peer_timeout_seconds; }

double steady_clock_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void CollectivePause::operator()() {
  if (steady_clock_s() < spin_until_s_) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(100));
}

}  // namespace longseq
