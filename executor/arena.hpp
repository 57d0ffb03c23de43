// arena.hpp: the executor's device memory, tracked. Every device tensor is allocated here; the
// arena records current and peak bytes and which tensors were live at the peak, with the same
// TensorTrace bookkeeping (and tensor names) the planner's prediction uses, so measured and
// predicted memory can be diffed item by item. A second arena serves as the host pool that
// receives offloaded checkpoints.
//
// Invariant: a Buffer returns its bytes when destroyed; the arena's counters are exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/tensor_trace.hpp"

namespace longseq {

// Thrown when an allocation would exceed the arena's budget; what() is one line, `live` is the
// breakdown at the moment of failure.
class DeviceOutOfMemory : public std::runtime_error {
 public:
  DeviceOutOfMemory(const std::string& message, std::vector<TraceItem> live_items)
      : std::runtime_error(message), live(std::move(live_items)) {}
  std::vector<TraceItem> live;
};

// Where an arena's bytes come from: host memory here; the CUDA path supplies a device-memory
// backend with the same three calls, and the arena's accounting stays as it is.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* data) noexcept = 0;
  virtual void fill_zero(void* data, size_t bytes) = 0;
};

// Plain host memory (the CPU "device" and every host pool).
MemoryBackend& host_memory_backend();

class Arena;

// A buffer of `elements` values of T owned by an arena: move-only; releases its bytes when
// destroyed. float for the CPU path and for what accumulates; Bf16 for the GPU's activations.
template <typename T>
class BufferOf {
 public:
  BufferOf() = default;
  BufferOf(BufferOf&& other) noexcept { *this = std::move(other); }
  BufferOf& operator=(BufferOf&& other) noexcept {
    if (this != &other) {
      release();
      arena_ = std::exchange(other.arena_, nullptr);
      storage_id_ = other.storage_id_;
      data_ = std::exchange(other.data_, nullptr);
      elements_ = std::exchange(other.elements_, 0);
    }
    return *this;
  }
  BufferOf(const BufferOf&) = delete;
  BufferOf& operator=(const BufferOf&) = delete;
  ~BufferOf() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return elements_; }
  bool empty() const { return elements_ == 0; }
  inline void release();

 private:
  friend class Arena;
  Arena* arena_ = nullptr;
  int64_t storage_id_ = -1;
  T* data_ = nullptr;
  int64_t elements_ = 0;
};
using Buffer = BufferOf<float>;

class Arena {
 public:
  // capacity_bytes: the budget (infinite by default); name: "device" or "host", for messages.
  explicit Arena(std::string name, double capacity_bytes = std::numeric_limits<double>::infinity(),
                 MemoryBackend& backend = host_memory_backend());
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `category` and `name` must be string literals (the trace keeps views of them).
  template <typename T = float>
  BufferOf<T> allocate(std::string_view category, std::string_view name, int64_t elements, bool zeroed = false) {
    BufferOf<T> buffer;
    buffer.data_ = static_cast<T*>(allocate_bytes(category, name, elements * static_cast<int64_t>(sizeof(T)), zeroed, buffer.storage_id_));
    buffer.arena_ = this;
    buffer.elements_ = elements;
    return buffer;
  }
  // `name`, a string literal, becomes the buffer's name in the trace (same bytes, new role).
  template <typename T>
  void rename(BufferOf<T>& buffer, std::string_view name) {
    trace_.rename_storage(buffer.storage_id_, name);
  }
  void set_moment(std::string_view moment) { trace_.set_moment(moment); }

  double current_bytes() const { return trace_.current_bytes(); }
  double peak_bytes() const { return trace_.peak_bytes(); }
  std::string_view peak_moment() const { return trace_.peak_moment(); }
  const std::vector<TraceItem>& peak_items() const { return trace_.peak_items(); }
  double capacity_bytes() const { return capacity_bytes_; }
  MemoryBackend& backend() { return backend_; }

 private:
  template <typename T>
  friend class BufferOf;
  // Checks the budget, takes the bytes from the backend and records them; sets storage_id.
  void* allocate_bytes(std::string_view category, std::string_view name, int64_t bytes, bool zeroed, int64_t& storage_id);
  void free(int64_t storage_id, void* data) noexcept;
  std::string name_;
  MemoryBackend& backend_;
  double capacity_bytes_;
  TensorTrace trace_;
};

template <typename T>
void BufferOf<T>::release() {
  if (arena_) arena_->free(storage_id_, data_);
  arena_ = nullptr;
  data_ = nullptr;
  elements_ = 0;
}

}  // namespace longseq
