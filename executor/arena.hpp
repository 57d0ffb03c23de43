// arena.hpp: the executor's device memory, tracked. Every device tensor is allocated here; the
// arena records current and peak bytes and which tensors were live at the peak, with the same
// TensorTrace bookkeeping (and tensor names) the planner's prediction uses, so measured and
// predicted memory can be diffed item by item. A second arena serves as the host pool that
// receives offloaded checkpoints.
//
// Invariant: a Buffer returns its bytes when destroyed; the arena's counters are exact.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
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

// Where an arena's bytes come from: host memory here; the CUDA path supplies a cudaMalloc-backed
// backend with the same three calls, and the arena's accounting stays as it is.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual float* allocate(int64_t elements) = 0;
  virtual void release(float* data) noexcept = 0;
  virtual void fill_zero(float* data, int64_t elements) = 0;
};

// Plain host memory (the CPU "device" and every host pool).
MemoryBackend& host_memory_backend();

class Arena;

// A float buffer owned by an arena: move-only; releases its bytes when destroyed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return elements_; }
  bool empty() const { return elements_ == 0; }
  void release();

 private:
  friend class Arena;
  Arena* arena_ = nullptr;
  int64_t storage_id_ = -1;
  float* data_ = nullptr;
  int64_t elements_ = 0;
};

class Arena {
 public:
  // capacity_bytes: the budget (infinite by default); name: "device" or "host", for messages.
  explicit Arena(std::string name, double capacity_bytes = std::numeric_limits<double>::infinity(),
                 MemoryBackend& backend = host_memory_backend());
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `category` and `name` must be string literals (the trace keeps views of them).
  Buffer allocate(std::string_view category, std::string_view name, int64_t elements, bool zeroed = false);
  void set_moment(std::string_view moment) { trace_.set_moment(moment); }

  double current_bytes() const { return trace_.current_bytes(); }
  double peak_bytes() const { return trace_.peak_bytes(); }
  std::string_view peak_moment() const { return trace_.peak_moment(); }
  const std::vector<TraceItem>& peak_items() const { return trace_.peak_items(); }
  double capacity_bytes() const { return capacity_bytes_; }

 private:
  friend class Buffer;
  void free(int64_t storage_id, float* data) noexcept;
  std::string name_;
  MemoryBackend& backend_;
  double capacity_bytes_;
  TensorTrace trace_;
};

}  // namespace longseq
