// tensor_trace.hpp: replays allocations and frees in program order and records the peak, with
// the list of tensors that were live at that moment.
//
// The planner drives it with the decoder-layer inventory (layer_inventory.hpp) to predict peak
// memory; the executor's tracking arena reports with the same names, so measured and predicted
// can be diffed tensor by tensor. Sizes are bytes held as double: exact to 2^53 bytes (8 PiB),
// and free of integer overflow when the planner probes absurd sequence lengths.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace longseq {

struct TraceItem {
  std::string_view category;  // the breakdown group: "model_states", "layer", "loss", ...
  std::string_view name;      // the tensor, e.g. "attention.q"
  double bytes = 0;
  double count = 1;           // identical tensors folded into one item (e.g. per-layer checkpoints)
  // Names sharing a storage have the same id; the storage's bytes sit on exactly one of them.
  int64_t storage_id = 0;
};

class TensorTrace {
 public:
  // A layer's replay holds a few dozen tensors at once: room for them up front (the planner's search
  // replays thousands of steps).
  TensorTrace() { live_.reserve(64); }
  // Returns the new tensor's storage id (for free_storage).
  int64_t alloc(std::string_view category, std::string_view name, double bytes, double count = 1);
  // Frees the most recently allocated live tensor called `name`; freeing a tensor that is not
  // live is a bug in the schedule and throws std::logic_error.
  void free(std::string_view name);
  // Frees exactly the tensor allocated with this id (an arena releasing its own buffer, whatever
  // other live tensors share its name).
  void free_storage(int64_t storage_id);
  // Gives the live tensor with this id a new name (a runtime handing a buffer to a new role
  // without copying it, e.g. a checkpoint whose copy to the host is still in flight).
  void rename_storage(int64_t storage_id, std::string_view name);
  bool is_live(std::string_view name) const;
  // Makes `to` a view of live tensor `from`: both names share one storage, counted once, which
  // is released when the last name sharing it is freed (PyTorch's view semantics). Used where a
  // runtime hands the same memory to two consumers, e.g. attention inputs without an all-to-all.
  void alias(std::string_view from, std::string_view category, std::string_view to);
  // Without item recording the trace keeps only peak bytes and moment (the planner's search
  // evaluates thousands of plans and needs no breakdown for most of them).
  void set_record_peak_items(bool record) { record_peak_items_ = record; }
  // Labels the allocations that follow, for reporting when the peak happened.
  void set_moment(std::string_view moment) { moment_ = moment; }

  double current_bytes() const { return current_bytes_; }
  double peak_bytes() const { return peak_bytes_; }
  std::string_view peak_moment() const { return peak_moment_; }
  const std::vector<TraceItem>& peak_items() const { return peak_items_; }
  const std::vector<TraceItem>& live_items() const { return live_; }

 private:
  // One name of `storage_id` is gone: its count of extra names (views) falls by one.
  void name_released(int64_t storage_id);
  std::vector<TraceItem> live_;
  // Storages named more than once (alias): how many names beyond the first are live.
  std::unordered_map<int64_t, int64_t> shared_names_;
  std::vector<TraceItem> peak_items_;
  double current_bytes_ = 0;
  double peak_bytes_ = 0;
  int64_t next_storage_id_ = 0;
  bool record_peak_items_ = true;
  std::string_view moment_;
  std::string_view peak_moment_;
};

}  // namespace longseq
