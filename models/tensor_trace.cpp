#include "models/tensor_trace.hpp"

#include <stdexcept>

namespace longseq {

int64_t TensorTrace::alloc(std::string_view category, std::string_view name, double bytes, double count) {
  // Zero-byte tensors are kept (so the schedule can free them) and left out of reports.
  if (bytes < 0 || count <= 0) throw std::logic_error("TensorTrace::alloc: negative size for '" + std::string(name) + "'");
  const int64_t storage_id = next_storage_id_++;
  live_.push_back(TraceItem{category, name, bytes, count, storage_id});
  current_bytes_ += bytes;
  // Strictly greater: among equal peaks the first is reported, which is the earlier moment.
  if (current_bytes_ > peak_bytes_) {
    peak_bytes_ = current_bytes_;
    if (record_peak_items_) peak_items_ = live_;
    peak_moment_ = moment_;
  }
  return storage_id;
}

void TensorTrace::free_storage(int64_t storage_id) {
  for (auto it = live_.begin(); it != live_.end(); ++it) {
    if (it->storage_id != storage_id) continue;
    current_bytes_ -= it->bytes;
    live_.erase(it);
    name_released(storage_id);
    return;
  }
  throw std::logic_error("TensorTrace::free_storage: storage " + std::to_string(storage_id) + " is not live");
}

void TensorTrace::rename_storage(int64_t storage_id, std::string_view name) {
  for (auto& item : live_)
    if (item.storage_id == storage_id) {
      item.name = name;
      return;
    }
  throw std::logic_error("TensorTrace::rename_storage: storage " + std::to_string(storage_id) + " is not live");
}

namespace {

// Names are string literals of the schedule's code, so the same name is usually the same pointer:
// compared first, before the characters.
bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && (a.data() == b.data() || a == b);
}

}  // namespace

void TensorTrace::free(std::string_view name) {
  for (auto it = live_.rbegin(); it != live_.rend(); ++it) {
    if (!same_name(it->name, name)) continue;
    // A storage outlives the name while another view of it is live: its bytes move there. Only
    // storages with views are searched for one (a step's replay frees thousands of tensors).
    bool shared = false;
    if (shared_names_.count(it->storage_id) > 0) {
      for (auto& other : live_) {
        if (&other != &*it && other.storage_id == it->storage_id) {
          other.bytes += it->bytes;
          shared = true;
          break;
        }
      }
    }
    if (!shared) current_bytes_ -= it->bytes;
    const int64_t storage_id = it->storage_id;
    live_.erase(std::next(it).base());
    name_released(storage_id);
    return;
  }
  throw std::logic_error("TensorTrace::free: '" + std::string(name) + "' is not live");
}

void TensorTrace::alias(std::string_view from, std::string_view category, std::string_view to) {
  for (auto it = live_.rbegin(); it != live_.rend(); ++it) {
    if (it->name != from) continue;
    const int64_t storage_id = it->storage_id;
    live_.push_back(TraceItem{category, to, 0, 1, storage_id});
    ++shared_names_[storage_id];
    return;
  }
  throw std::logic_error("TensorTrace::alias: '" + std::string(from) + "' is not live");
}

void TensorTrace::name_released(int64_t storage_id) {
  const auto found = shared_names_.find(storage_id);
  if (found != shared_names_.end() && --found->second == 0) shared_names_.erase(found);
}

bool TensorTrace::is_live(std::string_view name) const {
  for (const auto& item : live_)
    if (item.name == name) return true;
  return false;
}

}  // namespace longseq
