#include "executor/arena.hpp"

#include <algorithm>
#include <fmt/format.h>

namespace longseq {

namespace {
class HostMemoryBackend final : public MemoryBackend {
 public:
  float* allocate(int64_t elements) override { return elements > 0 ? new float[static_cast<size_t>(elements)] : nullptr; }
  void release(float* data) noexcept override { delete[] data; }
  void fill_zero(float* data, int64_t elements) override { std::fill_n(data, elements, 0.0f); }
};
}  // namespace

MemoryBackend& host_memory_backend() {
  static HostMemoryBackend backend;
  return backend;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    arena_ = other.arena_;
    storage_id_ = other.storage_id_;
    data_ = other.data_;
    elements_ = other.elements_;
    other.arena_ = nullptr;
    other.data_ = nullptr;
    other.elements_ = 0;
  }
  return *this;
}

void Buffer::release() {
  if (arena_) arena_->free(storage_id_, data_);
  arena_ = nullptr;
  data_ = nullptr;
  elements_ = 0;
}

Arena::Arena(std::string name, double capacity_bytes, MemoryBackend& backend)
    : name_(std::move(name)), backend_(backend), capacity_bytes_(capacity_bytes) {}

void Arena::free(int64_t storage_id, float* data) noexcept {
  backend_.release(data);
  trace_.free_storage(storage_id);  // recorded at allocation, so it is live
}

Buffer Arena::allocate(std::string_view category, std::string_view name, int64_t elements, bool zeroed) {
  const double bytes = static_cast<double>(elements) * static_cast<double>(sizeof(float));
  if (trace_.current_bytes() + bytes > capacity_bytes_) {
    std::vector<TraceItem> live = trace_.live_items();
    live.push_back({category, name, bytes, 1, -1});
    throw DeviceOutOfMemory(fmt::format("{} out of memory: {} needs {:.1f} MiB with {:.1f} of {:.1f} MiB in use", name_, name,
                                        bytes / (1 << 20), trace_.current_bytes() / (1 << 20), capacity_bytes_ / (1 << 20)),
                            std::move(live));
  }
  Buffer buffer;
  buffer.arena_ = this;
  buffer.elements_ = elements;
  buffer.data_ = backend_.allocate(elements);
  if (zeroed && elements > 0) backend_.fill_zero(buffer.data_, elements);
  buffer.storage_id_ = trace_.alloc(category, name, bytes);
  return buffer;
}

}  // namespace longseq
