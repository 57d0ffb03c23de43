#include "executor/arena.hpp"

#include <cstring>
#include <new>
#include <fmt/format.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace longseq {

namespace {
class HostMemoryBackend final : public MemoryBackend {
 public:
  HostMemoryBackend() {
#if defined(__GLIBC__)
    // A step allocates and frees the same activation sizes layer after layer. glibc returns a
    // block above its mmap threshold (128 KiB by default) to the OS at every free and trims the
    // heap's top, so each reuse page-faults its memory in again: on this project's VM that cost
    // more than the kernels (the executor's GEMMs ran at a tenth of their measured rate). Blocks
    // up to glibc's largest mmap threshold (32 MiB on 64-bit) stay in the heap, and the heap is
    // not trimmed: freed memory is reused as it is (the caching a GPU's allocator does too).
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024);
#endif
  }
  void* allocate(size_t bytes) override { return bytes > 0 ? ::operator new(bytes) : nullptr; }
  void release(void* data) noexcept override { ::operator delete(data); }
  void fill_zero(void* data, size_t bytes) override { std::memset(data, 0, bytes); }
};
}  // namespace

MemoryBackend& host_memory_backend() {
  static HostMemoryBackend backend;
  return backend;
}

Arena::Arena(std::string name, double capacity_bytes, MemoryBackend& backend)
    : name_(std::move(name)), backend_(backend), capacity_bytes_(capacity_bytes) {}

void Arena::free(int64_t storage_id, void* data) noexcept {
  backend_.release(data);
  trace_.free_storage(storage_id);  // recorded at allocation, so it is live
}

void* Arena::allocate_bytes(std::string_view category, std::string_view name, int64_t bytes_wanted, bool zeroed, int64_t& storage_id) {
  const double bytes = static_cast<double>(bytes_wanted);
  if (trace_.current_bytes() + bytes > capacity_bytes_) {
    std::vector<TraceItem> live = trace_.live_items();
    live.push_back({category, name, bytes, 1, -1});
    throw DeviceOutOfMemory(fmt::format("{} out of memory: {} needs {:.1f} MiB with {:.1f} of {:.1f} MiB in use", name_, name,
                                        bytes / (1 << 20), trace_.current_bytes() / (1 << 20), capacity_bytes_ / (1 << 20)),
                            std::move(live));
  }
  void* data = backend_.allocate(static_cast<size_t>(bytes_wanted));
  if (zeroed && bytes_wanted > 0) backend_.fill_zero(data, static_cast<size_t>(bytes_wanted));
  storage_id = trace_.alloc(category, name, bytes);
  return data;
}

}  // namespace longseq
